"""Balancing by throughput through two CoordinatorCores, without Ray: readers measure each shard's
bytes/s, renewals carry it into the rows, the lease poll of the instance below its share steals
the hot owner's cold leases and never the super-hot one; then nothing moves. All on one FakeClock."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator import CoordinatorCore
from kinesis_actors.reader import ShardReaderCore
from kinesis_actors.records import StartAt
from kinesis_actors.testing import FakeClock, FakeKinesis, InlineIo, InProcessLeaseStore, LocalReader

from .test_coordinator_balancing import LEASE_S, POLL_S, RENEW_S, STREAM, finish, until

HOT = "shardId-000000000000"
WINDOW_S = 1.0


def instance(owner: str, store: InProcessLeaseStore, kinesis: FakeKinesis, delivered: list[tuple[str, int]],
             clock: FakeClock) -> CoordinatorCore:
    """An instance whose readers measure over ``WINDOW_S`` (as ``load_window_s`` sets them)."""
    stream = KinesisStream(STREAM, start_at=StartAt.trim_horizon(), lease_poll_interval_s=POLL_S,
                           shard_sync_interval_s=5.0, idle_wait_s=0.02, load_window_s=WINDOW_S)

    async def deliver(records: list[Any]) -> None:
        delivered.extend((r.shard_id, int(r.sequence_number)) for r in records)

    def launch(_: int) -> LocalReader:
        core = ShardReaderCore(store=store.peer(clock=clock), deliver=deliver, kinesis=kinesis, clock=clock,
                               sleep=clock.sleep, io=InlineIo(clock, threads=2),  # type: ignore[arg-type]
                               load_window_s=WINDOW_S)
        return LocalReader(core, start_delay_s=0.05, sleep=clock.sleep)

    return CoordinatorCore(stream, aws=None, store=store, owner_id=owner,  # type: ignore[arg-type]
                           lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, launcher=launch, kinesis=kinesis,
                           call_timeout_s=5.0, handoff_timeout_s=2 * LEASE_S, clock=clock, sleep=clock.sleep)


def test_the_owner_of_a_super_hot_shard_keeps_it_and_gives_the_cold_ones_away() -> None:
    async def scenario() -> tuple[collections.Counter[str | None], dict[str, str | None], int]:
        clock = FakeClock()
        kinesis, rows, delivered = FakeKinesis(8), InProcessLeaseStore(clock=clock), []
        a = instance("a", rows.peer(clock=clock), kinesis, delivered, clock)
        await finish(clock, a.start())
        b = instance("b", rows.peer(clock=clock), kinesis, delivered, clock)
        async def traffic() -> None:  # 100 KB/s into the hot shard, 2 KB/s into each other
            while True:
                kinesis.shards[HOT].add(10, b"h" * 1000)
                kinesis.publish(1, b"c" * 200)
                await clock.sleep(0.1)

        pump = asyncio.create_task(traffic())
        await clock.run_for(3.0)  # a full window measured; renewals carry it into the rows
        assert rows.get(STREAM, HOT).throughput_kbps > 50
        await finish(clock, b.start())
        await until(clock, lambda: b.held() == sorted(set(kinesis.shards) - {HOT}), 30, "b holding the 7 cold shards")
        settled = {lease.shard_id: lease.owner for lease in rows.list(STREAM)}
        await clock.run_for(40 * POLL_S + 5.0)
        after = {lease.shard_id: lease.owner for lease in rows.list(STREAM)}
        pump.cancel()
        await finish(clock, b.close())
        await finish(clock, a.close())
        return collections.Counter(settled.values()), after if after != settled else {}, len(delivered) - len(set(delivered))

    counts, moved_after, duplicates = asyncio.run(scenario())
    assert counts == {"a": 1, "b": 7}  # count balancing would leave a with the hot shard and three more
    assert moved_after == {}, "settled: nothing moves afterwards"
    assert duplicates == 0
