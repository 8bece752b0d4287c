"""Parallel delivery of one shard: up to N batches in flight, order kept per partition key.

Lambda's ``ParallelizationFactor``: one shard's records are split by partition key into
``N`` lanes. Batches go out in **rounds** (:meth:`~.gather.BatchGatherer.take_round`): a
round is a contiguous run of the shard cut into one batch per lane (every record of one
key in the same batch, keys spread so the lanes fill evenly), and the next round
starts once every batch of the last one is acknowledged, which puts the checkpoint past
all of it. So records of one key are delivered in order, at most ``N`` batches are in
flight, and at most ``N`` batches (one round) lie past the checkpoint: a failure
redelivers at most those.

The checkpoint is the highest position below which every record is acknowledged
(:class:`AckTracker`): positions are ``(sequence number, sub-sequence)``, so a checkpoint
may fall inside a KPL aggregate, after the last acknowledged user record (the fetcher
resumes after it). Before ``SHARD_END`` the reader's loop delivers whatever is gathered
and waits until every lane's batches are acknowledged: ``SHARD_END`` is written only after
the shard's last record is. With ``N = 1`` and neither a window nor a byte limit the reader
uses :class:`~.engine.OneLane` instead (one batch in flight, no per-record tracking).
:class:`Lanes` is the interface the reader's loop drives, which both implement.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any, Protocol

from .. import mutation
from ..records import Record
from .gather import BatchGatherer
from .options import DeliveryOptions

__all__ = ["AckTracker", "ShardPipeline", "Lanes"]

log = logging.getLogger(__name__)

_FAILED_IDLE = mutation.register("lane_failure_shard_end",
                                 "a failed lane is not collected by wait() and, uncollected, counts as idle")

OnAck = Callable[[int], Awaitable[None]]
DeliverBatch = Callable[[Sequence[Record], OnAck], Awaitable[Any]]


class AckTracker:
    """One shard's records, in shard order, and which are acknowledged.

    ``add`` registers records as they are fetched; ``ack`` marks records done (in any
    order); ``advance`` returns the last record of the acknowledged prefix when it moved:
    the highest position below which everything is acknowledged, the only safe checkpoint.

    Records are known by identity (``id``): ``ack`` takes the very objects ``add``
    registered, as :class:`ShardPipeline` hands its lanes the objects it registered, so no
    sequence number is parsed per record (a record not registered is never acknowledged:
    the checkpoint then stays behind it). The tracker holds every registered record until
    it is behind the checkpoint, so an id is never reused meanwhile; and the acknowledged
    set holds ints, which Python's full garbage collections (they stop the whole process)
    do not scan, however many records a shard holds here.
    """

    def __init__(self) -> None:
        self._records: collections.deque[Record] = collections.deque()
        self._acked: set[int] = set()

    @property
    def pending(self) -> int:
        """Records registered and not yet behind the checkpoint."""
        return len(self._records)

    def add(self, records: Iterable[Record]) -> None:
        """Register records in shard order (after those registered before)."""
        self._records.extend(records)

    def ack(self, records: Iterable[Record]) -> None:
        """Mark records acknowledged (delivered, filtered or dead-lettered): objects :meth:`add` registered."""
        self._acked.update(map(id, records))

    def advance(self) -> Record | None:
        """Drop the acknowledged prefix; its last record (the new checkpoint), or None if it did not move."""
        last = None
        records, acked = self._records, self._acked
        while records and id(records[0]) in acked:
            last = records.popleft()
            acked.discard(id(last))
        return last

    def clear(self) -> None:
        """Forget everything (a seek: the records are fetched again)."""
        self._records.clear()
        self._acked.clear()


class Lanes(Protocol):
    """What the reader's read loop drives to deliver one shard's records: :class:`ShardPipeline`
    or :class:`~.engine.OneLane`. The error of a batch is raised by the next :meth:`dispatch`
    or :meth:`wait`; lanes holding an unraised error are never :attr:`idle`, so a shard's end
    is never recorded past a batch that failed."""

    @property
    def idle(self) -> bool:
        """Nothing held, nothing in flight, every finished batch collected."""

    @property
    def in_flight(self) -> int:
        """Batches with the downstream, not yet acknowledged."""

    def add(self, records: Sequence[Record]) -> None:
        """Hold fetched records (shard order) for delivery."""

    def dispatch(self, *, force: bool = False) -> int:
        """Start what may start now (``force``: whatever is held, windows aside); how many batches started."""

    def can_fetch(self) -> bool:
        """True while the next response may be fetched."""

    def due_in(self) -> float | None:
        """Seconds until held records are due (a window), or None."""

    async def wait(self, timeout_s: float, *, also: asyncio.Future[Any] | None = None) -> None:
        """Wait until a batch ends, ``also`` ends, or ``timeout_s`` seconds pass."""

    async def cancel(self) -> None:
        """Cancel the batches in flight and drop what is held."""


@dataclasses.dataclass
class _Lane:
    index: int
    task: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


class ShardPipeline:
    """gather -> lanes -> deliver -> acknowledge -> checkpoint, for one shard.

    The consumer's loop calls :meth:`add` with each fetched response, :meth:`dispatch` to
    start the next round when the last one is acknowledged, :meth:`can_fetch` before its
    next fetch (False while a ready round waits for one in flight: that is the backpressure), :meth:`wait`
    while it may not fetch, and, at shard end, ``dispatch(force=True)`` and :meth:`wait` until
    :attr:`idle`.

    Args:
        options: the :class:`DeliveryOptions` (``parallelization_factor``, batch limits, window).
        deliver: ``async deliver(batch, on_ack)``, e.g. ``DeliveryEngine.deliver``.
        checkpoint: ``async checkpoint(record)``: write the checkpoint after ``record``.
            Called one at a time, with positions that only grow: when a round is fully
            acknowledged, and after a partial acknowledgement (``on_ack(n)`` short of the
            batch, a ``PartialBatchError``) that moved the acknowledged prefix. A batch
            acknowledged whole while others of its round are still in flight moves the
            prefix without a write: the round's last batch writes it, one lease-table
            write per round instead of up to N, and a failure before then redelivers
            that round, at most N batches.
        max_records: the ``GetRecords`` ``Limit`` (the batch limit without ``max_batch_records``).
        clock: monotonic seconds (the window).
        wall_clock: epoch seconds, to count a window from the records' arrival times (see
            :class:`~.gather.BatchGatherer`); None: from when they are gathered.
        acked: called with records once they are acknowledged (delivered, filtered or
            dead-lettered), in no particular order across lanes: the byte budget and counters.
        stats: figures to set: ``batches_in_flight``, ``max_batches_in_flight`` (gauges) and
            ``batches`` (batches done).
        sleep: ``async sleep`` on ``clock`` (the timeout of :meth:`wait`), as :class:`~.engine.OneLane`'s.

    Errors of a lane (``SinkError``, a refused checkpoint) are parked and raised by the next
    :meth:`dispatch` or :meth:`wait`; nothing is checkpointed past them.
    """

    def __init__(self, options: DeliveryOptions, deliver: DeliverBatch, checkpoint: Callable[[Record], Awaitable[None]],
                 *, max_records: int, clock: Callable[[], float],
                 acked: Callable[[Sequence[Record]], object] | None = None,
                 wall_clock: Callable[[], float] | None = None,
                 stats: MutableMapping[str, Any] | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        n = options.parallelization_factor
        self._gatherer = BatchGatherer(max_records=options.batch_limit(max_records), max_bytes=options.max_batch_bytes,
                                       window_s=options.batch_window_s, clock=clock, lanes=n,
                                       wall_clock=wall_clock)
        self._lanes = [_Lane(i) for i in range(n)]
        self._refill_below = max_records
        self._deliver = deliver
        self._sleep = sleep
        self._checkpoint = checkpoint
        self._acked = acked or (lambda records: None)
        self.stats = stats if stats is not None else {}
        self.stats.setdefault("max_batches_in_flight", 0)
        self.tracker = AckTracker()
        self._lock = asyncio.Lock()
        self._round_end: tuple[int, int] | None = None  # position of the last record of the round in flight
        self._unwritten: Record | None = None  # the acknowledged prefix's end, not written yet
        self._error: BaseException | None = None

    # ------------------------------------------------------------ state
    @property
    def in_flight(self) -> int:
        """Batches handed to the downstream and not yet acknowledged (at most N)."""
        return sum(lane.busy for lane in self._lanes)

    @property
    def gathered(self) -> int:
        """Records gathered and not yet handed to the downstream."""
        return len(self._gatherer)

    @property
    def idle(self) -> bool:
        """True when nothing is gathered, nothing is in flight and every finished batch has
        been collected by :meth:`dispatch` or :meth:`wait` (which raise a lane's parked
        error): a failed lane never looks idle, so shard end cannot be
        written past its records."""
        if _FAILED_IDLE in mutation.ACTIVE:
            return not self.gathered and not self.in_flight
        return not self.gathered and all(lane.task is None for lane in self._lanes)

    def _may_start(self) -> bool:
        """The next round starts once no batch is in flight: a lane's task ends only after its
        records are acknowledged and the acknowledged prefix advanced, so the last round
        then lies behind the checkpoint. At most one round (N batches) is ever past it, so
        a failure redelivers at most N batches of the shard, not
        every batch a fast lane acknowledged ahead of a slow one."""
        return not any(lane.busy for lane in self._lanes)

    def can_fetch(self) -> bool:
        """True while fewer records are gathered than one ``GetRecords`` can bring (the next
        response is fetched while these go out), or while no ready round waits for the one in
        flight; False otherwise (fetching more would only grow what waits)."""
        return self.gathered < self._refill_below or self._may_start() or not self._gatherer.ready()

    def due_in(self) -> float | None:
        """Seconds until the next round is ready if it may start (0.0: now), or None (nothing to wait for)."""
        return self._gatherer.due_in() if self._may_start() else None

    def _note_in_flight(self) -> None:
        n = self.in_flight
        self.stats["batches_in_flight"] = n
        self.stats["max_batches_in_flight"] = max(self.stats["max_batches_in_flight"], n)

    def _raise_parked(self) -> None:
        for lane in self._lanes:
            task = lane.task
            if task is not None and task.done():
                lane.task = None
                if not task.cancelled() and task.exception() is not None and self._error is None:
                    self._error = task.exception()
        self._note_in_flight()
        if self._error is not None:
            raise self._error

    # ------------------------------------------------------------ flow
    def add(self, records: Sequence[Record]) -> None:
        """Register fetched records (in shard order) and gather them (each into its key's lane)."""
        if not records:
            return
        records = list(records)  # the same objects in the tracker and the lanes (it knows them by identity)
        self.tracker.add(records)
        self._gatherer.add(records)

    def dispatch(self, *, force: bool = False) -> int:
        """Start the next round if it may start (nothing in flight) and is ready (``force``:
        whatever is held, within the limits); how many batches started.

        Raises:
            The parked error of a lane that failed.
        """
        self._raise_parked()
        started = 0
        parts = self._gatherer.take_round(force=force) if self._may_start() else None
        ends = [batch[-1].position for batch in parts or () if batch]
        if ends:
            self._round_end = max(ends)
        for lane, batch in zip(self._lanes, parts or ()):
            if batch:
                lane.task = asyncio.create_task(self._run(batch), name=f"lane-{lane.index}")
                started += 1
        self._note_in_flight()
        return started

    async def _run(self, batch: list[Record]) -> None:
        acked = 0

        async def on_ack(n: int) -> None:
            nonlocal acked
            newly, acked = batch[acked:n], max(acked, n)
            self.tracker.ack(newly)
            self._acked(newly)
            await self._write_checkpoint(defer=n >= len(batch))

        await self._deliver(batch, on_ack)
        if acked < len(batch):  # a deliver that returns has done every record
            await on_ack(len(batch))
        self.stats["batches"] = self.stats.get("batches", 0) + 1

    async def _write_checkpoint(self, *, defer: bool = False) -> None:
        """Write the acknowledged prefix's end if it moved; with ``defer``, not while it
        stops short of the round in flight (see ``checkpoint`` in the class docstring)."""
        async with self._lock:
            last = self.tracker.advance()
            if last is not None:
                self._unwritten = last
            target = self._unwritten
            if target is None or (defer and self._round_end is not None and target.position < self._round_end):
                return
            self._unwritten = None
            await self._checkpoint(target)

    async def wait(self, timeout_s: float, *, also: asyncio.Future[Any] | None = None) -> None:
        """Wait until a batch in flight is acknowledged, ``also`` (e.g. the shard's fetch) ends,
        or ``timeout_s`` seconds on the injected clock; at once if none of them is pending.

        Raises:
            The parked error of a lane that failed.
        """
        tasks: list[asyncio.Future[Any]] = [lane.task for lane in self._lanes
                                            if lane.task is not None and not lane.task.done()]
        if also is not None and not also.done():
            tasks.append(also)
        if tasks:
            timer = asyncio.ensure_future(self._sleep(max(0.0, timeout_s)))
            try:
                await asyncio.wait([*tasks, timer], return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
        if _FAILED_IDLE not in mutation.ACTIVE:
            self._raise_parked()

    async def cancel(self) -> None:
        """Cancel the batches in flight; forget everything gathered and a parked error (a seek, a lost lease)."""
        tasks = [lane.task for lane in self._lanes if lane.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:  # gather() of nothing still asks for an event loop (a task closed at exit has none)
            await asyncio.gather(*tasks, return_exceptions=True)
        for lane in self._lanes:
            lane.task = None
        self._gatherer.drop()
        self.tracker.clear()
        self._round_end = self._unwritten = self._error = None
        self._note_in_flight()
