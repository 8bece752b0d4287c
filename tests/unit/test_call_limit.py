"""CallLimit: AIMD on renewal latency, and a stuck call holds its own shard's slot only (issue 21 part 1).

Driven on a FakeClock (its ``sleep`` is the limit's sleep): no wall-clock waits.
"""

from __future__ import annotations

import asyncio

from kinesis_actors.reader import CallLimit
from kinesis_actors.testing import FakeClock


def cut_to_one(limit: CallLimit, clock: FakeClock) -> None:
    while int(limit.limit) > 1:
        limit.note_renewal(0.9, 1.0)
        clock.advance(0.4)


def test_slow_renewals_halve_the_limit_and_fast_ones_raise_it_again() -> None:
    clock = FakeClock()
    limit = CallLimit(16, clock=clock, sleep=clock.sleep)
    limit.note_renewal(0.5, 1.0)
    limit.note_renewal(0.5, 1.0)  # within a third of an interval of the last cut: no second cut
    assert int(limit.limit) == 8 and limit.cuts == 1
    cut_to_one(limit, clock)
    assert int(limit.limit) == 1
    for _ in range(200):
        limit.note_renewal(0.01, 1.0)
    assert int(limit.limit) == 16


def test_a_stuck_call_holds_its_own_shard_only_however_low_the_limit() -> None:
    async def main() -> None:
        clock = FakeClock()
        limit = CallLimit(16, clock=clock, sleep=clock.sleep, stuck_after_s=1.0)
        cut_to_one(limit, clock)
        stuck = await limit.acquire("s0")  # hangs until its socket timeout (2 s)
        queued = asyncio.ensure_future(limit.acquire("s1"))
        await clock.run_for(0.5)
        assert not queued.done(), "within stuck_after_s the call still counts against a limit of 1"
        await clock.run_for(0.6)
        assert queued.done(), "a call in flight past stuck_after_s no longer counts"
        neighbour = queued.result()
        limit.release(neighbour)
        await clock.run_for(0.9)
        limit.release(stuck)  # ReadTimeoutError after 2 s
        other = await limit.acquire("s1")
        again = asyncio.ensure_future(limit.acquire("s0"))
        await clock.run_for(0.0)
        assert again.done(), "the stuck shard's next call runs outside the limit: it takes no neighbour's place"
        assert limit.in_flight == 1
        third = asyncio.ensure_future(limit.acquire("s2"))
        await clock.run_for(0.1)
        assert not third.done(), "the limit still holds the shards that are not stuck"
        limit.release(other)
        await clock.run_for(0.0)
        assert third.done()
        limit.release(third.result())
        quick = again.result()
        limit.release(quick)  # returned within stuck_after_s: s0 counts again
        first = await limit.acquire("s0")
        blocked = asyncio.ensure_future(limit.acquire("s0"))
        await clock.run_for(0.1)
        assert not blocked.done()
        limit.release(first)
        await clock.run_for(0.0)
        limit.release(await blocked)

    asyncio.run(main())


def test_waiters_are_admitted_in_arrival_order_and_a_newcomer_queues_behind_them() -> None:
    """At a limit of 1, shards that poll again and again (at the tip) must not starve a shard
    that has been waiting: places go to waiters in arrival order, and a call arriving while
    others wait queues behind them (a shard whose first GetRecords waited 40 s behind its
    neighbours' polls did not deliver at all in the 64-shard stall test)."""
    async def main() -> None:
        clock = FakeClock()
        limit = CallLimit(16, clock=clock, sleep=clock.sleep, stuck_after_s=5.0)
        cut_to_one(limit, clock)
        holder = await limit.acquire("tip-0")
        admitted: list[str] = []

        async def call(key: str) -> None:
            token = await limit.acquire(key)
            admitted.append(key)
            await clock.sleep(0.01)
            limit.release(token)

        waiting = [asyncio.ensure_future(call(f"w{i}")) for i in range(3)]
        await clock.run_for(0.1)
        assert limit.queued == 3
        limit.release(holder)  # room for one: the first waiter's, not a newcomer's
        late = asyncio.ensure_future(call("tip-1"))
        await clock.run_for(0.005)
        assert admitted == ["w0"], admitted
        await clock.finish(asyncio.gather(*waiting, late), within_s=1.0)
        assert admitted == ["w0", "w1", "w2", "tip-1"], admitted
        assert limit.queued == 0 and limit.in_flight == 0

    asyncio.run(main())


def test_a_cancelled_wait_leaves_the_queue_and_a_cancelled_admission_frees_its_place() -> None:
    async def main() -> None:
        clock = FakeClock()
        limit = CallLimit(16, clock=clock, sleep=clock.sleep, stuck_after_s=5.0)
        cut_to_one(limit, clock)
        holder = await limit.acquire("a")
        first = asyncio.ensure_future(limit.acquire("b"))
        second = asyncio.ensure_future(limit.acquire("c"))
        await clock.run_for(0.1)
        limit.release(holder)  # admits b ...
        first.cancel()  # ... whose caller is cancelled before it runs: c gets the place
        await asyncio.gather(first, return_exceptions=True)
        await clock.run_for(0.01)
        assert second.done() and limit.in_flight == 1 and limit.queued == 0
        limit.release(second.result())
        assert limit.in_flight == 0

    asyncio.run(main())
