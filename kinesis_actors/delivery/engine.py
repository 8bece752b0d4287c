"""The delivery engine: one batch to the downstream with retries, partial acknowledgements,
bisection, a maximum record age and a filter; nothing acknowledged out of order.

:class:`DeliveryEngine` is plain code: the sink call, the dead-letter writer, the wall
clock (record ages) and the sleep are injected, so unit tests drive it without Ray or
time. The reader's consumer wraps the sink call and the sleep so that waiting on them
stamps its heartbeat (a slow or failing downstream keeps the lease).

What happens to a batch (each step follows Lambda's event source mapping for Kinesis):

1. ``record_filter`` runs on every record; rejected ones are done (acknowledged without
   delivery, counted in ``filtered``).
2. Before every attempt, records older than ``max_record_age_s`` (arrival time against the
   wall clock) are dead-lettered with reason ``max_record_age`` and are done (Lambda
   checks the age before each invocation too).
3. The remaining records go to the sink as one batch. Returning is the acknowledgement of
   all of them. ``PartialBatchError(failed_from=i)`` acknowledges the first ``i``; the rest
   is retried, and that retry counts against ``max_sink_retries`` (Lambda: a partial
   response retries from the first failed record). Any other exception fails them all.
4. Retries wait :data:`SINK_BACKOFF` (capped exponential backoff, full jitter).
5. Past its retries, with ``bisect_on_error``, the failing records are split in halves; each
   half is tried once, and a half that fails is split again; a single record gets the full
   ``max_sink_retries`` before it is given up (Lambda: "splitting batches doesn't consume
   the retry quota"). Without bisection, every failing record is given up.
6. A record given up goes to the dead letters (reason ``sink``, the last error, its
   attempts), or, without dead letters, the batch fails with ``SinkError`` naming the
   record's shard and sequence number.

Acknowledgement is in order: ``on_ack(n)`` is awaited each time the acknowledged prefix of
the batch grows to ``n`` records, so the consumer checkpoints after record ``n - 1`` and
never past a record that is not done (delivered, filtered or dead-lettered). A dead letter
is written before its record counts as done.

:class:`OneLane` hands a shard's batches to the engine one at a time (``parallelization_factor``
1 without a window or a byte limit); :class:`~.parallel.ShardPipeline` is the N-lane form.
What a batch came to (:class:`~.outcome.DeliveryResult`) and what a sink's error says
(:func:`~.outcome.partial_failed_from`) are :mod:`~kinesis_actors.delivery.outcome`'s.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from ..backoff import Backoff, Retry
from ..errors import LeaseLostError, SinkError
from ..records import Record
from .dead_letter import DeadLetter, DeadLetterWriter
from .options import DeliveryOptions
from .outcome import DeliveryResult, given_up, partial_failed_from

__all__ = ["DeliveryEngine", "DeliveryResult", "SINK_BACKOFF", "partial_failed_from", "OneLane"]

log = logging.getLogger(__name__)

SINK_BACKOFF = Backoff(base_s=0.1, cap_s=10.0)
"""Waits between attempts of a failing sink: up to 0.1 s doubling to 10 s, full jitter."""

Deliver = Callable[[Sequence[Record]], Awaitable[Any]]
OnAck = Callable[[int], Awaitable[None]]


def _view(records: Sequence[Record], indices: list[int]) -> Sequence[Record]:
    """``records`` at ``indices``: a slice when they are contiguous (a compact batch stays
    compact across the process boundary), else a list."""
    lo, hi = indices[0], indices[-1] + 1
    if hi - lo == len(indices):
        return records if (lo, hi) == (0, len(records)) else records[lo:hi]
    return [records[i] for i in indices]


class _Batch:
    """The per-record state of one batch: done flags, failed attempts, the acknowledged prefix
    (a batch the sink takes whole costs no Python loop over its records)."""

    def __init__(self, records: Sequence[Record]) -> None:
        self.records = records
        self.done = [False] * len(records)
        self.attempts: collections.Counter[int] = collections.Counter()  # failed attempts of records still failing
        self.prefix = 0

    def mark_done(self, indices: list[int]) -> None:
        """Flag ``indices`` (ascending) done; a contiguous run is one slice assignment."""
        if indices and indices[-1] - indices[0] + 1 == len(indices):
            self.done[indices[0]:indices[-1] + 1] = [True] * len(indices)
        else:
            for i in indices:
                self.done[i] = True

    def advance(self) -> bool:
        """Move the prefix over done records; True if it moved."""
        start = self.prefix
        try:
            self.prefix = self.done.index(False, start)
        except ValueError:  # every record from the prefix on is done
            self.prefix = len(self.records)
        return self.prefix > start


class DeliveryEngine:
    """Delivers batches of one shard under the delivery controls (see the module docstring).

    Args:
        options: the :class:`DeliveryOptions`.
        deliver: ``async deliver(records)``: the sink call; returning acknowledges.
        dead_letters: the :class:`DeadLetterWriter`, or None (``dead_letter`` unset).
        shard_id: for messages.
        sleep: ``async sleep(seconds)`` between retries.
        wall_clock: seconds since the epoch (record ages).
        stats: counters to bump: ``sink_failures``, ``filtered``, ``bisected``,
            ``partial_acks`` (``dead_letter_records`` is the writer's), or None.
        backoff: waits between retries (:data:`SINK_BACKOFF`).
        rng: uniform in ``[0, 1)`` for the backoff's jitter (tests), or None.
    """

    def __init__(self, options: DeliveryOptions, deliver: Deliver, *, dead_letters: DeadLetterWriter | None,
                 shard_id: str, sleep: Callable[[float], Awaitable[None]], wall_clock: Callable[[], float],
                 stats: MutableMapping[str, Any] | None = None, backoff: Backoff = SINK_BACKOFF,
                 rng: Callable[[], float] | None = None) -> None:
        if options.max_record_age_s is not None and dead_letters is None:
            raise ValueError("max_record_age_s needs a dead-letter writer")
        self.options = options
        self._deliver = deliver
        self._dead_letters = dead_letters
        self._shard_id = shard_id
        self._sleep = sleep
        self._wall_clock = wall_clock
        self.stats = stats if stats is not None else {}
        self._backoff = backoff
        self._rng = rng

    def _bump(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    async def deliver(self, records: Sequence[Record], on_ack: OnAck | None = None) -> DeliveryResult:
        """Deliver one batch until every record is done.

        Args:
            records: one shard's records, in sequence order.
            on_ack: awaited with ``n`` each time records ``[0, n)`` become done.

        Returns:
            The :class:`DeliveryResult` (``acknowledged == len(records)``).

        Raises:
            SinkError: a record given up with no dead letters configured (it names the
                shard and sequence number; the cause is chained), a ``record_filter`` that
                raised, or a dead letter that cannot be written. Records before it may
                already be acknowledged (``on_ack`` said so).
            LeaseLostError: raised by ``deliver`` (the consumer's lease check before a sink
                call): passed on at once, never retried.
            asyncio.CancelledError: the consumer stopped; what ``on_ack`` reported stands.
        """
        batch, result = _Batch(records), DeliveryResult()
        self._filter(batch, result)
        await self._advance(batch, on_ack)
        pending = [i for i, done in enumerate(batch.done) if not done] if result.filtered else list(range(len(records)))
        if pending:
            await self._settle(batch, pending, self.options.max_sink_retries, result, on_ack)
        result.acknowledged = batch.prefix
        return result

    def _filter(self, batch: _Batch, result: DeliveryResult) -> None:
        keep = self.options.record_filter
        if keep is None:
            return
        for i, record in enumerate(batch.records):
            try:
                accepted = keep(record)
            except Exception as e:
                raise SinkError(f"record_filter raised on shard {record.shard_id} sequence number "
                                f"{record.sequence_number}: {e!r:.300}") from e
            if not accepted:
                batch.done[i] = True
                result.filtered += 1
        if result.filtered:
            self._bump("filtered", result.filtered)

    async def _advance(self, batch: _Batch, on_ack: OnAck | None) -> None:
        if batch.advance() and on_ack is not None:
            await on_ack(batch.prefix)

    async def _settle(self, batch: _Batch, indices: list[int], retries: int, result: DeliveryResult,
                      on_ack: OnAck | None) -> None:
        """Deliver ``indices`` with ``retries`` retries; bisect or give up what still fails."""
        failing, error = await self._attempts(batch, indices, retries, result, on_ack)
        if not failing:
            return
        if self.options.bisect_on_error and len(failing) > 1:
            self._bump("bisected")
            mid = len(failing) // 2
            log.info("shard %s: bisecting %d failing records at sequence number %s", self._shard_id, len(failing),
                     batch.records[failing[mid]].sequence_number)
            for half in (failing[:mid], failing[mid:]):
                await self._settle(batch, half, self.options.max_sink_retries if len(half) == 1 else 0, result,
                                   on_ack)
            return
        await self._give_up(batch, failing, error, result, on_ack)

    async def _attempts(self, batch: _Batch, indices: list[int], retries: int, result: DeliveryResult,
                        on_ack: OnAck | None) -> tuple[list[int], BaseException | None]:
        """Try ``indices`` up to ``retries + 1`` times; the indices still failing and the last error."""
        remaining, attempt = indices, 0
        while True:
            remaining = await self._expire(batch, remaining, result, on_ack)
            if not remaining:
                return [], None
            attempt += 1
            result.attempts += 1
            try:
                await self._deliver(_view(batch.records, remaining))
                done, error = len(remaining), None
            except (asyncio.CancelledError, LeaseLostError):
                raise  # stopped, or fenced before the call: never a failure of the sink
            except Exception as e:
                error = e
                k = partial_failed_from(e)
                done = k if k is not None and 0 <= k <= len(remaining) else 0
                if k is not None and k != done:
                    log.warning("shard %s: PartialBatchError(failed_from=%r) outside 0..%d; the whole batch "
                                "counts as failed", self._shard_id, k, len(remaining))
                elif k:
                    self._bump("partial_acks")
            batch.mark_done(remaining[:done])
            result.delivered += done
            remaining = remaining[done:]
            await self._advance(batch, on_ack)
            if not remaining:
                return [], None
            for i in remaining:  # only a record still failing is ever given up: only its attempts are read
                batch.attempts[i] += 1
            self._bump("sink_failures")
            retry = Retry(self._backoff, max_attempts=retries + 1, rng=self._rng or random.random)  # on failure only
            pause = retry.pause_s(attempt, started=0.0)
            if pause is None:  # retries + 1 attempts made
                return remaining, error
            log.info("shard %s: sink failed on %d records (%r); retry %d in %.2f s", self._shard_id, len(remaining),
                     error, attempt, pause)
            await self._sleep(pause)

    async def _expire(self, batch: _Batch, indices: list[int], result: DeliveryResult,
                      on_ack: OnAck | None) -> list[int]:
        """Dead-letter the records of ``indices`` older than ``max_record_age_s``; the others."""
        max_age = self.options.max_record_age_s
        if max_age is None:
            return indices
        now = self._wall_clock()
        old = [i for i in indices if (t := batch.records[i].approximate_arrival_timestamp) is not None
               and now - t.timestamp() > max_age]
        if not old:
            return indices
        assert self._dead_letters is not None
        await self._dead_letters.write([(batch.records[i], "max_record_age", None, 0) for i in old])
        batch.mark_done(old)
        result.dead_lettered += len(old)
        await self._advance(batch, on_ack)
        gone = set(old)
        return [i for i in indices if i not in gone]

    async def _give_up(self, batch: _Batch, failing: list[int], error: BaseException | None, result: DeliveryResult,
                       on_ack: OnAck | None) -> None:
        if self._dead_letters is None:
            raise given_up(batch.records[failing[0]], batch.attempts[failing[0]], error) from error
        letters: list[DeadLetter] = [(batch.records[i], "sink", error, batch.attempts[i]) for i in failing]
        await self._dead_letters.write(letters)
        batch.mark_done(failing)
        result.dead_lettered += len(failing)
        await self._advance(batch, on_ack)


class OneLane:
    """One batch of a shard in flight (``parallelization_factor`` 1, no window, no byte limit):
    fetched responses go downstream in shard order through :meth:`DeliveryEngine.deliver`,
    cut into batches of at most ``size`` records.

    It is the one-lane form of :class:`~.parallel.Lanes`, the interface the reader's read
    loop drives (:class:`~.parallel.ShardPipeline` is the other). With one batch in flight
    the acknowledged prefix of that batch is the checkpoint, so no record is tracked on its
    own, and a response goes downstream as the compact batch it was fetched as (sliced
    when larger than ``size``). The error of a batch is kept and raised by the next
    :meth:`dispatch` or :meth:`wait`; until then the lane is not :attr:`idle`.

    Args:
        deliver: ``async deliver(batch, on_ack)``, e.g. :meth:`DeliveryEngine.deliver`.
        checkpoint: ``async checkpoint(record, partial)``: every record up to ``record`` is
            acknowledged; ``partial`` when the rest of its batch is retried.
        acked: called with records once they are acknowledged (the counters).
        size: most records per batch. refill_below: :meth:`can_fetch` while fewer are held.
        sleep: ``async sleep`` on the injected clock (the timeout of :meth:`wait`).
        stats: ``batches`` counts the batches done.
    """

    def __init__(self, deliver: Callable[[Sequence[Record], OnAck], Awaitable[Any]],
                 checkpoint: Callable[[Record, bool], Awaitable[None]], acked: Callable[[Sequence[Record]], object],
                 *, size: int, refill_below: int, sleep: Callable[[float], Awaitable[Any]],
                 stats: MutableMapping[str, Any]) -> None:
        self._deliver, self._checkpoint, self._acked = deliver, checkpoint, acked
        self._size, self._refill_below, self._sleep = size, refill_below, sleep
        self.stats = stats
        self._held: list[Sequence[Record]] = []  # fetched responses, the first one handed out up to _offset
        self._offset = 0
        self._count = 0  # records held, not handed out
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    @property
    def idle(self) -> bool:
        """Nothing held and no batch (running, or ended and not collected)."""
        return self._task is None and not self._held

    @property
    def in_flight(self) -> int:
        """1 while a batch is with the downstream, else 0."""
        return int(self._task is not None and not self._task.done())

    def add(self, records: Sequence[Record]) -> None:
        """Hold a fetched response's records (after those held)."""
        if len(records):
            self._held.append(records)
            self._count += len(records)

    def can_fetch(self) -> bool:
        """True while fewer than ``refill_below`` records wait to be handed out."""
        return self._count < self._refill_below

    def due_in(self) -> float | None:
        """None: held records go out once the batch in flight is acknowledged."""
        return None

    def dispatch(self, *, force: bool = False) -> int:
        """Hand the next batch downstream unless one is in flight; 1 if it did.

        Raises:
            The error of the last batch (``SinkError``, ``LeaseLostError``).
        """
        self._collect()
        if self._task is not None or not self._held:
            return 0
        head, start = self._held[0], self._offset
        stop = min(len(head), start + self._size)
        batch = head if start == 0 and stop == len(head) else head[start:stop]
        self._offset = stop
        if stop == len(head):
            self._held.pop(0)
            self._offset = 0
        self._count -= len(batch)
        self._task = asyncio.create_task(self._run(batch), name="lane-0")
        return 1

    async def _run(self, batch: Sequence[Record]) -> None:
        done = 0

        async def on_ack(n: int) -> None:
            nonlocal done
            self._acked(batch[done:n])
            done = n
            await self._checkpoint(batch[n - 1], n < len(batch))

        await self._deliver(batch, on_ack)
        self.stats["batches"] = self.stats.get("batches", 0) + 1

    def _collect(self) -> None:
        task = self._task
        if task is not None and task.done():
            self._task = None
            if not task.cancelled() and task.exception() is not None and self._error is None:
                self._error = task.exception()
        if self._error is not None:
            raise self._error

    async def wait(self, timeout_s: float, *, also: asyncio.Future[Any] | None = None) -> None:
        """Wait until the batch in flight ends, ``also`` ends, or ``timeout_s`` seconds pass on
        the injected clock.

        Raises:
            The error of the batch.
        """
        waits = {f for f in (self._task, also) if f is not None and not f.done()}
        if waits:
            timer = asyncio.ensure_future(self._sleep(max(0.0, timeout_s)))
            try:
                await asyncio.wait(waits | {timer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
        self._collect()

    async def cancel(self) -> None:
        """Cancel the batch in flight; drop what is held and a kept error (a seek, the loop's end)."""
        task, self._task, self._error = self._task, None, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._held.clear()
        self._offset = self._count = 0
