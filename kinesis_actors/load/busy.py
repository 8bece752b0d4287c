"""How busy a reader's event loop is: the fraction of wall time it was not waiting in ``select``.

A reader's shards, its record filter and its sink calls all run on one asyncio event loop (one
thread, one GIL). When that loop never waits for I/O it is saturated: more shards on it only
queue, however few cores the OS gives the process. Process CPU alone cannot tell this apart on
a busy node: a saturated reader on 2 cores shared with other work was measured using 0.5 cores,
under a 0.6 target, while its loop never idled. The busy fraction does: wall time counts the
time the loop's thread waited for a core or for the GIL as busy, since the loop had work.

How it is measured: :class:`TimedSelector` wraps the loop's selector and adds up the time spent
inside ``select()`` calls that may wait (a timeout other than 0: asyncio polls with 0 while
callbacks are ready, which is not a wait); busy seconds are wall seconds minus those. Each loop
iteration calls ``select()`` once, so the cost is two clock reads, a subtraction and an addition
per waiting iteration, O(1), whatever the number of shards: measured +0.11 us on an iteration of
3.1 us that waits on a timer and +0.03 us on one of 2.0 us that only polls (``python -m
bench.loop_busy``: medians of 5 x 200,000 iterations of an empty loop, with and without the
wrapper; 2 cores at load average 4.9), with a wrapper that also made two attribute stores per
timed call: an upper bound for this one. A reader's iteration runs a fetch, a delivery or a
filter: far longer.
A periodic lag probe (a timer on the loop, its lateness sampled) was not chosen: it wakes an
idle loop on every probe, its lateness depends on how long the callbacks queued ahead of it take
rather than on the share of time they fill, and its resolution is its period.

Relied on: CPython's :class:`asyncio.BaseSelectorEventLoop` (the default loop) keeps its
:mod:`selectors` selector in the attribute ``_selector`` and waits for I/O and timers only through
``_selector.select(timeout)``. Ray 2.60 runs an async actor on ``asyncio.new_event_loop()``, or on
uvloop when uvloop is installed (``ray[serve]`` brings it) and ``RAY_USE_UVLOOP`` is not ``0``
(``ray._private.async_compat.get_new_event_loop``). A loop without a selector to wrap (uvloop, the
Windows proactor) is left alone: the figure is then unknown (None) and decisions use CPU alone.
"""

from __future__ import annotations

import asyncio
import logging
import selectors
from typing import Any

from ..clock import Clock, monotonic_s
from .window import WindowRate

__all__ = ["TimedSelector", "LoopBusyMeter", "BUSY_SATURATED"]

log = logging.getLogger("kinesis_actors.load")

BUSY_SATURATED = 0.9
"""Fraction of wall time: a reader whose event loop was busy at least this much of a whole
``load_window_s`` is saturated, whatever its CPU figure (the loop has no room for more shards)."""


class TimedSelector(selectors.BaseSelector):
    """A selector that delegates to ``inner`` and adds up the seconds spent in ``select()``.

    Args:
        inner: the loop's selector.
        clock: monotonic seconds (the meter's clock).

    Attributes:
        idle_s: seconds spent inside ``select()`` calls with a timeout other than 0 so far. Read
            on the loop's own thread (as :class:`LoopBusyMeter` does), no call is under way then.
    """

    def __init__(self, inner: selectors.BaseSelector, clock: Clock = monotonic_s) -> None:
        self.inner, self._clock = inner, clock
        self.idle_s = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """``inner.select(timeout)``, timed unless ``timeout`` is 0: asyncio polls with 0 when
        callbacks are ready to run, so that call is not a wait (the loop is busy)."""
        if timeout == 0:
            return self.inner.select(0)
        start = self._clock()
        try:
            return self.inner.select(timeout)
        finally:
            self.idle_s += self._clock() - start

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        """As ``inner.register``."""
        return self.inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        """As ``inner.unregister``."""
        return self.inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        """As ``inner.modify``."""
        return self.inner.modify(fileobj, events, data)

    def close(self) -> None:
        """As ``inner.close``."""
        self.inner.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        """As ``inner.get_key`` (KeyError if ``fileobj`` is not registered)."""
        return self.inner.get_key(fileobj)

    def get_map(self) -> Any:
        """As ``inner.get_map``."""
        return self.inner.get_map()


class LoopBusyMeter:
    """The busy fraction (0..1) of one event loop, averaged over ``window_s``.

    :meth:`attach` wraps the loop's selector once (later calls with the same loop do nothing);
    :meth:`sample` then gives busy seconds per wall second over the last window, or None before
    a full window or on a loop that could not be wrapped.

    Args:
        window_s: the window, seconds (``load_window_s``).
        clock: monotonic seconds (the selector's timer too).
    """

    def __init__(self, window_s: float, *, clock: Clock = monotonic_s) -> None:
        self._rate = WindowRate(window_s)
        self._clock = clock
        self.selector: TimedSelector | None = None
        self._loop: Any = None
        self._attached_at = 0.0

    def attach(self, loop: Any) -> bool:
        """Time ``loop``'s waits from now on; True if they are timed (see the module docstring
        for the loops that cannot be). The same loop again: nothing changes. Another loop: it
        is timed instead and the window starts again. A loop whose selector is a
        :class:`TimedSelector` already (another meter's) keeps it: never a wrapper on a wrapper."""
        if self._loop is loop:
            return self.selector is not None
        self._loop, self.selector = loop, None
        inner = getattr(loop, "_selector", None)
        if not isinstance(inner, selectors.BaseSelector):
            log.info("event loop %s has no selector to time: the reader's loop_busy figure stays unknown",
                     type(loop).__name__)
            return False
        self.selector = inner if isinstance(inner, TimedSelector) else TimedSelector(inner, self._clock)
        loop._selector = self.selector
        self._attached_at = self._clock()
        self._rate = WindowRate(self._rate.window_s)
        return True

    def attach_running(self) -> bool:
        """:meth:`attach` the running loop; False outside one."""
        try:
            return self.attach(asyncio.get_running_loop())
        except RuntimeError:
            return False

    def sample(self) -> float | None:
        """Sample now: the busy fraction over the last window (0..1), or None (no full window yet,
        or no loop timed). Called on the timed loop's thread (never during its ``select()``)."""
        if self.selector is None:
            return None
        now = self._clock()
        self._rate.add(now, (now - self._attached_at) - self.selector.idle_s)
        rate = self._rate.rate()
        return None if rate is None else min(1.0, max(0.0, rate))
