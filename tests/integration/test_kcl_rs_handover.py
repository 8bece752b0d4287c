"""The real peer both ways: kcl-rs 0.1.4 -> kinesis_actors (KclLeaseStore) -> kcl-rs, one lease table.

kcl-rs (KCL v3 in Rust, PyPI ``kcl-rs``) runs in its own virtualenv (``bench/.venv-kclrs``,
installed on first use, skipped with pip's reason when it cannot be) as
``bench/_kclrs_worker.py``, which checkpoints after every batch and logs every record it
delivers. All three phases read one stream through one KCL lease table on the embedded
emulator:

1. kcl-rs reads the first records and checkpoints, then its process ends;
2. ours continues from kcl-rs's checkpoints: every later record, none kcl-rs checkpointed;
   then ``close()`` releases every lease as KCL's ``evictLease`` does;
3. a new kcl-rs worker continues from our checkpoints: every later record, none before.

Slow (kcl-rs's start, about 5 s on rows that exist, twice; Ray's start): marked ``slow`` and ``bench_harness`` (the bench-harness CI stage)
and staged like ``test_bench_peer_kcl_rs.py``, which shares its kcl-rs virtualenv fixture.
"""

from __future__ import annotations

import asyncio
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.peer_kcl_rs import SETTINGS, _CloudWatchSink, _kcl_worker, seed_kcl_leases
from kinesis_actors import KclLeaseStore, KinesisBroker, KinesisStream, StartAt

from .helpers import create_stream, dynamodb_client, kinesis_client, wait_until
from .test_bench_peer_kcl_rs import kclrs_venv  # noqa: F401 - the fixture: installs kcl-rs or skips with pip's reason


@pytest.fixture(scope="module")
def kclrs_python(kclrs_venv: Path) -> str:
    return str(kclrs_venv / "bin" / "python")


def _publish(endpoint: str, stream: str, prefix: str, n: int) -> dict[tuple[str, str], bytes]:
    kinesis = kinesis_client(endpoint)
    out = {}
    for i in range(n):
        data = f"{prefix}-{i}".encode()
        r = kinesis.put_record(StreamName=stream, Data=data, PartitionKey=f"key-{i}")
        out[(r["ShardId"], r["SequenceNumber"])] = data
    return out


def _kcl_rs_reads(ctx: Any, cw: str, stream: str, app: str, name: str, expect: int, log: Path) -> set[tuple[str, str]]:
    """Run one kcl-rs worker until it delivered ``expect`` records (it checkpoints each batch), then end it."""
    worker = _kcl_worker(ctx, cw, name, stream, app, SETTINGS["seeded"],
                         expect=expect, exit_after_reached=1.0, record_log=str(log), timeout_s=240)
    try:
        done = worker.wait("done", timeout_s=270)
    finally:
        worker.kill()
    assert done is not None and done["count"] >= expect, f"kcl-rs {name}: {done} {worker.stderr_tail()}"
    assert done["checkpoint_errors"] == 0, done
    return {(shard, seq) for _, shard, seq in (line.split() for line in log.read_text().splitlines())}


def _checkpoints(endpoint: str, app: str) -> dict[str, int]:
    items = dynamodb_client(endpoint).scan(TableName=app, ConsistentRead=True)["Items"]
    return {i["leaseKey"]["S"]: int(i["checkpoint"]["S"]) for i in items
            if i.get("entityType", {}).get("S", "LEASE") == "LEASE" and i["checkpoint"]["S"].isdigit()}


