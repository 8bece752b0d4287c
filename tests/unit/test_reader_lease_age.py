"""Lease freshness at add (issue 21, race 2; INTERFACES.md item 5): a reader judges a lease
from when the Coordinator took it (``lease_age_s``), not from when the reader opened it."""

from __future__ import annotations

import asyncio
from typing import Any

from kinesis_actors.reader import ConsumerState, ReaderIo, ReaderSpec, ShardReaderCore
from kinesis_actors.records import Record, StartAt
from kinesis_actors.testing import FakeClock, FakeShard, InProcessLeaseStore

STREAM, SHARD = "s", "shardId-000000000000"
LEASE_S, RENEW_S = 10.0, 1.0


def test_a_lease_taken_over_while_its_shard_was_being_opened_delivers_nothing() -> None:
    # The Coordinator took the lease, then placing it on a reader took 30 s (a reader
    # starting); meanwhile another instance saw it lapse and took it. The reader must
    # count the lease 30 s old, renew it before its first delivery, and be fenced there.
    clock = FakeClock(follow_real=True)
    store = InProcessLeaseStore(clock=clock)
    shard = FakeShard(5)
    lease = store.take(STREAM, SHARD, owner="me", duration_s=LEASE_S)
    assert lease is not None
    lease = store.checkpoint(lease, "2")
    thief = store.peer()
    assert thief.list(STREAM)  # the other instance sees the row...
    clock.advance(30.0)  # ...and, the placement being slow, sees it unchanged for a whole lease
    assert thief.take(STREAM, SHARD, owner="thief", duration_s=LEASE_S) is not None
    delivered: list[Record] = []

    async def deliver(records: list[Record]) -> None:
        delivered.extend(records)

    async def scenario() -> Any:
        core = ShardReaderCore(store=store, deliver=deliver, kinesis=shard, clock=clock,
                               io=ReaderIo(kinesis_threads=2, store_threads=2))
        spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                          lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, idle_wait_s=0.01)
        await core.add(spec, lease, lease_age_s=30.0)
        events = await core.events(timeout_s=5.0)
        await core.close()
        return events

    events = asyncio.run(scenario())
    assert delivered == [], "a fenced zombie delivered a batch"
    assert [e.state for e in events] == [ConsumerState.LOST]
    assert store.get(STREAM, SHARD).owner == "thief"


class _InlineStoreIo:
    """The reader's IO seam with the store calls inline, noting when each renewal was sent."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.sent = clock, []  # type: tuple[FakeClock, list[float]]

    async def store(self, fn: Any, *args: Any) -> Any:
        self.sent.append(self.clock())
        return fn(*args)

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        """No call limit here."""


def _renewals(spread: float, lease_age_s: float) -> list[float]:
    """When the first two renewals of a fresh keeper are sent, in seconds after its start."""
    from kinesis_actors.reader import LeaseKeeper

    clock = FakeClock()
    store = InProcessLeaseStore(clock=clock)
    lease = store.take(STREAM, SHARD, owner="me", duration_s=LEASE_S)
    assert lease is not None
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=LEASE_S, renew_interval_s=3.0)
    io = _InlineStoreIo(clock)
    keeper = LeaseKeeper(spec, lease, store, io, clock=clock, sleep=clock.sleep,  # type: ignore[arg-type]
                         lease_age_s=lease_age_s, rng=lambda: spread)
    start = clock()

    async def scenario() -> None:
        task = asyncio.create_task(keeper.renew_loop())
        await clock.until(lambda: len(io.sent) >= 2 or task.done(), within_s=10.0, what="two renewals")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    return [round(t - start, 3) for t in io.sent[:2]]


def test_the_first_renewal_is_spread_over_the_second_half_of_the_interval_then_one_per_interval() -> None:
    # The first renewal falls due one interval after the take minus rng x half an interval
    # (rng 0.5: a quarter interval earlier), the next one interval after the first; each is
    # sent on the 0.25 s renewal grid, so up to one slot (plus a 10 ms clock step) late.
    late = 0.25 + 0.011
    for spread, age, first in ((0.0, 0.0, 3.0), (0.5, 0.0, 2.25), (0.99, 0.0, 1.515), (0.5, 1.0, 1.25)):
        sent = _renewals(spread, age)
        assert first <= sent[0] <= first + late, f"rng {spread}, lease {age} s old: first renewal at {sent[0]} s"
        assert 3.0 <= sent[1] - sent[0] <= 3.0 + late, f"rng {spread}: renewals {sent}"
