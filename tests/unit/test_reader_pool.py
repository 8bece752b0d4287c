"""Readers that hold many leases, without Ray: packing, re-homing, the byte budget, the first pass.

The Coordinator runs here over in-process readers (``testing.LocalReader`` over a real
``ShardReaderCore``), a fake Kinesis and an in-process lease table, all on one FakeClock with
the readers' blocking calls inline: time passes only as a test drives it, and every bound is on
that clock.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator import CoordinatorCore, pick_reader, pool_size
from kinesis_actors.errors import StartError
from kinesis_actors.reader import TRANSITIONS, ByteBudget, ConsumerState, ReaderSpec, ShardReaderCore
from kinesis_actors.records import Record, StartAt
from kinesis_actors.testing import FakeClock, FakeKinesis, InlineIo, InProcessLeaseStore, LocalReader

STREAM = "s"
LEASE_S, RENEW_S, POLL_S = 1.0, 0.2, 0.1
T = TypeVar("T")


async def until(clock: FakeClock, cond: Callable[[], Any], timeout_s: float, what: str) -> None:
    """Drive ``clock`` in 10 ms steps until ``cond()``; AssertionError after ``timeout_s`` of fake time."""
    await clock.until(cond, within_s=timeout_s, what=what)


async def finish(clock: FakeClock, work: Awaitable[T], timeout_s: float = 60.0) -> T:
    """Drive ``clock`` until ``work`` is done; its result."""
    result: T = await clock.finish(work, within_s=timeout_s)
    return result


class Instance:
    """One instance: a CoordinatorCore whose launcher makes LocalReaders; a recording sink."""

    def __init__(self, kinesis: FakeKinesis, rows: InProcessLeaseStore, *, owner: str = "a", cap: int = 4,
                 start_delay_s: float = 0.05, max_buffered_bytes: int = 64 << 20, fail_starts: int = 0,
                 deliver: Callable[[list[Record]], Any] | None = None, reader_start_timeout_s: float = 5.0,
                 poll_s: float = POLL_S, **stream_kwargs: Any) -> None:
        self.clock = clock = FakeClock()  # the Coordinator's, its readers' and the lease table's
        self.kinesis_delay_s: dict[str, float] = {}  # shard id -> fake seconds each of its Kinesis calls takes
        self.delivered: list[tuple[str, int, float]] = []
        self.batches: list[tuple[str, int, int]] = []  # (shard, first seq, last seq)
        self.readers: list[LocalReader] = []
        self.adds: collections.Counter[str] = collections.Counter()
        self.start_delay_s = start_delay_s
        self.start_delays: list[float] = []  # per reader, in launch order (then start_delay_s)
        self.fail_starts = fail_starts
        kinesis_ = kinesis

        async def record(records: list[Record]) -> None:
            if deliver is not None:
                await deliver(records)
            now = clock()
            self.delivered.extend((r.shard_id, int(r.sequence_number), now) for r in records)
            self.batches.append((records[0].shard_id, int(records[0].sequence_number), int(records[-1].sequence_number)))

        instance = self

        class CountingCore(ShardReaderCore):
            async def add(self, spec: ReaderSpec, lease: Any, *, lease_age_s: float | None = None) -> Any:
                instance.adds[spec.shard_id] += 1
                return await super().add(spec, lease, lease_age_s=lease_age_s)

        def launch(_: int) -> LocalReader:
            if self.fail_starts > 0:
                self.fail_starts -= 1
                raise RuntimeError("the actor could not be created")
            delay = self.start_delays.pop(0) if self.start_delays else self.start_delay_s
            io = InlineIo(clock, threads=4, delay_s=lambda pool, args: self.kinesis_delay_s.get(args[0], 0.0)
                          if pool == "kinesis" else 0.0)  # 4 threads a pool, like ReaderIo(4, 4)
            core = CountingCore(store=rows.peer(clock=clock), deliver=record, kinesis=kinesis_,
                                max_buffered_bytes=max_buffered_bytes, clock=clock, sleep=clock.sleep,
                                io=io)  # type: ignore[arg-type]
            reader = LocalReader(core, start_delay_s=delay, sleep=clock.sleep)
            self.readers.append(reader)
            return reader

        stream = KinesisStream(STREAM, start_at=StartAt.trim_horizon(), lease_poll_interval_s=poll_s,
                               shard_sync_interval_s=5.0, idle_wait_s=0.02, max_idle_wait_s=0.05,
                               max_shards_per_reader=cap, **stream_kwargs)
        table = rows.peer(clock=clock)
        self.core = CoordinatorCore(stream, aws=None, store=table, owner_id=owner,  # type: ignore[arg-type]
                                    lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, launcher=launch,
                                    kinesis=kinesis, call_timeout_s=5.0, reader_start_timeout_s=reader_start_timeout_s,
                                    clock=clock, sleep=clock.sleep)

    def seen(self) -> set[tuple[str, int]]:
        return {(s, q) for s, q, _ in self.delivered}

    def live_readers(self) -> list[LocalReader]:
        return [r for r in self.readers if not r.dead and r.core.shard_ids()]


# ---------------------------------------------------------------------- packing (pure)
@pytest.mark.parametrize(("leases", "cap", "expected"), [
    (0, 64, 2), (1, 64, 2), (64, 64, 2), (65, 64, 3), (128, 64, 3), (1000, 64, 17), (4, 1, 5), (250, 250, 2)])
def test_the_pool_has_room_for_every_lease_and_one_reader_to_spare(leases: int, cap: int, expected: int) -> None:
    assert pool_size(leases, cap) == expected
    # losing any one reader leaves room for every lease
    assert (pool_size(leases, cap) - 1) * cap >= leases


def test_leases_are_packed_evenly_never_past_the_cap_and_only_on_ready_readers() -> None:
    loads = {rid: 0 for rid in (1, 2, 4, 5)}  # the READY readers; reader 3 is still starting
    placed = collections.Counter[int]()
    for _ in range(13):
        rid = pick_reader(loads, 4)
        assert rid is not None and rid != 3, "a reader still starting takes nothing"
        loads[rid] += 1
        placed[rid] += 1
    assert sorted(placed.values()) == [3, 3, 3, 4], "even: no reader two ahead of another"
    while (rid := pick_reader(loads, 4)) is not None:
        loads[rid] += 1
    assert loads == {1: 4, 2: 4, 4: 4, 5: 4}, "filled to the cap, never past it"
    assert pick_reader({1: 2}, 2) is None, "full: nobody has room"


def test_consumer_states_allow_only_the_drawn_transitions() -> None:
    terminal = {s for s in ConsumerState if s.terminal}
    assert terminal == {ConsumerState.SHARD_ENDED, ConsumerState.CLOSED, ConsumerState.HANDED_OVER,
                        ConsumerState.LOST, ConsumerState.FAILED}
    assert all(not TRANSITIONS[s] for s in terminal)
    for state, moves in TRANSITIONS.items():
        if not state.terminal:
            assert {ConsumerState.LOST, ConsumerState.FAILED} <= moves, f"{state} can always be lost or fail"
    assert ConsumerState.PROCESSING not in TRANSITIONS[ConsumerState.SHUTTING_DOWN], "no way back from a stop"


async def run_for(inst: Instance, seconds: float) -> None:
    """Let ``seconds`` of the instance's fake clock pass."""
    await inst.clock.run_for(seconds)


