"""Placement by load through the Coordinator, without Ray: in-process readers whose CPU is
injected (GIL-bound: 0.7 cores per hot shard, at most one core), a fake Kinesis and an
in-process lease table, all on one FakeClock. Two hot shards that count placement put on one
reader end on two readers, every record delivered exactly once; with reader_target_cpu=None
nothing moves."""

from __future__ import annotations

import asyncio
from typing import Any

from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator import CoordinatorCore
from kinesis_actors.reader import ShardReaderCore
from kinesis_actors.records import Record, StartAt
from kinesis_actors.testing import FakeClock, FakeKinesis, FakeShard, InlineIo, InProcessLeaseStore, LocalReader

STREAM = "s"
HOT = ("shardId-000000000000", "shardId-000000000002")  # count placement puts both on reader 1
HOT_CPU = 0.7  # cores one hot shard costs its reader


class Run:
    def __init__(self, **stream_kwargs: Any) -> None:
        self.clock = clock = FakeClock()
        self.kinesis = FakeKinesis(4, records=0)
        for sid in HOT:
            self.kinesis.shards[sid] = FakeShard(50_000)
        for sid in self.kinesis.shards:
            self.kinesis.shards[sid].max_per_call = 20
        rows = InProcessLeaseStore(clock=clock)
        self.delivered: list[tuple[str, int]] = []
        self.readers: list[LocalReader] = []

        async def record(records: list[Record]) -> None:
            self.delivered.extend((r.shard_id, int(r.sequence_number)) for r in records)

        def launch(_: int) -> LocalReader:
            holder: list[ShardReaderCore] = []
            used, last = [0.0], [clock()]

            def cpu_time() -> float:  # GIL-bound: the hot shards it holds, at most one core
                now = clock()
                hot = sum(1 for sid in holder[0].shard_ids() if sid in HOT) if holder else 0
                used[0] += (now - last[0]) * min(1.0, HOT_CPU * hot)
                last[0] = now
                return used[0]

            io = InlineIo(clock, threads=4, delay_s=lambda pool, args: 0.05 if pool == "kinesis" else 0.0)
            core = ShardReaderCore(store=rows.peer(clock=clock), deliver=record, kinesis=self.kinesis, clock=clock,
                                   sleep=clock.sleep, io=io, load_window_s=1.0,  # type: ignore[arg-type]
                                   cpu_time=cpu_time)
            holder.append(core)
            reader = LocalReader(core, start_delay_s=0.05, sleep=clock.sleep)
            self.readers.append(reader)
            return reader

        stream = KinesisStream(STREAM, start_at=StartAt.trim_horizon(), lease_poll_interval_s=0.2,
                               shard_sync_interval_s=5.0, idle_wait_s=0.02, max_idle_wait_s=0.05,
                               max_shards_per_reader=4, load_window_s=1.0, **stream_kwargs)
        self.core = CoordinatorCore(stream, aws=None, store=rows.peer(clock=clock), owner_id="a",  # type: ignore[arg-type]
                                    lease_duration_s=2.0, renew_interval_s=0.4, launcher=launch,
                                    kinesis=self.kinesis, call_timeout_s=5.0, reader_start_timeout_s=5.0,
                                    clock=clock, sleep=clock.sleep)

    def homes(self) -> dict[str, int]:
        return {sid: r.id for sid, h in self.core.placements.held.items() if (r := h.reader) is not None}


def exactly_once(delivered: list[tuple[str, int]]) -> dict[str, int]:
    """Per shard, the records delivered are 1..n, each once; returns n per shard."""
    by_shard: dict[str, list[int]] = {}
    for sid, seq in delivered:
        by_shard.setdefault(sid, []).append(seq)
    for sid, seqs in by_shard.items():
        assert sorted(seqs) == list(range(1, len(seqs) + 1)), f"{sid}: duplicates or gaps"
    return {sid: len(seqs) for sid, seqs in by_shard.items()}


def test_two_hot_shards_on_one_reader_end_on_two_readers_with_every_record_once() -> None:
    run = Run()

    async def scenario() -> dict[str, int]:
        await run.clock.finish(run.core.start(30.0), within_s=60.0)
        first = run.homes()
        assert first[HOT[0]] == first[HOT[1]], "count placement put both hot shards on one reader"
        await run.clock.until(lambda: len({run.homes().get(s) for s in HOT}) == 2, within_s=15.0,
                              what="the hot shards on two readers")
        await run.clock.run_for(6.0)  # and they stay apart: nothing moves them back
        homes = run.homes()
        await run.clock.finish(run.core.close(), within_s=60.0)
        return homes

    homes = asyncio.run(scenario())
    assert homes[HOT[0]] != homes[HOT[1]]
    assert run.core.counters["shards_moved"] == 1, "one move was enough, and nothing moved back"
    counts = exactly_once(run.delivered)
    assert counts[HOT[0]] > 100 and counts[HOT[1]] > 100


def test_with_reader_target_cpu_none_nothing_moves() -> None:
    run = Run(reader_target_cpu=None)

    async def scenario() -> dict[str, int]:
        await run.clock.finish(run.core.start(30.0), within_s=60.0)
        await run.clock.run_for(10.0)
        homes = run.homes()
        await run.clock.finish(run.core.close(), within_s=60.0)
        return homes

    homes = asyncio.run(scenario())
    assert homes[HOT[0]] == homes[HOT[1]]
    assert run.core.counters.get("shards_moved", 0) == 0
    exactly_once(run.delivered)


def test_after_a_reader_dies_its_shards_are_spread_back_once_the_replacement_is_ready() -> None:
    run = Run(reader_target_cpu=None)  # by count: the hot figures play no part
    for sid in run.kinesis.shards:
        run.kinesis.shards[sid] = FakeShard(0)  # an idle stream

    async def scenario() -> list[int]:
        await run.clock.finish(run.core.start(30.0), within_s=60.0)
        victim = next(r for r in run.readers if r.core.shard_ids())
        victim.kill()
        await run.clock.until(lambda: run.core.counters["readers_replaced"] == 1 and len(run.core.pool.ready()) == 2,
                              within_s=20.0, what="the replacement ready")
        await run.clock.until(lambda: sorted(_counts(run)) == [2, 2], within_s=20.0,
                              what="the shards spread back over the two readers")
        await run.clock.run_for(5.0)  # and they stay
        counts = _counts(run)
        await run.clock.finish(run.core.close(), within_s=60.0)
        return counts

    assert sorted(asyncio.run(scenario())) == [2, 2]
    assert run.core.counters["shards_moved"] == 2


def _counts(run: Run) -> list[int]:
    homes = run.homes()
    return [sum(1 for rid in homes.values() if rid == r.id) for r in run.core.pool.ready()]
