"""Delivery controls end to end: real Coordinator/ShardReader actors, the emulator over HTTP."""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import ray

from kinesis_actors import (
    DynamoLeaseStore,
    InvalidError,
    KinesisBroker,
    KinesisStream,
    PartialBatchError,
    StartAt,
)

from .helpers import create_stream, kinesis_client, wait_until
from .test_consume import make_broker  # noqa: F401  (the fixture: connected brokers with short lease timings)

pytestmark = pytest.mark.usefixtures("ray_session")

POLL = dict(shard_sync_interval_s=1.0, lease_poll_interval_s=0.3, idle_wait_s=0.05, max_idle_wait_s=0.2)


@ray.remote(num_cpus=0, max_concurrency=32)
class Sink:
    """A push sink: refuses records whose payload starts with ``poison``; acknowledges half of
    each batch's first call (``partial``); sleeps ``delay_s`` per call; counts calls in flight."""

    def __init__(self, *, partial: bool = False, delay_s: float = 0.0) -> None:
        self.acked: list[tuple[str, str, bytes, str]] = []  # shard, seq, data, key
        self.batches: list[int] = []
        self.calls = 0
        self.partial = partial
        self.delay_s = delay_s
        self.seen_first: set[str] = set()
        self.in_flight = 0
        self.max_in_flight = 0

    async def process_batch(self, records: Any) -> None:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            bad = [i for i, r in enumerate(records) if r.data.startswith(b"poison")]
            first = records[0].sequence_number
            if self.partial and len(records) > 1 and first not in self.seen_first:
                self.seen_first.add(first)
                half = len(records) // 2
                self._ack(records[:half])
                raise PartialBatchError(failed_from=half)
            if bad:
                self._ack(records[:bad[0]])
                raise PartialBatchError(f"poison at {bad[0]}", failed_from=bad[0]) if bad[0] else ValueError("poison")
            self._ack(records)
        finally:
            self.in_flight -= 1

    def _ack(self, records: Any) -> None:
        self.acked.extend((r.shard_id, r.sequence_number, r.data, r.partition_key) for r in records)
        if records:
            self.batches.append(len(records))

    def state(self) -> dict[str, Any]:
        return {"acked": list(self.acked), "batches": list(self.batches), "calls": self.calls,
                "max_in_flight": self.max_in_flight}


def read_all(endpoint: str, stream: str) -> list[dict[str, Any]]:
    """Every record of a one-shard stream from TRIM_HORIZON, as JSON documents."""
    client = kinesis_client(endpoint)
    shard = client.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    it = client.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    docs: list[dict[str, Any]] = []
    for _ in range(50):
        out = client.get_records(ShardIterator=it, Limit=10_000)
        docs.extend(json.loads(r["Data"]) for r in out["Records"])
        if not out["Records"]:
            break
        it = out["NextShardIterator"]
    return docs


def state(sink: Any) -> dict[str, Any]:
    return ray.get(sink.state.remote())


def test_a_poison_record_in_1000_is_dead_lettered_alone_and_the_rest_delivered(
        make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str) -> None:
    stream, dlq = f"poison-{unique}", f"poison-dlq-{unique}"
    create_stream(endpoint, dlq, 1)
    conn = make_broker()
    sink = Sink.remote()
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(), bisect_on_error=True,
                                       max_sink_retries=1, max_batch_records=100, dead_letter=conn.publisher(dlq),
                                       **POLL), sink=sink)
    items = [(b"poison" if i == 617 else b"ok-%d" % i, f"key-{i % 7}") for i in range(1000)]
    results = conn.publisher(stream).put_many(items)
    wait_until(lambda: len({d for _, _, d, _ in state(sink)["acked"]}) >= 999, timeout_s=60, what="999 delivered")
    wait_until(lambda: read_all(endpoint, dlq), timeout_s=20, what="the dead letter")
    docs = read_all(endpoint, dlq)
    assert len(docs) == 1 and docs[0]["sequence_number"] == results[617].sequence_number
    assert base64.b64decode(docs[0]["data"]) == b"poison" and docs[0]["reason"] == "sink"
    assert docs[0]["error"].startswith(("ValueError", "PartialBatchError")) and docs[0]["attempts"] >= 2
    assert {d for _, _, d, _ in state(sink)["acked"]} == {data for data, _ in items if data != b"poison"}
    wait_until(lambda: conn.lease_store.list(stream)[0].checkpoint == results[-1].sequence_number, timeout_s=20,
               what="the checkpoint at the last record")
    sub.close()