# ---------------------------------------------------------------------- the byte budget
def test_the_budget_never_holds_more_than_its_limit_plus_one_response() -> None:
    rng = random.Random(7)
    budget = ByteBudget(1000, max_response=300)
    in_flight: list[int] = []
    held: list[int] = []
    for _ in range(20_000):
        op = rng.random()
        if op < 0.4 and budget.try_reserve():
            in_flight.append(rng.randint(0, 300))  # what the response will hold
        elif op < 0.7 and in_flight:
            nbytes = in_flight.pop(rng.randrange(len(in_flight)))
            budget.settle(nbytes)
            held.append(nbytes)
        elif held:
            budget.release(held.pop(rng.randrange(len(held))))
        assert budget.used + budget.reserved <= 1000 + 300
        assert budget.used == sum(held)
    assert budget.peak <= 1300


def test_room_given_back_is_granted_to_the_waiters_in_arrival_order_and_newcomers_queue_behind() -> None:
    """Ten fetches wait on a full budget; each fetch that comes back empty makes room for
    one more, which is reserved for the first waiter before it runs (only it wakes), and a
    fetch arriving while others wait gets no room ahead of them."""
    async def scenario() -> None:
        budget = ByteBudget(1000, max_response=300)
        assert budget.try_reserve() and budget.try_reserve() and budget.try_reserve()
        woken: list[int] = []

        async def fetch(i: int) -> None:
            await budget.reserve(heartbeat_s=None)
            woken.append(i)

        tasks = [asyncio.create_task(fetch(i)) for i in range(10)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert budget.queued == 10 and budget.waits == 10
        for n in range(1, 4):
            budget.settle(0)  # one fetch came back empty: room for one, granted to the head
            assert not budget.try_reserve(), "a newcomer does not jump the queue"
            for _ in range(3):
                await asyncio.sleep(0)
            assert woken == list(range(n)), woken
        assert budget.reserved == 900 and budget.queued == 7
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert budget.queued == 0, "a cancelled wait leaves the queue"
        budget.settle(0)
        assert budget.try_reserve(), "with nobody queued, room is taken at once"

    asyncio.run(scenario())


def test_a_queued_fetch_keeps_its_place_across_heartbeats_while_shards_at_the_tip_cycle() -> None:
    """One shard queues behind a full budget while two others keep fetching and coming back
    empty (shards at the tip). Its heartbeats (tick) must not cost its place: the first room
    given back is its own, however often the others come back."""
    clock = FakeClock()

    async def scenario() -> None:
        budget = ByteBudget(600, max_response=300, sleep=clock.sleep)
        assert budget.try_reserve() and budget.try_reserve()  # the two shards at the tip
        ticks: list[float] = []
        waiter = asyncio.create_task(budget.reserve(heartbeat_s=0.25, tick=lambda: ticks.append(clock())))
        await clock.run_for(1.0)  # queued, ticking
        assert len(ticks) >= 3 and budget.queued == 1
        budget.settle(0)  # a tip shard comes back empty ...
        assert not budget.try_reserve(), "... and cannot fetch again ahead of the queued shard"
        await clock.run_for(0.1)
        assert waiter.done(), "the queued shard was granted the first room given back"
        assert budget.reserved == 600 and budget.queued == 0

    asyncio.run(scenario())


def test_a_wait_on_the_budget_ticks_each_heartbeat_and_a_cancelled_grant_goes_to_the_next() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        budget = ByteBudget(300, max_response=300, sleep=clock.sleep)
        assert budget.try_reserve()
        ticks: list[float] = []
        first = asyncio.create_task(budget.reserve(heartbeat_s=0.5, tick=lambda: ticks.append(clock())))
        second = asyncio.create_task(budget.reserve(heartbeat_s=0.5))
        await clock.run_for(1.6)
        assert len(ticks) == 3 and budget.queued == 2, (ticks, budget.queued)
        budget.settle(0)  # room for one: granted to the first waiter
        first.cancel()  # which is cancelled before it runs: its room goes to the second
        await asyncio.gather(first, return_exceptions=True)
        await clock.run_for(0.01)
        assert second.done() and budget.reserved == 300 and budget.queued == 0

    asyncio.run(scenario())


def test_a_stalled_sink_bounds_what_a_reader_holds_and_keeps_every_lease() -> None:
    """20 shards of 64 KiB records behind a sink that does not acknowledge: the reader holds
    at most its budget plus one response, nobody loses a lease, and once the sink recovers
    every record arrives."""
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(20), InProcessLeaseStore()
        kinesis.publish(40, data=b"x" * 65536)
        gate = asyncio.Event()

        async def stalled(records: list[Record]) -> None:
            await gate.wait()

        limit = 1 << 20
        inst = Instance(kinesis, rows, cap=32, max_buffered_bytes=limit, deliver=stalled, max_records=5)
        await finish(inst.clock, inst.core.start(10))
        counters = {lease.shard_id: lease.counter for lease in rows.list(STREAM)}
        await run_for(inst, 3 * LEASE_S)  # a stall of three lease durations
        reader = inst.live_readers()[0]
        budget = reader.core.budget
        largest = 5 * (65536 + 1)  # one response: max_records records
        assert budget.peak <= limit + largest, (budget.peak, limit)
        assert budget.waits > 0, "fetching waited for room"
        rows_now = rows.list(STREAM)
        assert all(lease.owner == "a" for lease in rows_now), "no lease changed owner during the stall"
        assert all(lease.counter > counters[lease.shard_id] for lease in rows_now), "every lease was renewed"
        assert inst.core.counters["leases_lost"] == 0
        gate.set()
        await until(inst.clock, lambda: len(inst.seen()) == 20 * 40, 20, "every record after the stall")
        assert budget.peak <= limit + largest
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


def test_a_stuck_get_records_holds_up_no_other_shard() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(6), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=8)
        await finish(inst.clock, inst.core.start(10))
        stuck = "shardId-000000000000"
        inst.kinesis_delay_s[stuck] = 0.4 * LEASE_S  # every call on it answers late, holding a Kinesis thread
        t0 = inst.clock()
        for _ in range(10):
            kinesis.publish(1)
            await run_for(inst, 0.05)
        others = [sid for sid in kinesis.shards if sid != stuck]
        await until(inst.clock, lambda: all((sid, 10) in inst.seen() for sid in others), 2.0, "the other shards delivering")
        assert inst.clock() - t0 < 1.5
        assert inst.core.counters["leases_lost"] == 0
        inst.kinesis_delay_s[stuck] = 0.0
        await until(inst.clock, lambda: (stuck, 10) in inst.seen(), 5, "the slow shard catching up")
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


