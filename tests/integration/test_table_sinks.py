"""IcebergSink and DeltaSink on real Ray actors, the emulator (Kinesis and DynamoDB) and real tables
(pyiceberg's SQL catalog on SQLite with a local warehouse; deltalake on local files): every record
in the table exactly once, also after a reader is SIGKILLed with commits pending; the lease-table
checkpoint never ahead of the table."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
from kinesis_actors.sinks import DeltaSink, IcebergSink
from kinesis_actors.sinks.tables import ShardKey
from tests.unit.table_fixtures import commit_positions, iceberg_catalog, scan

from .helpers import wait_until
from .test_consume import POLL, make_broker  # noqa: F401 - the fixture: connected brokers, shut down afterwards

pytestmark = pytest.mark.usefixtures("ray_session")


def make_sink(kind: str, tmp: Path, **kw: Any) -> Any:
    if kind == "iceberg":
        return IcebergSink("ka.events", catalog=iceberg_catalog(tmp), **kw)
    return DeltaSink(str(tmp / "events"), **kw)


def publish(conn: KinesisBroker, stream: str, prefix: str, n: int) -> set[str]:
    payloads = [f"{prefix}-{i}" for i in range(n)]
    conn.publisher(stream).put_many([(p.encode(), f"key-{i}") for i, p in enumerate(payloads)])
    return set(payloads)


def payloads(sink: Any) -> list[str]:
    table = scan(sink.backend())
    return [] if table is None else [b.decode() for b in table.column("data").to_pylist()]


def check_checkpoints_behind_table(conn: KinesisBroker, stream: str, sink: Any) -> None:
    """No lease-table checkpoint is ahead of the table's position of its shard (that would skip records)."""
    newest: dict[str, int] = {}
    for commit in reversed(commit_positions(sink.backend())):
        for key, position in commit.items():
            if key.stream == stream and position.sequence_number is not None:
                newest[key.shard_id] = int(position.sequence_number)
    for lease in conn.lease_store.list(stream):  # type: ignore[union-attr]
        if lease.checkpoint and lease.checkpoint.isdigit():
            assert int(lease.checkpoint) <= newest[lease.shard_id], (lease, newest)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_every_record_lands_once_and_a_sigkilled_reader_with_commits_pending_writes_nothing_twice(
        kind: str, make_broker: Callable[..., KinesisBroker], unique: str, tmp_path: Path) -> None:
    stream = f"tables-{kind}-{unique}"
    conn = make_broker(lease_store=DynamoLeaseStore(f"leases-{unique}", create_if_missing=True), owner_id="a")
    sink = make_sink(kind, tmp_path, commit_interval_s=1.5)
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon(),
                                       max_shards_per_reader=1, **POLL), sink=sink)
    sent = publish(conn, stream, "a", 200)
    wait_until(lambda: set(payloads(sink)) >= sent, timeout_s=45, what="the first records in the table")
    # More records, then a reader dies while its last batches are staged and not committed.
    sent |= publish(conn, stream, "b", 200)
    wait_until(lambda: sink.stats()["rows_staged"] >= 300, timeout_s=30, what="records staged")
    readers = [r for r in sub.stats()["readers"] if r.get("shards")]
    os.kill(readers[0]["pid"], signal.SIGKILL)
    sent |= publish(conn, stream, "c", 100)
    wait_until(lambda: set(payloads(sink)) >= sent, timeout_s=60, what="every record after the SIGKILL")
    got = payloads(sink)
    assert len(got) == len(sent) == 500, f"{len(got) - len(set(got))} duplicates"
    check_checkpoints_behind_table(conn, stream, sink)
    sub.close()
    assert sink.actor is None  # the subscription's close stopped the committer (GatheringSink.end_close)
    stats = sink.close()  # its last counters
    assert stats["rows_committed"] == 500 and stats["staged_bytes"] == 0
    commits = commit_positions(sink.backend())
    assert all(len(c) >= 1 for c in commits)
    assert {k.shard_id for c in commits for k in c} == {s.shard_id for s in conn.lease_store.list(stream)}  # type: ignore[union-attr]
    check_checkpoints_behind_table(conn, stream, sink)


