"""Shared pieces of the kinesalite and fault-layer tests: brokers with Kinesis on one
emulator and the lease table on moto's DynamoDB, resharding helpers, an ordered sink."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray

from kinesis_actors.broker import KinesisBroker
from kinesis_actors.leases.dynamodb import DynamoLeaseStore
from kinesis_actors.testing import FaultInjector

from .helpers import kinesis_client, wait_until

FAST = dict(lease_duration_s=2.0, renew_interval_s=0.5)
POLL = dict(shard_sync_interval_s=0.5, lease_poll_interval_s=0.3)
PARENT = "shardId-000000000000"


def lease_store(dynamodb_url: str, table: str) -> DynamoLeaseStore:
    """A lease store pinned to moto's DynamoDB (a broker never overwrites an explicit endpoint)."""
    return DynamoLeaseStore(table, create_if_missing=True, endpoint=dynamodb_url, region="us-east-1",
                            test_credentials=True)


def list_shards_calls_since(injector: FaultInjector, since: float) -> int:
    """How many ListShards calls the injector logged (from any process) since ``since`` (epoch s)."""
    return len(injector.calls("ListShards", since=since))


def broker_factory(kinesis_url: str, dynamodb_url: str, table: str,
                   prepare: Callable[[KinesisBroker], KinesisBroker] | None = None) -> Iterator[Callable[..., KinesisBroker]]:
    """Yield ``make(**kwargs)``: connected brokers (Kinesis at ``kinesis_url``, leases in
    ``table`` on ``dynamodb_url``), all shut down afterwards."""
    brokers: list[KinesisBroker] = []

    def make(**kwargs: Any) -> KinesisBroker:
        options = {"endpoint": kinesis_url, "region": "us-east-1", "test_credentials": True,
                   "lease_store": lease_store(dynamodb_url, table), **FAST, **kwargs}
        broker = KinesisBroker(**options)
        if prepare is not None:
            broker = prepare(broker)
        brokers.append(broker.connect())
        return broker

    yield make
    for broker in brokers:
        try:
            broker.shutdown()
        except Exception:  # a test that failed its subscription already reported it
            pass


def create_stream(url: str, name: str, shards: int) -> None:
    client = kinesis_client(url)
    client.create_stream(StreamName=name, ShardCount=shards)
    wait_active(url, name)


def wait_active(url: str, name: str) -> None:
    client = kinesis_client(url)
    wait_until(lambda: client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"]
               == "ACTIVE", timeout_s=10, what=f"stream {name} ACTIVE")


def split(url: str, stream: str, shard_id: str = PARENT) -> None:
    """SplitShard at the middle of the shard's hash key range; waits until ACTIVE."""
    client = kinesis_client(url)
    shard = next(s for s in client.list_shards(StreamName=stream)["Shards"] if s["ShardId"] == shard_id)
    lo, hi = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
    client.split_shard(StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str((lo + hi) // 2 + 1))
    wait_active(url, stream)


def merge(url: str, stream: str, shard_id: str, adjacent: str) -> None:
    client = kinesis_client(url)
    client.merge_shards(StreamName=stream, ShardToMerge=shard_id, AdjacentShardToMerge=adjacent)
    wait_active(url, stream)


def publish(broker: KinesisBroker, stream: str, phase: str, n: int, keys: int = 8) -> list[bytes]:
    """``n`` records ``b"<phase>-<key>-<i>"`` over ``keys`` partition keys, in one call."""
    payloads = [f"{phase}-k{i % keys}-{i}".encode() for i in range(n)]
    broker.publisher(stream).put_many([(p, f"k{i % keys}") for i, p in enumerate(payloads)])
    return payloads


@ray.remote(num_cpus=0, max_concurrency=8)
class OrderedSink:
    """A push sink that logs every acknowledged record in acknowledgement order.

    ``delay_s`` per batch (a slow downstream); calls after the ``fail_after``-th raise (a
    downstream that stopped acknowledging: nothing more is checkpointed); ``gated``: every
    batch waits until :meth:`open_gate` (threaded actor: batches of several shards wait
    side by side, then are acknowledged in the order they are let through).
    """

    def __init__(self, delay_s: float = 0.0, fail_after: int | None = None, gated: bool = False) -> None:
        self.log: list[tuple[str, str, int | None, bytes]] = []
        self.batches: list[tuple[str, str, int | None]] = []
        self.calls = 0
        self.delay_s = delay_s
        self.fail_after = fail_after
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.lock = threading.Lock()

    def process_batch(self, records: list[Any]) -> None:
        with self.lock:
            self.calls += 1
            call = self.calls
        if self.fail_after is not None and call > self.fail_after:
            raise RuntimeError(f"sink stopped acknowledging (call {call})")
        if not self.gate.wait(timeout=60):
            raise RuntimeError("the gate was never opened")
        with self.lock:  # one batch at a time past the gate: a total acknowledgement order
            if self.delay_s:
                time.sleep(self.delay_s)
            self.log.extend((r.shard_id, r.sequence_number, r.sub_sequence_number, r.data) for r in records)
            last = records[-1]
            self.batches.append((last.shard_id, last.sequence_number, last.sub_sequence_number))

    def open_gate(self) -> None:
        self.gate.set()

    def records(self) -> list[tuple[str, str, int | None, bytes]]:
        with self.lock:
            return list(self.log)

    def acked_batches(self) -> list[tuple[str, str, int | None]]:
        with self.lock:
            return list(self.batches)

    def payloads(self) -> list[bytes]:
        return [d for *_, d in self.records()]


def delivered(sink: Any) -> list[tuple[str, str, int | None, bytes]]:
    return ray.get(sink.records.remote())


def wait_delivered(sink: Any, expected: set[bytes], *, timeout_s: float, what: str = "every record") -> list[Any]:
    """Wait until the sink acknowledged every payload of ``expected``; returns its log."""
    return wait_until(lambda: (log := delivered(sink)) and {d for *_, d in log} >= expected and log,
                      timeout_s=timeout_s, what=what)

