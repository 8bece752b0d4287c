"""ShardReaderCore's control seams on a fake clock: request_handoff (INTERFACES.md item 6) and a
stop that keeps its deadline while the lease table hangs (item 4). No thread, no wall-clock wait:
blocking calls run inline, and a hung lease table is a store call that never returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from kinesis_actors.reader import STOP_SLACK_S, ConsumerState, ReaderSpec, ShardReaderCore
from kinesis_actors.records import Record, StartAt
from kinesis_actors.testing import FakeClock, FakeShard, InlineIo, InProcessLeaseStore

STREAM, SHARD = "s", "shardId-000000000000"
T = TypeVar("T")


class Reader:
    def __init__(self, records: int = 5) -> None:
        self.clock = FakeClock()
        self.store = InProcessLeaseStore(clock=self.clock)
        self.shard = FakeShard(records)
        self.io = InlineIo(self.clock)
        self.delivered: list[Record] = []

        async def deliver(batch: list[Record]) -> None:
            self.delivered.extend(batch)

        self.core = ShardReaderCore(store=self.store, deliver=deliver, kinesis=self.shard, clock=self.clock,
                                    sleep=self.clock.sleep, io=self.io)  # type: ignore[arg-type]

    async def add(self) -> None:
        lease = self.store.take(STREAM, SHARD, owner="me", duration_s=10.0)
        assert lease is not None
        spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                          lease_duration_s=10.0, renew_interval_s=1.0, idle_wait_s=0.05, max_idle_wait_s=0.1)
        opened = asyncio.ensure_future(self.core.add(spec, lease, lease_age_s=0.0))
        await self.clock.run_for(0.5)
        assert opened.done() and opened.result().state is ConsumerState.PROCESSING

    async def until(self, cond: Callable[[], bool], *, within_s: float, what: str) -> None:
        end = self.clock() + within_s
        while not cond():
            assert self.clock() < end, f"not within {within_s} s of the fake clock: {what}"
            await self.clock.run_for(0.01)


def test_request_handoff_hands_over_after_the_batch_in_flight_without_waiting_for_a_renewal() -> None:
    async def scenario() -> None:
        r = Reader()
        await r.add()
        await r.until(lambda: r.store.get(STREAM, SHARD).checkpoint == "5", within_s=2.0, what="checkpoint 5")
        row = r.store.get(STREAM, SHARD)
        assert r.store.request_handoff(STREAM, SHARD, owner="thief", expect_counter=row.counter)
        assert not r.core.request_handoff("shardId-000000000009", "thief"), "not read here"
        assert r.core.request_handoff(SHARD, "thief")
        # well within one renew interval (1 s): the request does not wait for the next renewal
        await r.until(lambda: r.core.shard_ids() == [], within_s=0.3, what="the hand-over")
        events = await r.core.events(timeout_s=0.0)
        assert [e.state for e in events] == [ConsumerState.HANDED_OVER]
        handed = r.store.get(STREAM, SHARD)
        assert handed.owner == "thief" and handed.checkpoint == "5"
        assert [int(x.sequence_number) for x in r.delivered] == [1, 2, 3, 4, 5]
        assert not r.core.request_handoff(SHARD, "thief"), "ended: no longer read here"

    asyncio.run(scenario())


def test_stop_returns_within_its_grace_while_the_lease_table_hangs_and_leaves_the_lease_to_expire() -> None:
    async def scenario() -> None:
        r = Reader()
        await r.add()
        await r.until(lambda: r.store.get(STREAM, SHARD).checkpoint == "5", within_s=2.0, what="checkpoint 5")
        r.io.hang_store = True
        r.shard.add(3)  # a batch whose checkpoint will hang
        await r.until(lambda: r.io.hung > 0, within_s=2.0, what="a lease write hanging")
        stop = asyncio.ensure_future(r.core.stop(SHARD, grace_s=2.0))
        started = r.clock()
        await r.until(stop.done, within_s=2.0 + 2 * STOP_SLACK_S, what="stop() returning")
        assert r.clock() - started >= 2.0, "the batch in flight had its grace"
        events = await r.core.events(timeout_s=0.0)
        assert [e.state for e in events] == [ConsumerState.CLOSED]
        row = r.store.get(STREAM, SHARD)
        assert row.owner == "me" and row.checkpoint == "5", "not released: the lease expires, nothing checkpointed"
        assert r.core.shard_ids() == []

    asyncio.run(scenario())
