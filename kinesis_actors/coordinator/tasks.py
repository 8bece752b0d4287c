"""Kept background tasks: every task the Coordinator starts is held until it ends, and its
unexpected error is logged and counted (never lost with an unkept ``create_task``).

Each concern owns its own :class:`TaskSet` (the core's tick steps, the pool's reader
starts, the placements' opens, the rest): the close cancels or waits for a set it holds,
never tasks picked out by their names (a task's name is for the log only)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

__all__ = ["TaskSet", "Sleep"]

log = logging.getLogger("kinesis_actors.coordinator")

Sleep = Callable[[float], Awaitable[None]]
"""An injectable ``asyncio.sleep`` (seconds)."""


class TaskSet:
    """One group of background tasks of a Coordinator.

    Args:
        counters: the Coordinator's counters; ``task_errors`` counts tasks that ended with
            an error nobody handled (each is also logged with its traceback).
    """

    def __init__(self, counters: dict[str, int]) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._counters = counters
        counters.setdefault("task_errors", 0)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start ``coro`` as a kept task; ``name`` names it in the log only. Returns the task."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Keep an already started task the same way (an open that outlived the first pass)."""
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._counters["task_errors"] += 1
            log.error("background task %s failed", task.get_name(), exc_info=error)

    def running(self) -> list[asyncio.Task[Any]]:
        """The tasks of this set still running."""
        return [t for t in self._tasks if not t.done()]

    async def cancel(self) -> None:
        """Cancel every running task of this set and wait until each has ended (their
        errors are not raised here: :meth:`_done` logs them)."""
        tasks = self.running()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def settle(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` seconds for the running tasks of this set to end; never raises."""
        tasks = self.running()
        if tasks and timeout_s > 0:
            await asyncio.wait(tasks, timeout=timeout_s)