# ---------------------------------------------------------------------- re-homing
def test_a_dead_readers_leases_reopen_on_live_readers_at_once_under_the_same_owner() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(9, records=20), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=4, start_delay_s=0.05)
        await finish(inst.clock, inst.core.start(10))
        assert len(inst.readers) == pool_size(9, 4) == 4
        await until(inst.clock, lambda: len(inst.seen()) == 9 * 20, 5, "the first records")
        victim = max(inst.live_readers(), key=lambda r: len(r.core.shard_ids()))
        moved = victim.core.shard_ids()
        assert len(moved) >= 2, "the victim holds several shards"
        before = {sid: rows.get(STREAM, sid).counter for sid in moved}
        inst.start_delay_s = 2.0  # the replacement reader takes long to start: nobody waits for it
        victim.kill()
        kinesis.publish(5)
        # bounded well below the replacement's 2 s start, so they cannot have waited for it (bench measures the time)
        await until(inst.clock, lambda: all((sid, 25) in inst.seen() for sid in moved), 1.0, "the moved shards delivering")
        assert inst.readers[-1].start_delay_s == 2.0, "the replacement was still starting"
        for sid in moved:
            row = rows.get(STREAM, sid)
            assert row.owner == "a" and row.counter > before[sid], "re-taken under the same owner: fenced"
        assert inst.core.counters["readers_replaced"] == 1
        assert inst.core.counters["shards_rehomed"] == len(moved)
        assert all(inst.adds[sid] == 2 for sid in moved), "each moved shard opened once more, not twice"
        await until(inst.clock, lambda: len(inst.seen()) == 9 * 25, 5, "every shard's new records")
        per_shard = collections.defaultdict(list)
        for s, q, _ in inst.delivered:
            per_shard[s].append(q)
        for sid, seqs in per_shard.items():
            assert sorted(set(seqs)) == list(range(1, 26)), f"{sid}: no gap"
        await until(inst.clock, lambda: sum(1 for r in inst.readers if not r.dead) == 4 and inst.readers[-1].start_delay_s == 0,
                    5, "the pool restored")
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


