"""Consume a stream on Ray: real Coordinator/ShardReader actors, the emulator over HTTP."""

from __future__ import annotations

import copy
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
import ray

from kinesis_actors import (
    DynamoLeaseStore,
    InvalidError,
    KinesisBroker,
    KinesisError,
    KinesisStream,
    MemoryLeaseStore,
    NotConnectedError,
    SinkError,
    StartAt,
    StreamError,
)

from .helpers import Collector, create_stream, drain, dynamodb_client, wait_until

pytestmark = pytest.mark.usefixtures("ray_session")

FAST = dict(lease_duration_s=2.0, renew_interval_s=0.5)
POLL = dict(shard_sync_interval_s=1.0, lease_poll_interval_s=0.3)


@pytest.fixture
def make_broker(endpoint: str) -> Iterator[Callable[..., KinesisBroker]]:
    """Connected brokers on the emulator with short lease timings; all shut down afterwards."""
    brokers: list[KinesisBroker] = []

    def make(**kwargs: Any) -> KinesisBroker:
        options = {"endpoint": endpoint, "region": "us-east-1", "test_credentials": True, **FAST, **kwargs}
        broker = KinesisBroker(**options).connect()
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.shutdown()


def publish(broker: KinesisBroker, stream: str, prefix: str, n: int) -> list[bytes]:
    payloads = [f"{prefix}-{i}".encode() for i in range(n)]
    broker.publisher(stream).put_many([(p, f"key-{i}") for i, p in enumerate(payloads)])
    return payloads


# ----------------------------------------------------------------------------- start positions
def test_latest_delivers_what_is_published_after_subscribe(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    conn = make_broker()
    stream = f"latest-{unique}"
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=2, **POLL))
    before = publish(conn, stream, "before", 0)
    after = publish(conn, stream, "after", 20)
    got = {r.data for r in drain(sub, 20)}
    assert got == set(after) and not got & set(before)
    sub.close()


def test_latest_skips_records_published_before(make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str) -> None:
    stream = f"latest2-{unique}"
    create_stream(endpoint, stream, 2)
    conn = make_broker()
    old = publish(conn, stream, "old", 10)
    sub = conn.subscribe(KinesisStream(stream, **POLL))
    new = publish(conn, stream, "new", 10)
    got = {r.data for r in drain(sub, 10)}
    assert got == set(new)
    assert not got & set(old)
    sub.close()


def test_trim_horizon_delivers_everything_in_order(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    conn = make_broker()
    stream = f"trim-{unique}"
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=3, start_at=StartAt.trim_horizon(), **POLL))
    sent = publish(conn, stream, "r", 300)
    got = drain(sub, 300)
    assert {r.data for r in got} == set(sent)
    by_shard: dict[str, list[int]] = {}
    for r in got:
        assert r.stream == stream and r.approximate_arrival_timestamp.tzinfo is not None
        by_shard.setdefault(r.shard_id, []).append(int(r.sequence_number))
    for seqs in by_shard.values():
        assert seqs == sorted(seqs), "records of a shard arrive in sequence order"
    sub.close()


def test_at_timestamp(make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str) -> None:
    stream = f"ts-{unique}"
    create_stream(endpoint, stream, 1)
    conn = make_broker()
    old = publish(conn, stream, "old", 5)
    time.sleep(0.3)  # bounded: arrival timestamps must differ from the cut-off
    cut = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.3)
    new = publish(conn, stream, "new", 5)
    sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.at_timestamp(cut), **POLL))
    got = {r.data for r in drain(sub, 5)}
    assert got == set(new) and not got & set(old)
    sub.close()


# ----------------------------------------------------------------------------- restarts
def test_restart_on_dynamo_resumes_after_checkpoint(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream, table = f"resume-{unique}", f"leases-{unique}"
    conn = make_broker(lease_store=DynamoLeaseStore(table, create_if_missing=True), owner_id="a")
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon(), **POLL))
    first = publish(conn, stream, "first", 40)
    drain(sub, 40)
    sub.close()
    assert all(lease.owner is None and lease.checkpoint for lease in conn.lease_store.list(stream))
    conn.shutdown()

    second_conn = make_broker(lease_store=DynamoLeaseStore(table), owner_id="a2")
    second = publish(second_conn, stream, "second", 30)
    sub2 = second_conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), **POLL))
    got = drain(sub2, 30)
    assert {r.data for r in got} == set(second)
    assert not {r.data for r in got} & set(first)
    # nothing more is coming: the first run's records are never delivered again
    assert sub2.next_batch(timeout_s=1.0) == []
    sub2.close()


