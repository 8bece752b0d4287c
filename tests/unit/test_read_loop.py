"""The one read loop of a shard consumer (kinesis_actors.reader.consumer), for every
parallelization_factor, and the states' behaviour table (kinesis_actors.reader.states).
Fake clock, inline calls, no Ray."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kinesis_actors import SinkError, StartAt
from kinesis_actors.clock import monotonic_s
from kinesis_actors.delivery import DeliveryOptions, ShardPipeline
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardConsumer, StopReason
from kinesis_actors.reader.states import BEHAVIOURS, TERMINAL, TRANSITIONS
from kinesis_actors.testing import FakeClock, FakeShard, InlineIo, InProcessLeaseStore

STREAM, SHARD = "s", "shardId-000000000000"


def make(shard: FakeShard, sink: Any, clock: FakeClock, *, factor: int) -> tuple[ShardConsumer, InProcessLeaseStore]:
    store = InProcessLeaseStore()
    lease = store.take(STREAM, SHARD, owner="me", duration_s=2.0)
    assert lease is not None
    shard.clock = clock
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=2.0, renew_interval_s=0.2, max_records=100, idle_wait_s=0.01,
                      delivery=DeliveryOptions(parallelization_factor=factor, max_sink_retries=0))
    reader = ShardConsumer(spec, lease, store, sink, shard, clock=clock, sleep=clock.sleep, io=InlineIo(clock))
    return reader, store


@pytest.mark.parametrize("factor", [1, 2])
def test_a_batch_failing_during_the_empty_shard_end_fetch_never_lets_shard_end_be_written(factor: int) -> None:
    """The batch in flight fails while the next fetch, made meanwhile, finds the shard's end
    with no records: the consumer fails, and SHARD_END is never written past the batch."""
    shard, clock = FakeShard(100, max_per_call=100), FakeClock()
    written: list[str] = []

    async def sink(records: Any) -> None:
        shard.closed = True  # the next GetRecords: no records, no next iterator
        while len(shard.calls) < 2:  # the shard-end fetch is made while this batch is in flight
            await clock.sleep(0.01)
        raise RuntimeError("the sink gave up")

    reader, store = make(shard, sink, clock, factor=factor)
    original = store.checkpoint

    def spy(lease: Any, seq: str, **kw: Any) -> Any:
        written.append(seq)
        return original(lease, seq, **kw)

    store.checkpoint = spy  # type: ignore[method-assign]

    async def main() -> ConsumerState:
        await clock.finish(reader.open(), within_s=5.0)
        with pytest.raises(SinkError):
            await clock.finish(reader.run(), within_s=10.0)
        return reader.state

    assert asyncio.run(main()) is ConsumerState.FAILED
    assert len(shard.calls) == 2 and written == []
    row = store.get(STREAM, SHARD)
    assert row.checkpoint is None and row.owner is None  # released at no checkpoint, SHARD_END never written


@pytest.mark.parametrize("factor", [1, 2])
def test_shard_end_is_written_after_every_batch_through_shutting_down(factor: int) -> None:
    shard, clock = FakeShard(250, closed=True, max_per_call=100), FakeClock()
    got: list[int] = []
    states: list[str] = []

    async def sink(records: Any) -> None:
        got.extend(int(r.sequence_number) for r in records)
        states.append(reader.state.value)

    reader, store = make(shard, sink, clock, factor=factor)
    seen = reader._to

    def to(state: ConsumerState) -> None:
        states.append(state.value)
        seen(state)

    reader._to = to  # type: ignore[method-assign]

    async def main() -> ConsumerState:
        return await clock.finish(reader.run(), within_s=20.0)

    assert asyncio.run(main()) is ConsumerState.SHARD_ENDED
    assert got == list(range(1, 251)) and len(shard.calls) == 3  # no fetch past the response that ended it
    assert store.get(STREAM, SHARD).checkpoint == "SHARD_END"
    assert states[0] == "processing" and states[-2:] == ["shutting_down", "shard_ended"]


def test_every_live_state_names_its_task_and_a_move_for_every_stop_reason() -> None:
    live = [s for s in ConsumerState if s not in TERMINAL]
    assert set(live) == {ConsumerState.INITIALIZING, ConsumerState.PROCESSING, ConsumerState.SHUTTING_DOWN}
    for state in live:
        behaviour = BEHAVIOURS[state]
        assert behaviour.task is not None and callable(getattr(ShardConsumer, behaviour.task))
        assert set(StopReason) <= set(behaviour.next), f"{state}: a stop reason with no move"
        assert behaviour.next[StopReason.LEASE_LOST] is ConsumerState.LOST
    assert BEHAVIOURS[ConsumerState.INITIALIZING].next[None] is ConsumerState.PROCESSING
    assert None not in BEHAVIOURS[ConsumerState.PROCESSING].next, "the read loop returns only with a stop"
    assert BEHAVIOURS[ConsumerState.FAILED].task == "leave_after_failure"
    assert all(TRANSITIONS[s] == frozenset(BEHAVIOURS[s].next.values()) for s in ConsumerState)


def seeking_consumer(shard: FakeShard, sink: Any, clock: FakeClock, *, factor: int,
                     io: InlineIo | None = None) -> tuple[ShardConsumer, InProcessLeaseStore]:
    """A consumer of ``factor`` lanes that checkpoints every acknowledged batch, its blocking
    calls made by ``io`` (default: inline on ``clock``)."""
    store = InProcessLeaseStore()
    lease = store.take(STREAM, SHARD, owner="me", duration_s=2.0)
    assert lease is not None
    shard.clock = clock
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=2.0, renew_interval_s=0.2, max_records=100, idle_wait_s=0.01,
                      min_checkpoint_interval_s=0,
                      delivery=DeliveryOptions(parallelization_factor=factor, max_sink_retries=0))
    return ShardConsumer(spec, lease, store, sink, shard, clock=clock, sleep=clock.sleep,
                         io=io or InlineIo(clock)), store


class ThreadedFetchIo(InlineIo):
    """InlineIo whose Kinesis calls run in a thread while :attr:`threaded`: a GetRecords that
    hangs there is a call running (ReaderIo's pool), which a seek must wait for."""

    threaded = False

    async def kinesis(self, fn: Any, *args: Any, limited: bool = True, shard: str | None = None) -> Any:
        if self.threaded:
            return await asyncio.to_thread(fn, *args)
        return await super().kinesis(fn, *args, limited=limited, shard=shard)


@pytest.mark.parametrize("factor", [1, 2])
def test_a_batch_that_fails_while_a_seek_waits_for_the_fetch_fails_the_consumer(factor: int) -> None:
    """A seek waits for the fetch running in its thread; the batch in flight fails meanwhile,
    where no wait of the lanes sees it. The wait for the batches in flight that follows
    raises its error: the consumer fails, instead of dropping the error with the lanes'
    cancel, seeking on, and ending cleanly at the next stop."""
    shard, clock = FakeShard(10), FakeClock()
    fail_now = asyncio.Event()
    io = ThreadedFetchIo(clock)

    async def sink(records: Any) -> None:
        if not io.threaded and not shard.release.is_set():  # the first batch: the fetch made meanwhile hangs
            io.threaded, shard.faults = True, ["hang"]
            await fail_now.wait()
            raise RuntimeError("the sink gave up")

    reader, store = seeking_consumer(shard, sink, clock, factor=factor, io=io)

    async def main() -> None:
        await clock.finish(reader.open(), within_s=5.0)
        run = asyncio.ensure_future(reader.run())
        await clock.until(lambda: bool(reader.keeper.call_started), within_s=30.0, what="the fetch in its thread")
        seek = asyncio.ensure_future(reader.seek(StartAt.trim_horizon()))
        await clock.run_for(0.3)  # the loop is in the seek, waiting for the call
        fail_now.set()
        await clock.run_for(0.1)  # the batch fails: no wait of the lanes runs
        io.threaded = False
        shard.release.set()
        deadline = monotonic_s() + 10.0  # real seconds: the thread returns
        while reader.keeper.call_started is not None:
            assert monotonic_s() < deadline, "the hung call did not return"
            await asyncio.sleep(0.001)
        await clock.finish(seek, within_s=5.0)
        await clock.finish(reader.stop(), within_s=10.0)  # a stop after the failure raises it, never ends cleanly
        with pytest.raises(SinkError):
            await clock.finish(run, within_s=5.0)

    asyncio.run(main())
    assert reader.state is ConsumerState.FAILED
    assert store.get(STREAM, SHARD).checkpoint is None, "nothing acknowledged"


@pytest.mark.parametrize("factor", [2, 3])
def test_a_seek_with_records_gathered_leaves_the_tracker_nothing_dropped(factor: int) -> None:
    """A seek while one batch is in flight and fetched records wait gathered: what was dropped
    leaves the pipeline's tracker too (it holds only records fetched after the seek), so the
    checkpoint reaches the shard's last record again (a dropped record kept there would hold
    it back forever: it is never acknowledged)."""
    shard, clock = FakeShard(20, max_per_call=5), FakeClock()
    got: list[int] = []

    async def sink(records: Any) -> None:
        await clock.sleep(0.5)
        got.extend(int(r.sequence_number) for r in records)

    reader, store = seeking_consumer(shard, sink, clock, factor=factor)

    async def main() -> None:
        await clock.finish(reader.open(), within_s=5.0)
        run = asyncio.ensure_future(reader.run())
        pipeline = reader._lanes
        assert isinstance(pipeline, ShardPipeline)
        await clock.until(lambda: pipeline.in_flight and pipeline.gathered, within_s=2.0,
                          what="a batch in flight and records gathered")
        await clock.finish(reader.seek(StartAt.trim_horizon()), within_s=5.0)
        assert pipeline.tracker.pending <= len(shard.records) and not got[5:], "dropped: not delivered"
        await clock.until(lambda: store.get(STREAM, SHARD).checkpoint == "20", within_s=20.0,
                          what="checkpoint 20 after the seek")
        assert pipeline.tracker.pending == 0
        await clock.finish(reader.stop(), within_s=5.0)
        await clock.finish(run, within_s=5.0)

    asyncio.run(main())
    assert got[:5] == [1, 2, 3, 4, 5] and got[5:] == list(range(1, 21)), "the batch in flight, then all again"