def test_a_transform_shapes_the_rows_and_the_table_is_created_by_the_first_batch(
        make_broker: Callable[..., KinesisBroker], unique: str, tmp_path: Path) -> None:
    import pyarrow as pa

    def parse(table: pa.Table) -> pa.Table:  # nested: shipped to the readers by value
        docs = [json.loads(b) for b in table.column("data").to_pylist()]
        return pa.table({"order": pa.array([d["order"] for d in docs], pa.int64()),
                         "shard_id": table.column("shard_id")})

    stream = f"tables-tf-{unique}"
    conn = make_broker(lease_store=DynamoLeaseStore(f"leases-{unique}", create_if_missing=True), owner_id="a")
    sink = make_sink("iceberg", tmp_path, commit_interval_s=0.5, transform=parse)
    assert sink.backend().load() is None
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(), **POLL),
                         sink=sink)
    conn.publisher(stream).put_many([(json.dumps({"order": i}).encode(), "k") for i in range(50)])
    wait_until(lambda: (t := scan(sink.backend())) is not None and t.num_rows == 50, timeout_s=45,
               what="50 rows")
    table = scan(sink.backend())
    assert table.column_names == ["order", "shard_id"]
    assert sorted(table.column("order").to_pylist()) == list(range(50))
    sub.close()
    sink.close()
    (positions,) = commit_positions(sink.backend())[:1]
    assert list(positions) == [ShardKey(stream, "shardId-000000000000")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_two_instances_share_one_table_through_graceful_handoffs_and_write_each_record_once(
        kind: str, make_broker: Callable[..., KinesisBroker], unique: str, tmp_path: Path) -> None:
    """Instance b joins and takes about half of the shards from a by graceful handoff; each
    instance has its own committer, both commit to one table (their commits race in the SQL
    catalog's compare-and-swap, or for the next ``_delta_log`` version, and are retried)."""
    stream, leases = f"tables-two-{unique}", f"leases-{unique}"
    a = make_broker(lease_store=DynamoLeaseStore(leases, create_if_missing=True), owner_id="a")
    b = make_broker(lease_store=DynamoLeaseStore(leases), owner_id="b")
    config = dict(start_at=StartAt.trim_horizon(), max_shards_per_reader=4, **POLL)
    sink_a = make_sink(kind, tmp_path, commit_interval_s=1.0)
    sub_a = a.subscribe(KinesisStream(stream, create_if_missing=4, **config), sink=sink_a)
    sent = publish(a, stream, "a", 200)
    wait_until(lambda: set(payloads(sink_a)) >= sent, timeout_s=45, what="a's records in the table")
    sink_b = make_sink(kind, tmp_path, commit_interval_s=1.0)
    sub_b = b.subscribe(KinesisStream(stream, **config), sink=sink_b)

    def held_by_b() -> int:
        sent.update(publish(a, stream, f"m{len(sent)}", 20))  # records keep coming during the moves
        return sum(1 for lease in a.lease_store.list(stream) if lease.owner == "b")  # type: ignore[union-attr]

    wait_until(lambda: held_by_b() >= 2, timeout_s=60, interval_s=0.5, what="b holding two shards")
    sent |= publish(b, stream, "z", 100)
    wait_until(lambda: set(payloads(sink_a)) >= sent, timeout_s=60, what="every record in the table")
    got = payloads(sink_a)
    assert len(got) == len(set(got)) == len(sent), f"{len(got) - len(set(got))} duplicates"
    sub_b.close()
    sub_a.close()
    committed = sink_a.close()["rows_committed"] + sink_b.close()["rows_committed"]
    assert committed == len(sent)
    check_checkpoints_behind_table(a, stream, sink_a)


def test_a_catalog_that_refuses_commits_for_a_while_loses_and_repeats_nothing(
        make_broker: Callable[..., KinesisBroker], unique: str, tmp_path: Path) -> None:
    """Another connection holds the SQLite catalog's write lock (``BEGIN IMMEDIATE``) for a while:
    every commit fails with SQLite's "database is locked" (reads still work), the committer keeps
    the rows staged and retries, and once the lock is gone the table holds every record once."""
    import sqlite3

    stream = f"tables-lock-{unique}"
    conn = make_broker(lease_store=DynamoLeaseStore(f"leases-{unique}", create_if_missing=True), owner_id="a")
    sink = make_sink("iceberg", tmp_path, commit_interval_s=0.5)
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon(), **POLL),
                         sink=sink)
    sent = publish(conn, stream, "a", 100)
    wait_until(lambda: set(payloads(sink)) >= sent, timeout_s=45, what="the first records in the table")
    lock = sqlite3.connect(str(tmp_path / "catalog.db"), isolation_level=None, timeout=30)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the catalog's write lock: its commit's UPDATE cannot run
        failures = sink.stats()["commit_failures"]
        sent_locked = publish(conn, stream, "b", 200)
        wait_until(lambda: sink.stats()["rows_staged"] >= 300, timeout_s=30, what="records staged")
        wait_until(lambda: sink.stats()["commit_failures"] >= failures + 2, timeout_s=60,
                   what="commits refused by the locked catalog")
        assert not set(payloads(sink)) & sent_locked, "a commit landed through the catalog's lock"
        assert "locked" in str(sink.stats()["last_error"]), sink.stats()["last_error"]
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    sent |= sent_locked | publish(conn, stream, "c", 100)
    wait_until(lambda: set(payloads(sink)) >= sent, timeout_s=60, what="every record after the lock")
    got = payloads(sink)
    assert len(got) == len(sent) == 400, f"{len(got) - len(set(got))} duplicates"
    check_checkpoints_behind_table(conn, stream, sink)
    sub.close()
    assert sink.close()["rows_committed"] == 400


