"""The lease keeper of one consumer: fenced store writes, the renew loop, liveness, and
the pacing of its checkpoint writes.

* Every store write is conditional on the lease owner and counter (fencing). Writes are
  serialised and always use the latest :class:`~kinesis_actors.leases.protocol.Lease`; a
  lease is valid from when its last successful write was SENT.
* The renew loop renews only while the read loop shows signs of life (a heartbeat stamped
  at every step and every ``renew_interval_s / 2`` while it waits on the downstream, on a
  backoff, on the byte budget or on a thread of the pool): a stuck loop lets its lease
  lapse; a slow downstream never does.
* Retries of lease writes live here, in one helper (:meth:`LeaseKeeper.retried`): a
  transient store error (throttled, unreachable) is retried with backoff until the lease is
  in doubt (its last successful write older than ``renew_deadline_s``); then the lease
  counts as lost. The DynamoDB stores make one attempt per call (no botocore retries under
  these).
* Checkpoints (:class:`CheckpointPacer`): only acknowledged positions are written. With
  ``min_checkpoint_interval_s=None`` the pending position rides the lease's next renewal:
  the renewal is the checkpoint write (a checkpoint raises the counter, so it renews in the
  same conditional write), and the table sees one write per renew interval. With 0 every
  acknowledged batch is written; above 0, at most one per interval. A forced flush (close,
  handoff) and a partial acknowledgement write at once. ``SHARD_END`` and a seek drop what is
  pending (each writes its own position). A lost lease drops it too: the next owner resumes
  at the stored checkpoint, so every record acknowledged since is delivered again.
* A renewal, and the checkpoint of a pending position, carry the shard's throughput
  (:meth:`LeaseKeeper.throughput`, once a full load window was measured) in the same
  conditional write: the row's figure costs no write of its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any

from .. import mutation
from ..backoff import Backoff
from ..clock import monotonic_s
from ..errors import KinesisError, LeaseLostError
from ..leases.protocol import Lease, LeaseStore
from .io import ReaderIo, ToThreadIo
from .spec import ReaderSpec, Sleep

__all__ = ["LeaseKeeper", "CheckpointPacer", "CHECKPOINT_BACKOFF"]

log = logging.getLogger("kinesis_actors.reader")

CHECKPOINT_BACKOFF = Backoff(base_s=0.2, cap_s=5.0, floor_s=0.05)
"""Waits between attempts of a lease write the store failed transiently (:meth:`LeaseKeeper.retried`),
each capped at a third of the renew interval and at 1 s."""

_NO_LIVENESS = mutation.register("renew_without_liveness_check", "a stuck read loop's lease is renewed on")
_UNFENCED_CHECKPOINT = mutation.register("checkpoint_after_lost_lease",
                                         "a refused checkpoint is written again over the new owner's row")

RENEW_SLOT_S = 0.25
"""Renewals fall due on a grid of this many seconds of the monotonic clock (at most a tenth of
the renew interval): the consumers of one process due in the same slot wake together, and their
lease-store calls overlap, so MemoryLeaseStore's group commit carries them in a few actor calls."""


def renewal_slot(due: float, renew_interval_s: float) -> float:
    """``due`` (monotonic s) rounded up to the renewal grid (:data:`RENEW_SLOT_S`, at most a
    tenth of ``renew_interval_s``): a renewal is late by less than one slot."""
    slot = min(RENEW_SLOT_S, renew_interval_s / 10)
    return math.ceil(due / slot) * slot


Write = Callable[..., "Lease | None"]
"""A store write: ``write(latest lease, *args)`` -> the new Lease (e.g. ``store.renew``)."""


