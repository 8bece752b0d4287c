"""The Coordinator's tick: each part's update run when it is due, on the injected clock.

Like Ray Serve's controller loop (``update()`` per tick, each manager in its own
try/except), but each part runs in its own kept task: a slow part never delays another,
and a part still running when due again is not started twice (its next round starts once
it is done). A part that fails is logged, counted (``step_failures``) and retried when
next due; an error marked ``fatal`` (e.g. a KCL worker seen live on the table) goes to
``on_fatal`` instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .lifecycle import Lifecycle
from .tasks import Sleep, TaskSet

__all__ = ["Tick"]

log = logging.getLogger("kinesis_actors.coordinator")

Update = Callable[[], Coroutine[Any, Any, None]]


@dataclasses.dataclass
class _Part:
    update: Update
    interval_s: Callable[[], float]  # read as each run ends: a part may space itself out by what it measured
    before_running: bool  # runs while the Coordinator is STARTING too
    due: float = 0.0
    started: float = 0.0


class Tick:
    """Runs the parts of one Coordinator when each is due.

    Args:
        name: the stream name (for the log).
        lifecycle: the Coordinator's; parts other than ``before_running`` ones wait for
            RUNNING, and the loop ends once it is closing.
        clock / sleep: the injected monotonic clock (seconds) and its sleep.
        counters: ``step_failures`` is counted here (``task_errors`` by the step set).
        on_fatal: awaited with an error whose ``fatal`` attribute is true.

    Attributes:
        steps: the parts' runs under way (a :class:`~.tasks.TaskSet`, cancelled by :meth:`stop`).
    """

    def __init__(self, name: str, *, lifecycle: Lifecycle, clock: Callable[[], float], sleep: Sleep,
                 counters: dict[str, int], on_fatal: Callable[[BaseException], Awaitable[None]]) -> None:
        self._name, self._lifecycle, self._clock, self._sleep = name, lifecycle, clock, sleep
        self._counters, self._on_fatal = counters, on_fatal
        counters.setdefault("step_failures", 0)
        self._parts: dict[str, _Part] = {}
        self.steps = TaskSet(counters)
        self._running: dict[str, asyncio.Task[None]] = {}
        self._nudge = asyncio.Event()  # look at what is due now
        self._task: asyncio.Task[None] | None = None

    def add(self, name: str, update: Update, interval_s: Callable[[], float], *, first_in_s: float,
            before_running: bool = False) -> None:
        """Run ``update`` every ``interval_s()`` seconds (start to start; read as each run ends, so
        a run that measured something can space the next one), the first ``first_in_s`` after
        :meth:`start`."""
        self._parts[name] = _Part(update, interval_s, before_running, due=first_in_s)

    @property
    def started(self) -> bool:
        """:meth:`start` was called."""
        return self._task is not None

    def start(self) -> None:
        """Start the loop (a task held here until :meth:`stop`)."""
        now = self._clock()
        for part in self._parts.values():
            part.due += now
        self._task = asyncio.create_task(self._loop(), name=f"coordinator-{self._name}")

    def due_now(self, name: str | None = None) -> None:
        """Look at what is due at once; with ``name``, run that part at once (if it is running,
        again as soon as that run ends)."""
        if name is not None:
            part = self._parts[name]
            part.due = min(part.due, self._clock())
        self._nudge.set()

    async def stop(self) -> None:
        """Cancel the loop and every part's run under way, and wait until they have ended."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.steps.cancel()

    async def _loop(self) -> None:
        while not self._lifecycle.closing:
            now = self._clock()
            self._nudge.clear()
            active = {n: p for n, p in self._parts.items() if self._lifecycle.running or p.before_running}
            for name, part in active.items():
                if now >= part.due and name not in self._running:
                    task = self._running[name] = self.steps.spawn(self._step(name, part.update), f"step-{name}")
                    task.add_done_callback(functools.partial(self._step_done, name))
                    part.started, part.due = now, math.inf  # set as it ends, or by due_now meanwhile
            waits = [p.due for n, p in active.items() if n not in self._running]
            await self._nap(max(0.0, min(waits, default=now + 1.0) - self._clock()))

    def _step_done(self, name: str, _: object) -> None:
        """The next run of ``name`` is due ``interval_s()`` after this one started, read now (the
        lease poll's interval follows the read it just timed, ``last_read_s``, not the one
        before), or at once if :meth:`due_now` asked for it during this run."""
        self._running.pop(name, None)
        part = self._parts[name]
        part.due = min(part.due, part.started + part.interval_s())
        self._nudge.set()

    async def _nap(self, seconds: float) -> None:
        """Sleep ``seconds`` on the injected sleep, or less when nudged."""
        nudged = asyncio.ensure_future(self._nudge.wait())
        nap = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait({nudged, nap}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            nudged.cancel()
            nap.cancel()

    async def _step(self, name: str, update: Update) -> None:
        try:
            await update()
        except Exception as e:  # any failure of one part: logged and counted, retried when next due
            if getattr(e, "fatal", False):
                await self._on_fatal(e)
                return
            self._counters["step_failures"] += 1
            log.warning("%s: %s failed (%r); retrying when next due", self._name, name, e)
