"""The one-lane loop fetches the shard's next response while the current one is delivered
(kinesis_actors.reader.consumer, .reading), and a stop, a seek or shard end never lets a response
fetched ahead reach the sink or the checkpoint out of turn. Fake clock, inline calls, no Ray."""

from __future__ import annotations

import asyncio
from typing import Any

from kinesis_actors import StartAt
from kinesis_actors.reader import ByteBudget, ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.testing import FakeClock, FakeShard, InlineIo, InProcessLeaseStore

STREAM, SHARD = "s", "shardId-000000000000"


class GatedSink:
    """Holds every batch until :attr:`gate` is set; records what it was given."""

    def __init__(self, *, let_through: int = 0) -> None:
        self.let_through = let_through  # batches passed before the gate applies
        self.gate = asyncio.Event()
        self.started: list[list[Any]] = []
        self.done: list[list[Any]] = []

    async def __call__(self, records: Any) -> None:
        self.started.append(list(records))
        if len(self.started) > self.let_through:
            await self.gate.wait()
        self.done.append(list(records))


def make(shard: FakeShard, sink: GatedSink) -> tuple[ShardConsumer, InProcessLeaseStore, FakeClock, ByteBudget]:
    """A consumer of ``shard`` into ``sink`` on a fake clock, with a 10 MiB byte budget."""
    clock = FakeClock()
    budget = ByteBudget(10 << 20, sleep=clock.sleep)
    store = InProcessLeaseStore()
    lease = store.take(STREAM, SHARD, owner="me", duration_s=2.0)
    assert lease is not None
    shard.clock = clock
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=2.0, renew_interval_s=0.2, max_records=100, idle_wait_s=0.01)
    reader = ShardConsumer(spec, lease, store, sink, shard, clock=clock, sleep=clock.sleep, io=InlineIo(clock),
                           budget=budget)  # type: ignore[arg-type]
    return reader, store, clock, budget


def seqs(batches: list[list[Any]]) -> list[int]:
    return [int(r.sequence_number) for b in batches for r in b]


async def fetched_ahead(reader: ShardConsumer, shard: FakeShard, sink: GatedSink,
                        clock: FakeClock) -> asyncio.Task[ConsumerState]:
    """Open and run ``reader`` until its first batch is with the sink and the next
    response is fetched; the running task."""
    await clock.finish(reader.open(), within_s=5.0)
    task = asyncio.create_task(reader.run())
    await clock.until(lambda: sink.started and len(shard.calls) >= 2, within_s=5.0,
                      what="a batch with the sink, the next response fetched")
    return task


def test_the_next_get_records_runs_while_the_batch_is_with_the_sink() -> None:
    shard, sink = FakeShard(300, max_per_call=100), GatedSink()
    reader, store, clock, budget = make(shard, sink)

    async def main() -> None:
        await clock.finish(reader.open(), within_s=5.0)
        task = asyncio.create_task(reader.run())
        await clock.until(lambda: sink.started, within_s=5.0, what="the first batch with the sink")
        await clock.until(lambda: len(shard.calls) >= 2, within_s=2.0, what="the second GetRecords meanwhile")
        # one response ahead, not more: the third waits until the first is acknowledged
        await clock.run_for(1.0)
        assert len(shard.calls) == 2 and len(sink.started) == 1 and not sink.done
        assert store.get(STREAM, SHARD).checkpoint is None  # nothing acknowledged yet
        assert reader.held_bytes == budget.used > 0  # both responses counted by the budget
        sink.gate.set()
        await clock.until(lambda: sum(map(len, sink.done)) == 300, within_s=30.0, what="every record")
        await clock.finish(reader.stop(), within_s=5.0)
        assert await clock.finish(task, within_s=5.0) == ConsumerState.CLOSED

    asyncio.run(main())
    assert seqs(sink.done) == list(range(1, 301))
    assert store.get(STREAM, SHARD).checkpoint == "300"
    assert budget.used == 0 and budget.reserved == 0 and reader.held_bytes == 0


