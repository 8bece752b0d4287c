"""``min_checkpoint_interval_s``: at most one checkpoint write per interval per shard, and always one on
close, on handoff and at SHARD_END (no Ray: an in-process lease store and a fake shard, on a FakeClock
with the reader's calls inline; the interval is measured on that clock)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kinesis_actors import SHARD_END, InvalidError, KinesisStream, StartAt
from kinesis_actors.leases.protocol import Lease
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.testing import FakeClock, FakeShard, InProcessLeaseStore

from .test_reader_core import SHARD, STREAM, Recorder, clock_of, finish, until
from .test_reader_core import consumer as on_clock

WAIT_S = 60.0  # a deadline on the fake clock


class CountingStore(InProcessLeaseStore):
    """Counts checkpoint writes (each one a conditional ``UpdateItem`` on DynamoDB)."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        super().__init__(clock=self.clock)
        self.checkpoints: list[str] = []
        self.written_at: list[float] = []

    def checkpoint(self, lease: Lease, sequence_number: str, *, sub_sequence: int | None = None,
                   throughput_kbps: float | None = None) -> Lease:
        self.checkpoints.append(sequence_number)
        self.written_at.append(self.clock())
        return super().checkpoint(lease, sequence_number, sub_sequence=sub_sequence, throughput_kbps=throughput_kbps)


def consumer(shard: FakeShard, store: InProcessLeaseStore, sink: Any, interval_s: float, *,
             owner: str = "me", max_records: int = 10, clock: FakeClock | None = None) -> ShardConsumer:
    """A consumer on ``clock`` (default: the CountingStore's)."""
    lease = store.take(STREAM, SHARD, owner=owner, duration_s=2.0)
    assert lease is not None
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id=owner, start_at=StartAt.trim_horizon(),
                      lease_duration_s=2.0, renew_interval_s=0.2, max_records=max_records, idle_wait_s=0.01,
                      max_idle_wait_s=0.05, min_checkpoint_interval_s=interval_s)
    if clock is None:
        assert isinstance(store, CountingStore)
        clock = store.clock
    return on_clock(spec, lease, store, sink, shard, clock)


async def read_then_stop(reader: ShardConsumer, sink: Recorder, n: int) -> ConsumerState:
    clock = clock_of(reader)
    await finish(clock, reader.open())
    task = asyncio.create_task(reader.run())
    await until(clock, lambda: len(sink.seqs) >= n or task.done(), WAIT_S, f"{n} records delivered")
    await finish(clock, reader.stop())
    state: ConsumerState = await finish(clock, task)
    return state


def test_default_zero_writes_one_checkpoint_per_acknowledged_batch() -> None:
    shard, store, sink = FakeShard(250), CountingStore(), Recorder()
    reader = consumer(shard, store, sink, 0.0)
    assert asyncio.run(read_then_stop(reader, sink, 250)) == ConsumerState.CLOSED
    assert len(sink.batches) == 25
    assert store.checkpoints == [str(10 * i) for i in range(1, 26)], "one write per batch, none extra on close"
    assert reader.stats["checkpoints_written"] == 25
    assert store.get(STREAM, SHARD).checkpoint == "250"


def test_above_zero_writes_at_most_one_per_interval_and_one_on_close() -> None:
    shard, store, sink = FakeShard(250), CountingStore(), Recorder()
    reader = consumer(shard, store, sink, 60.0)
    assert asyncio.run(read_then_stop(reader, sink, 250)) == ConsumerState.CLOSED
    assert sink.seqs == list(range(1, 251))
    # the first acknowledged batch, then nothing within the interval, then the close
    assert store.checkpoints == ["10", "250"]
    row = store.get(STREAM, SHARD)
    assert row.checkpoint == "250" and row.owner is None, "closed: the last acknowledged record, released"


