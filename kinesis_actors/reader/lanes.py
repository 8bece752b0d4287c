"""The read loop with lanes: ``parallelization_factor > 1``, a batching window or a byte limit.

One shard's records are gathered by the consumer's
:class:`~kinesis_actors.delivery.ShardPipeline` and delivered in rounds of up to
``parallelization_factor`` batches (one per lane, split by partition key). The loop
fetches in the background while rounds go out: one ``GetRecords`` at a time, started
while fewer records are gathered than one response can bring (the ``Limit``) or no ready
round waits for the one in flight (that is the backpressure: a shard holds at most one
round in flight and about one response gathered, within the reader's byte budget, which
counts gathered records until they are acknowledged). So a shard with a backlog has its
next response by the time the gathered one is delivered, as KCL's prefetching retriever
does, instead of stopping for one call per response (at ``parallelization_factor=4``
with 50 ms batches a response of 10,000 records lasts about 3 s, and a call on moto
took 0.3-1 s). The loop wakes at a window's end even while the call waits for its turn.
The checkpoint is the highest position below which every record is acknowledged. At
shard end every gathered record is delivered and every lane's batches acknowledged
before ``SHARD_END`` is written (invariant 2). A stop lets the batches in flight finish
(the stop's grace bounds it) and drops what is gathered and the fetch in flight; a seek
does the same before it reopens.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..delivery import ShardPipeline
from ..kinesis import Fetched
from ..records import Record
from .prefetch import Prefetch

if TYPE_CHECKING:
    from .consumer import ShardConsumer

__all__ = ["process_in_lanes"]


async def _settle(consumer: ShardConsumer, lanes: ShardPipeline, step_s: float) -> None:
    """Wait (alive) until no batch is in flight; the stop's grace cancels this wait."""
    while lanes.in_flight:
        consumer._alive()
        await lanes.wait(step_s)


async def _drained(consumer: ShardConsumer, lanes: ShardPipeline, interrupted: Callable[[], bool],
                   step_s: float) -> bool:
    """Shard end: deliver everything gathered, wait until every lane's batches are
    acknowledged; True once they are (False if stopped or asked to seek meanwhile)."""
    while not lanes.idle and not interrupted():
        consumer._alive()
        lanes.dispatch(force=True)
        await lanes.wait(step_s)
    return lanes.idle and not interrupted()


def _materialize(got: Fetched) -> None:
    """Build the response's :class:`~kinesis_actors.records.Record` objects (the batch keeps
    them): the lanes split records by partition key and track each one's position, and
    building 10,000 of them takes about 25 ms, which in a pool thread after the fetch
    (``Reading.fetch(prepare=...)``) does not hold up the other shards' rounds on the event
    loop."""
    got.records.records()


async def process_in_lanes(consumer: ShardConsumer) -> None:
    """``PROCESSING`` with lanes, until stopped or shard end (see the module docstring).

    Raises:
        SinkError, LeaseLostError, KinesisError: as the one-lane loop (a lane's error is
            raised here; nothing is checkpointed past its records).
    """
    from .consumer import lag_ms  # the consumer's module imports this one

    reading = consumer.reading
    # (position of the last record, budget bytes) of each fetched response not yet behind the
    # checkpoint: its bytes go back to the budget once every record of it is acknowledged
    responses: collections.deque[tuple[tuple[int, int], int]] = collections.deque()

    async def checkpoint(last: Record) -> None:
        await consumer._checkpoint_after(last)
        position = last.position
        while responses and responses[0][0] <= position:
            reading.give_back(responses.popleft()[1])

    lanes = consumer.delivery.pipeline(checkpoint, consumer._count_acked)
    step_s = max(0.05, consumer.spec.renew_interval_s / 2)

    interrupted = consumer._interrupted
    fetch = Prefetch(reading, interrupted, f"fetch-{consumer.spec.shard_id}", _materialize)

    try:
        while True:
            consumer._alive()
            if consumer._stopping():
                await fetch.end()
                await _settle(consumer, lanes, step_s)
                return
            if consumer._seek is not None:
                await fetch.end()
                await _settle(consumer, lanes, step_s)
                await lanes.cancel()
                responses.clear()
                await consumer._apply_seek()  # drops what is gathered, gives its bytes back
            await consumer.checkpoints.flush(due_only=True)
            lanes.dispatch()
            if lanes.can_fetch():
                fetch.start()
            due = lanes.due_in()
            await lanes.wait(step_s if due is None else min(due, step_s), also=fetch.task)
            got = fetch.take()  # a fetch error ends the loop as before
            if got is None:
                continue  # a batch was acknowledged, a window ended, a heartbeat is due, or nothing came
            consumer.stats["millis_behind_latest"] = lag_ms(got)
            if len(got.records):
                responses.append((got.records[-1].position, got.bytes))
            lanes.add(got.records)
            if got.shard_end and await _drained(consumer, lanes, interrupted, step_s):
                await consumer._shard_end()
                return
    finally:
        await fetch.end(wait_for_call=False)
        await lanes.cancel()
