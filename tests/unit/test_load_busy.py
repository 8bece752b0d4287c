"""The event loop's busy fraction (LoopBusyMeter, TimedSelector) and the saturation rule that reads it
(LoadPlacer.load): injected clocks and selectors, no Ray."""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

from kinesis_actors.load import BUSY_SATURATED, LoadFigures, LoadPlacer, LoopBusyMeter, ReaderLoad, ShardLoad, TimedSelector

W = 2.0


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class WaitingSelector(selectors.DefaultSelector):
    """A real selector whose select() advances the fake clock by the time it "waits"."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock, self.wait_s = clock, 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.clock.t += self.wait_s
        return []


class FakeLoop:
    def __init__(self, selector: selectors.BaseSelector | None) -> None:
        self._selector = selector


def run_loop(clock: Clock, sel: Any, *, busy_s: float, idle_s: float, seconds: float) -> None:
    """Iterate like asyncio's _run_once: wait in select (idle_s), then run callbacks (busy_s)."""
    end = clock.t + seconds
    inner = sel.inner
    while clock.t < end - 1e-9:
        inner.wait_s = idle_s
        sel.select(1.0)
        clock.t += busy_s


def test_busy_fraction_is_wall_time_outside_select_over_the_last_window() -> None:
    clock = Clock()
    loop = FakeLoop(WaitingSelector(clock))
    meter = LoopBusyMeter(W, clock=clock)
    assert meter.attach(loop) and isinstance(loop._selector, TimedSelector)
    assert meter.sample() is None  # no full window yet
    run_loop(clock, loop._selector, busy_s=0.125, idle_s=0.375, seconds=W)  # binary fractions: exact windows
    assert meter.sample() == 0.25
    run_loop(clock, loop._selector, busy_s=0.25, idle_s=0.0, seconds=W)  # a loop that never waits
    assert meter.sample() == 1.0
    run_loop(clock, loop._selector, busy_s=0.0, idle_s=0.25, seconds=W)  # an idle loop
    assert meter.sample() == 0.0


def test_attach_wraps_once_and_a_loop_without_a_selector_stays_unknown() -> None:
    clock = Clock()
    loop = FakeLoop(WaitingSelector(clock))
    meter = LoopBusyMeter(W, clock=clock)
    assert meter.attach(loop) and meter.attach(loop)
    assert isinstance(loop._selector, TimedSelector) and not isinstance(loop._selector.inner, TimedSelector)
    timed = loop._selector
    assert LoopBusyMeter(W, clock=clock).attach(loop) and loop._selector is timed  # a second meter: no second wrapper
    other = LoopBusyMeter(W, clock=clock)
    assert not other.attach(FakeLoop(None))
    clock.t += 2 * W
    assert other.sample() is None


def test_a_poll_with_timeout_0_is_not_a_wait() -> None:
    """asyncio polls select(0) while callbacks are ready: that time is busy."""
    clock = Clock()
    inner = WaitingSelector(clock)
    sel = TimedSelector(inner, clock)
    inner.wait_s = 0.5
    sel.select(0)
    assert sel.idle_s == 0.0
    sel.select(None)
    assert sel.idle_s == 0.5


def test_a_real_asyncio_loop_measures_idle_waits_and_busy_callbacks() -> None:
    async def main() -> tuple[float | None, float | None]:
        figures = LoadFigures(0.2, busy=LoopBusyMeter(0.2))
        reader: dict[str, Any] = {}
        figures.annotate(reader, {})
        await asyncio.sleep(0.3)  # the loop waits in select
        figures.annotate(reader, {})
        idle = reader["loop_busy"] if reader["loop_busy_known"] else None
        loop = asyncio.get_running_loop()
        end = loop.time() + 0.3
        while loop.time() < end:  # callbacks back to back: select(0) only
            await asyncio.sleep(0)
        figures.annotate(reader, {})
        return idle, reader["loop_busy"] if reader["loop_busy_known"] else None

    idle, busy = asyncio.run(main())
    assert idle is not None and idle < 0.5
    assert busy is not None and busy > 0.8


def shard(sid: str, records_per_s: float) -> ShardLoad:
    return ShardLoad(sid, bytes_per_s=records_per_s * 100, records_per_s=records_per_s)


def test_a_reader_whose_loop_never_idles_sheds_although_its_cpu_is_under_the_target() -> None:
    """A shared node gives the saturated reader 0.5 cores (under 0.6): its busy loop decides."""
    p = LoadPlacer(target_cpu=0.6, max_readers=None, max_shards_per_reader=128, load_window_s=W)
    hot = ReaderLoad(1, 0.5, (shard("a", 1000), shard("b", 1000)), busy=1.0)
    plan = p.plan([hot, ReaderLoad(2, 0.01, (shard("c", 1),), busy=0.02)], now=100.0)
    assert [(m.shard_id, m.source, m.target) for m in plan.moves] == [("b", 1, 2)]
    assert p.load(hot) == 0.6 / BUSY_SATURATED


def test_the_same_cpu_without_a_busy_loop_or_busy_figure_moves_nothing() -> None:
    for busy in (0.5, None):
        p = LoadPlacer(target_cpu=0.6, max_readers=None, max_shards_per_reader=128, load_window_s=W)
        readers = [ReaderLoad(1, 0.5, (shard("a", 1000), shard("b", 1000)), busy=busy),
                   ReaderLoad(2, 0.01, (shard("c", 1),), busy=busy)]
        assert p.plan(readers, now=100.0).moves == ()
        assert p.load(readers[0]) == 0.5  # busy/0.9 x 0.6 = 0.33 < cpu: the CPU decides


def test_the_busy_rule_keeps_the_cpu_target_when_a_core_is_free() -> None:
    """Uncontended, the loop's busy share is about its CPU: the CPU passes the target first."""
    p = LoadPlacer(target_cpu=0.6, max_readers=None, max_shards_per_reader=128, load_window_s=W)
    for cpu in (0.3, 0.59, 0.61, 0.9):
        assert p.load(ReaderLoad(1, cpu, busy=cpu)) == cpu
    assert p.load(ReaderLoad(1, None, busy=1.0)) is None  # the CPU window decides when the figures start
    none = LoadPlacer(target_cpu=None, max_readers=None, max_shards_per_reader=128, load_window_s=W)
    assert none.load(ReaderLoad(1, 0.2, busy=1.0)) == 0.2
