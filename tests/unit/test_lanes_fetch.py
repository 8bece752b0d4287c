"""With lanes the read loop fetches in the background (kinesis_actors.reader.consumer): the next
``GetRecords`` runs while a round is in flight, and a stop or seek never waits on a fetch
that waits for the byte budget. Fake clock, inline calls, no Ray."""

from __future__ import annotations

import asyncio
from typing import Any

from kinesis_actors import StartAt
from kinesis_actors.delivery import DeliveryOptions
from kinesis_actors.reader import ByteBudget, ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.testing import FakeClock, FakeShard, InlineIo, InProcessLeaseStore

STREAM, SHARD = "s", "shardId-000000000000"


class GatedSink:
    """Holds every batch until :attr:`gate` is set; records what it was given."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started: list[list[Any]] = []
        self.done: list[list[Any]] = []

    async def __call__(self, records: Any) -> None:
        self.started.append(list(records))
        await self.gate.wait()
        self.done.append(list(records))


def make(shard: FakeShard, sink: GatedSink, clock: FakeClock, *, budget: ByteBudget | None = None,
         max_records: int = 100) -> tuple[ShardConsumer, InProcessLeaseStore]:
    store = InProcessLeaseStore()
    lease = store.take(STREAM, SHARD, owner="me", duration_s=2.0)
    assert lease is not None
    shard.clock = clock
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=2.0, renew_interval_s=0.2, max_records=max_records, idle_wait_s=0.01,
                      delivery=DeliveryOptions(parallelization_factor=2, max_batch_records=10))
    reader = ShardConsumer(spec, lease, store, sink, shard, clock=clock, sleep=clock.sleep, io=InlineIo(clock),
                           budget=budget)  # type: ignore[arg-type]
    return reader, store


def test_the_next_get_records_runs_while_a_round_is_in_flight() -> None:
    shard, sink, clock = FakeShard(300, max_per_call=100), GatedSink(), FakeClock()
    reader, store = make(shard, sink, clock)

    async def main() -> None:
        await clock.finish(reader.open(), within_s=5.0)
        task = asyncio.create_task(reader.run())
        await clock.until(lambda: sink.started, within_s=5.0, what="the first round in flight")
        # 10 of the first 100 records are in flight and 90 gathered, fewer than one response
        # (the Limit, 100): the second GetRecords is made while the sink still holds the batch
        await clock.until(lambda: len(shard.calls) >= 2, within_s=2.0, what="a fetch during the round")
        assert not sink.done
        sink.gate.set()
        await clock.until(lambda: sum(map(len, sink.done)) == 300, within_s=30.0, what="every record")
        await clock.finish(reader.stop(), within_s=5.0)
        assert await clock.finish(task, within_s=5.0) == ConsumerState.CLOSED

    asyncio.run(main())
    assert [int(r.sequence_number) for b in sink.done for r in b] == list(range(1, 301))
    assert store.get(STREAM, SHARD).checkpoint == "300"


def test_a_stop_does_not_wait_on_a_fetch_queued_for_the_byte_budget() -> None:
    shard, sink, clock = FakeShard(300, max_per_call=100), GatedSink(), FakeClock()
    budget = ByteBudget(1, sleep=clock.sleep)  # one response at a time: the second fetch queues for room
    reader, store = make(shard, sink, clock, budget=budget)

    async def main() -> None:
        await clock.finish(reader.open(), within_s=5.0)
        task = asyncio.create_task(reader.run())
        await clock.until(lambda: sink.started and budget.waits, within_s=5.0, what="a round in flight, a fetch queued for room")
        # The queued fetch gets room only once the first response is acknowledged, which the
        # stop does not wait for: the batch in flight finishes and the rest is dropped.
        stop = asyncio.create_task(reader.stop(grace_s=10.0))
        await clock.until(lambda: len(sink.started) == 1 and not stop.done(), within_s=1.0, what="the stop under way")
        sink.gate.set()
        await clock.finish(stop, within_s=1.0)  # not at the grace's end: the queued fetch was dropped
        assert await clock.finish(task, within_s=5.0) == ConsumerState.CLOSED

    asyncio.run(main())
    assert len(shard.calls) == 1 and budget.used == 0 and budget.reserved == 0
    assert store.get(STREAM, SHARD).checkpoint == "10"  # the batch acknowledged, nothing past it



def test_records_are_built_in_the_fetch_thread_not_on_the_event_loop(monkeypatch: Any) -> None:
    """The lanes split and track every record, so a response's Record objects are built in the
    GetRecords call's thread (``Reading.fetch(prepare=...)``): built on the event loop, 10,000
    of them hold up every other shard's rounds for about 25 ms."""
    import threading
    import time

    from kinesis_actors.reader import delivery as lanes
    from kinesis_actors.reader.io import ToThreadIo

    built_on: list[int] = []
    real = lanes._materialize

    def materialize(got: Any) -> None:
        built_on.append(threading.get_ident())
        real(got)
        assert got.records._cache is not None  # the batch keeps what was built

    monkeypatch.setattr(lanes, "_materialize", materialize)
    shard, sink = FakeShard(300, max_per_call=100), GatedSink()
    sink.gate.set()
    store = InProcessLeaseStore()
    lease = store.take(STREAM, SHARD, owner="me", duration_s=5.0)
    assert lease is not None
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=5.0, renew_interval_s=1.0, max_records=100, idle_wait_s=0.01,
                      delivery=DeliveryOptions(parallelization_factor=2, max_batch_records=10))
    reader = ShardConsumer(spec, lease, store, sink, shard, io=ToThreadIo())  # type: ignore[arg-type]

    async def main() -> int:
        loop_thread = threading.get_ident()
        await reader.open()
        task = asyncio.create_task(reader.run())
        deadline = time.monotonic() + 20.0
        while sum(map(len, sink.done)) < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await reader.stop()
        await task
        return loop_thread

    loop_thread = asyncio.run(main())
    assert sum(map(len, sink.done)) == 300
    assert len(built_on) >= 3 and loop_thread not in built_on  # one build per response of 100, none on the loop