def test_two_readers_dying_at_once_rehome_every_lease_without_waiting_for_a_poll() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(6, records=5), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=4, poll_s=30.0)  # no lease poll comes to the rescue
        await finish(inst.clock, inst.core.start(10))
        await until(inst.clock, lambda: len(inst.seen()) == 30, 5, "the first records")
        holders = sorted(inst.live_readers(), key=lambda r: -len(r.core.shard_ids()))[:2]
        moved = sorted(sid for r in holders for sid in r.core.shard_ids())
        for r in holders:
            r.kill()  # the second dies before the first one's leases are placed
        kinesis.publish(3)
        await until(inst.clock, lambda: all((sid, 8) in inst.seen() for sid in moved), 3.0, "every moved shard delivering")
        assert all(rows.get(STREAM, sid).owner == "a" for sid in moved)
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


def test_a_lease_poll_during_a_slow_rehome_never_takes_the_shard_twice() -> None:
    """The cause of two redelivered batches after a node loss: while a dead reader's lease
    was being reopened, a lease poll took the same row again (its counter rose, the reopened
    consumer lost the lease and its batch was delivered again). Caught by the redelivery bound
    (a poll that re-takes leases not yet OPEN fails it on 19 of 20 seeds); every open is also
    checked as it starts: no live reader holds the shard or is opening it. A respread may move
    a re-homed shard to the replacement reader once that is ready: a third open, after the
    source stopped, which both checks allow."""
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(4), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=2)
        await finish(inst.clock, inst.core.start(10))
        sleep = inst.clock.sleep
        opening: collections.Counter[str] = collections.Counter()
        second_opens: list[tuple[str, float]] = []
        for reader in inst.readers:  # every open from now on is slow: several polls pass meanwhile
            original = reader.core.add

            async def slow_add(spec: Any, lease: Any, original: Any = original, **kw: Any) -> Any:
                if opening[spec.shard_id] or any(not r.dead and spec.shard_id in r.core.shard_ids()
                                                 for r in inst.readers):
                    second_opens.append((spec.shard_id, inst.clock()))
                opening[spec.shard_id] += 1
                try:
                    await sleep(5 * POLL_S)
                    return await original(spec, lease, **kw)
                finally:
                    opening[spec.shard_id] -= 1

            reader.core.add = slow_add  # type: ignore[method-assign]
        victim = inst.live_readers()[0]
        moved = victim.core.shard_ids()
        victim.kill()
        for _ in range(12):
            kinesis.publish(1)
            await run_for(inst, POLL_S)
        await until(inst.clock, lambda: all((sid, 12) in inst.seen() for sid in moved), 5, "the moved shards delivering")
        assert not second_opens, f"opened while a live reader held or was opening it: {second_opens}"
        assert all(inst.adds[sid] >= 2 for sid in moved), dict(inst.adds)
        live = [r for r in inst.readers if not r.dead]
        hosts = collections.Counter(sid for r in live for sid in r.core.shard_ids())
        assert all(n == 1 for n in hosts.values()), f"one consumer per shard: {hosts}"
        redelivered = collections.Counter(s for s, _, _ in inst.delivered) - collections.Counter(
            s for s, _ in inst.seen())
        assert all(redelivered[sid] <= 1 for sid in moved), redelivered
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


