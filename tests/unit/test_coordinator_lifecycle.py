"""CoordinatorCore's lifecycle without Ray: one state enum, its transition table, task sets closed as a whole."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from kinesis_actors.coordinator import CoordinatorState
from kinesis_actors.coordinator.lifecycle import TRANSITIONS, Lifecycle
from kinesis_actors.coordinator.tasks import TaskSet
from kinesis_actors.errors import KinesisError
from kinesis_actors.testing import FakeKinesis, InProcessLeaseStore

from .test_coordinator_poll import core_over

S = CoordinatorState


def test_the_table_lists_every_state_and_only_the_two_ends_are_terminal() -> None:
    assert set(TRANSITIONS) == set(CoordinatorState)
    assert {s for s in CoordinatorState if s.terminal} == {S.CLOSED, S.FAILED}
    for moves in TRANSITIONS.values():
        assert moves <= set(CoordinatorState)


def test_a_move_outside_the_table_raises_and_changes_nothing() -> None:
    life = Lifecycle("s")
    with pytest.raises(RuntimeError, match="new -> running"):
        life.move(S.RUNNING)
    assert life.state is S.NEW and not life.closing
    life.move(S.STARTING)
    life.move(S.RUNNING)
    assert life.running and not life.closing
    life.move(S.CLOSING)
    assert life.closing and not life.running
    life.move(S.CLOSED)
    assert life.closing
    with pytest.raises(RuntimeError):
        life.move(S.CLOSING)


def test_start_then_close_walks_new_starting_running_closing_closed() -> None:
    kinesis, opened = FakeKinesis(2), {}

    async def scenario() -> None:
        core = core_over(InProcessLeaseStore(), kinesis, opened)
        assert core.lifecycle.state is S.NEW
        await core.start(timeout_s=10)
        assert core.lifecycle.state is S.RUNNING
        assert core.pool.closing is False and core.placements.closing is False
        close = asyncio.ensure_future(core.close())
        await asyncio.sleep(0)
        assert core.lifecycle.state is S.CLOSING
        assert core.pool.closing and core.placements.closing, "the parts read the one state"
        await close
        assert core.lifecycle.state is S.CLOSED and core.error() is None
        await core.close()  # a second close waits for the same one and moves nothing
        assert core.lifecycle.state is S.CLOSED
        assert await core.wait(1)

    asyncio.run(scenario())


def test_a_fatal_error_parks_and_ends_in_failed() -> None:
    kinesis, opened = FakeKinesis(2), {}

    async def scenario() -> None:
        core = core_over(InProcessLeaseStore(), kinesis, opened)
        await core.start(timeout_s=10)
        error = KinesisError("the sink gave up")
        await core.fail(error)
        assert core.lifecycle.closing
        assert await core.wait(10)
        assert core.lifecycle.state is S.FAILED
        assert core.error() is error, "parked for the next public call"
        assert not core.pool.starts.running() and not core.placements.opens.running()

    asyncio.run(scenario())


def test_a_task_set_cancels_and_awaits_every_task_it_holds() -> None:
    async def scenario() -> None:
        counters: dict[str, Any] = {}
        tasks, ended = TaskSet(counters), []

        async def forever(n: int) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                ended.append(n)

        for n in range(3):
            tasks.spawn(forever(n), "the name is for the log only")
        await asyncio.sleep(0)
        assert len(tasks.running()) == 3
        await tasks.cancel()
        assert sorted(ended) == [0, 1, 2] and not tasks.running()
        assert counters["task_errors"] == 0

    asyncio.run(scenario())


def test_the_tick_runs_each_part_when_due_never_twice_at_once_and_counts_failures() -> None:
    from kinesis_actors.coordinator.tick import Tick
    from kinesis_actors.testing import FakeClock

    async def scenario() -> None:
        clock, life, counters = FakeClock(), Lifecycle("s"), {}
        fatal: list[BaseException] = []
        runs = {"slow": 0, "flaky": 0, "early": 0}
        release = asyncio.Event()

        async def slow() -> None:
            runs["slow"] += 1
            await release.wait()

        async def flaky() -> None:
            runs["flaky"] += 1
            raise ValueError("the table throttled")

        async def early() -> None:
            runs["early"] += 1

        async def on_fatal(e: BaseException) -> None:
            fatal.append(e)

        tick = Tick("s", lifecycle=life, clock=clock, sleep=clock.sleep, counters=counters, on_fatal=on_fatal)
        tick.add("slow", slow, lambda: 1.0, first_in_s=0.0)
        tick.add("flaky", flaky, lambda: 1.0, first_in_s=0.5)
        tick.add("early", early, lambda: 1.0, first_in_s=0.0, before_running=True)
        life.move(S.STARTING)
        tick.start()
        await clock.run_for(2.05)
        assert runs == {"slow": 0, "flaky": 0, "early": 3}, "only before_running parts while STARTING"
        life.move(S.RUNNING)
        tick.due_now()
        await clock.run_for(3.0)
        assert runs["slow"] == 1, "a part still running is not started again when due"
        assert runs["flaky"] >= 3 and counters["step_failures"] == runs["flaky"] and not fatal
        release.set()
        await clock.run_for(1.0)
        assert runs["slow"] >= 2, "its next round starts once it is done"
        await tick.stop()
        assert not tick.steps.running()

    asyncio.run(scenario())


def test_a_part_is_spaced_by_the_interval_its_own_run_measured() -> None:
    """The lease poll spaces itself by its last read's time: the gap after a run is the interval
    as that run left it (a slow read spaces the next poll; the first fast read after it, the one
    after), not the interval before the run."""
    from kinesis_actors.coordinator.tick import Tick
    from kinesis_actors.testing import FakeClock

    async def scenario() -> None:
        clock, life, counters = FakeClock(), Lifecycle("s"), {}
        starts: list[float] = []
        spacing = [1.0]

        async def poll() -> None:
            starts.append(clock())
            spacing[0] = 5.0 if len(starts) == 1 else 1.0  # the first read was slow, the others fast

        async def on_fatal(e: BaseException) -> None:
            raise AssertionError(e)

        tick = Tick("s", lifecycle=life, clock=clock, sleep=clock.sleep, counters=counters, on_fatal=on_fatal)
        tick.add("poll", poll, lambda: spacing[0], first_in_s=0.0, before_running=True)
        life.move(S.STARTING)
        tick.start()
        await clock.run_for(7.5)
        gaps = [round(b - a, 1) for a, b in itertools.pairwise(starts)]  # the fake clock naps in 10 ms steps
        assert gaps == [5.0, 1.0, 1.0], gaps
        await tick.stop()

    asyncio.run(scenario())


def test_due_now_during_a_run_runs_the_part_again_as_that_run_ends() -> None:
    """A shard ended while a lease poll was under way: the poll asked for at once runs right after
    the one under way, not a whole interval later."""
    from kinesis_actors.coordinator.tick import Tick
    from kinesis_actors.testing import FakeClock

    async def scenario() -> None:
        clock, life, counters = FakeClock(), Lifecycle("s"), {}
        starts: list[float] = []

        async def poll() -> None:
            starts.append(clock())
            if len(starts) == 1:
                tick.due_now("poll")  # asked for while this run is under way
                await clock.sleep(0.5)

        async def on_fatal(e: BaseException) -> None:
            raise AssertionError(e)

        tick = Tick("s", lifecycle=life, clock=clock, sleep=clock.sleep, counters=counters, on_fatal=on_fatal)
        tick.add("poll", poll, lambda: 10.0, first_in_s=0.0, before_running=True)
        life.move(S.STARTING)
        tick.start()
        await clock.run_for(2.0)
        assert [round(t - starts[0], 1) for t in starts] == [0.0, 0.5], starts
        await tick.stop()

    asyncio.run(scenario())


def test_a_fatal_error_of_a_part_goes_to_on_fatal_not_to_the_failure_count() -> None:
    from kinesis_actors.coordinator.tick import Tick
    from kinesis_actors.testing import FakeClock

    async def scenario() -> None:
        clock, life, counters = FakeClock(), Lifecycle("s"), {}
        fatal: list[BaseException] = []
        error = KinesisError("a KCL worker holds this table")
        error.fatal = True  # type: ignore[attr-defined]

        async def refuse() -> None:
            raise error

        async def on_fatal(e: BaseException) -> None:
            fatal.append(e)

        tick = Tick("s", lifecycle=life, clock=clock, sleep=clock.sleep, counters=counters, on_fatal=on_fatal)
        tick.add("poll", refuse, lambda: 1.0, first_in_s=0.0, before_running=True)
        life.move(S.STARTING)
        tick.start()
        await clock.run_for(0.5)
        assert fatal == [error] and counters["step_failures"] == 0
        await tick.stop()

    asyncio.run(scenario())