def test_restart_on_memory_store_opens_at_start_at(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"mem-{unique}"
    conn = make_broker(lease_store=MemoryLeaseStore())
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(), **POLL))
    sent = publish(conn, stream, "a", 10)
    drain(sub, 10)
    sub.close()
    conn.shutdown()
    # A new instance with a new memory store has no checkpoints: TRIM_HORIZON reads all again.
    conn2 = make_broker(lease_store=MemoryLeaseStore())
    sub2 = conn2.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), **POLL))
    assert {r.data for r in drain(sub2, 10)} == set(sent)
    sub2.close()


# ----------------------------------------------------------------------------- one broker, many brokers
def test_second_subscription_to_a_stream_is_refused(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    conn = make_broker()
    stream = f"dup-{unique}"
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, **POLL))
    with pytest.raises(InvalidError, match="already reads"):
        conn.subscribe(KinesisStream(stream, **POLL))
    with pytest.raises(InvalidError, match="already reads"):
        copy.copy(conn).subscribe(KinesisStream(stream, **POLL))  # a copy shares the connection
    sub.close()


def test_two_brokers_with_own_stores_each_see_every_record(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"own-{unique}"
    a = make_broker(owner_id="a")
    b = make_broker(owner_id="b")
    sa = a.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon(), **POLL))
    sb = b.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), **POLL))
    sent = publish(a, stream, "x", 50)
    assert {r.data for r in drain(sa, 50)} == set(sent)
    assert {r.data for r in drain(sb, 50)} == set(sent)
    sa.close()
    sb.close()


def test_two_brokers_sharing_a_table_split_shards_and_see_everything(
    make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str
) -> None:
    stream, table = f"share-{unique}", f"leases-{unique}"
    create_stream(endpoint, stream, 4)
    a = make_broker(lease_store=DynamoLeaseStore(table, create_if_missing=True), owner_id="a")
    b = make_broker(lease_store=DynamoLeaseStore(table, create_if_missing=True), owner_id="b")
    sink = Collector.remote()
    sa = a.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), **POLL), sink=sink)
    sb = b.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), **POLL), sink=sink)
    sent = publish(a, stream, "s", 200)
    owners_seen: list[dict[str, str | None]] = []

    def all_delivered() -> bool:
        owners_seen.append({lease.shard_id: lease.owner for lease in a.lease_store.list(stream)})
        return set(ray.get(sink.payloads.remote())) >= set(sent)

    wait_until(all_delivered, timeout_s=30, what="every record at the shared sink")
    # Leases move while the brokers balance (2 each): compare two reads once they settled.
    wait_until(lambda: len(sa.leases()) == len(sb.leases()) == 2, timeout_s=20, what="2 shards each")
    held_a, held_b = {x.shard_id for x in sa.leases()}, {x.shard_id for x in sb.leases()}
    assert not held_a & held_b, "a shard is never held by both brokers"
    assert held_a | held_b == {f"shardId-00000000000{i}" for i in range(4)}
    sa.close()
    # close() releases: the other broker holds every shard within a few lease-poll intervals
    wait_until(lambda: len(sb.leases()) == 4, timeout_s=5, what="b taking a's released shards")
    more = publish(b, stream, "after-close", 40)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(more), timeout_s=20, what="records after close")
    sb.close()


# ----------------------------------------------------------------------------- failures
def test_killed_reader_is_replaced_and_nothing_is_lost(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    conn = make_broker(owner_id="k")
    stream = f"kill-{unique}"
    sink = Collector.remote()
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon(), **POLL), sink=sink)
    first = publish(conn, stream, "a", 50)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(first), timeout_s=20)
    readers = sub._call("reader_handles")
    victim_shard, victim = sorted(readers.items())[0]
    killed_at = time.monotonic()
    ray.kill(victim, no_restart=True)
    wait_until(lambda: sub._call("reader_handles").get(victim_shard, victim) != victim, timeout_s=10,
               what="replacement reader")
    replaced_after = time.monotonic() - killed_at
    assert replaced_after < FAST["lease_duration_s"] + 3, "replaced without waiting for lease expiry"
    second = publish(conn, stream, "b", 50)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(first) | set(second), timeout_s=20)
    assert sub.stats()["readers_replaced"] >= 1
    sub.close()


