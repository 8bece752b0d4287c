"""CoordinatorCore balancing without Ray: in-process readers (ShardReaderCore) over fake shards,
two or more instances over one in-process lease table, all on one FakeClock (readers' blocking
calls inline): time passes only as a test drives it; every bound is on that clock."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator import CoordinatorCore
from kinesis_actors.leases.protocol import Lease, TableSnapshot
from kinesis_actors.reader import ShardReaderCore
from kinesis_actors.records import StartAt
from kinesis_actors.testing import FakeClock, FakeKinesis, InlineIo, InProcessLeaseStore, LocalReader

STREAM = "s"
LEASE_S, RENEW_S, POLL_S = 1.0, 0.2, 0.1
T = TypeVar("T")


class BlindStore(InProcessLeaseStore):
    """A holder that never sees handoff requests (an old version of the library)."""

    def renew(self, lease: Lease, **kw: Any) -> Lease:
        return dataclasses.replace(super().renew(lease, **kw), next_owner=None)

    def checkpoint(self, lease: Lease, *args: Any, **kw: Any) -> Lease:
        return dataclasses.replace(super().checkpoint(lease, *args, **kw), next_owner=None)

    def snapshot(self, stream: str) -> TableSnapshot:  # its Coordinator's lease poll does not see them either
        seen = super().snapshot(stream)
        return TableSnapshot([dataclasses.replace(lease, next_owner=None) for lease in seen.leases], seen.instances)


def instance(owner: str, store: InProcessLeaseStore, kinesis: FakeKinesis, delivered: list[tuple[str, int]],
             clock: FakeClock, **stream_kwargs: Any) -> CoordinatorCore:
    stream = KinesisStream(STREAM, start_at=StartAt.trim_horizon(), lease_poll_interval_s=POLL_S,
                           shard_sync_interval_s=5.0, idle_wait_s=0.02, **stream_kwargs)

    async def deliver(records: list[Any]) -> None:
        delivered.extend((r.shard_id, int(r.sequence_number)) for r in records)

    def launch(_: int) -> LocalReader:
        core = ShardReaderCore(store=store.peer(clock=clock), deliver=deliver, kinesis=kinesis, clock=clock,
                               sleep=clock.sleep, io=InlineIo(clock, threads=2))  # type: ignore[arg-type]
        return LocalReader(core, start_delay_s=0.05, sleep=clock.sleep)

    return CoordinatorCore(stream, aws=None, store=store, owner_id=owner,  # type: ignore[arg-type]
                           lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, launcher=launch, kinesis=kinesis,
                           call_timeout_s=5.0, handoff_timeout_s=2 * LEASE_S, clock=clock, sleep=clock.sleep)


async def until(clock: FakeClock, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Drive ``clock`` in 20 ms steps until ``cond()``; AssertionError after ``timeout_s`` of fake time."""
    await clock.until(cond, within_s=timeout_s, what=what, step_s=0.02)


async def finish(clock: FakeClock, work: Awaitable[T], timeout_s: float = 30.0) -> T:
    """Drive ``clock`` until ``work`` is done; its result."""
    result: T = await clock.finish(work, within_s=timeout_s, step_s=0.02)
    return result


def owners(store: InProcessLeaseStore) -> collections.Counter[str | None]:
    return collections.Counter(lease.owner for lease in store.list(STREAM))


def test_a_joining_instance_gets_half_by_handoff_with_no_duplicate() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        kinesis, rows, delivered = FakeKinesis(4), InProcessLeaseStore(clock=clock), []
        a = instance("a", rows.peer(clock=clock), kinesis, delivered, clock)
        await finish(clock, a.start())
        assert a.held() == sorted(kinesis.shards)
        kinesis.publish(20)
        b = instance("b", rows.peer(clock=clock), kinesis, delivered, clock, max_leases_to_steal=1)
        await finish(clock, b.start())
        await until(clock, lambda: len(a.held()) == 2 and len(b.held()) == 2, 10, "2/2")
        for _ in range(5):
            kinesis.publish(5)
            await clock.run_for(POLL_S)
        await until(clock, lambda: len(delivered) == 4 * 45, 5, "every record")
        assert len(set(delivered)) == len(delivered), "a planned move delivers no duplicate"
        assert a.counters["leases_handed_over"] == 2 and b.counters["handoffs_received"] == 2
        assert b.counters["handoffs_forced"] == 0 and a.counters["leases_lost"] == 0
        assert b.last_plan is not None and b.last_plan.target == 2 and b.last_plan.live == ("a", "b")
        assert [i.owner for i in rows.instances(STREAM)] == ["a", "b"]
        settled = dict(owners(rows))
        await clock.run_for(10 * POLL_S)
        assert dict(owners(rows)) == settled, "balanced: nothing moves"
        await finish(clock, b.close())
        assert [i.owner for i in rows.instances(STREAM, include_stale=True)] == ["a"], "close deletes presence"
        await until(clock, lambda: len(a.held()) == 4, 3, "a takes b's released shards")
        await finish(clock, a.close())

    asyncio.run(scenario())


def test_a_holder_that_ignores_the_request_loses_the_lease_after_the_timeout() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        kinesis, rows, delivered = FakeKinesis(2), InProcessLeaseStore(clock=clock), []
        blind = BlindStore(rows._rows, clock=clock)
        a = instance("a", blind, kinesis, delivered, clock)
        await finish(clock, a.start())
        b = instance("b", rows.peer(clock=clock), kinesis, delivered, clock)
        started = clock()
        await finish(clock, b.start())
        await until(clock, lambda: len(b.held()) == 1, 10, "b forcing one lease")
        assert clock() - started >= 2 * LEASE_S * 0.9, "only after the handoff timeout"
        assert b.counters["handoffs_forced"] == 1
        await until(clock, lambda: len(a.held()) == 1, 3 * RENEW_S + 1, "a's fenced reader stopping")
        assert a.counters["leases_lost"] == 1
        await finish(clock, a.close())
        await finish(clock, b.close())

    asyncio.run(scenario())


def test_an_instance_closing_with_pending_requests_leaves_nothing_stuck() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        kinesis, rows, delivered = FakeKinesis(4), InProcessLeaseStore(clock=clock), []
        a = instance("a", rows.peer(clock=clock), kinesis, delivered, clock)
        await finish(clock, a.start())
        b = instance("b", rows.peer(clock=clock), kinesis, delivered, clock, max_leases_to_steal=2)
        await finish(clock, b.start())  # its first pass asks a for up to two leases
        # A request is written only at the counter b's scan saw: where a's reader renewed in
        # between (its store calls run on threads), it is asked again at a later poll.
        assert 1 <= b.counters["handoffs_requested"] <= 2
        assert any(lease.next_owner == "b" for lease in rows.list(STREAM)), "a request pending at the close"
        await finish(clock, b.close())
        assert not any(lease.next_owner == "b" for lease in rows.list(STREAM)), "requests withdrawn"
        await until(clock, lambda: len(a.held()) == 4, 3, "a reading every shard again")
        assert not any(lease.owner == "b" for lease in rows.list(STREAM))
        await finish(clock, a.close())

    asyncio.run(scenario())