# ---------------------------------------------------------------------- the first pass
def test_the_first_pass_waits_for_slow_readers_within_its_deadline() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(6, records=3), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=3, start_delay_s=0.8)
        t0 = inst.clock()
        await finish(inst.clock, inst.core.start(10))
        assert inst.clock() - t0 >= 0.8, "it waited for the readers"
        assert sorted(inst.core.held()) == sorted(kinesis.shards)
        await until(inst.clock, lambda: len(inst.seen()) == 18, 5, "every record")
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


def test_readers_slower_than_their_start_timeout_are_waited_for_while_another_reader_answered() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(6, records=2), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=2, reader_start_timeout_s=0.2)
        inst.start_delays = [0.02, 0.8, 0.8, 0.8]  # a pool of 4; three take 4x their start timeout
        await finish(inst.clock, inst.core.start(10))
        assert sorted(inst.core.held()) == sorted(kinesis.shards)
        assert inst.core.counters["reader_start_failures"] == 0, "slow is not failed"
        assert len(inst.readers) == 4 and not any(r.dead for r in inst.readers), "none killed and started again"
        await until(inst.clock, lambda: len(inst.seen()) == 12, 5, "every record")
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


def test_the_first_pass_spreads_the_leases_over_every_reader_it_started() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(4), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=64)
        inst.start_delays = [0.05, 0.6]  # the second reader is slower to start
        await finish(inst.clock, inst.core.start(10))
        assert sorted(len(r.core.shard_ids()) for r in inst.readers) == [2, 2], "2 + 2, not 4 + 0"
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


def test_a_first_pass_past_its_deadline_says_how_many_shards_opened_and_why() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(6), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=3, start_delay_s=30.0)
        with pytest.raises(StartError) as err:
            await finish(inst.clock, inst.core.start(0.5))
        assert (err.value.started, err.value.total) == (0, 6)
        assert "0 of 6 shards opened" in str(err.value) and "readers still starting" in str(err.value)
        await finish(inst.clock, inst.core.close())
        assert all(lease.owner is None for lease in rows.list(STREAM)), "what was taken is released"

    asyncio.run(scenario())


