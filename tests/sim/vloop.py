"""An asyncio event loop on virtual time: when nothing is ready it jumps to the next timer.

Why our own ~50 lines rather than PyPI ``looptime``: the whole simulator's determinism rests on
this loop, and it is easier to reason about a loop whose every line is here. It is the stock
``SelectorEventLoop`` with two changes: :meth:`VirtualLoop.time` reads a virtual clock, and the
selector never blocks and never looks at a file descriptor (nothing in a simulated world uses
one, and no thread calls ``call_soon_threadsafe``): when the loop asks it to wait, it moves the
virtual clock forward by the timeout asked for, the delay to the earliest timer. So
``asyncio.sleep``, ``wait_for`` and ``wait(timeout=)`` all run on virtual time and a simulated
hour takes as long as its callbacks take to run.

Facts relied on (CPython 3.10-3.13 ``BaseEventLoop._run_once``): the loop asks its selector to
wait ``min(earliest timer - time(), 24 h)`` seconds, or 0 when callbacks are ready, or None
(forever) when nothing is scheduled; after the select it runs every timer due before
``time() + clock_resolution``. A ``select(None)`` with nothing ready is a deadlock of the
simulated world (nothing can ever happen again): :class:`Deadlock` is raised.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

__all__ = ["VirtualLoop", "Deadlock"]


class Deadlock(RuntimeError):
    """Nothing ready and no timer scheduled: the simulated world can never move again."""


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """A selector that never blocks; waiting moves :attr:`now` forward instead."""

    def __init__(self, start: float) -> None:
        super().__init__()
        self.now = start

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout == 0:
            return []
        if timeout is None:
            raise Deadlock("nothing ready and no timer scheduled")
        self.now += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """A ``SelectorEventLoop`` whose :meth:`time` is virtual seconds (starting at ``start``).

    Args:
        start: the first reading of :meth:`time`, seconds.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._vsel = _VirtualSelector(start)
        super().__init__(self._vsel)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        """Virtual seconds (moves only while the loop waits for its next timer)."""
        return self._vsel.now


def run(main: Any, *, start: float = 1000.0) -> Any:
    """Run coroutine ``main`` to completion on a new :class:`VirtualLoop`; its result.

    Raises:
        What ``main`` raises; :class:`Deadlock` when the world stops with ``main`` unfinished.
    """
    loop = VirtualLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
