"""One ``GetRecords`` (or subscription read) of a shard fetched ahead, and the one-lane read loop.

:class:`Prefetch` holds at most one fetcher step of the shard in flight as an asyncio task,
so the shard's next response is read while the current one is delivered, as KCL's
prefetching retriever does (it keeps one response ahead by default). Both read loops use
it: :func:`process_one_lane` (the default: one lane, no window) and
:func:`~.lanes.process_in_lanes`.

Invariants it keeps: at most one batch of the shard is unacknowledged (a prefetched response
is only fetched, never delivered, before the one before it is acknowledged); the bytes of a
prefetched response are counted by the reader's byte budget from when it arrives until
they are acknowledged or dropped, so a shard holds at most two responses (one being
delivered, one fetched ahead) and the process never more than its budget; a stop or a seek
drops the response fetched ahead (its records were never delivered, so nothing is
checkpointed past them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..kinesis import Fetched

if TYPE_CHECKING:
    from .consumer import ShardConsumer
    from .reading import Reading

__all__ = ["Prefetch", "process_one_lane"]


class Prefetch:
    """At most one fetcher step of the shard in flight, as an asyncio task.

    Args:
        reading: the consumer's :class:`~.reading.Reading`.
        interrupted: True once the consumer stops or seeks (the fetch then ends after its pacing).
        name: the task's name.
        prepare: run on each answer in a pool thread after the call
            (:meth:`~.reading.Reading.fetch`), or None.
    """

    def __init__(self, reading: Reading, interrupted: Callable[[], bool], name: str,
                 prepare: Callable[[Fetched], object] | None = None) -> None:
        self._reading = reading
        self._interrupted = interrupted
        self._name = name
        self._prepare = prepare
        self.task: asyncio.Task[Fetched | None] | None = None

    def start(self) -> None:
        """Start the next fetch unless one is in flight."""
        if self.task is None:
            self.task = asyncio.create_task(self._reading.fetch(self._interrupted, self._prepare), name=self._name)

    def take(self) -> Fetched | None:
        """The fetch's answer once it ended (None while in flight, with none, or nothing to deliver).

        Raises:
            What the fetch raised (``KinesisError``, ``LeaseLostError``).
        """
        task = self.task
        if task is None or not task.done():
            return None
        self.task = None
        return task.result()

    async def next(self) -> Fetched | None:
        """The answer of the fetch in flight once it ends, else of a fetch made now (inline:
        no task is created for a step nothing overlaps, such as an idle shard's poll).

        Raises:
            What the fetch raised (``KinesisError``, ``LeaseLostError``).
        """
        task = self.task
        if task is None:
            return await self._reading.fetch(self._interrupted, self._prepare)
        try:
            return await task
        finally:
            if task.done():
                self.task = None

    async def end(self, *, wait_for_call: bool = True) -> None:
        """Drop the fetch in flight (a stop, a seek, the loop's end). It is cancelled while it
        is paced, waits for the byte budget (which the caller, waiting here, might never
        free) or is queued for a thread; a call already running in its thread is waited for
        (``wait_for_call``: a seek must not race the fetcher) or left to end on its own. Its
        records are dropped; their bytes go back with the rest (``Reading.give_back``)."""
        task, self.task = self.task, None
        if task is None:
            return
        if not task.done() and (self._reading.abandon() or not wait_for_call):
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def process_one_lane(consumer: ShardConsumer) -> None:
    """``PROCESSING`` in one lane without a window: fetch -> deliver -> acknowledge ->
    checkpoint, until stopped or shard end, with the next response fetched while a
    response with records is delivered (an empty answer is not fetched ahead: an idle
    shard polls inline, paced by its fetcher).

    Raises:
        SinkError: the sink failed the batch (nothing is checkpointed past it).
        LeaseLostError: the lease was lost (a fenced write or renewal failed).
        KinesisError: the fetcher's call failed for good.
    """
    from .consumer import lag_ms  # the consumer's module imports this one

    reading, interrupted = consumer.reading, consumer._interrupted
    fetch = Prefetch(reading, interrupted, f"fetch-{consumer.spec.shard_id}")
    size = consumer.delivery.controls.batch_limit(consumer.spec.max_records)
    try:
        while True:
            consumer._alive()
            if consumer._stopping():
                return
            if consumer._seek is not None:
                await fetch.end()
                await consumer._apply_seek()  # drops the response fetched ahead too
            await consumer.checkpoints.flush(due_only=True)
            got = await fetch.next()
            if got is None:
                continue
            consumer.stats["millis_behind_latest"] = lag_ms(got)
            records = got.records
            if len(records) and not got.shard_end:
                fetch.start()
            for start in range(0, len(records), size):
                if interrupted():
                    break
                await consumer._deliver_and_checkpoint(records[start : start + size])
            reading.give_back(got.bytes)  # acknowledged, or dropped (stop, seek)
            if got.shard_end and not interrupted():
                await consumer._shard_end()
                return
    finally:
        await fetch.end(wait_for_call=False)