def test_a_sink_that_acknowledges_half_a_batch_gets_only_the_rest_again(
        make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"half-{unique}"
    conn = make_broker()
    sink = Sink.remote(partial=True)
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(),
                                       max_batch_records=20, **POLL), sink=sink)
    sent = conn.publisher(stream).put_many([(b"h-%d" % i, "k") for i in range(200)])
    wait_until(lambda: len(state(sink)["acked"]) >= 200, timeout_s=60, what="200 acknowledged")
    acked = state(sink)["acked"]
    assert [seq for _, seq, _, _ in acked] == [r.sequence_number for r in sent]  # each once, in order
    wait_until(lambda: conn.lease_store.list(stream)[0].checkpoint == sent[-1].sequence_number, timeout_s=20)
    sub.close()


def test_old_records_go_to_the_dead_letters_and_fresh_ones_to_the_sink(
        make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str) -> None:
    stream, dlq = f"old-{unique}", f"old-dlq-{unique}"
    create_stream(endpoint, dlq, 1)
    create_stream(endpoint, stream, 1)
    conn = make_broker()
    old = conn.publisher(stream).put_many([(b"old-%d" % i, "k") for i in range(20)])
    time.sleep(3.0)  # let them age past max_record_age_s (what is tested is age, so time must pass)
    sink = Sink.remote()
    sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), max_record_age_s=2.0,
                                       dead_letter=conn.publisher(dlq), **POLL), sink=sink)
    wait_until(lambda: len(read_all(endpoint, dlq)) >= 20, timeout_s=30, what="20 dead letters")
    fresh = conn.publisher(stream).put_many([(b"fresh-%d" % i, "k") for i in range(5)])
    wait_until(lambda: len(state(sink)["acked"]) >= 5, timeout_s=30, what="the fresh records")
    docs = read_all(endpoint, dlq)
    assert [d["sequence_number"] for d in docs] == [r.sequence_number for r in old]
    assert all(d["reason"] == "max_record_age" and d["error"] is None and d["attempts"] == 0 for d in docs)
    assert [seq for _, seq, _, _ in state(sink)["acked"]] == [r.sequence_number for r in fresh]
    sub.close()


def test_a_window_on_a_trickle_gathers_records_into_few_batches(
        make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"window-{unique}"
    conn = make_broker()
    sink = Sink.remote()
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, batch_window_s=1.0, **POLL), sink=sink)
    publisher = conn.publisher(stream)
    sent = []
    for i in range(60):  # a trickle: about 20 records per second
        sent.append(publisher.put(b"t-%d" % i, "k"))
        time.sleep(0.05)
    wait_until(lambda: len(state(sink)["acked"]) >= 60, timeout_s=30, what="the trickle")
    s = state(sink)
    assert [seq for _, seq, _, _ in s["acked"]] == [r.sequence_number for r in sent]
    assert len(s["batches"]) <= 60 / 4, f"a 1 s window should gather a trickle, got batches {s['batches']}"
    sub.close()


def keep_even(record: Any) -> bool:
    return int(record.data.split(b"-")[1]) % 2 == 0


