"""Graceful handoff in ShardConsumer: finish the batch in flight, checkpoint, hand over (no Ray).

Every consumer runs on a FakeClock with its blocking calls inline; bounds are on fake time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kinesis_actors.reader import ConsumerState, ReaderSpec
from kinesis_actors.records import StartAt
from kinesis_actors.testing import FakeClock

from .test_reader_core import SHARD, STREAM, FakeShard, InProcessLeaseStore, Recorder, clock_of, consumer, finish, make_reader, until


class SlowRecorder(Recorder):
    """Takes ``delay_s`` of fake time per batch, so a handoff request lands while a batch is in flight."""

    def __init__(self, delay_s: float, sleep: Callable[[float], Awaitable[None]]) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.sleep = sleep
        self.in_flight = False

    async def __call__(self, records: list) -> None:
        self.in_flight = True
        try:
            await self.sleep(self.delay_s)
            await super().__call__(records)
        finally:
            self.in_flight = False


def test_handoff_finishes_the_batch_in_flight_and_the_thief_resumes_after_it() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        shard, store = FakeShard(400), InProcessLeaseStore(clock=clock)
        old_sink, new_sink = SlowRecorder(0.15, clock.sleep), Recorder()
        reader = make_reader(shard, store, old_sink, max_records=20, clock=clock)
        await finish(clock, reader.open())
        run = asyncio.create_task(reader.run())
        await until(clock, lambda: len(old_sink.seqs) >= 40 and old_sink.in_flight, what="a batch in flight")
        thief = store.peer()
        row = thief.get(STREAM, SHARD)
        assert thief.request_handoff(STREAM, SHARD, owner="thief", expect_counter=row.counter)
        # seen at the next renewal (0.2 s), after the batch in flight (0.15 s), plus a step
        outcome = await finish(clock, run, within_s=0.2 + 0.15 + 0.5)
        assert outcome == ConsumerState.HANDED_OVER
        handed = store.get(STREAM, SHARD)
        assert handed.owner == "thief" and handed.next_owner is None
        assert handed.checkpoint == str(old_sink.seqs[-1]), "the last delivered batch is checkpointed"
        # The thief's own reader re-takes its row at once and resumes after that checkpoint.
        lease = thief.take(STREAM, SHARD, owner="thief", duration_s=2.0)
        assert lease is not None
        spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="thief", start_at=StartAt.trim_horizon(),
                          lease_duration_s=2.0, renew_interval_s=0.2, max_records=100, idle_wait_s=0.01)
        second = consumer(spec, lease, thief, new_sink, shard, clock)
        await finish(clock, second.open())
        run2 = asyncio.create_task(second.run())
        await until(clock, lambda: len(old_sink.seqs) + len(new_sink.seqs) >= 400, what="all 400 records")
        await finish(clock, second.stop())
        assert await finish(clock, run2) == ConsumerState.CLOSED
        assert old_sink.seqs + new_sink.seqs == list(range(1, 401)), "no duplicate, no gap"

    asyncio.run(scenario())


def test_an_idle_reader_hands_over_within_a_renew_interval() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        shard, store, sink = FakeShard(3), InProcessLeaseStore(clock=clock), Recorder()
        reader = make_reader(shard, store, sink, clock=clock)
        await finish(clock, reader.open())
        run = asyncio.create_task(reader.run())
        await until(clock, lambda: store.get(STREAM, SHARD).checkpoint == "3", what="checkpoint 3")
        row = store.get(STREAM, SHARD)
        assert store.request_handoff(STREAM, SHARD, owner="thief", expect_counter=row.counter)
        assert await finish(clock, run, within_s=0.2 + 0.3) == ConsumerState.HANDED_OVER  # renew_interval_s + a step
        handed = store.get(STREAM, SHARD)
        assert handed.owner == "thief" and handed.checkpoint == "3"
        assert sink.seqs == [1, 2, 3]

    asyncio.run(scenario())


def test_a_request_naming_ourselves_is_ignored() -> None:
    async def scenario() -> None:
        shard, store, sink = FakeShard(5), InProcessLeaseStore(), Recorder()
        reader = make_reader(shard, store, sink)
        clock = clock_of(reader)
        await finish(clock, reader.open())
        run = asyncio.create_task(reader.run())
        row = store.get(STREAM, SHARD)
        assert store.request_handoff(STREAM, SHARD, owner="me", expect_counter=row.counter)
        await clock.run_for(0.5)  # a few renewals
        assert not run.done()
        await finish(clock, reader.stop())
        assert await finish(clock, run) == ConsumerState.CLOSED
        assert store.get(STREAM, SHARD).owner is None

    asyncio.run(scenario())


def test_a_withdrawn_request_releases_instead_of_handing_over() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        shard, store = FakeShard(100), InProcessLeaseStore(clock=clock)
        sink = SlowRecorder(0.4, clock.sleep)
        reader = make_reader(shard, store, sink, max_records=10, clock=clock)
        await finish(clock, reader.open())
        run = asyncio.create_task(reader.run())
        await until(clock, lambda: sink.in_flight, what="a batch in flight")
        row = store.get(STREAM, SHARD)
        assert store.request_handoff(STREAM, SHARD, owner="thief", expect_counter=row.counter)
        # seen at the next renewal, while the batch is in flight
        await until(clock, lambda: reader.stop_request is not None and reader.stop_request.to == "thief",
                    what="the request seen")
        assert store.withdraw_handoff(STREAM, SHARD, owner="thief")  # the thief closed meanwhile
        assert await finish(clock, run) == ConsumerState.CLOSED
        row = store.get(STREAM, SHARD)
        assert row.owner is None and row.checkpoint == str(sink.seqs[-1]), "released after the batch in flight"

    asyncio.run(scenario())


def test_stop_checkpoints_the_batch_in_flight_before_releasing() -> None:
    """A clean close is like a handoff to nobody: what was delivered is checkpointed."""
    async def scenario() -> None:
        clock = FakeClock()
        shard, store = FakeShard(100), InProcessLeaseStore(clock=clock)
        sink = SlowRecorder(0.3, clock.sleep)
        reader = make_reader(shard, store, sink, max_records=10, clock=clock)
        await finish(clock, reader.open())
        run = asyncio.create_task(reader.run())
        await until(clock, lambda: sink.in_flight and len(sink.seqs) >= 10, what="a batch in flight")
        await finish(clock, reader.stop(release=True, grace_s=2.0))
        assert await finish(clock, run) == ConsumerState.CLOSED
        row = store.get(STREAM, SHARD)
        assert row.owner is None and row.checkpoint == str(sink.seqs[-1]) and len(sink.seqs) % 10 == 0

    asyncio.run(scenario())