def test_a_stop_drops_the_response_fetched_ahead_undelivered_and_unchecked() -> None:
    shard, sink = FakeShard(300, max_per_call=100), GatedSink()
    reader, store, clock, budget = make(shard, sink)

    async def main() -> None:
        task = await fetched_ahead(reader, shard, sink, clock)
        stop = asyncio.create_task(reader.stop(grace_s=10.0))
        await clock.until(lambda: reader.stop_request is not None, within_s=1.0, what="the stop asked")
        sink.gate.set()
        await clock.finish(stop, within_s=2.0)
        assert await clock.finish(task, within_s=5.0) == ConsumerState.CLOSED

    asyncio.run(main())
    assert seqs(sink.done) == list(range(1, 101))  # the batch in flight finished; 101-200 never went out
    row = store.get(STREAM, SHARD)
    assert row.checkpoint == "100" and row.owner is None
    assert budget.used == 0 and budget.reserved == 0 and reader.held_bytes == 0


def test_a_seek_drops_the_response_fetched_ahead_and_reads_from_the_new_position() -> None:
    shard, sink = FakeShard(300, max_per_call=100), GatedSink()
    reader, store, clock, budget = make(shard, sink)

    async def main() -> None:
        task = await fetched_ahead(reader, shard, sink, clock)
        seek = asyncio.create_task(reader.seek(StartAt.at_sequence_number("250")))
        await clock.until(lambda: reader.seeking, within_s=1.0, what="the seek asked")
        sink.gate.set()
        await clock.finish(seek, within_s=5.0)
        await clock.until(lambda: seqs(sink.done)[-1:] == [300], within_s=10.0, what="read to the tip after the seek")
        await clock.finish(reader.stop(), within_s=5.0)
        assert await clock.finish(task, within_s=5.0) == ConsumerState.CLOSED

    asyncio.run(main())
    assert seqs(sink.done) == list(range(1, 101)) + list(range(250, 301))
    assert store.get(STREAM, SHARD).checkpoint == "300"
    assert budget.used == 0 and budget.reserved == 0 and reader.held_bytes == 0


def test_nothing_is_fetched_ahead_of_shard_end_and_shard_end_follows_every_acknowledgement() -> None:
    shard, sink = FakeShard(150, closed=True, max_per_call=100), GatedSink(let_through=1)
    reader, store, clock, _ = make(shard, sink)

    async def main() -> None:
        await clock.finish(reader.open(), within_s=5.0)
        task = asyncio.create_task(reader.run())
        await clock.until(lambda: len(sink.started) == 2, within_s=5.0, what="the last batch with the sink")
        await clock.run_for(1.0)
        # the answer that ended the shard is not fetched past (no third call, no new iterator)
        assert len(shard.calls) == 2 and len(shard.iterator_requests) == 1
        assert store.get(STREAM, SHARD).checkpoint != "SHARD_END"
        sink.gate.set()
        assert await clock.finish(task, within_s=5.0) == ConsumerState.SHARD_ENDED

    asyncio.run(main())
    assert seqs(sink.done) == list(range(1, 151))
    assert store.get(STREAM, SHARD).checkpoint == "SHARD_END"


def test_an_idle_shard_polls_inline_without_a_task_per_poll() -> None:
    shard, sink = FakeShard(0), GatedSink()
    reader, _, clock, _ = make(shard, sink)
    names: set[str] = set()

    async def main() -> None:
        await clock.finish(reader.open(), within_s=5.0)
        task = asyncio.create_task(reader.run())
        await clock.until(lambda: len(shard.calls) >= 5, within_s=30.0, what="five empty polls")
        names.update(t.get_name() for t in asyncio.all_tasks())
        await clock.finish(reader.stop(), within_s=5.0)
        assert await clock.finish(task, within_s=5.0) == ConsumerState.CLOSED

    asyncio.run(main())
    assert f"fetch-{SHARD}" not in names and not sink.started
