"""Enhanced fan-out end to end on kinesis-mock (npm kinesis-local): real Coordinator and
ShardReader actors reading with SubscribeToShard; the lease tables on moto's DynamoDB (a
second endpoint, kept by DynamoLeaseStore(endpoint=...)).

kinesis-mock sends one event per second per subscription and refuses a new subscription
for about 2 s after one was dropped (ResourceInUseException), so waits here are seconds.
Lease timings are longer than test_consume's: a subscription read waits for the next
event within the Kinesis call timeout (half the lease), which must exceed that second.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray

from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
from kinesis_actors.fanout import FANOUT_EVENT_RESERVE_BYTES

from .helpers import Collector, as_background_job, create_stream, drain, kinesis_client, wait_until

pytestmark = [pytest.mark.kinesis_mock, pytest.mark.usefixtures("ray_session")]

TIMING = dict(lease_duration_s=6.0, renew_interval_s=1.5)
POLL = dict(shard_sync_interval_s=2.0, lease_poll_interval_s=0.5)


def fanout(stream: str, app: str, **kwargs: Any) -> KinesisStream:
    return KinesisStream(stream, retrieval="fanout", consumer_name=app, **POLL, **kwargs)


@pytest.fixture
def make_broker(kinesis_mock: str, emulator: Any) -> Iterator[Callable[..., KinesisBroker]]:
    """Brokers with Kinesis on kinesis-mock; ``table=`` puts the leases in DynamoDB on moto."""
    brokers: list[KinesisBroker] = []

    def make(table: str | None = None, **kwargs: Any) -> KinesisBroker:
        if table is not None:
            kwargs["lease_store"] = DynamoLeaseStore(table, create_if_missing=True, endpoint=emulator.endpoint,
                                                     region="us-east-1", test_credentials=True)
        options = {"endpoint": kinesis_mock, "region": "us-east-1", "test_credentials": True, **TIMING, **kwargs}
        broker = KinesisBroker(**options).connect()
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.shutdown()


def publish(broker: KinesisBroker, stream: str, prefix: str, n: int, size: int = 0) -> list[bytes]:
    payloads = [f"{prefix}-{i}-".encode().ljust(size, b"x") for i in range(n)]
    broker.publisher(stream).put_many([(p, f"key-{i}") for i, p in enumerate(payloads)])
    return payloads


def consumers(endpoint: str, stream: str) -> list[dict[str, Any]]:
    client = kinesis_client(endpoint)
    arn = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    found: list[dict[str, Any]] = client.list_stream_consumers(StreamARN=arn)["Consumers"]
    return found


def test_trim_horizon_registers_the_consumer_by_name_and_close_keeps_it(
        make_broker: Callable[..., KinesisBroker], kinesis_mock: str, unique: str) -> None:
    conn = make_broker()
    stream = f"efo-trim-{unique}"
    sub = conn.subscribe(fanout(stream, f"app-{unique}", create_if_missing=2, start_at=StartAt.trim_horizon()))
    sent = publish(conn, stream, "r", 200)
    got = drain(sub, 200, timeout_s=30)
    assert {r.data for r in got} == set(sent)
    by_shard: dict[str, list[int]] = {}
    for r in got:
        by_shard.setdefault(r.shard_id, []).append(int(r.sequence_number))
    assert all(s == sorted(s) for s in by_shard.values()), "a shard's records arrive in order"
    shards = sub.stats()["shards"]
    assert all(s.get("retrieval") == "fanout" and s["subscriptions"] >= 1 and s["get_records_calls"] == 0
               for s in shards.values()), shards
    sub.close()
    (consumer,) = consumers(kinesis_mock, stream)
    assert consumer["ConsumerName"] == f"app-{unique}" and consumer["ConsumerStatus"] == "ACTIVE", \
        "close() never deregisters the stream consumer"
    assert conn.deregister_stream_consumer(stream, f"app-{unique}")
    wait_until(lambda: not consumers(kinesis_mock, stream), timeout_s=10, what="the consumer deregistered")


def test_latest_delivers_only_what_is_published_after_subscribe(
        make_broker: Callable[..., KinesisBroker], kinesis_mock: str, unique: str) -> None:
    stream = f"efo-latest-{unique}"
    create_stream(kinesis_mock, stream, 2)
    conn = make_broker()
    old = publish(conn, stream, "old", 10)
    sub = conn.subscribe(fanout(stream, "app"))  # returns once every shard's first SubscribeToShard was accepted
    new = publish(conn, stream, "new", 20)
    got = {r.data for r in drain(sub, 20, timeout_s=30)}
    assert got == set(new) and not got & set(old)
    assert all(lease.start_position.startswith("AT_TIMESTAMP:") for lease in conn.lease_store.list(stream)), \
        "LATEST is pinned at the opening"
    sub.close()


def test_at_timestamp(make_broker: Callable[..., KinesisBroker], kinesis_mock: str, unique: str) -> None:
    stream = f"efo-ts-{unique}"
    create_stream(kinesis_mock, stream, 1)
    conn = make_broker()
    old = publish(conn, stream, "old", 5)
    time.sleep(0.3)  # bounded: arrival timestamps must differ from the cut-off
    cut = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.3)
    new = publish(conn, stream, "new", 5)
    sub = conn.subscribe(fanout(stream, "app", start_at=StartAt.at_timestamp(cut)))
    got = {r.data for r in drain(sub, 5, timeout_s=30)}
    assert got == set(new) and not got & set(old)
    sub.close()


def test_checkpoint_and_restart_resume_after_the_checkpoint(
        make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream, table = f"efo-resume-{unique}", f"leases-{unique}"
    conn = make_broker(table=table, owner_id="a")
    sub = conn.subscribe(fanout(stream, "app", create_if_missing=2, start_at=StartAt.trim_horizon()))
    first = publish(conn, stream, "first", 40)
    assert {r.data for r in drain(sub, 40, timeout_s=30)} == set(first)
    sub.close()
    checkpoints = {lease.shard_id: lease.checkpoint for lease in conn.lease_store.list(stream)}
    assert all(checkpoints.values()), checkpoints
    second = publish(conn, stream, "second", 30)
    conn2 = make_broker(table=table, owner_id="b")
    sub2 = conn2.subscribe(fanout(stream, "app", start_at=StartAt.trim_horizon()))
    got = {r.data for r in drain(sub2, 30, timeout_s=30)}
    assert got == set(second), "resumed after the checkpoints: nothing of the first run again"
    sub2.close()


def test_a_sigkilled_reader_resubscribes_from_the_checkpoint(
        make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"efo-kill-{unique}"
    conn = make_broker(table=f"leases-{unique}", owner_id="k")
    sink = Collector.remote()
    sub = conn.subscribe(fanout(stream, "app", create_if_missing=2, start_at=StartAt.trim_horizon()), sink=sink)
    first = publish(conn, stream, "a", 60)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(first), timeout_s=30, what="the first records")
    pids = sorted(r["pid"] for r in sub.stats()["readers"] if r.get("shards"))
    os.kill(pids[0], signal.SIGKILL)  # a reader process holding a subscription dies at once
    second = publish(conn, stream, "b", 60)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(first) | set(second), timeout_s=45,
               what="every record after the SIGKILL")
    payloads = ray.get(sink.payloads.remote())
    assert len(payloads) - len(set(payloads)) <= 60, "at most the batch in flight is delivered again"
    assert sub.stats()["readers_replaced"] >= 1
    # Every shard's current reader confirmed a subscription. The dead reader's shard is on a new
    # reader, and the other may have been moved since (the respread after a replacement), so each
    # count may have restarted; a count of 0 that stays 0 is what this catches.
    wait_until(lambda: [s["subscriptions"] >= 1 for s in sub.stats()["shards"].values()] == [True, True],
               timeout_s=30, what="a confirmed subscription on both shards")
    sub.close()


def test_two_instances_share_the_lease_table_and_the_consumer(
        make_broker: Callable[..., KinesisBroker], kinesis_mock: str, unique: str) -> None:
    stream, table = f"efo-two-{unique}", f"leases-{unique}"
    create_stream(kinesis_mock, stream, 4)
    a = make_broker(table=table, owner_id="a")
    b = make_broker(table=table, owner_id="b")
    sink = Collector.remote()
    sa = a.subscribe(fanout(stream, "shared-app", start_at=StartAt.trim_horizon()), sink=sink)
    sb = b.subscribe(fanout(stream, "shared-app", start_at=StartAt.trim_horizon()), sink=sink)
    wait_until(lambda: len(sa.leases()) + len(sb.leases()) == 4 and sa.leases() and sb.leases(), timeout_s=30,
               what="both instances holding shards")
    sent = publish(a, stream, "r", 200)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(sent), timeout_s=30, what="every record")
    shards = {lease.shard_id for lease in a.lease_store.list(stream)}
    assert {s for s, _ in ray.get(sink.acked_batches.remote())} == shards
    (consumer,) = consumers(kinesis_mock, stream)
    assert consumer["ConsumerName"] == "shared-app"
    sa.close()
    sb.close()


@ray.remote(num_cpus=0)
class SlowSink:
    """Holds each batch 0.3 s, remembering every payload."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def process_batch(self, records: list[Any]) -> None:
        time.sleep(0.3)
        self.seen.extend(r.data for r in records)

    def payloads(self) -> list[bytes]:
        return list(self.seen)


