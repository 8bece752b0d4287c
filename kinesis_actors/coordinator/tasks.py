"""Kept background tasks: every task the Coordinator starts is held until it ends, and its
unexpected error is logged and counted (never lost with an unkept ``create_task``)."""

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
    """The background tasks of one Coordinator.

    Args:
        counters: the Coordinator's counters; ``task_errors`` counts tasks that ended with
            an error nobody handled (each is also logged with its traceback).
    """

    def __init__(self, counters: dict[str, int]) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._counters = counters
        counters.setdefault("task_errors", 0)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start ``coro`` as a kept task named ``name``; returns it."""
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

    def running(self, prefix: str = "") -> list[asyncio.Task[Any]]:
        """The tasks still running whose name starts with ``prefix``."""
        return [t for t in self._tasks if not t.done() and t.get_name().startswith(prefix)]