def test_reader_replaced_before_first_checkpoint_with_latest_loses_nothing(
    make_broker: Callable[..., KinesisBroker], unique: str
) -> None:
    conn = make_broker(lease_store=DynamoLeaseStore(f"leases-{unique}", create_if_missing=True), owner_id="l")
    stream = f"latest-kill-{unique}"
    sink = Collector.remote(fail_first=1000)  # nothing is acknowledged: no checkpoint yet
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, max_sink_retries=1000, **POLL), sink=sink)
    sent = publish(conn, stream, "after", 20)
    wait_until(lambda: ray.get(sink.call_count.remote()) >= 1, timeout_s=10)
    assert all(lease.checkpoint is None for lease in conn.lease_store.list(stream))
    sub.abort()  # crash: readers and coordinator gone, nothing acknowledged
    conn2 = make_broker(lease_store=DynamoLeaseStore(f"leases-{unique}"), owner_id="l")  # same owner id
    sink2 = Collector.remote()
    sub2 = conn2.subscribe(KinesisStream(stream, **POLL), sink=sink2)
    wait_until(lambda: set(ray.get(sink2.payloads.remote())) >= set(sent), timeout_s=20,
               what="records published after the first subscribe, re-read from the recorded start position")
    sub2.close()


def test_lease_taken_away_stops_the_reader_for_good(make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str) -> None:
    table, stream = f"leases-{unique}", f"steal-{unique}"
    conn = make_broker(lease_store=DynamoLeaseStore(table, create_if_missing=True), owner_id="victim")
    sink = Collector.remote()
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(), **POLL), sink=sink)
    publish(conn, stream, "a", 10)
    wait_until(lambda: len(ray.get(sink.payloads.remote())) >= 10, timeout_s=20)
    # A thief rewrites the row (owner and counter) behind the reader's back, then keeps it renewed.
    key = f"{stream}:shardId-000000000000"
    ddb = dynamodb_client(endpoint)
    ddb.update_item(TableName=table, Key={"lease_key": {"S": key}},
                    UpdateExpression="SET lease_owner = :o, lease_counter = lease_counter + :one",
                    ExpressionAttributeValues={":o": {"S": "thief"}, ":one": {"N": "1"}})
    thief_store = DynamoLeaseStore(table, endpoint=endpoint, region="us-east-1", test_credentials=True)
    lease = thief_store.get(stream, "shardId-000000000000")
    assert lease is not None and lease.owner == "thief"
    calls_before = ray.get(sink.call_count.remote())
    publish(conn, stream, "b", 10)
    deadline = time.monotonic() + 3 * FAST["lease_duration_s"]
    while time.monotonic() < deadline:
        lease = thief_store.renew(lease)  # raises LeaseLostError if the old reader wrote anything
        row = thief_store.get(stream, "shardId-000000000000")
        assert row is not None and row.owner == "thief" and row.counter == lease.counter
        time.sleep(0.2)  # the thief's renew interval
    assert ray.get(sink.call_count.remote()) <= calls_before + 1, "the reader stopped within one renew interval"
    sub.close()


def test_sink_failing_twice_then_succeeding(make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str) -> None:
    table, stream = f"leases-{unique}", f"flaky-{unique}"
    conn = make_broker(lease_store=DynamoLeaseStore(table, create_if_missing=True))
    sink = Collector.remote(fail_first=2)
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(), **POLL), sink=sink)
    samples: list[str | None] = []
    stop = threading.Event()
    store = DynamoLeaseStore(table, endpoint=endpoint, region="us-east-1", test_credentials=True)

    def sample() -> None:
        while not stop.is_set():
            row = store.get(stream, "shardId-000000000000")
            samples.append(row.checkpoint if row else None)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    sent = publish(conn, stream, "f", 30)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(sent), timeout_s=20)
    wait_until(lambda: store.get(stream, "shardId-000000000000").checkpoint is not None, timeout_s=5)
    stop.set()
    sampler.join()
    acked = {int(seq) for _, seq in ray.get(sink.acked_batches.remote())}
    for checkpoint in samples:
        assert checkpoint is None or int(checkpoint) in acked, "a checkpoint is always an acknowledged batch's end"
    assert ray.get(sink.call_count.remote()) >= 3
    sub.close()


def test_sink_that_always_fails_fails_the_subscription(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    conn = make_broker()
    stream = f"dead-{unique}"
    sink = Collector.remote(always_fail=True)
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(),
                                       max_sink_retries=2, **POLL), sink=sink)
    publish(conn, stream, "x", 3)
    with pytest.raises(SinkError, match="sink failure"):
        sub.wait(timeout_s=30)
    assert all(lease.checkpoint is None for lease in conn.lease_store.list(stream))
    with pytest.raises(SinkError):
        sub.close()


def test_killed_coordinator_is_restarted(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    conn = make_broker(owner_id="c")
    stream = f"coord-{unique}"
    sink = Collector.remote()
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=2, start_at=StartAt.trim_horizon(), **POLL), sink=sink)
    first = publish(conn, stream, "a", 20)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(first), timeout_s=20)
    ray.kill(sub._coordinator, no_restart=True)
    wait_until(lambda: sub.coordinator_restarts >= 1, timeout_s=30, what="a new Coordinator")
    second = publish(conn, stream, "b", 20)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(second), timeout_s=20)
    sub.close()