def test_staged_rows_stay_within_the_streams_byte_budget_while_the_catalog_refuses_commits(
        make_broker: Callable[..., KinesisBroker], unique: str, tmp_path: Path) -> None:
    """The committer stages at most the stream's ``max_buffered_bytes`` (plus the batches whose
    staging is waiting): past it, staging (the acknowledgement) waits for a commit, so reading
    stops while the catalog's write lock is held; afterwards every record lands once."""
    import sqlite3

    stream, budget, pad = f"tables-budget-{unique}", 256 << 10, "." * 1000
    conn = make_broker(lease_store=DynamoLeaseStore(f"leases-{unique}", create_if_missing=True), owner_id="a")
    sink = make_sink("iceberg", tmp_path, commit_interval_s=0.5)
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon(), max_records=100,
                                       max_buffered_bytes=budget, **POLL), sink=sink)
    sent = publish(conn, stream, "a", 50)
    wait_until(lambda: set(payloads(sink)) >= sent, timeout_s=45, what="the first records in the table")
    assert sink.stats()["max_staged_bytes"] == budget
    lock = sqlite3.connect(str(tmp_path / "catalog.db"), isolation_level=None, timeout=30)
    try:
        lock.execute("BEGIN IMMEDIATE")
        failures = sink.stats()["commit_failures"]
        big = [f"b-{i}{pad}" for i in range(2000)]  # ~2 MiB: 8 budgets
        for i in range(0, len(big), 500):
            conn.publisher(stream).put_many([(p.encode(), f"key-{i + j}") for j, p in enumerate(big[i:i + 500])])
        wait_until(lambda: sink.stats()["commit_failures"] >= failures + 2, timeout_s=60,
                   what="commits refused by the locked catalog")
        staged = [sink.stats() for _ in range(5)]
        assert max(s["staged_bytes"] for s in staged) <= 2 * budget, [s["staged_bytes"] for s in staged]
        assert staged[-1]["rows_staged"] < 50 + len(big) // 2, "reading did not wait for room"
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    sent |= set(big)
    wait_until(lambda: set(payloads(sink)) >= sent, timeout_s=90, what="every record after the lock")
    got = payloads(sink)
    assert len(got) == len(set(got)) == len(sent), f"{len(got) - len(set(got))} duplicates"
    check_checkpoints_behind_table(conn, stream, sink)
    sub.close()