def test_a_filter_survives_a_restart_from_checkpoints(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    table, stream = f"leases-{unique}", f"filter-{unique}"
    conn = make_broker(lease_store=DynamoLeaseStore(table, create_if_missing=True))
    cfg = KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(), record_filter=keep_even, **POLL)
    sink = Sink.remote()
    sub = conn.subscribe(cfg, sink=sink)
    sent = conn.publisher(stream).put_many([(b"f-%d" % i, "k") for i in range(40)] +
                                           [(b"f-%d" % i, "k") for i in (41, 43, 45)])  # ends with rejected records
    wait_until(lambda: conn.lease_store.list(stream)[0].checkpoint == sent[-1].sequence_number, timeout_s=30,
               what="the checkpoint past the filtered tail")
    assert sorted(d for _, _, d, _ in state(sink)["acked"]) == sorted(b"f-%d" % i for i in range(0, 40, 2))
    stats = sub.stats()["shards"]["shardId-000000000000"]
    assert stats.get("filtered") == 23
    sub.close()
    conn2 = make_broker(lease_store=DynamoLeaseStore(table, create_if_missing=True))
    sink2 = Sink.remote()
    sub2 = conn2.subscribe(cfg, sink=sink2)
    more = conn2.publisher(stream).put_many([(b"f-%d" % i, "k") for i in range(100, 104)])
    wait_until(lambda: len(state(sink2)["acked"]) >= 2, timeout_s=30, what="the new even records")
    wait_until(lambda: conn2.lease_store.list(stream)[0].checkpoint == more[-1].sequence_number, timeout_s=20)
    assert sorted(d for _, _, d, _ in state(sink2)["acked"]) == [b"f-100", b"f-102"]  # nothing old again
    sub2.close()


def test_parallelization_factor_4_with_a_slow_sink_keeps_key_order(
        make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"par-{unique}"
    conn = make_broker()
    sink = Sink.remote(delay_s=0.2)
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(),
                                       parallelization_factor=4, max_batch_records=10, **POLL), sink=sink)
    sent = conn.publisher(stream).put_many([(b"p-%d" % i, f"key-{i % 32}") for i in range(400)])
    wait_until(lambda: len(state(sink)["acked"]) >= 400, timeout_s=90, what="400 acknowledged")
    s = state(sink)
    assert 2 <= s["max_in_flight"] <= 4  # batches of one shard overlapped, never more than 4
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for _, seq, _, key in s["acked"]:
        by_key[key].append(int(seq))
    assert all(seqs == sorted(seqs) for seqs in by_key.values())
    assert sorted(int(seq) for _, seq, _, _ in s["acked"]) == sorted(int(r.sequence_number) for r in sent)
    wait_until(lambda: conn.lease_store.list(stream)[0].checkpoint == sent[-1].sequence_number, timeout_s=20)
    sub.close()


def test_pull_mode_ack_upto_returns_the_rest_first(make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream = f"pull-{unique}"
    conn = make_broker()
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(), **POLL))
    sent = conn.publisher(stream).put_many([(b"u-%d" % i, "k") for i in range(10)])
    batch = wait_until(lambda: sub.next_batch(timeout_s=0.5), timeout_s=30, what="a batch")
    n = len(batch)
    sub.ack(upto=n // 2)
    wait_until(lambda: conn.lease_store.list(stream)[0].checkpoint == batch[n // 2 - 1].sequence_number,
               timeout_s=20, what="the checkpoint after the acknowledged half")
    rest = sub.next_batch(timeout_s=10)
    assert [r.sequence_number for r in rest][: n - n // 2] == [r.sequence_number for r in batch[n // 2:]]
    assert [r.sequence_number for r in batch] == [r.sequence_number for r in sent[:n]]
    sub.close()


def test_pull_mode_refuses_bisect_and_unserialisable_filters(make_broker: Callable[..., KinesisBroker],
                                                             unique: str) -> None:
    conn = make_broker()
    with pytest.raises(InvalidError, match="push sink"):
        conn.subscribe(KinesisStream(f"x-{unique}", bisect_on_error=True))
    lock = threading.Lock()
    with pytest.raises(InvalidError, match="cannot be serialised"):
        conn.subscribe(KinesisStream(f"x-{unique}", record_filter=lambda r: lock.locked()), sink=Sink.remote())