class LeaseKeeper:
    """Keeps one lease: fenced writes, renewals, and whether the read loop is alive.

    Args:
        spec: the consumer's spec (owner, lease timing). lease: the lease as taken.
        store: the lease store (blocking calls, run in ``io``'s store pool).
        io: the process's :class:`~kinesis_actors.reader.io.ReaderIo` (or ``ToThreadIo``).
        clock: monotonic seconds. sleep: ``async sleep`` on that clock.
        lease_age_s: seconds since the write that produced ``lease`` was sent (a lower
            bound); None: one renew interval, assumed.
        on_lost: called once with why, when the lease is found lost (fenced, or past its deadline).
        on_handoff: called with the asker's owner id when a write returns ``lease_next_owner``.
        rng: uniform [0, 1) (the first renewal's spread, backoff jitter); None: ``random.random``.
        stats: the consumer's stats dict (``lease_counter`` is kept up to date there).

    Attributes:
        rider: the :class:`CheckpointPacer` whose pending checkpoint the next renewal writes
            (``min_checkpoint_interval_s=None``), or None.
    """

    def __init__(self, spec: ReaderSpec, lease: Lease, store: LeaseStore, io: ReaderIo | ToThreadIo, *,
                 clock: Callable[[], float] = monotonic_s, sleep: Sleep = asyncio.sleep,
                 lease_age_s: float | None = None, on_lost: Callable[[str], None] = lambda why: None,
                 on_handoff: Callable[[str], None] = lambda asker: None,
                 rng: Callable[[], float] | None = None, stats: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.store = store
        self._lease = lease
        self._io = io
        self._clock = clock
        self._sleep = sleep
        self._on_lost = on_lost
        self._on_handoff = on_handoff
        self._rng = rng if rng is not None else random.random
        self._lock = asyncio.Lock()
        self.lost: str | None = None  # why the lease was lost; then nothing more is written
        age = spec.renew_interval_s if lease_age_s is None else max(0.0, lease_age_s)
        self._last_write = clock() - age  # when the last successful write was SENT
        self._beat = clock()
        self._waiting = 0  # > 0 while the loop waits on a store write (bounded by its timeouts): alive
        self.call_started: list[float] | None = None  # a Kinesis call of the loop: [] while queued
        self.loop_task: asyncio.Task[Any] | None = None  # writes from this task count as signs of life
        self.rider: CheckpointPacer | None = None
        self.stats: dict[str, Any] = stats if stats is not None else {}
        self.stats["lease_counter"] = lease.counter

    @property
    def lease(self) -> Lease:
        """The latest Lease written (its counter is the fencing token)."""
        return self._lease

    # ------------------------------------------------------------------ writes
    async def write(self, what: str, call: Write | None, *args: Any, pacer: CheckpointPacer | None = None) -> Lease:
        """One conditional store write ``call(latest lease, *args)``, serialised. ``what`` names it.

        With a ``pacer``, its pending position is read once this write's turn comes (under the
        lock that serialises writes, so a checkpoint never overtakes a later one, nor
        ``SHARD_END``): when one is pending, the write is its checkpoint instead of ``call``
        (a checkpoint raises the counter: it renews as well); when none is and ``call`` is
        None, nothing is written.

        Raises:
            LeaseLostError: the lease was lost before, or this write was refused (fenced).
            KinesisError: the store failed otherwise (throttled, unreachable: ``retriable``).
        """
        if asyncio.current_task() is not self.loop_task:
            return await self._write_now(what, call, args, pacer)
        self._waiting += 1
        try:
            return await self._write_now(what, call, args, pacer)
        finally:
            self._waiting -= 1
            self._beat = max(self._beat, self._clock())

    async def _write_now(self, what: str, call: Write | None, args: tuple[Any, ...],
                         pacer: CheckpointPacer | None) -> Lease:
        async with self._lock:
            if self.lost is not None:
                raise LeaseLostError(f"lease {self._lease.key} was lost; not writing")
            position = pacer.pending if pacer is not None else None
            if position is not None:
                call, args = functools.partial(self.store.checkpoint, sub_sequence=position[1],
                                               throughput_kbps=self.throughput()), (position[0],)
            if call is None:
                return self._lease
            # A write already sent must update our Lease even if we are cancelled meanwhile,
            # or the next write (the release at close) would carry a stale counter.
            sent = self._clock()
            write = asyncio.ensure_future(self._io.store(call, self._lease, *args))
            try:
                new = self._applied(await asyncio.shield(write), sent)
            except asyncio.CancelledError:
                # Wait for the write in flight (a second cancel, the stop's deadline, ends that
                # wait: then the write lands later and is adopted if still the newest, or the
                # lease expires).
                write.add_done_callback(functools.partial(self._adopt_late, sent=sent))
                try:
                    self._applied(await write, sent)
                except BaseException:  # the write failed or we were cancelled again: as it lands
                    pass
                raise
            except LeaseLostError:
                if position is not None and _UNFENCED_CHECKPOINT in mutation.ACTIVE:
                    await self._io.store(self._overwrite, call, args)
                self.mark_lost(f"{what} refused: the lease changed owner or counter")
                raise
            if pacer is not None and position is not None:
                pacer.written(position)
            return new

    def _overwrite(self, call: Write | None, args: tuple[Any, ...]) -> None:
        """The planted bug ``checkpoint_after_lost_lease``: the refused write again, on the row as it is now."""
        row = self.store.get(self.spec.stream, self.spec.shard_id)
        if call is not None and row is not None and row.owner is not None:
            try:
                call(row, *args)
            except Exception as e:  # the row moved again: the bug lands at most once
                log.debug("shard %s: planted overwrite refused (%r)", self.spec.shard_id, e)

    def _adopt_late(self, done: asyncio.Future[Lease | None], sent: float) -> None:
        """A write cancelled while in flight landed later: adopt its Lease (not awaited by anyone)."""
        if done.cancelled() or done.exception() is not None:
            return
        new = done.result()
        if new is not None and new.counter > self._lease.counter:
            self._applied(new, sent)

    def _applied(self, new: Lease | None, sent: float) -> Lease:
        if new is not None:
            self._lease = new
            self.stats["lease_counter"] = new.counter
            asker = new.next_owner
            if asker and asker != self.spec.owner_id and new.owner == self.spec.owner_id:
                self._on_handoff(asker)
        self._last_write = max(self._last_write, sent)
        return self._lease

    async def retried(self, what: str, attempt: Callable[[], Awaitable[Lease]], *,
                      sleep: Callable[[float], Awaitable[Any]] | None = None) -> Lease:
        """Run ``attempt`` (one store write through :meth:`write`), retrying a transient store
        error with backoff until the lease is in doubt (:meth:`in_doubt`), when it is marked
        lost. The one retry loop of lease writes: the stores make one attempt per call.

        Args:
            what: names the write in messages. attempt: ``async attempt()`` -> the new Lease.
            sleep: ``async sleep(seconds)`` between attempts (the read loop's keeps its
                heartbeat going); default: the keeper's sleep.

        Raises:
            LeaseLostError: refused (fenced), or given up with the lease in doubt (marked lost).
            KinesisError: a non-retriable store error.
        """
        failures = 0
        while True:
            try:
                return await attempt()
            except LeaseLostError:
                raise
            except KinesisError as e:
                if not e.retriable:
                    raise
                failures += 1
                if self.in_doubt():
                    self.mark_lost(f"{what} failing past the deadline ({e!r:.200})")
                    raise LeaseLostError(f"lease {self._lease.key}: {what} not written by the deadline") from e
                log.info("shard %s: %s failed (%r); retry %d", self.spec.shard_id, what, e, failures)
                wait = min(CHECKPOINT_BACKOFF.delay_s(failures, rng=self._rng), self.spec.renew_interval_s / 3, 1.0)
                await (sleep or self._sleep)(wait)

    def mark_lost(self, why: str) -> None:
        """The lease is lost: write nothing more; tell the consumer (once)."""
        if self.lost is None:
            self.lost = why
            log.warning("shard %s: lease lost (%s); stopping without writing", self.spec.shard_id, why)
            self._on_lost(why)

    def throughput(self) -> float | None:
        """The shard's throughput in KB/s (from its ``bytes_per_s``) once a full ``load_window_s``
        was measured (``stats["load_known"]``), else None: renewals and the checkpoints of
        pending positions carry it in their own conditional write, so the row's figure costs
        no write of its own."""
        if not self.stats.get("load_known"):
            return None
        return max(0.0, float(self.stats.get("bytes_per_s") or 0.0)) / 1000.0

    async def renew(self) -> Lease:
        """One renewal (a fenced write, with :meth:`throughput`; see :meth:`write`). With a
        :attr:`rider` holding an acknowledged position, the renewal is the checkpoint write of
        that position."""
        return await self.write("renew", functools.partial(self.store.renew, throughput_kbps=self.throughput()),
                                pacer=self.rider)

    def in_doubt(self) -> bool:
        """True when the last successful write is older than ``renew_deadline_s``: the lease
        may have lapsed (a paused process, a long outage) and another owner may read."""
        return self._clock() - self._last_write > self.spec.renew_deadline_s

    async def confirm(self) -> None:
        """Before handing a batch downstream: if the lease is in doubt, renew it first. A
        zombie (a process resumed after SIGSTOP, a lease taken long ago) is fenced here.

        Raises:
            LeaseLostError: refused, or the store unreachable with the lease in doubt.
        """
        if not self.in_doubt():
            return
        try:
            await self.renew()
        except LeaseLostError:
            raise
        except Exception as e:  # any store failure: with the lease in doubt, not delivering is the safe side
            self.mark_lost(f"lease in doubt and the store unreachable ({e!r:.200})")
            raise LeaseLostError(f"lease {self._lease.key} in doubt; not delivering") from e

    async def checkpoint(self, pacer: CheckpointPacer, sleep_alive: Callable[[float], Any]) -> None:
        """Write ``pacer``'s pending position now (if still pending when its turn comes),
        retried (:meth:`retried`).

        Raises:
            LeaseLostError: refused (fenced), or given up at the deadline (marked lost).
            KinesisError: a non-retriable store error.
        """
        await self.retried("checkpoint", functools.partial(self.write, "checkpoint", None, pacer=pacer),
                           sleep=sleep_alive)

    # ------------------------------------------------------------------ liveness
    def alive(self) -> None:
        """The read loop is alive now."""
        self._beat = self._clock()

    def last_sign_of_life(self) -> float:
        """When the loop last showed it is alive (monotonic s). Waiting for a place in the
        Kinesis pool or on a store write counts as alive (other loops hold the resource;
        the wait is bounded); a Kinesis call counts from when its thread started it, and
        must end within its socket timeout."""
        call = self.call_started
        if self._waiting or (call is not None and not call):
            return self._clock()
        return max(self._beat, call[0]) if call else self._beat

    # ------------------------------------------------------------------ renew loop
    async def renew_loop(self) -> None:
        """Renew every ``renew_interval_s`` after the last successful write while the loop is
        alive, until the lease is lost, each on the grid of :func:`renewal_slot`. The first
        renewal comes between half an interval and one interval after the take, spread, so
        consumers opened together do not renew in one burst forever after (they share slots,
        not one instant), and no two writes are ever more than an interval (plus a slot) apart. A checkpoint written in
        the meantime renews the lease (it raises the counter), so the renewal then waits for its
        new due time. A failing renewal is retried by :meth:`retried` until the lease is in doubt."""
        spec = self.spec
        first = True
        while self.lost is None:
            written = self._last_write
            due = written + spec.renew_interval_s
            if first:
                due -= self._rng() * spec.renew_interval_s / 2
                first = False
            await self._sleep(max(0.0, renewal_slot(due, spec.renew_interval_s) - self._clock()))
            now = self._clock()
            if self._last_write != written:
                continue  # a checkpoint written meanwhile renewed the lease: the next renewal is due later
            silent = now - self.last_sign_of_life()
            # the loop is stuck (a hung call): let the lease lapse
            if silent > spec.lease_duration_s and _NO_LIVENESS not in mutation.ACTIVE:
                log.warning("shard %s: read loop silent for %.1f s; not renewing", spec.shard_id, silent)
                if self.in_doubt():
                    self.mark_lost("read loop stuck past the lease deadline")
                    return
                await self._sleep(min(spec.renew_interval_s, 0.5))
                continue
            try:
                await self.retried("renew", self.renew)
                self._io.note_renewal(self._clock() - now, spec.renew_interval_s)
            except LeaseLostError:
                return
            except Exception as e:  # a non-retriable store error: not a lost lease, until our deadline
                if self.in_doubt():
                    self.mark_lost(f"renewals failing past the deadline ({e!r:.200})")
                    return
                log.warning("shard %s: renew failed (%r); retrying", spec.shard_id, e)
                await self._sleep(min(spec.renew_interval_s / 3, 1.0))


class CheckpointPacer:
    """The acknowledged-but-not-checkpointed position of one lease, and when to write it.

    Args:
        keeper: the consumer's :class:`LeaseKeeper` (it writes the pending position under
            its write lock: :meth:`LeaseKeeper.checkpoint`, :meth:`LeaseKeeper.renew`).
        interval_s: ``min_checkpoint_interval_s``: None rides the renewals (this pacer
            becomes the keeper's :attr:`LeaseKeeper.rider`); 0 writes every acknowledged
            batch; above 0, at most one write per interval (seconds).
        clock: monotonic seconds (the consumer's injected clock).
        sleep_alive: ``async sleep_alive(seconds)`` for the keeper's retry waits (keeps the
            loop's heartbeat going while it waits).
        stats: the consumer's stats dict (``checkpoint`` and ``checkpoints_written`` are kept there).
    """

    def __init__(self, keeper: LeaseKeeper, interval_s: float | None, *, clock: Callable[[], float],
                 sleep_alive: Callable[[float], Awaitable[Any]], stats: dict[str, Any]) -> None:
        self._keeper = keeper
        self._interval_s = interval_s
        self._clock = clock
        self._sleep_alive = sleep_alive
        self._stats = stats
        self.pending: tuple[str, int | None] | None = None  # (sequence, sub-sequence) acknowledged, not written
        self._partial = False  # the pending position ends a partial acknowledgement: written at once
        self._written_at = float("-inf")  # when the last checkpoint was written (injected clock, s)
        if interval_s is None:
            keeper.rider = self

    def acknowledged(self, sequence_number: str, sub_sequence: int | None, *, partial: bool = False) -> None:
        """The downstream acknowledged every record up to this one: it may be checkpointed.
        ``partial``: the acknowledgement covers part of a batch only (the rest is retried):
        the next :meth:`flush` writes it whatever the mode."""
        self.pending = (sequence_number, sub_sequence)
        self._partial = partial

    def clear(self) -> None:
        """Drop what is pending (``SHARD_END`` or a seek writes its own position instead)."""
        self.pending = None
        self._partial = False

    def written(self, position: tuple[str, int | None]) -> None:
        """``position`` was written (by :meth:`flush` or with a renewal): count it, and drop it
        from pending unless a later acknowledgement replaced it meanwhile."""
        self._written_at = self._clock()
        if self.pending == position:
            self.pending = None
            self._partial = False
        self._stats["checkpoint"] = position[0]
        self._stats["checkpoints_written"] = self._stats.get("checkpoints_written", 0) + 1

    async def flush(self, *, due_only: bool = False) -> None:
        """Write the checkpoint of the last acknowledged record, if not written yet. With
        ``due_only`` (after each acknowledged batch), only when the mode says so: never when
        riding the renewals (None), once ``min_checkpoint_interval_s`` passed since the last
        write otherwise (always, when it is 0); a partial acknowledgement is always written.

        Raises:
            LeaseLostError, KinesisError: as :meth:`LeaseKeeper.checkpoint`.
        """
        if self.pending is None:
            return
        if due_only and not self._partial and (
                self._interval_s is None or self._clock() - self._written_at < self._interval_s):
            return
        await self._keeper.checkpoint(self, self._sleep_alive)
