"""Pull mode's sink: :class:`PullQueueCore`, a small async actor the subscription owns.

A reader's ``process_batch`` call parks in it until the driver acknowledges the batch
(``next_batch`` asks for the next one, or ``ack``), so the reader's code is the same in
push and pull mode (an :class:`~kinesis_actors.sinks.protocol.ActorSink` over this
actor), and backpressure is one batch per shard.

Partial acknowledgement (``ack(upto=i)``) is a push sink's ``PartialBatchError`` seen
from the driver: the reader's ``process_batch`` call raises ``PartialBatchError(failed_from=i)``
(the reader checkpoints records ``[0, i)`` and calls again with the rest, as for a push
sink, which counts against ``max_sink_retries``), while the queue puts the rest at its
front at once, so the driver's next ``next`` returns it first whatever the reader's retry
wait; the reader's call for the rest then waits on that entry instead of queueing the
records again.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Sequence
from typing import Any

from ..clock import monotonic_s
from ..errors import InvalidError, PartialBatchError
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
        self._current: tuple[int, Sequence[Record], asyncio.Future[None]] | None = None
        # shard id -> {(first and last position, length): future} of the queued rests of a
        # partly acknowledged batch that its reader has not asked for yet
        self._rests: dict[str, dict[tuple[Any, ...], asyncio.Future[None]]] = {}
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

        The rest of a batch the driver acknowledged in part is already queued (at the front):
        a call with exactly those records waits on it instead of queueing them again.

        Raises:
            PartialBatchError: the driver acknowledged records ``[0, failed_from)`` only.
            asyncio.CancelledError: the call was cancelled.
        """
        if len(records):
            rests = self._rests.get(records[0].shard_id, {})
            rest = rests.pop(_shape(records), None)
            if rest is not None:
                await rest
                return
            rests.clear()  # the reader moved on: rests it never asked for are stale
        entry = (next(self._ids), records, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        self._event().set()
        try:
            await entry[2]
        except asyncio.CancelledError:
            if entry in self._waiting:
                self._waiting.remove(entry)
            raise

    def ack(self, upto: int | None = None) -> bool:
        """Acknowledge the batch the driver holds (``upto``: only its records ``[0, upto)``).

        With ``0 < upto < len(batch)`` the reader checkpoints the first ``upto`` records and
        the rest goes to the front of the queue (the next ``next`` returns it); ``upto=0``
        acknowledges nothing and puts the whole batch back at the front.

        Returns:
            False if the driver holds no batch.

        Raises:
            InvalidError: ``upto`` is not an int in ``0..len(batch)``.
        """
        current = self._current
        if current is None:
            return False
        _, records, future = current
        if upto is not None and (isinstance(upto, bool) or not isinstance(upto, int) or not 0 <= upto <= len(records)):
            raise InvalidError(f"ack(upto=...) takes an int in 0..{len(records)} (the batch's length), got {upto!r}")
        self._current = None
        if upto is None or upto == len(records) or future.done():
            if not future.done():
                future.set_result(None)
            return True
        if upto == 0:
            self._waiting.appendleft(current)
        else:
            rest: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            rest.add_done_callback(_retrieve)
            self._waiting.appendleft((next(self._ids), records[upto:], rest))
            self._rests.setdefault(records[0].shard_id, {})[_shape(records[upto:])] = rest
            future.set_exception(PartialBatchError(f"the driver acknowledged {upto} of {len(records)} records",
                                                   failed_from=upto))
        self._event().set()
        return True

    async def next(self, timeout_s: float, ack_previous: bool = True) -> Sequence[Record] | None:
        """Called by the driver: acknowledge the batch handed out before (if ``ack_previous``),
        then return the next batch, or None after ``timeout_s`` seconds.

        Raises:
            The error given to :meth:`fail` (the subscription's fatal error).
        """
        if ack_previous:
            self.ack()
        deadline = monotonic_s() + max(0.0, timeout_s)
        while True:
            if self._error is not None:
                raise self._error
            while self._waiting:
                batch_id, records, future = self._waiting.popleft()
                if future.done():  # its call was cancelled (the reader stopped or lost its lease)
                    continue
                self._current = (batch_id, records, future)
                return records
            remaining = deadline - monotonic_s()
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


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a rest's outcome as seen: a reader that stopped never awaits it."""
    if not future.cancelled():
        future.exception()


def _shape(records: Sequence[Record]) -> tuple[Any, ...]:
    """What identifies a shard's batch: its first and last positions and its length."""
    return records[0].position, records[-1].position, len(records)


def make_pull_queue() -> Any:
    """Create the pull-mode queue actor (``num_cpus=0``, async, owned by the caller)."""
    import ray

    actor_cls = ray.remote(num_cpus=0, max_concurrency=10_000)(PullQueueCore)  # type: ignore[call-overload]  # Ray types task options only
    return actor_cls.options(name=None).remote()
