"""The delivery seam: how a consumer hands one batch downstream (INTERFACES.md item 8).

A consumer gives each batch to ONE :class:`BatchDelivery` and checkpoints what the
:class:`DeliveryResult` says; the retries, their backoff, the dead-letter stream and the
:class:`~kinesis_actors.errors.SinkError` live here and nowhere else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from ..backoff import Backoff
from ..errors import SinkError
from ..records import Record
from .spec import Deliver, ReaderSpec, Sleep
from .timers import wait_first

__all__ = ["BatchDelivery", "DeliveryResult", "SINK_BACKOFF"]

log = logging.getLogger("kinesis_actors.reader")
T = TypeVar("T")

SINK_BACKOFF = Backoff(base_s=0.1, cap_s=10.0, floor_s=0.05)
"""Waits between deliveries of a batch the sink refused (full jitter, 0.05 s to 10 s)."""


@dataclasses.dataclass(frozen=True)
class DeliveryResult:
    """How a batch fared downstream.

    Attributes:
        acknowledged: how many records from the start of the batch are acknowledged and
            may be checkpointed (``len(batch)`` today: a batch is acknowledged whole).
        attempts: deliveries made (1 when the sink took it at once).
        dead_lettered: True when the batch went to the dead-letter stream instead.
    """

    acknowledged: int
    attempts: int = 1
    dead_lettered: bool = False


class BatchDelivery:
    """Delivers one consumer's batches: the sink, retries with backoff, then dead letters.

    A failing batch is delivered again after :data:`SINK_BACKOFF` waits, up to
    ``spec.max_sink_retries`` retries; then it is published to ``dead_letter`` (when set;
    acknowledged once published there) or :class:`~kinesis_actors.errors.SinkError` is
    raised. While it waits on the sink or on a backoff, ``alive()`` is called at least
    every ``renew_interval_s / 2`` seconds: a slow or failing downstream keeps the lease.

    Args:
        spec: the consumer's :class:`ReaderSpec` (``max_sink_retries``, ``renew_interval_s``).
        deliver: the sink's ``async deliver(records)``; returning acknowledges the batch.
        dead_letter: a Publisher (``put_many([(data, partition_key)])``, blocking) or None.
        run_blocking: ``async run_blocking(fn, *args)``: where the blocking publish runs
            (the reader's Kinesis pool).
        clock: monotonic seconds. sleep: ``async sleep`` on that clock.
        alive: called while waiting (the consumer's heartbeat).
        rng: uniform [0, 1) for the backoff jitter.
    """

    def __init__(self, spec: ReaderSpec, deliver: Deliver, *, dead_letter: Any = None,
                 run_blocking: Callable[..., Awaitable[Any]] | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Sleep = asyncio.sleep, alive: Callable[[], None] = lambda: None,
                 rng: Callable[[], float] | None = None) -> None:
        self.spec = spec
        self._deliver = deliver
        self._dead_letter = dead_letter
        self._run_blocking = run_blocking if run_blocking is not None else asyncio.to_thread
        self._clock = clock
        self._sleep = sleep
        self._alive = alive
        self._rng = rng
        self.failures = 0  # failed deliveries, all batches

    async def deliver(self, batch: Sequence[Record]) -> DeliveryResult:
        """Deliver ``batch`` until the sink acknowledges it (or the dead-letter stream takes it).

        Raises:
            SinkError: the sink refused it ``max_sink_retries + 1`` times and there is no
                dead-letter stream (the cause chained).
            asyncio.CancelledError: cancelled; the batch is not acknowledged.
        """
        attempt = 0
        while True:
            try:
                await self.await_alive(self._deliver(list(batch)))
                return DeliveryResult(len(batch), attempts=attempt + 1)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the sink's failure, whatever its type: retried, then dead letters or SinkError
                attempt += 1
                self.failures += 1
                if attempt > self.spec.max_sink_retries:
                    return await self._give_up(batch, attempt, e)
                pause = SINK_BACKOFF.delay_s(attempt, **({"rng": self._rng} if self._rng else {}))
                log.info("shard %s: sink failed (%r); retry %d in %.2f s", self.spec.shard_id, e, attempt, pause)
                await self.sleep_alive(pause)

    async def _give_up(self, batch: Sequence[Record], attempt: int, error: Exception) -> DeliveryResult:
        if self._dead_letter is None:
            raise SinkError(f"the sink refused a batch of shard {self.spec.shard_id} {attempt} times: "
                            f"{error!r:.300}") from error
        await self.await_alive(self._run_blocking(self._dead_letter.put_many,
                                                  [(r.data, r.partition_key) for r in batch]))
        log.warning("shard %s: batch of %d sent to the dead-letter stream after %d failures",
                    self.spec.shard_id, len(batch), attempt)
        return DeliveryResult(len(batch), attempts=attempt, dead_lettered=True)

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