def test_an_idle_shard_writes_its_pending_checkpoint_once_the_interval_passed() -> None:
    shard, store, sink = FakeShard(30), CountingStore(), Recorder()
    reader = consumer(shard, store, sink, 0.3)

    async def scenario() -> None:
        await finish(store.clock, reader.open())
        task = asyncio.create_task(reader.run())
        await until(store.clock, lambda: len(sink.seqs) == 30, WAIT_S, what="30 records")
        await until(store.clock, lambda: store.get(STREAM, SHARD).checkpoint == "30", WAIT_S, what="the pending checkpoint")
        assert not task.done() and store.get(STREAM, SHARD).owner == "me", "written while still reading"
        await finish(store.clock, reader.stop())
        await finish(store.clock, task)

    asyncio.run(scenario())
    assert store.checkpoints[0] == "10" and store.checkpoints[-1] == "30"
    gaps = [b - a for a, b in zip(store.written_at, store.written_at[1:])]
    assert all(gap >= 0.3 - 0.01 for gap in gaps), f"two checkpoints closer than the interval: {gaps}"


def test_a_lost_lease_redelivers_what_was_acknowledged_since_the_last_checkpoint() -> None:
    """Invariant 10 widened: the next owner resumes at the stored checkpoint, so every record
    acknowledged after it (not only the batch in flight) is delivered again."""
    shard, store = FakeShard(100), CountingStore()
    first_sink, second_sink = Recorder(), Recorder()
    reader = consumer(shard, store, first_sink, 60.0)

    async def scenario() -> None:
        await finish(store.clock, reader.open())
        task = asyncio.create_task(reader.run())
        await until(store.clock, lambda: len(first_sink.seqs) == 100, WAIT_S, what="100 records")
        thief = store.peer()
        row = thief.get(STREAM, SHARD)
        assert thief.rows.update(row.key, row.owner, row.counter, {"lease_owner": "thief",
                                                              "lease_counter": row.counter + 1}) is not None
        assert await finish(store.clock, task, WAIT_S) == ConsumerState.LOST
        await read_then_stop(consumer(shard, thief, second_sink, 0.0, owner="thief", clock=store.clock), second_sink, 90)

    asyncio.run(scenario())
    assert store.get(STREAM, SHARD).checkpoint == "100"
    assert second_sink.seqs == list(range(11, 101)), "resumed after the stored checkpoint (10), not after 100"


def test_a_handoff_checkpoints_the_last_acknowledged_record_first() -> None:
    shard, store, sink = FakeShard(40), CountingStore(), Recorder()
    reader = consumer(shard, store, sink, 60.0)

    async def scenario() -> ConsumerState:
        await finish(store.clock, reader.open())
        task = asyncio.create_task(reader.run())
        await until(store.clock, lambda: len(sink.seqs) == 40, WAIT_S, what="40 records")
        thief = store.peer()
        row = thief.get(STREAM, SHARD)
        assert thief.request_handoff(STREAM, SHARD, owner="thief", expect_counter=row.counter)
        return await finish(store.clock, task, WAIT_S)

    assert asyncio.run(scenario()) == ConsumerState.HANDED_OVER
    row = store.get(STREAM, SHARD)
    assert row.owner == "thief" and row.checkpoint == "40"
    assert store.checkpoints == ["10", "40"]


def test_shard_end_is_written_even_within_the_interval() -> None:
    shard, store, sink = FakeShard(30, closed=True), CountingStore(), Recorder()
    reader = consumer(shard, store, sink, 60.0)

    async def scenario() -> ConsumerState:
        await finish(store.clock, reader.open())
        return await finish(store.clock, reader.run(), WAIT_S)

    assert asyncio.run(scenario()) == ConsumerState.SHARD_ENDED
    assert sink.seqs == list(range(1, 31))
    assert store.checkpoints == ["10", SHARD_END]
    assert store.get(STREAM, SHARD).checkpoint == SHARD_END


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "1", True])
def test_the_interval_is_validated_before_any_aws_call(bad: Any) -> None:
    with pytest.raises(InvalidError, match="min_checkpoint_interval_s"):
        KinesisStream("s", min_checkpoint_interval_s=bad)
    assert KinesisStream("s").min_checkpoint_interval_s is None  # the default: with the renewals
    assert KinesisStream("s", min_checkpoint_interval_s=0).min_checkpoint_interval_s == 0