def test_a_slow_sink_keeps_memory_within_the_budget_and_loses_nothing(
        make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"efo-slow-{unique}"
    conn = make_broker(table=f"leases-{unique}")
    sink = SlowSink.remote()
    budget = 256 * 1024
    sub = conn.subscribe(fanout(stream, "app", create_if_missing=2, start_at=StartAt.trim_horizon(),
                                max_buffered_bytes=budget, max_shards_per_reader=2), sink=sink)
    sent: list[bytes] = []
    for i in range(6):  # 6 x 100 records of 4 KiB while the sink holds batches
        sent += publish(conn, stream, f"w{i}", 100, size=4096)
    wait_until(lambda: set(ray.get(sink.payloads.remote())) >= set(sent), timeout_s=50, what="every record")
    readers = sub.stats()["readers"]
    peak = max(r["peak_buffered_bytes"] for r in readers)
    assert 0 < peak <= budget + FANOUT_EVENT_RESERVE_BYTES, peak
    sub.close()


def test_the_efo_emulator_serves_kinesis_on_kinesis_mock_and_dynamodb_on_moto(kinesis_mock: str, unique: str) -> None:
    from kinesis_actors.emulator import Emulator

    with Emulator(efo=True) as emu:
        assert emu.endpoint != emu.dynamodb_endpoint
        assert emu.endpoint.startswith("http://127.0.0.1:") and emu.dynamodb_endpoint.startswith("http://127.0.0.1:")
        client = kinesis_client(emu.endpoint)
        client.create_stream(StreamName=f"e-{unique}", ShardCount=1)
        store = DynamoLeaseStore(f"t-{unique}", create_if_missing=True, endpoint=emu.dynamodb_endpoint,
                                 region="us-east-1", test_credentials=True)
        assert store.list(f"e-{unique}") == []
        pid = emu.kinesis_mock.pid if emu.kinesis_mock else None
        assert pid is not None
    assert emu.kinesis_mock is not None and emu.kinesis_mock.pid is None, "stopped with the emulator"


def test_cli_emulator_efo_prints_both_endpoints(kinesis_mock: str) -> None:
    import subprocess
    import sys

    # started with SIGINT ignored and blocked (as by `cmd &` in a script): "Ctrl-C stops them" all the same
    proc = subprocess.Popen(as_background_job([sys.executable, "-m", "kinesis_actors.cli", "emulator", "--efo",
                                               "--port", "0"]),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        kinesis, dynamodb = proc.stdout.readline().strip(), proc.stdout.readline().strip()
        assert kinesis.startswith("http://127.0.0.1:") and dynamodb.startswith("http://127.0.0.1:")
        assert kinesis_client(kinesis).list_streams()["StreamNames"] is not None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_http_subscriber_on_kinesis_mock_events_refusals_and_close(kinesis_mock: str, unique: str) -> None:
    from botocore.exceptions import ClientError

    from kinesis_actors.fanout import HttpSubscriber, ensure_stream_consumer, parse_event_payload

    stream = f"efo-http-{unique}"
    create_stream(kinesis_mock, stream, 1)
    k = kinesis_client(kinesis_mock)
    arn = ensure_stream_consumer(k, stream, "probe")
    assert ensure_stream_consumer(k, stream, "probe") == arn, "an existing consumer is reused"
    k.put_record(StreamName=stream, Data=b"hello", PartitionKey="a")
    subscribe = HttpSubscriber(k)
    params = {"ConsumerARN": arn, "ShardId": "shardId-000000000000", "StartingPosition": {"Type": "TRIM_HORIZON"}}
    source = subscribe(params)
    (first,) = first_frames(source, 1)
    event = parse_event_payload(first.payload)
    assert [r.data for r in event.records] == [b"hello"] and event.continuation_sequence_number
    second = subscribe(params)  # while the first is open: HTTP 200, then a refusal as the first frame
    (refusal,) = first_frames(second, 1)
    assert refusal.headers[":message-type"] == "exception"
    assert refusal.headers[":exception-type"] == "ResourceInUseException"
    second.close()
    source.close()
    try:  # a consumer that does not exist: refused with the HTTP status (AWS) or in the first frame (kinesis-mock)
        third = subscribe({**params, "ConsumerARN": arn.replace("/consumer/probe:", "/consumer/nobody:")})
        (frame,) = first_frames(third, 1)
        third.close()
        code = frame.headers.get(":exception-type")
    except ClientError as e:
        code = e.response["Error"]["Code"]
    assert code == "ResourceNotFoundException"


def first_frames(source: Any, n: int) -> list[Any]:
    from botocore.eventstream import EventStreamBuffer

    buffer, frames = EventStreamBuffer(), []
    while len(frames) < n:
        buffer.add_data(source.read())
        frames.extend(buffer)
    return frames[:n]
