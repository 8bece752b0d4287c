"""ShardConsumer (one lease's read loop) without Ray or network: an in-process lease store and a fake shard.

Every reader here runs on a :class:`FakeClock` (its clock and its sleep) with its blocking
calls made inline (:class:`InlineIo`): time passes only when a test drives the clock, and
every bound is a bound on that clock, never on the wall clock."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from kinesis_actors import SHARD_END, SinkError, StartAt
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.reader.tasks import LATEST_CLOCK_MARGIN_S
from kinesis_actors.testing import FakeClock, FakeShard, FlakyLeaseStore, InlineIo, InProcessLeaseStore, kpl_aggregate

STREAM, SHARD = "s", "shardId-000000000000"
T = TypeVar("T")
_CLOCKS: weakref.WeakKeyDictionary[ShardConsumer, FakeClock] = weakref.WeakKeyDictionary()


def consumer(spec: ReaderSpec, lease: Any, store: Any, deliver: Any, shard: Any, clock: FakeClock,
             **kwargs: Any) -> ShardConsumer:
    """A ShardConsumer on ``clock`` (its clock and sleep), its blocking calls inline;
    ``kwargs`` go to ShardConsumer (e.g. ``rng``)."""
    if isinstance(shard, FakeShard):
        shard.clock = clock  # GetRecords call times on the reader's clock
    reader = ShardConsumer(spec, lease, store, deliver, shard, clock=clock, sleep=clock.sleep,
                           io=InlineIo(clock), **kwargs)  # type: ignore[arg-type]
    _CLOCKS[reader] = clock
    return reader


def make_reader(shard: FakeShard, store: InProcessLeaseStore, deliver: Any, *, start_at: StartAt | None = None,
                max_records: int = 100, lease_duration_s: float = 2.0, max_sink_retries: int = 2,
                dead_letter: Any = None, clock: FakeClock | None = None,
                min_checkpoint_interval_s: float | None = None) -> ShardConsumer:
    lease = store.take(STREAM, SHARD, owner="me", duration_s=lease_duration_s)
    assert lease is not None
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=start_at or StartAt.trim_horizon(),
                      lease_duration_s=lease_duration_s, renew_interval_s=0.2, max_records=max_records,
                      idle_wait_s=0.01, max_sink_retries=max_sink_retries, dead_letter=dead_letter,
                      min_checkpoint_interval_s=min_checkpoint_interval_s)
    return consumer(spec, lease, store, deliver, shard, clock or FakeClock())


class Recorder:
    def __init__(self, fail_first: int = 0, always: bool = False) -> None:
        self.batches: list[list[Any]] = []
        self.calls = 0
        self.fail_first, self.always = fail_first, always

    async def __call__(self, records: list[Any]) -> None:
        self.calls += 1
        if self.always or self.calls <= self.fail_first:
            raise RuntimeError(f"fail {self.calls}")
        self.batches.append(records)

    @property
    def seqs(self) -> list[int]:
        return [int(r.sequence_number) for b in self.batches for r in b]


def clock_of(reader: ShardConsumer) -> FakeClock:
    """The fake clock ``reader`` runs on."""
    return _CLOCKS[reader]


async def until(clock: FakeClock, cond: Callable[[], Any], within_s: float = 5.0, what: str = "condition") -> None:
    """Drive ``clock`` in 10 ms steps until ``cond()``; AssertionError after ``within_s`` of fake time."""
    await clock.until(cond, within_s=within_s, what=what)


async def finish(clock: FakeClock, work: Awaitable[T], within_s: float = 5.0) -> T:
    """Drive ``clock`` until ``work`` is done (within ``within_s`` of fake time); its result."""
    result: T = await clock.finish(work, within_s=within_s)
    return result


async def run_until(reader: ShardConsumer, cond: Any, timeout_s: float = 5.0) -> str:
    clock = clock_of(reader)
    await finish(clock, reader.open())
    task = asyncio.create_task(reader.run())
    await until(clock, lambda: cond() or task.done(), timeout_s, "the condition")
    if not task.done():
        await finish(clock, reader.stop())
    return await finish(clock, task)


def test_delivers_in_order_and_checkpoints_after_ack() -> None:
    shard, store, sink = FakeShard(250), InProcessLeaseStore(), Recorder()
    reader = make_reader(shard, store, sink, max_records=100)
    outcome = asyncio.run(run_until(reader, lambda: len(sink.seqs) == 250))
    assert outcome == ConsumerState.CLOSED
    assert sink.seqs == list(range(1, 251))
    row = store.get(STREAM, SHARD)
    assert row.checkpoint == "250" and row.owner is None  # closed: checkpointed and released


def test_shard_end_writes_shard_end_after_last_ack_and_releases() -> None:
    shard, store, sink = FakeShard(30, closed=True), InProcessLeaseStore(), Recorder()
    outcome = asyncio.run(run_until(make_reader(shard, store, sink), lambda: False))
    assert outcome == ConsumerState.SHARD_ENDED
    assert sink.seqs == list(range(1, 31))
    row = store.get(STREAM, SHARD)
    assert row.checkpoint == SHARD_END and row.owner is None


def test_a_failed_release_after_shard_end_leaves_the_row_to_expire_and_the_loop_ends_shard_ended() -> None:
    """Found by the simulator: the release after ``SHARD_END`` lost its response (the write
    landed); that error failed the read loop, and with it the whole subscription."""
    shard, rows, sink = FakeShard(30, closed=True), InProcessLeaseStore(), Recorder()
    store = FlakyLeaseStore(rows, "release", nth=1, when="after")  # written, the response lost
    outcome = asyncio.run(run_until(make_reader(shard, store, sink), lambda: False))  # type: ignore[arg-type]
    assert outcome == ConsumerState.SHARD_ENDED and store.failures == 1
    assert rows.get(STREAM, SHARD).checkpoint == SHARD_END


def test_sink_failures_are_retried_and_never_checkpointed_past() -> None:
    shard, store = FakeShard(10), InProcessLeaseStore()
    sink = Recorder(fail_first=2)
    checkpoints: list[str | None] = []
    original = store.checkpoint

    def spy(lease: Any, seq: str, **kw: Any) -> Any:
        assert sink.batches and int(seq) <= sink.seqs[-1], "checkpoint only after the batch was acknowledged"
        checkpoints.append(seq)
        return original(lease, seq, **kw)

    store.checkpoint = spy  # type: ignore[method-assign]
    asyncio.run(run_until(make_reader(shard, store, sink), lambda: len(sink.seqs) == 10))
    assert sink.calls == 3 and sink.seqs == list(range(1, 11)) and checkpoints == ["10"]


def test_sink_that_always_fails_raises_sink_error_without_checkpoint() -> None:
    shard, store = FakeShard(5), InProcessLeaseStore()
    reader = make_reader(shard, store, Recorder(always=True), max_sink_retries=2)
    with pytest.raises(SinkError, match="3 times"):
        asyncio.run(run_until(reader, lambda: False))
    assert store.get(STREAM, SHARD).checkpoint is None


def test_dead_letter_receives_one_document_per_refused_record_then_it_is_acknowledged() -> None:
    class DeadLetter:
        def __init__(self) -> None:
            self.items: list[tuple[bytes, str]] = []

        def put_many(self, items: list[tuple[bytes, str]]) -> list[Any]:
            self.items.extend(items)
            return []

    shard, store, dlq = FakeShard(5), InProcessLeaseStore(), DeadLetter()
    reader = make_reader(shard, store, Recorder(always=True), max_sink_retries=1, dead_letter=dlq)
    asyncio.run(run_until(reader, lambda: len(dlq.items) == 5))
    docs = [json.loads(d) for d, _ in dlq.items]
    assert [base64.b64decode(d["data"]) for d in docs] == [f"r{i}".encode() for i in range(1, 6)]
    assert [d["sequence_number"] for d in docs] == ["1", "2", "3", "4", "5"]
    assert all(d["reason"] == "sink" and d["attempts"] == 2 and d["error"] == "RuntimeError: fail 2" for d in docs)
    assert {key for _, key in dlq.items} == {SHARD}  # keyed by the shard id
    assert store.get(STREAM, SHARD).checkpoint == "5"


def test_lost_lease_stops_the_reader_and_it_writes_nothing_more() -> None:
    shard, store = FakeShard(5), InProcessLeaseStore()
    sink = Recorder()
    reader = make_reader(shard, store, sink, min_checkpoint_interval_s=0.0)  # one checkpoint per batch

    clock = clock_of(reader)

    async def scenario() -> str:
        await finish(clock, reader.open())
        task = asyncio.create_task(reader.run())
        await until(clock, lambda: len(sink.seqs) >= 5, what="5 records")
        # another owner takes the row (as after an expiry elsewhere)
        thief = store.peer()
        row = thief.get(STREAM, SHARD)
        stolen = thief.rows.update(row.key, row.owner, row.counter, {"lease_owner": "thief", "lease_counter": row.counter + 1})
        assert stolen is not None
        shard.add(5)
        return await finish(clock, task, 3.0)

    assert asyncio.run(scenario()) == ConsumerState.LOST
    row = store.get(STREAM, SHARD)
    assert row.owner == "thief" and row.checkpoint == "5"


def test_expired_iterator_reopens_after_the_last_acknowledged_record() -> None:
    shard, store, sink = FakeShard(10), InProcessLeaseStore(), Recorder()
    reader = make_reader(shard, store, sink, max_records=5)

    clock = clock_of(reader)

    async def scenario() -> None:
        await finish(clock, reader.open())
        task = asyncio.create_task(reader.run())
        await until(clock, lambda: len(sink.seqs) >= 10, what="10 records")
        shard.faults += ["ExpiredIteratorException", "ExpiredIteratorException"]
        shard.add(5)
        await until(clock, lambda: len(sink.seqs) >= 15, what="15 records")
        await finish(clock, reader.stop())
        await finish(clock, task)

    asyncio.run(scenario())
    assert sink.seqs == list(range(1, 16)), "nothing skipped, nothing repeated"
    reopen = shard.iterator_requests[-1]
    assert reopen == {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": "10"}
    assert reader.stats["expired_iterators"] == 2


def test_throttling_backs_off_and_never_exceeds_five_calls_per_second() -> None:
    shard, store, sink = FakeShard(3), InProcessLeaseStore(), Recorder()
    shard.faults += ["ProvisionedThroughputExceededException"] * 3
    reader = make_reader(shard, store, sink)
    asyncio.run(run_until(reader, lambda: len(sink.seqs) == 3, timeout_s=10))
    gaps = [b - a for a, b in zip(shard.calls, shard.calls[1:])]
    assert gaps[0] >= 0.2, "first wait after a throttle is at least 200 ms"
    assert all(g >= 0.19 for g in gaps), "never more than 5 GetRecords per second"
    assert reader.stats["throttles"] == 3 and store.get(STREAM, SHARD).owner is None  # kept, then released at stop


def test_latest_is_recorded_once_as_a_timestamp() -> None:
    shard, store, sink = FakeShard(3), InProcessLeaseStore(), Recorder()
    before = int(time.time() * 1000)
    reader = make_reader(shard, store, sink, start_at=StartAt.latest())
    asyncio.run(reader.open())
    recorded = StartAt.parse(store.get(STREAM, SHARD).start_position)
    margin_ms = int(LATEST_CLOCK_MARGIN_S * 1000)  # recorded earlier by the margin for clock skew against AWS
    assert recorded.kind == "AT_TIMESTAMP"
    assert before - margin_ms <= recorded.timestamp_ms <= int(time.time() * 1000) - margin_ms
    assert shard.iterator_requests[0]["ShardIteratorType"] == "LATEST"


def test_resume_inside_a_kpl_aggregate_after_a_partial_ack() -> None:
    _, _, blob = kpl_aggregate([(f"pk{i}", f"user-{i}".encode()) for i in range(6)])
    shard, store = FakeShard(), InProcessLeaseStore()
    shard.add(1, data=blob)
    first = Recorder()

    async def ack_once_then_hang(records: list[Any]) -> None:
        if first.batches:
            await asyncio.Event().wait()  # the second batch is never acknowledged
        await first(records)

    reader = make_reader(shard, store, ack_once_then_hang, max_records=4)

    clock = clock_of(reader)

    async def crash_after_first_ack() -> None:
        await finish(clock, reader.open())
        task = asyncio.create_task(reader.run())
        await until(clock, lambda: reader.stats["batches"] >= 1, what="the first batch")
        await finish(clock, reader.stop(release=False, grace_s=0.05))  # like a crash: nothing more acknowledged
        await finish(clock, task)

    asyncio.run(crash_after_first_ack())
    row = store.get(STREAM, SHARD)
    assert (row.checkpoint, row.checkpoint_sub_sequence) == ("1", 3)
    # crash after the first 4 user records were acknowledged: a new reader resumes inside the aggregate
    second = Recorder()
    lease = store.take(STREAM, SHARD, owner="me", duration_s=2.0)  # the owner re-takes its own row
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=2.0, renew_interval_s=0.2, max_records=4, idle_wait_s=0.01)
    reader2 = consumer(spec, lease, store, second, shard, clock)
    asyncio.run(run_until(reader2, lambda: len(second.batches) >= 1))
    assert [r.data for b in second.batches for r in b] == [b"user-4", b"user-5"]
    assert [r.sub_sequence_number for b in second.batches for r in b] == [4, 5]


def test_a_failing_sink_in_long_backoff_keeps_the_lease() -> None:
    # Backoffs 0.1, 0.2, 0.4, 0.8 s: the last is longer than the 0.5 s lease. The loop is alive
    # (handling an error), so it must keep renewing and deliver once the sink recovers.
    shard, store = FakeShard(3), InProcessLeaseStore()
    sink = Recorder(fail_first=4)
    reader = make_reader(shard, store, sink, lease_duration_s=0.5, max_sink_retries=10)
    outcome = asyncio.run(run_until(reader, lambda: len(sink.seqs) == 3, timeout_s=10))
    assert outcome == ConsumerState.CLOSED and sink.seqs == [1, 2, 3]
    assert store.get(STREAM, SHARD).checkpoint == "3"


def test_a_checkpoint_that_fails_transiently_is_retried_not_fatal() -> None:
    # The lease table is briefly unreachable: the checkpoint of an acknowledged batch is
    # retried (a network error is not a lost lease) and reading goes on.
    shard, inner = FakeShard(30), InProcessLeaseStore()
    store = FlakyLeaseStore(inner, "checkpoint", nth=2, times=3)
    sink = Recorder()
    reader = make_reader(shard, store, sink, max_records=10)
    outcome = asyncio.run(run_until(reader, lambda: inner.get(STREAM, SHARD).checkpoint == "30"))
    assert outcome == ConsumerState.CLOSED and store.failures == 3
    assert sink.seqs == list(range(1, 31))


def test_a_checkpoint_failing_past_the_deadline_stops_without_writing() -> None:
    shard, inner = FakeShard(5), InProcessLeaseStore()
    store = FlakyLeaseStore(inner, "checkpoint", nth=1, times=10_000)
    sink = Recorder()
    reader = make_reader(shard, store, sink, lease_duration_s=0.6)
    outcome = asyncio.run(run_until(reader, lambda: False, timeout_s=5))
    assert outcome == ConsumerState.LOST
    assert sink.seqs == [1, 2, 3, 4, 5]  # delivered once, never checkpointed: the next owner re-delivers
    row = inner.get(STREAM, SHARD)
    assert row.checkpoint is None and row.owner == "me"  # stopped without writing (not even a release)


def test_a_reader_resumed_after_a_pause_delivers_nothing_once_fenced() -> None:
    # A zombie: the process is paused (SIGSTOP) between GetRecords and delivery for longer
    # than the lease; another owner takes the shard meanwhile. On resuming, the reader must
    # not hand the batch it holds downstream.
    clock = FakeClock()
    shard, store, sink = FakeShard(3), InProcessLeaseStore(clock=clock), Recorder()
    reader = make_reader(shard, store, sink, lease_duration_s=1.0, clock=clock, min_checkpoint_interval_s=0.0)
    get_records = shard.get_records

    def paused_get_records(**kw: Any) -> dict[str, Any]:
        out = get_records(**kw)
        if out["Records"] and int(out["Records"][0]["SequenceNumber"]) > 3:  # the batch after the first
            thief = store.peer()
            row = thief.get(STREAM, SHARD)
            assert thief.rows.update(row.key, row.owner, row.counter,
                                 {"lease_owner": "thief", "lease_counter": row.counter + 1}) is not None
            clock.advance(5.0)  # the pause: five lease durations pass at once
        return out

    shard.get_records = paused_get_records  # type: ignore[method-assign]

    async def scenario() -> str:
        await finish(clock, reader.open())
        task = asyncio.create_task(reader.run())
        await until(clock, lambda: len(sink.seqs) >= 3, what="3 records")
        shard.add(3)
        return await finish(clock, task, 3.0)

    assert asyncio.run(scenario()) == ConsumerState.LOST
    assert sink.seqs == [1, 2, 3]
    row = store.get(STREAM, SHARD)
    assert row.owner == "thief" and row.checkpoint == "3"


def test_lease_validity_counts_from_when_a_write_was_sent() -> None:
    # The process is paused right after sending a renewal; the store applies it, the answer
    # is read after the pause. The lease must be judged from the send time, so it is in doubt.
    clock = FakeClock()
    inner = InProcessLeaseStore(clock=clock)

    class PausedAfterSend:
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def renew(self, lease: Any, **kw: Any) -> Any:
            out = inner.renew(lease, **kw)
            clock.advance(5.0)  # the pause
            return out

    shard, sink = FakeShard(1), Recorder()
    reader = make_reader(shard, PausedAfterSend(), sink, lease_duration_s=1.0,  # type: ignore[arg-type]
                         clock=clock)
    asyncio.run(reader.keeper.renew())
    assert reader.keeper.in_doubt()
