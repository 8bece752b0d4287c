"""Many shards per reader process, on real Ray actors and an emulator over HTTP.

* 128 shards on one node with default settings: everything delivered, no lease lost,
  the readers and the Coordinator within 1.5 GiB USS.
* A sink that stalls for three lease durations on 64 shards: no lease changes owner and
  no lease's counter stands still for a lease duration.
* 128 idle shards against a moto server that serves one request at a time: the whole
  subscription (polls, renewals, lease-table reads) within about 200 requests/s, and
  every lease renewed within ``renew_interval_s + 1 s``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import boto3
import psutil
import pytest
import ray

from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
from kinesis_actors.emulator import Emulator

from .helpers import dynamodb_client, kinesis_client, wait_until

pytestmark = pytest.mark.usefixtures("ray_session")

GIB = 2**30


def create_filled_stream(endpoint: str, name: str, shards: int, per_shard: int, size: int = 100) -> None:
    """A stream of ``shards`` shards with ``per_shard`` records of ``size`` bytes in each."""
    k = kinesis_client(endpoint)
    k.create_stream(StreamName=name, ShardCount=shards)
    k.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 150})
    listed = k.list_shards(StreamName=name)["Shards"]
    assert len(listed) == shards
    for shard in listed:
        if per_shard:
            records = [{"Data": f"{shard['ShardId']}-{i}".encode().ljust(size, b"."), "PartitionKey": "k",
                        "ExplicitHashKey": shard["HashKeyRange"]["StartingHashKey"]} for i in range(per_shard)]
            assert k.put_records(StreamName=name, Records=records)["FailedRecordCount"] == 0


@ray.remote(num_cpus=0)
class CountingSink:
    """Counts distinct records per shard; can hold every batch until ``open_gate()``."""

    def __init__(self, gated: bool = False) -> None:
        import asyncio

        self.seen: set[tuple[str, str]] = set()
        self.deliveries = 0
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()

    async def process_batch(self, records: list[Any]) -> None:
        await self.gate.wait()
        self.deliveries += len(records)
        self.seen.update((r.shard_id, r.sequence_number) for r in records)

    def open_gate(self) -> None:
        self.gate.set()

    def counts(self) -> tuple[int, int, int]:
        """(distinct records, deliveries, shards seen)"""
        return len(self.seen), self.deliveries, len({s for s, _ in self.seen})


def uss_of(pids: list[int]) -> int:
    return sum(psutil.Process(pid).memory_full_info().uss for pid in pids)


def test_128_shards_on_one_node_are_read_by_a_few_readers_within_the_memory_budget(endpoint: str, unique: str) -> None:
    name, shards, per_shard = f"scale128-{unique}", 128, 20
    create_filled_stream(endpoint, name, shards, per_shard)
    sink = CountingSink.remote()
    with KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True).connect() as conn:
        sub = conn.subscribe(KinesisStream(name, start_at=StartAt.trim_horizon()), sink=sink)
        wait_until(lambda: ray.get(sink.counts.remote())[0] == shards * per_shard, timeout_s=60,
                   what="every record of 128 shards")
        stats = sub.stats()
        pids = [r["pid"] for r in stats["readers"]] + [stats["coordinator"]["pid"]]
        uss = uss_of(pids)
        assert stats["leases_lost"] == 0 and stats["leases_held"] == shards
        assert all(lease.owner == sub.owner_id for lease in sub.leases()) and len(sub.leases()) == shards
        cap = stats["max_shards_per_reader"]
        assert len(stats["readers"]) == max(2, -(-shards // cap) + 1), "one reader to spare, no more"
        assert max(r["shards"] for r in stats["readers"]) <= cap
        assert uss <= 1.5 * GIB, f"readers + Coordinator USS {uss / 2**20:.0f} MiB"
        sub.close()
        assert sub.leases() == [], "close released all 128 leases"


def test_a_sink_stalled_for_three_lease_durations_on_64_shards_keeps_every_lease(endpoint: str, unique: str) -> None:
    name, shards, lease_s = f"stall64-{unique}", 64, 2.0
    create_filled_stream(endpoint, name, shards, 5)
    table = f"stall-{unique}"
    sink = CountingSink.remote(gated=True)
    broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True,
                           lease_store=DynamoLeaseStore(table, create_if_missing=True),
                           lease_duration_s=lease_s, renew_interval_s=0.5)
    ddb = dynamodb_client(endpoint)

    def rows() -> dict[str, tuple[str | None, int]]:
        items = ddb.scan(TableName=table, ConsistentRead=True)["Items"]
        return {i["shard_id"]["S"]: (i.get("lease_owner", {}).get("S"), int(i["lease_counter"]["N"]))
                for i in items if "shard_id" in i}

    with broker.connect() as conn:
        sub = conn.subscribe(KinesisStream(name, start_at=StartAt.trim_horizon(), lease_poll_interval_s=0.5),
                             sink=sink)
        owner = sub.owner_id
        samples = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3 * lease_s:  # the stall: nothing is acknowledged
            samples.append((time.monotonic(), rows()))
            time.sleep(1.0)
        assert ray.get(sink.counts.remote())[1] == 0, "the sink held everything"
        for _, snapshot in samples:
            assert len(snapshot) == shards and all(o == owner for o, _ in snapshot.values()), "no owner change"
        for (t_a, a), (t_b, b) in zip(samples, samples[2:]):
            assert t_b - t_a >= lease_s
            still = [sid for sid in a if b[sid][1] == a[sid][1]]
            assert not still, f"counters stood still for {t_b - t_a:.1f} s: {still[:5]}"
        stats = sub.stats()
        assert stats["leases_lost"] == 0
        assert all(r["buffered_bytes"] <= r["max_buffered_bytes"] + 10 * 2**20 for r in stats["readers"])
        ray.get(sink.open_gate.remote())
        wait_until(lambda: ray.get(sink.counts.remote())[0] == shards * 5, timeout_s=30, what="every record after")
        sub.close()


@pytest.fixture
def single_threaded_emulator() -> Iterator[Emulator]:
    """A moto server of our own that serves one request at a time (as many test setups run it)."""
    with Emulator(threaded=False) as emu:
        yield emu


def test_128_idle_shards_on_a_one_request_at_a_time_server_stay_within_the_request_budget(
        single_threaded_emulator: Emulator, unique: str) -> None:
    emu = single_threaded_emulator
    name, shards, table = f"idle128-{unique}", 128, f"idle-{unique}"
    create_filled_stream(emu.endpoint, name, shards, 0)
    ddb = boto3.client("dynamodb", endpoint_url=emu.endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    broker = KinesisBroker(endpoint=emu.endpoint, region="us-east-1", test_credentials=True,
                           lease_store=DynamoLeaseStore(table, create_if_missing=True))  # defaults: 10 s / 3 s
    with broker.connect() as conn:
        sub = conn.subscribe(KinesisStream(name, start_at=StartAt.trim_horizon()), sink=CountingSink.remote())
        time.sleep(5.0)  # settle: every shard at its tip, idle waits at their cap (deliberate: a measurement window)
        window_s, ours = 12.0, 0
        before = emu.requests()
        last_change: dict[str, tuple[int, float]] = {}
        gaps: list[float] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < window_s:
            items = ddb.scan(TableName=table, ConsistentRead=True)["Items"]
            ours += 1
            now = time.monotonic()
            for item in items:
                if "shard_id" not in item:
                    continue
                sid, counter = item["shard_id"]["S"], int(item["lease_counter"]["N"])
                seen = last_change.get(sid)
                if seen is None or seen[0] != counter:
                    if seen is not None:
                        gaps.append(now - seen[1])
                    last_change[sid] = (counter, now)
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        after = emu.requests()
        total = sum(after.values()) - sum(before.values()) - ours
        rate = total / elapsed
        by_op = {op: round((after.get(op, 0) - before.get(op, 0)) / elapsed, 1) for op in after}
        stats = sub.stats()
        assert stats["leases_lost"] == 0 and len(sub.leases()) == shards
        assert rate <= 200, f"{rate:.0f} requests/s: {by_op}"
        get_records = by_op.get("GetRecords", 0)
        assert get_records / shards <= 1.05, f"an idle shard polls at most about once a second ({by_op})"
        # every lease renewed within renew_interval_s + 1 s (sampled every ~0.5 s: +1 sample of slack)
        assert gaps and max(gaps) <= 3.0 + 1.0 + 0.75, f"longest renewal gap {max(gaps):.2f} s"
        sub.close()
