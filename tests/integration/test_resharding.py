"""Resharding on kinesalite (it routes writes to child shards and ends closed shards with a
null NextShardIterator): every parent read to its end and acknowledged before any child,
SHARD_END written after the parent's last acknowledged batch, restarts resume after the
checkpoint. The lease table stays on moto's DynamoDB."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from kinesis_actors.broker import KinesisBroker
from kinesis_actors.config import KinesisStream
from kinesis_actors.leases.protocol import SHARD_END
from kinesis_actors.records import StartAt
from kinesis_actors.testing import FaultInjector, with_faults

from .helpers import wait_until
from .kinesalite_bench import (
    PARENT,
    POLL,
    OrderedSink,
    broker_factory,
    create_stream,
    delivered,
    lease_store,
    list_shards_calls_since,
    merge,
    publish,
    split,
    wait_delivered,
)

pytestmark = [pytest.mark.kinesalite, pytest.mark.usefixtures("ray_session")]

CHILDREN = {"shardId-000000000001", "shardId-000000000002"}


@pytest.fixture
def table(unique: str) -> str:
    return f"leases-{unique}"


@pytest.fixture
def calls(tmp_path: Path) -> FaultInjector:
    """A fault injector without rules: a log of every Kinesis call the brokers make."""
    return FaultInjector.create(tmp_path / "calls")


@pytest.fixture
def make_broker(kinesalite: str, endpoint: str, table: str, calls: FaultInjector) -> Iterator[Callable[..., KinesisBroker]]:
    """Brokers with Kinesis on kinesalite and the lease table on moto's DynamoDB."""
    yield from broker_factory(kinesalite, endpoint, table, prepare=lambda broker: with_faults(broker, calls))


def children_listed(calls: FaultInjector, since: float) -> None:
    """Wait until the Coordinator listed the shards twice after ``since`` (it knows the children)."""
    wait_until(lambda: list_shards_calls_since(calls, since) >= 2, timeout_s=10, what="ListShards after resharding")


def key_of(data: bytes) -> str:
    return data.decode().split("-")[1]


def assert_parents_first(log: list[Any], parents: set[str], children: set[str]) -> None:
    """No child record acknowledged before the last record of any parent; per key, every
    parent record before every child record; each shard in sequence order."""
    shards = [shard for shard, *_ in log]
    last_parent = max(i for i, shard in enumerate(shards) if shard in parents)
    first_child = min(i for i, shard in enumerate(shards) if shard in children)
    assert first_child > last_parent, f"child record #{first_child} acknowledged before parent record #{last_parent}"
    by_key: dict[str, list[str]] = {}
    for shard, _, _, data in log:
        by_key.setdefault(key_of(data), []).append("parent" if shard in parents else "child")
    for key, kinds in by_key.items():
        assert kinds == sorted(kinds, key=lambda k: k == "child"), f"key {key}: a child record before a parent's"
    for shard in set(shards):
        seqs = [int(seq) for s, seq, _, _ in log if s == shard]
        assert seqs == sorted(seqs), f"{shard} delivered out of sequence order"


def test_split_with_a_slow_sink_reads_the_parent_to_its_end_first(
    make_broker: Callable[..., KinesisBroker], kinesalite: str, endpoint: str, table: str, unique: str,
    calls: FaultInjector,
) -> None:
    stream = f"split-{unique}"
    create_stream(kinesalite, stream, 1)
    conn = make_broker(owner_id="a")
    before = publish(conn, stream, "parent", 60)
    sink = OrderedSink.remote(delay_s=0.02, gated=True)  # holds the parent's first batch
    sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), max_records=5, **POLL), sink=sink)
    split_at = time.time()
    split(kinesalite, stream)  # while the parent's first batch waits at the sink
    after = publish(conn, stream, "child", 60)
    children_listed(calls, split_at)
    ray.get(sink.open_gate.remote())
    log = wait_delivered(sink, set(before) | set(after), timeout_s=40)
    assert {shard for shard, *_ in log} == {PARENT} | CHILDREN
    assert {d for s, *_, d in log if s == PARENT} == set(before), "writes after the split went to the children"
    assert_parents_first(log, {PARENT}, CHILDREN)
    row = lease_store(endpoint, table).get(stream, PARENT)
    assert row is not None and row.checkpoint == SHARD_END and row.owner is None, row
    wait_until(lambda: sub.stats()["shards_ended"] >= 1, timeout_s=5, what="shard end counted")
    assert all(lease.shard_id in CHILDREN for lease in sub.leases()), "the parent's lease was released"
    sub.close()