def test_readers_that_keep_failing_to_start_end_the_first_pass_early_with_the_cause() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(2), InProcessLeaseStore()
        inst = Instance(kinesis, rows, fail_starts=100)
        t0 = inst.clock()
        with pytest.raises(StartError, match="could not be created"):
            await finish(inst.clock, inst.core.start(60))
        assert inst.clock() - t0 < 10, "no waiting for the whole deadline"
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


def test_a_reader_that_fails_to_start_is_retried_and_nothing_is_lost() -> None:
    async def scenario() -> None:
        kinesis, rows = FakeKinesis(4, records=5), InProcessLeaseStore()
        inst = Instance(kinesis, rows, cap=4, fail_starts=1)  # 1 of the first 2 readers fails
        await finish(inst.clock, inst.core.start(10))
        assert inst.core.counters["reader_start_failures"] == 1
        await until(inst.clock, lambda: len(inst.seen()) == 20, 5, "every record on the reader that started")
        await until(inst.clock, lambda: sum(1 for r in inst.readers if not r.dead) >= 2, 5, "the failed reader retried")
        await finish(inst.clock, inst.core.close())

    asyncio.run(scenario())


def test_250_leases_in_one_process_are_each_renewed_on_time_while_one_store_call_hangs() -> None:
    """Each lease is renewed by its own conditional write every renew interval; with 250 in
    one reader and one lease's store calls taking 1.5 s, every other lease still renews
    within renew_interval_s + 1 s of its previous renewal. On a fake clock: store calls run
    inline, 16 at a time (the store pool's threads), the slow one holding its place for 1.5 s
    of fake time."""
    renew_s, lease_s, shards = 0.5, 3.0, 250
    slow_shard = "shardId-000000000007"
    clock = FakeClock()
    kinesis, rows = FakeKinesis(shards), InProcessLeaseStore(clock=clock)
    writes: dict[str, list[float]] = collections.defaultdict(list)

    class Timed(InProcessLeaseStore):
        def renew(self, lease: Any, **kw: Any) -> Any:
            new = super().renew(lease, **kw)
            writes[lease.shard_id].append(clock())
            return new

    def slow(pool: str, args: tuple[Any, ...]) -> float:  # one slow DynamoDB call, every time
        return 1.5 if pool == "store" and args and getattr(args[0], "shard_id", None) == slow_shard else 0.0

    async def scenario() -> None:
        store = Timed(rows._rows, clock=clock)

        async def deliver(records: list[Record]) -> None: ...

        core = ShardReaderCore(store=store, deliver=deliver, kinesis=kinesis, clock=clock, sleep=clock.sleep,
                               io=InlineIo(clock, delay_s=slow, threads=16))  # type: ignore[arg-type]
        spec = dict(stream=STREAM, owner_id="a", start_at=StartAt.trim_horizon(), lease_duration_s=lease_s,
                    renew_interval_s=renew_s, idle_wait_s=0.25, max_idle_wait_s=1.0)
        for sid in kinesis.shards:
            lease = rows.take(STREAM, sid, owner="a", duration_s=lease_s)
            adding = asyncio.ensure_future(core.add(ReaderSpec(shard_id=sid, **spec), lease))  # type: ignore[arg-type]
            while not adding.done():
                await clock.run_for(0.01)
            assert adding.result().state == "processing"
        t0 = clock()
        await clock.run_for(6 * renew_s, step_s=0.02)  # the observation window
        gaps = {sid: max(b - a for a, b in zip([t0, *w], [*w, clock()]))
                for sid, w in writes.items() if sid != slow_shard}
        assert len(gaps) == shards - 1
        worst = max(gaps.values())
        assert worst <= renew_s + 1.0, f"a lease waited {worst:.2f} s between renewals"
        assert all(s["state"] == "processing" for s in core.stats()["shards"].values()), "no lease lost"
        assert len(writes[slow_shard]) >= 1, "the slow lease renews too, just late"
        closing = asyncio.ensure_future(core.close(release=False))
        while not closing.done():
            await clock.run_for(0.05)

    asyncio.run(scenario())
