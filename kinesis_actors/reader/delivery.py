"""The delivery seam: the delivery controls of one consumer, wired in one place.

:class:`BatchDelivery` builds the consumer's :class:`~kinesis_actors.delivery.DeliveryEngine`
(retries and their backoff, partial acknowledgement, bisection, record age, filter, dead
letters) around the consumer's sink call, and its
:class:`~kinesis_actors.delivery.ShardPipeline` when batches are gathered (parallel lanes,
a window, a byte limit).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from .. import mutation
from ..clock import monotonic_s, wall_s
from ..delivery import DeadLetterWriter, DeliveryEngine, DeliveryResult, Lanes, OneLane, ShardPipeline
from ..delivery.engine import SINK_BACKOFF
from ..delivery.parallel import DeliverBatch, OnAck
from ..kinesis import Fetched
from ..records import Record
from .spec import Deliver, ReaderSpec, Sleep
from .timers import wait_first

# DeliveryResult, SINK_BACKOFF: kinesis_actors.delivery's
__all__ = ["BatchDelivery", "Checkpoint", "DeliveryResult", "SINK_BACKOFF"]

log = logging.getLogger("kinesis_actors.reader")
T = TypeVar("T")

_EARLY_CHECKPOINT = mutation.register("checkpoint_before_ack",
                                      "a batch's last record is checkpointed before the sink call")
_PARTIAL_WHOLE = mutation.register("partial_ack_checkpoints_batch",
                                   "a partial acknowledgement acknowledges (and checkpoints) the whole batch")


class Checkpoint(Protocol):
    """``async checkpoint(last, partial=False)``: every record up to ``last`` is acknowledged
    (``partial``: the rest of its batch is retried)."""

    def __call__(self, last: Record, partial: bool = False) -> Awaitable[None]: ...


def _materialize(got: Fetched) -> None:
    """Build a response's Record objects (its batch keeps them)."""
    got.records.records()


def _checkpoint_first(deliver: DeliverBatch, checkpoint: Checkpoint) -> DeliverBatch:
    """The planted bug ``checkpoint_before_ack``: ``deliver`` that checkpoints a batch's last record first."""
    async def early(batch: Sequence[Record], on_ack: OnAck) -> Any:
        await checkpoint(batch[-1])
        return await deliver(batch, on_ack)

    return early


def _partial_as_whole(deliver: DeliverBatch) -> DeliverBatch:
    """The planted bug ``partial_ack_checkpoints_batch``: ``deliver`` whose every acknowledgement
    covers the whole batch (the rest of a partially acknowledged batch is still retried)."""
    async def whole(batch: Sequence[Record], on_ack: OnAck) -> Any:
        return await deliver(batch, lambda n: on_ack(len(batch)))

    return whole