def test_merge_reads_both_parents_first(
    make_broker: Callable[..., KinesisBroker], kinesalite: str, endpoint: str, table: str, unique: str,
    calls: FaultInjector,
) -> None:
    stream = f"merge-{unique}"
    create_stream(kinesalite, stream, 2)
    conn = make_broker(owner_id="a")
    before = publish(conn, stream, "parent", 60)
    sink = OrderedSink.remote(delay_s=0.02, gated=True)
    sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), max_records=5, **POLL), sink=sink)
    parents = {"shardId-000000000000", "shardId-000000000001"}
    merge_at = time.time()
    merge(kinesalite, stream, *sorted(parents))
    after = publish(conn, stream, "child", 40)
    children_listed(calls, merge_at)
    ray.get(sink.open_gate.remote())
    log = wait_delivered(sink, set(before) | set(after), timeout_s=40)
    assert {s for s, *_, d in log if d in set(after)} == {"shardId-000000000002"}
    assert {s for s, *_, d in log if d in set(before)} == parents, "both parents held records"
    assert_parents_first(log, parents, {"shardId-000000000002"})
    store = lease_store(endpoint, table)
    for parent in parents:
        row = store.get(stream, parent)
        assert row is not None and row.checkpoint == SHARD_END and row.owner is None, row
    sub.close()


def test_restart_after_a_split_delivers_the_parent_tail_once(
    make_broker: Callable[..., KinesisBroker], kinesalite: str, endpoint: str, table: str, unique: str
) -> None:
    stream = f"restart-{unique}"
    create_stream(kinesalite, stream, 1)
    conn = make_broker(owner_id="a")
    parent = publish(conn, stream, "parent", 30)
    split(kinesalite, stream)
    children = publish(conn, stream, "child", 20)
    store = lease_store(endpoint, table)
    # The first run acknowledges two batches of the parent, then its downstream stops.
    sink1 = OrderedSink.remote(fail_after=2)
    sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), max_records=5,
                                       max_sink_retries=1000, **POLL), sink=sink1)
    wait_until(lambda: len(ray.get(sink1.acked_batches.remote())) == 2, timeout_s=20, what="two acknowledged batches")
    checkpoint = ray.get(sink1.acked_batches.remote())[-1][1]
    wait_until(lambda: (row := store.get(stream, PARENT)) and row.checkpoint == checkpoint, timeout_s=5,
               what="the second batch's checkpoint")
    first = delivered(sink1)
    assert [d for *_, d in first] == parent[:10] and all(s == PARENT for s, *_ in first)
    sub.abort()  # a crash: nothing more acknowledged, no release
    conn.shutdown()

    conn2 = make_broker(owner_id="a")  # the same owner re-takes its rows at once
    sink2 = OrderedSink.remote()
    sub2 = conn2.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), **POLL), sink=sink2)
    log = wait_delivered(sink2, set(parent[10:]) | set(children), timeout_s=30)
    parent_again = [(seq, d) for s, seq, _, d in log if s == PARENT]
    assert [d for _, d in parent_again] == parent[10:], "exactly the unread tail of the parent, in order"
    assert all(int(seq) > int(checkpoint) for seq, _ in parent_again), "nothing at or before the checkpoint again"
    assert_parents_first(log, {PARENT}, CHILDREN)
    assert store.get(stream, PARENT).checkpoint == SHARD_END
    sub2.close()


def test_at_timestamp_across_a_split(
    make_broker: Callable[..., KinesisBroker], kinesalite: str, endpoint: str, table: str, unique: str
) -> None:
    stream = f"ts-split-{unique}"
    create_stream(kinesalite, stream, 1)
    conn = make_broker(owner_id="a")
    old = publish(conn, stream, "old", 20)
    time.sleep(0.2)  # arrival timestamps (ms) on either side of the cut; bounded
    cut = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.2)
    new = publish(conn, stream, "new", 20)
    split(kinesalite, stream)
    children = publish(conn, stream, "child", 30)
    sink = OrderedSink.remote()
    sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.at_timestamp(cut), **POLL), sink=sink)
    log = wait_delivered(sink, set(new) | set(children), timeout_s=30)
    payloads = [d for *_, d in log]
    assert not set(payloads) & set(old), "records before the timestamp are never delivered"
    assert [d for s, *_, d in log if s == PARENT] == new
    assert_parents_first(log, {PARENT}, CHILDREN)
    store = lease_store(endpoint, table)
    assert store.get(stream, PARENT).checkpoint == SHARD_END
    for child in CHILDREN:  # children open at TRIM_HORIZON whatever start_at says
        assert store.get(stream, child).start_position == "TRIM_HORIZON"
    sub.close()