def _ours_read(ours_in: str, endpoint: str, stream: str, app: str, expect: set[bytes]) -> list[Any]:
    """Ours on the KCL table until every payload of ``expect`` arrived, then a clean close.

    ``ray``: a broker (Coordinator and ShardReader actors); ``in_process``: the same
    Coordinator and reader logic in this event loop (``CoordinatorCore``, ``ShardReaderCore``)."""
    stream_config = KinesisStream(stream, start_at=StartAt.latest(), shard_sync_interval_s=1.0,
                                  lease_poll_interval_s=0.3)
    got: list[Any] = []
    if ours_in == "ray":
        broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True, lease_duration_s=2.0,
                               renew_interval_s=0.5, lease_store=KclLeaseStore(app, stream=stream)).connect()
        try:
            sub = broker.subscribe(stream_config)
            wait_until(lambda: got.extend(sub.next_batch(timeout_s=0.5)) or expect <= {r.data for r in got},
                       timeout_s=120, what="ours: every later record")
            sub.close()
        finally:
            broker.shutdown()
        return got
    from kinesis_actors.coordinator import CoordinatorCore
    from kinesis_actors.reader import ReaderIo, ShardReaderCore
    from kinesis_actors.testing import LocalReader

    store = KclLeaseStore(app, endpoint=endpoint, region="us-east-1", test_credentials=True, stream=stream).open()
    kinesis = kinesis_client(endpoint)

    async def deliver(records: list[Any]) -> None:
        got.extend(records)

    async def scenario() -> None:
        core = CoordinatorCore(stream_config, aws=None, store=store, owner_id="ours",  # type: ignore[arg-type]
                               lease_duration_s=2.0, renew_interval_s=0.5, kinesis=kinesis, call_timeout_s=10.0,
                               launcher=lambda _: LocalReader(ShardReaderCore(
                                   store=store.peer(), deliver=deliver, kinesis=kinesis, io=ReaderIo())))
        await core.start()
        deadline = time.monotonic() + 120
        while not expect <= {r.data for r in got}:
            assert core.error() is None and time.monotonic() < deadline, core.error()
            await asyncio.sleep(0.1)
        await core.close()

    asyncio.run(scenario())
    return got


@pytest.mark.slow
@pytest.mark.bench_harness
@pytest.mark.timeout(900)
@pytest.mark.parametrize("ours_in", ["ray", "in_process"])
def test_kcl_rs_to_ours_and_back_loses_nothing_and_redelivers_nothing(
        kclrs_python: str, endpoint: str, tmp_path: Path, ours_in: str, request: pytest.FixtureRequest) -> None:
    if ours_in == "ray":
        request.getfixturevalue("ray_session")
    stream, app = f"kclrs-move-{uuid.uuid4().hex[:6]}", f"kclrs-app-{uuid.uuid4().hex[:6]}"
    create_stream(endpoint, stream, 2)
    seed_kcl_leases(endpoint, stream, app)  # the rows kcl-rs's first shard sync writes (no empty-table wait)
    ctx = types.SimpleNamespace(kclrs_python=kclrs_python, endpoint=endpoint)
    started = time.monotonic()
    with _CloudWatchSink() as cw:
        first = _publish(endpoint, stream, "a", 40)
        got_a = _kcl_rs_reads(ctx, cw.endpoint, stream, app, "first", len(first), tmp_path / "first.log")
        assert set(first) <= got_a
        by_kcl = _checkpoints(endpoint, app)
        assert len(by_kcl) == 2, by_kcl  # kcl-rs checkpointed both shards

        second = _publish(endpoint, stream, "b", 40)
        ours = _ours_read(ours_in, endpoint, stream, app, set(second.values()))
        redelivered = [r for r in ours if int(r.sequence_number) <= by_kcl[r.shard_id]]
        assert not redelivered, redelivered[:5]  # nothing kcl-rs checkpointed
        assert not {r.data for r in ours} & set(first.values())
        by_ours = _checkpoints(endpoint, app)
        assert all(by_ours[s] > by_kcl[s] for s in by_kcl), (by_kcl, by_ours)

        third = _publish(endpoint, stream, "c", 40)
        got_c = _kcl_rs_reads(ctx, cw.endpoint, stream, app, "again", len(third), tmp_path / "again.log")
    assert set(third) <= got_c  # 0 lost
    assert not got_c & (set(first) | set(second)), sorted(got_c & (set(first) | set(second)))[:5]  # 0 redelivered
    print(f"kcl-rs -> ours -> kcl-rs took {time.monotonic() - started:.1f} s", file=sys.stderr)
