"""Pull mode's sink: :class:`PullQueueCore`, a small async actor the subscription owns.

A reader's ``process_batch`` call parks in it until the driver acknowledges the batch
(``next_batch`` asks for the next one, or ``ack``), so the reader's code is the same in
push and pull mode (an :class:`~kinesis_actors.sinks.protocol.ActorSink` over this
actor), and backpressure is one batch per shard.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Sequence
from typing import Any

from ..records import Record

__all__ = ["PullQueueCore", "make_pull_queue"]


class PullQueueCore:
    """Batches waiting for the driver, and the one batch the driver holds unacknowledged.

    ``process_batch`` (called by readers) returns when the driver acknowledges that batch;
    ``next`` (called by the driver) acknowledges the batch it handed out before, then
    returns the next one or None on timeout. ``fail(error)`` makes every later ``next``
    raise ``error`` (a fatal error of the subscription).
    """

    def __init__(self) -> None:
        self._waiting: collections.deque[tuple[int, Sequence[Record], asyncio.Future[None]]] = collections.deque()
        self._current: tuple[int, asyncio.Future[None]] | None = None
        self._ids = itertools.count(1)
        self._changed: asyncio.Event | None = None
        self._error: BaseException | None = None

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    async def process_batch(self, records: Sequence[Record]) -> None:
        """Called by a reader: queue ``records`` (one shard's batch: a compact
        :class:`~kinesis_actors.batch.RecordBatch`, passed on as it is) and return once the driver
        acknowledges it (``next`` or ``ack``).

        A reader that stops or loses its lease cancels the call (``ray.cancel``, through
        :class:`~kinesis_actors.sinks.ActorSink`); Ray then cancels this coroutine, and the
        batch leaves the queue: ``next`` never hands it to the driver. One the driver
        already holds stays its current batch (acknowledging it then changes nothing).

        Raises:
            asyncio.CancelledError: the call was cancelled.
        """
        entry = (next(self._ids), records, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        self._event().set()
        try:
            await entry[2]
        except asyncio.CancelledError:
            if entry in self._waiting:
                self._waiting.remove(entry)
            raise

    def ack(self) -> bool:
        """Acknowledge the batch the driver holds; False if it holds none."""
        current, self._current = self._current, None
        if current is None:
            return False
        if not current[1].done():
            current[1].set_result(None)
        return True

    async def next(self, timeout_s: float, ack_previous: bool = True) -> Sequence[Record] | None:
        """Called by the driver: acknowledge the batch handed out before (if ``ack_previous``),
        then return the next batch, or None after ``timeout_s`` seconds.

        Raises:
            The error given to :meth:`fail` (the subscription's fatal error).
        """
        if ack_previous:
            self.ack()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        while True:
            if self._error is not None:
                raise self._error
            while self._waiting:
                batch_id, records, future = self._waiting.popleft()
                if future.done():  # its call was cancelled (the reader stopped or lost its lease)
                    continue
                self._current = (batch_id, future)
                return records
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            event = self._event()
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def fail(self, error: BaseException) -> None:
        """Park the subscription's fatal error: every later ``next`` raises it."""
        self._error = error
        self._event().set()

    def error(self) -> BaseException | None:
        """The parked fatal error, or None."""
        return self._error

    def pending(self) -> int:
        """How many batches wait for the driver (at most one per shard)."""
        return len(self._waiting)


def make_pull_queue() -> Any:
    """Create the pull-mode queue actor (``num_cpus=0``, async, owned by the caller)."""
    import ray

    actor_cls = ray.remote(num_cpus=0, max_concurrency=10_000)(PullQueueCore)  # type: ignore[call-overload]  # Ray types task options only
    return actor_cls.options(name=None).remote()