# ----------------------------------------------------------------------------- lifecycle and seek
def test_lifecycle_publisher_before_connect_and_after_shutdown(endpoint: str, unique: str) -> None:
    broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True, **FAST)
    early = broker.publisher(f"life-{unique}")
    with pytest.raises(NotConnectedError):
        early.put(b"x", partition_key="k")
    conn = broker.connect()
    assert conn.connect() is conn
    sub = conn.subscribe(KinesisStream(f"life-{unique}", create_if_missing=1, start_at=StartAt.trim_horizon(), **POLL))
    result = early.put("text payload", partition_key="k")
    assert result.shard_id == "shardId-000000000000" and result.sequence_number.isdigit()
    results = conn.publisher(f"life-{unique}").put_many([(b"a", "k1"), (b"b", "k2")])
    assert [int(r.sequence_number) for r in results] == sorted(int(r.sequence_number) for r in results)
    assert {r.data for r in drain(sub, 3)} == {b"text payload", b"a", b"b"}
    seek = conn.seek_handle(f"life-{unique}")
    clone = copy.copy(conn)
    assert conn.shutdown() is None
    for call in (lambda: early.put(b"x", partition_key="k"), lambda: clone.publisher(f"life-{unique}").put(b"x", "k"),
                 lambda: seek.seek(StartAt.trim_horizon())):
        with pytest.raises(NotConnectedError):
            call()


def test_seek_rereads_and_rewrites_the_checkpoint(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"seek-{unique}"
    conn = make_broker(lease_store=DynamoLeaseStore(f"leases-{unique}", create_if_missing=True))
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(), **POLL))
    sent = publish(conn, stream, "s", 10)
    drain(sub, 10)
    sub.ack()
    wait_until(lambda: conn.lease_store.get(stream, "shardId-000000000000").checkpoint is not None, timeout_s=5)
    moved = conn.seek_handle(stream).seek(StartAt.trim_horizon())
    assert moved == ["shardId-000000000000"]
    assert {r.data for r in drain(sub, 10)} == set(sent)
    with pytest.raises(InvalidError, match="shard_id"):
        conn.seek_handle(stream).seek(StartAt.at_sequence_number("1"))
    sub.close()


def test_from_session(endpoint: str, unique: str) -> None:
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    with KinesisBroker.from_session(session, endpoint=endpoint, **FAST) as conn, conn.subscribe(
            KinesisStream(f"sess-{unique}", create_if_missing=1, start_at=StartAt.trim_horizon(), **POLL)) as sub:
        conn.publisher(f"sess-{unique}").put(b"hello", partition_key="k")
        assert [r.data for r in drain(sub, 1)] == [b"hello"]


# ----------------------------------------------------------------------------- bad input
def test_bad_input(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    with pytest.raises(InvalidError):
        KinesisStream("")
    with pytest.raises(InvalidError):
        KinesisStream("bad name!")
    with pytest.raises(InvalidError):
        KinesisStream("ok", create_if_missing=0)
    with pytest.raises(InvalidError):
        KinesisBroker(lease_duration_s=0)
    with pytest.raises(InvalidError):
        KinesisBroker(lease_duration_s=1.0, renew_interval_s=2.0)
    conn = make_broker()
    with pytest.raises(StreamError, match="does not exist"):
        conn.subscribe(KinesisStream(f"missing-{unique}"))
    with pytest.raises(InvalidError):
        conn.subscribe("not-a-stream-config")  # type: ignore[arg-type]
    pub = conn.publisher(f"missing-{unique}")
    with pytest.raises(InvalidError, match="1 MiB"):
        pub.put(b"x" * (1024 * 1024 + 1), partition_key="k")
    with pytest.raises(InvalidError, match="partition_key"):
        pub.put(b"x", partition_key="")
    with pytest.raises(InvalidError, match="partition_key"):
        pub.put(b"x", partition_key="k" * 257)
    with pytest.raises(StreamError):
        pub.put(b"x", partition_key="k")


def test_an_endpoint_that_is_not_running_is_named_within_seconds(unique: str) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    broker = KinesisBroker(endpoint=f"http://127.0.0.1:{port}", region="us-east-1", test_credentials=True)
    with broker.connect() as conn:
        started = time.monotonic()
        with pytest.raises(KinesisError) as err:
            conn.subscribe(KinesisStream(f"orders-{unique}", start_at=StartAt.trim_horizon()), sink=None)
        took = time.monotonic() - started
    assert took < 15, f"{took:.1f} s"
    assert f"http://127.0.0.1:{port}" in str(err.value) and "Connection refused" in str(err.value), err.value
