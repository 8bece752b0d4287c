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
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--skip", "demo,peer,efo", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=850)
    assert out.exists(), proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["errors"] == {}, data["errors"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert data["mode"] == "quick" and data["machine"]["cores"]
    sections = {f["section"] for f in data["figures"]}
    assert {"throughput", "latency", "memory", "failover", "scale"} <= sections
    for f in data["figures"]:
        assert set(f) >= {"name", "value", "unit", "anchor", "anchor_value", "ratio", "goal", "goal_met"}
        assert f["value"] is None or isinstance(f["value"], (int, float))
    names = {f["name"] for f in data["figures"]}
    assert {"product_records_per_s", "raw_single_records_per_s", "raw_threads_records_per_s", "product_p50_ms",
            "reader_uss_at_rest_mib", "coordinator_pass_s", "crash_to_survivor_first_record_s",
            "reader_sigkill_to_shards_delivering_s", "scale_16_subscribe_s", "scale_64_all_delivered_s",
            "scale_64_uss_per_shard_mib", "scale_16_cap1_uss_total_mib"} <= names
    assert not [f for f in data["figures"] if f["name"].endswith("_failed")], "every scale run went to the end"
    assert "product_records_per_s" in proc.stdout  # the printed table
