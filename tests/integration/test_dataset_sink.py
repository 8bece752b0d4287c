"""DatasetSink on Ray and the emulator: records land in Parquet; checkpoints never pass a finished window."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
from kinesis_actors.sinks.dataset import DatasetSink

from .helpers import KeyedPublisher, create_stream, exactly_once, newest_by_shard, parquet_keys, wait_until

pytestmark = pytest.mark.usefixtures("ray_session")

FAST = dict(lease_duration_s=4.0, renew_interval_s=1.0)
POLL = dict(shard_sync_interval_s=1.0, lease_poll_interval_s=0.3, start_at=StartAt.trim_horizon())


@pytest.fixture
def conn(endpoint: str) -> Iterator[KinesisBroker]:
    broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True, **FAST).connect()
    yield broker
    broker.shutdown()


def publish(conn: KinesisBroker, stream: str, prefix: str, n: int) -> list[bytes]:
    payloads = [f"{prefix}-{i}".encode() for i in range(n)]
    conn.publisher(stream).put_many([(p, f"key-{i}") for i, p in enumerate(payloads)])
    return payloads


def written(path: pathlib.Path) -> dict[str, Any]:
    """Rows of every complete Parquet file under ``path``: payloads and the newest sequence
    number per shard. A file still being written (no footer yet) belongs to a window whose
    fn has not finished, so it is skipped (read on a later call)."""
    payloads: list[bytes] = []
    newest: dict[str, int] = {}
    for f in sorted(path.glob("*.parquet")):
        try:
            t = pq.read_table(f)
        except pa.ArrowInvalid:
            continue
        payloads += t.column("data").to_pylist()
        for sid, seq in zip(t.column("shard_id").to_pylist(), t.column("sequence_number").to_pylist()):
            newest[sid] = max(newest.get(sid, 0), int(seq))
    return {"payloads": payloads, "newest": newest}


def checkpoints(conn: KinesisBroker, stream: str) -> dict[str, int]:
    rows = conn.lease_store.list(stream)  # type: ignore[union-attr]
    return {r.shard_id: int(r.checkpoint) for r in rows if r.checkpoint and r.checkpoint.isdigit()}


def parquet_writer(path: pathlib.Path, gate: pathlib.Path | None = None) -> Callable[[Any], None]:
    out, gate_file = str(path), None if gate is None else str(gate)

    def write(ds: Any) -> None:
        if gate_file is not None:
            deadline = time.monotonic() + 30
            while not pathlib.Path(gate_file).exists():  # the test opens the gate
                if time.monotonic() > deadline:
                    raise TimeoutError("gate never opened")
                time.sleep(0.02)
        ds.write_parquet(out)

    return write


@pytest.mark.parametrize("batch_format", ["records", "pyarrow"])
def test_records_land_in_parquet_and_checkpoints_follow(conn: KinesisBroker, endpoint: str, unique: str,
                                                        tmp_path: pathlib.Path, batch_format: str) -> None:
    stream = f"dsink-{batch_format}-{unique}"
    create_stream(endpoint, stream, 2)
    payloads = publish(conn, stream, "p", 120)
    out = tmp_path / "out"
    sink = DatasetSink(parquet_writer(out), window_s=0.5, batch_format=batch_format)
    try:
        with conn.subscribe(KinesisStream(stream, **POLL), sink=sink):
            wait_until(lambda: out.exists() and len(set(written(out)["payloads"])) == 120, timeout_s=40,
                       what="every record in parquet")
            got = written(out)
            wait_until(lambda: checkpoints(conn, stream) == got["newest"], timeout_s=20, what="checkpoints at the end")
        assert set(got["payloads"]) == set(payloads)
        stats = sink.stats()
        assert stats["windows_completed"] >= 1 and stats["records_written"] >= 120 and stats["windows_failed"] == 0
    finally:
        sink.close()


def test_checkpoints_never_pass_a_window_fn_has_not_finished(conn: KinesisBroker, endpoint: str, unique: str,
                                                            tmp_path: pathlib.Path) -> None:
    stream = f"dsink-gate-{unique}"
    create_stream(endpoint, stream, 2)
    publish(conn, stream, "first", 40)
    out, gate = tmp_path / "out", tmp_path / "gate"
    sink = DatasetSink(parquet_writer(out, gate), window_s=0.3)
    try:
        with conn.subscribe(KinesisStream(stream, **POLL), sink=sink):
            # both shards' first batches wait in a window that fn has not finished
            wait_until(lambda: sink.stats()["windows_waiting"] >= 1, timeout_s=20, what="a window waiting for fn")
            time.sleep(0.5)  # give a wrongly early checkpoint time to appear
            assert checkpoints(conn, stream) == {}
            gate.touch()
            # from now on, sample: every checkpoint is covered by a finished window's file
            publish(conn, stream, "second", 40)
            deadline = time.monotonic() + 40
            while True:
                cps = checkpoints(conn, stream)  # read the checkpoints first, then the files
                files = written(out) if out.exists() else {"payloads": [], "newest": {}}
                for sid, cp in cps.items():
                    assert cp <= files["newest"].get(sid, -1), f"checkpoint of {sid} ahead of the written files"
                if len(set(files["payloads"])) == 80 and cps == files["newest"]:
                    break
                assert time.monotonic() < deadline, f"not done: {len(set(files['payloads']))} written, {cps}"
                time.sleep(0.1)
    finally:
        sink.close()


def test_a_failing_fn_is_retried_and_nothing_is_checkpointed_meanwhile(conn: KinesisBroker, endpoint: str,
                                                                      unique: str, tmp_path: pathlib.Path) -> None:
    stream = f"dsink-fail-{unique}"
    create_stream(endpoint, stream, 1)
    payloads = publish(conn, stream, "f", 30)
    out, failures = tmp_path / "out", tmp_path / "failures"
    out_s, failures_s = str(out), str(failures)

    def flaky(ds: Any) -> None:
        count = pathlib.Path(failures_s)
        n = int(count.read_text()) if count.exists() else 0
        if n < 2:
            count.write_text(str(n + 1))
            raise OSError("bucket unavailable")
        ds.write_parquet(out_s)

    sink = DatasetSink(flaky, window_s=0.2)
    try:
        with conn.subscribe(KinesisStream(stream, max_sink_retries=10, **POLL), sink=sink):
            wait_until(lambda: failures.exists() and failures.read_text() == "2", timeout_s=20, what="two failures")
            wait_until(lambda: out.exists() and set(written(out)["payloads"]) == set(payloads), timeout_s=30,
                       what="records written after the failures")
            wait_until(lambda: checkpoints(conn, stream) == written(out)["newest"], timeout_s=20, what="checkpoint")
        assert sink.stats()["windows_failed"] == 2
    finally:
        sink.close()


def test_close_writes_the_open_window_once_and_the_next_owner_resumes_after_it(
        endpoint: str, unique: str, tmp_path: pathlib.Path) -> None:
    """A window longer than the readers' grace at close (5 s): close() writes it at once,
    acknowledged and checkpointed before the release; a new subscription on the same
    durable lease table writes every record exactly once, by (shard id, sequence number)."""
    stream, table, out = f"dsink-close-{unique}", f"dsink-close-leases-{unique}", tmp_path / "out"
    create_stream(endpoint, stream, 2)
    publisher = KeyedPublisher(endpoint, stream, per_tick=4, interval_s=0.1).backlog(300).start()

    def connect() -> KinesisBroker:
        return KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True, owner_id=f"o-{unique}",
                             lease_store=DynamoLeaseStore(table, create_if_missing=True), **FAST).connect()

    first = connect()
    try:
        sink = DatasetSink(parquet_writer(out), window_s=8.0)
        sub = first.subscribe(KinesisStream(stream, **POLL), sink=sink)
        wait_until(lambda: sink.stats()["windows_completed"] >= 1, timeout_s=60, what="the first window written")
        wait_until(lambda: sink.stats()["open_window_records"] > 0, timeout_s=20, what="batches in the next window")
        sub.close()
        stats = sink.close()
        rows = first.lease_store.list(stream)  # type: ignore[union-attr]
    finally:
        first.shutdown()
    newest = newest_by_shard(parquet_keys(out))
    # the rule: what was written is checkpointed (nothing for the next owner to read again) and released
    assert {r.shard_id: int(r.checkpoint) for r in rows if r.checkpoint} == newest, (rows, newest, stats)
    assert all(r.owner is None for r in rows), rows
    assert stats["records_written"] + stats["records_dropped"] >= 300

    second = connect()
    try:
        sink = DatasetSink(parquet_writer(out), window_s=0.5)
        with second.subscribe(KinesisStream(stream, **POLL), sink=sink):
            published = publisher.stop()
            wait_until(lambda: set(parquet_keys(out)) >= published, timeout_s=60, what="every record written")
        sink.close()
    finally:
        second.shutdown()
    result = exactly_once(published, parquet_keys(out))
    assert result["duplicates"] == 0 and result["lost"] == 0 and result["unknown"] == 0, result