class BatchDelivery:
    """The delivery controls of one consumer (``spec.controls``).

    The retry, partial-acknowledgement, bisection, record-age and filter rules are the
    :class:`~kinesis_actors.delivery.DeliveryEngine`'s (retries wait
    :data:`~kinesis_actors.delivery.engine.SINK_BACKOFF`); dead letters go through a
    :class:`~kinesis_actors.delivery.DeadLetterWriter` (one JSON document per record,
    retried until written). With ``parallelization_factor > 1``, a window or a byte limit,
    batches are gathered and delivered by a :class:`~kinesis_actors.delivery.ShardPipeline`
    (:meth:`lanes`). While it waits on a dead-letter write or a backoff, ``alive()`` is
    called at least every ``renew_interval_s / 2`` seconds.

    Args:
        spec: the consumer's :class:`ReaderSpec` (``controls``, ``renew_interval_s``).
        deliver: the sink call ``async deliver(records)``; returning acknowledges the batch
            (the consumer's, which confirms its lease first).
        dead_letter: a Publisher (``put_many([(data, partition_key)])``, blocking) or None
            (default: ``spec.controls.dead_letter``).
        run_blocking: ``async run_blocking(fn, *args)``: where the blocking publish runs
            (the reader's Kinesis pool).
        clock: monotonic seconds. wall_clock: epoch seconds (record ages, windows).
        sleep: ``async sleep`` on ``clock``.
        alive: called while waiting (the consumer's heartbeat).
        rng: uniform [0, 1) for the backoff jitter.
        stats: the consumer's stats (the controls' counters go there).
    """

    def __init__(self, spec: ReaderSpec, deliver: Deliver, *, dead_letter: Any = None,
                 run_blocking: Callable[..., Awaitable[Any]] | None = None, clock: Callable[[], float] = monotonic_s,
                 wall_clock: Callable[[], float] = wall_s, sleep: Sleep = asyncio.sleep,
                 alive: Callable[[], None] = lambda: None, rng: Callable[[], float] | None = None,
                 stats: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.controls = controls = spec.controls
        self._run_blocking = run_blocking if run_blocking is not None else asyncio.to_thread
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._alive = alive
        self.stats: dict[str, Any] = stats if stats is not None else {}
        publisher = dead_letter if dead_letter is not None else controls.dead_letter
        writer = None
        if publisher is not None:
            async def publish(items: list[tuple[bytes, str]]) -> None:
                await self.await_alive(self._run_blocking(publisher.put_many, items))

            writer = DeadLetterWriter(publish, sleep=self.sleep_alive, stats=self.stats, rng=rng)
        self.engine = DeliveryEngine(controls, deliver, dead_letters=writer, shard_id=spec.shard_id,
                                     sleep=self.sleep_alive, wall_clock=wall_clock, stats=self.stats, rng=rng)

    @property
    def gathers(self) -> bool:
        """True when batches go through a :class:`ShardPipeline` (lanes, a window or a byte limit)."""
        c = self.controls
        return c.parallelization_factor > 1 or c.gathers or c.max_batch_bytes is not None

    def lanes(self, checkpoint: Checkpoint, acked: Callable[[Sequence[Record]], object], *, sleep: Sleep) -> Lanes:
        """The lanes of this shard, which the read loop drives: a :class:`ShardPipeline` when
        batches are gathered (:attr:`gathers`: up to ``parallelization_factor`` in flight),
        else a :class:`OneLane` (one batch in flight, at most ``batch_limit`` records).

        Args:
            checkpoint: ``async checkpoint(record, partial=False)``: every record up to it is
                acknowledged (``partial``: the rest of its batch is retried).
            acked: called with records once they are acknowledged (the counters).
            sleep: ``async sleep`` on the injected clock (the lanes' waits).
        """
        deliver: DeliverBatch = self.engine.deliver
        if _EARLY_CHECKPOINT in mutation.ACTIVE:  # planted bugs apply to lanes built while planted
            deliver = _checkpoint_first(deliver, checkpoint)
        if _PARTIAL_WHOLE in mutation.ACTIVE:
            deliver = _partial_as_whole(deliver)
        if self.gathers:
            return ShardPipeline(self.controls, deliver, checkpoint, max_records=self.spec.max_records,
                                 clock=self._clock, acked=acked, stats=self.stats, wall_clock=self._wall_clock,
                                 sleep=sleep)
        return OneLane(deliver, checkpoint, acked, size=self.controls.batch_limit(self.spec.max_records),
                       refill_below=self.spec.max_records, sleep=sleep, stats=self.stats)

    @property
    def prepare(self) -> Callable[[Fetched], object] | None:
        """What runs on each fetched response in the fetch's pool thread: with gathered batches,
        building its :class:`~kinesis_actors.records.Record` objects (the pipeline splits
        records by partition key and tracks each one's position, and the build there does not
        hold up the other shards' event loop); None with one lane (records stay compact)."""
        return _materialize if self.gathers else None

    async def await_alive(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` while calling ``alive()`` every ``renew_interval_s / 2`` seconds
        (at least every 0.05 s); cancelled with the caller."""
        task = asyncio.ensure_future(awaitable)
        beat = max(0.05, self.spec.renew_interval_s / 2)
        try:
            while True:
                done = await wait_first({task}, beat, self._sleep)
                self._alive()
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()

    async def sleep_alive(self, seconds: float) -> None:
        """Sleep ``seconds`` on the injected clock, calling ``alive()`` at least every
        ``renew_interval_s / 2`` seconds."""
        end = self._clock() + seconds
        while (left := end - self._clock()) > 0:
            await self._sleep(min(left, max(0.05, self.spec.renew_interval_s / 2)))
            self._alive()
