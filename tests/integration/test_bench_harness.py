"""The benchmark harness runs on a tiny input and writes valid JSON (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.bench_harness
@pytest.mark.timeout(900)
def test_bench_quick_writes_valid_json(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--skip", "demo,peer,efo,tables", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=850)
    assert out.exists(), proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["errors"] == {}, data["errors"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert data["mode"] == "quick" and data["machine"]["cores"]
    sections = {f["section"] for f in data["figures"]}
    assert {"throughput", "latency", "memory", "failover", "scale", "lease_cost"} <= sections
    for f in data["figures"]:
        assert set(f) >= {"name", "value", "unit", "anchor", "anchor_value", "ratio", "goal", "goal_met"}
        assert f["value"] is None or isinstance(f["value"], (int, float))
    names = {f["name"] for f in data["figures"]}
    assert {"product_records_per_s", "raw_single_records_per_s", "raw_threads_records_per_s", "product_p50_ms",
            "reader_uss_at_rest_mib", "coordinator_pass_s", "crash_to_survivor_first_record_s",
            "reader_sigkill_to_shards_delivering_s", "scale_16_subscribe_s", "scale_64_all_delivered_s",
            "scale_64_uss_per_shard_mib", "scale_16_cap1_uss_total_mib", "lc_idle_writes_per_shard_per_s",
            "lc_idle_usd_per_month_500_shards", "lc_load_default_writes_per_shard_per_s",
            "lc_load_default_wru_per_shard_per_renew_interval", "lc_load_default_usd_per_month_500_shards",
            "lc_load_default_redelivered_per_killed_shard"} <= names
    assert not [f for f in data["figures"] if f["name"].endswith("_failed")], "every scale run went to the end"
    assert "product_records_per_s" in proc.stdout  # the printed table


@pytest.mark.bench_harness
def test_the_counting_proxy_counts_lease_table_writes_and_reads_on_the_wire(endpoint: str, unique: str) -> None:
    """bench/count_proxy.py (section lease_cost): each DynamoDB request forwarded once and counted by
    its X-Amz-Target; a request whose client died before its body arrived is not forwarded."""
    import socket

    import boto3

    from bench.count_proxy import READS, WRITES, CountingProxy

    from .helpers import wait_until

    with CountingProxy(endpoint) as proxy:
        ddb = boto3.client("dynamodb", endpoint_url=proxy.url, region_name="us-east-1",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        table = f"proxy-{unique}"
        ddb.create_table(TableName=table, KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                         AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
                         BillingMode="PAY_PER_REQUEST")
        for key in ("a", "b"):
            ddb.put_item(TableName=table, Item={"k": {"S": key}, "n": {"N": "0"}})
        ddb.update_item(TableName=table, Key={"k": {"S": "a"}}, UpdateExpression="SET n = :one",
                        ExpressionAttributeValues={":one": {"N": "1"}})
        for _ in range(3):
            assert ddb.get_item(TableName=table, Key={"k": {"S": "a"}}, ConsistentRead=True)["Item"]["n"]["N"] == "1"
        assert len(ddb.scan(TableName=table, ConsistentRead=True)["Items"]) == 2
        with socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))) as s:
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.UpdateItem\r\n"
                      b"Content-Length: 100\r\n\r\n{\"Ta")  # then the client dies
        wait_until(lambda: proxy.dropped == 1, timeout_s=10, what="the proxy to drop the truncated request")
        calls = proxy.calls()
        ddb.close()
    ops = [c.op for c in calls]
    assert ops.count("CreateTable") == 1
    assert sum(op in WRITES for op in ops) == 3 and sum(op in READS for op in ops) == 4, ops
    assert all(c.status == 200 for c in calls)
