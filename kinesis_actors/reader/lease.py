"""The lease keeper of one consumer: fenced store writes, the renew loop, liveness, and
the pacing of its checkpoint writes.

* Every store write is conditional on the lease owner and counter (fencing). Writes are
  serialised and always use the latest :class:`~kinesis_actors.leases.protocol.Lease`; a
  lease is valid from when its last successful write was SENT.
* The renew loop renews only while the read loop shows signs of life (a heartbeat stamped
  at every step and every ``renew_interval_s / 2`` while it waits on the downstream, on a
  backoff, on the byte budget or on a thread of the pool): a stuck loop lets its lease
  lapse; a slow downstream never does.
* Failing renewals (throttled, unreachable) are retried until the deadline (last
  successful write + ``renew_deadline_s``); then the lease counts as lost.
* Checkpoints (:class:`CheckpointPacer`): only acknowledged positions are written. A
  periodic flush (``due_only``) writes at most once per ``min_checkpoint_interval_s``
  (every acknowledged batch, when it is 0); a forced flush (close, handoff, failure)
  always writes what is pending. ``SHARD_END`` and a seek drop what is pending (each
  writes its own position). A lost lease drops it too: the next owner resumes at the
  stored checkpoint, so every record acknowledged since is delivered again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..backoff import Backoff
from ..errors import KinesisError, LeaseLostError
from ..leases.protocol import Lease, LeaseStore
from .io import ReaderIo, ToThreadIo
from .spec import ReaderSpec, Sleep

__all__ = ["LeaseKeeper", "CheckpointPacer", "CHECKPOINT_BACKOFF"]

log = logging.getLogger("kinesis_actors.reader")

CHECKPOINT_BACKOFF = Backoff(base_s=0.2, cap_s=5.0, floor_s=0.05)

RENEW_SLOT_S = 0.25
"""Renewals fall due on a grid of this many seconds of the monotonic clock (at most a tenth of
the renew interval): the consumers of one process due in the same slot wake together, and their
lease-store calls overlap, so MemoryLeaseStore's group commit carries them in a few actor calls."""


def renewal_slot(due: float, renew_interval_s: float) -> float:
    """``due`` (monotonic s) rounded up to the renewal grid (:data:`RENEW_SLOT_S`, at most a
    tenth of ``renew_interval_s``): a renewal is late by less than one slot."""
    slot = min(RENEW_SLOT_S, renew_interval_s / 10)
    return math.ceil(due / slot) * slot
"""Waits between attempts of a checkpoint or renewal the store failed transiently (capped by the renew interval)."""

Write = Callable[[Lease], "Lease | None"]


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
    """

    def __init__(self, spec: ReaderSpec, lease: Lease, store: LeaseStore, io: ReaderIo | ToThreadIo, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep,
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
        self.stats: dict[str, Any] = stats if stats is not None else {}
        self.stats["lease_counter"] = lease.counter

    @property
    def lease(self) -> Lease:
        """The latest Lease written (its counter is the fencing token)."""
        return self._lease

    # ------------------------------------------------------------------ writes
    async def write(self, what: str, call: Write) -> Lease:
        """One conditional store write ``call(latest lease)``, serialised. ``what`` names it in messages.

        Raises:
            LeaseLostError: the lease was lost before, or this write was refused (fenced).
            KinesisError: the store failed otherwise (throttled, unreachable: ``retriable``).
        """
        if asyncio.current_task() is not self.loop_task:
            return await self._write_now(what, call)
        self._waiting += 1
        try:
            return await self._write_now(what, call)
        finally:
            self._waiting -= 1
            self._beat = max(self._beat, self._clock())

    async def _write_now(self, what: str, call: Write) -> Lease:
        async with self._lock:
            if self.lost is not None:
                raise LeaseLostError(f"lease {self._lease.key} was lost; not writing")
            # A write already sent must update our Lease even if we are cancelled meanwhile,
            # or the next write (the release at close) would carry a stale counter.
            sent = self._clock()
            write = asyncio.ensure_future(self._io.store(call, self._lease))
            try:
                new = await asyncio.shield(write)
            except asyncio.CancelledError:
                # Wait for the write in flight (a second cancel, the stop's deadline, ends that
                # wait: then the write lands later and is adopted if still the newest, or the
                # lease expires).
                write.add_done_callback(lambda done: self._adopt_late(done, sent))
                try:
                    self._applied(await write, sent)
                except BaseException:  # the write failed or we were cancelled again: as it lands
                    pass
                raise
            except LeaseLostError:
                self.mark_lost(f"{what} refused: the lease changed owner or counter")
                raise
            return self._applied(new, sent)

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

    def mark_lost(self, why: str) -> None:
        """The lease is lost: write nothing more; tell the consumer (once)."""
        if self.lost is None:
            self.lost = why
            log.warning("shard %s: lease lost (%s); stopping without writing", self.spec.shard_id, why)
            self._on_lost(why)

    def throughput(self) -> dict[str, float]:
        """``{"throughput_kbps": KB/s}`` once a full ``load_window_s`` was measured
        (``stats["load_known"]``, from the shard's ``bytes_per_s``), else ``{}``: renewals and
        checkpoints carry it in their own write, so the row's figure costs no write."""
        if not self.stats.get("load_known"):
            return {}
        return {"throughput_kbps": float(self.stats.get("bytes_per_s") or 0.0) / 1000.0}

    def _checkpoint_write(self, sequence_number: str, sub_sequence: int | None, extra: dict[str, float],
                          lease: Lease) -> Lease:
        return self.store.checkpoint(lease, sequence_number, sub_sequence=sub_sequence, **extra)

    def renew(self) -> Any:
        """One renewal (a fenced write, with :meth:`throughput`); see :meth:`write`."""
        extra = self.throughput()
        return self.write("renew", lambda lease: self.store.renew(lease, **extra))

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

    async def checkpoint(self, sequence_number: str, sub_sequence: int | None,
                         sleep_alive: Callable[[float], Any]) -> None:
        """Write the checkpoint of an acknowledged batch, retrying a transient store error
        with backoff for up to ``renew_deadline_s`` (while the lease is not in doubt).

        Raises:
            LeaseLostError: refused (fenced), or given up at the deadline (marked lost).
            KinesisError: a non-retriable store error.
        """
        attempt, first_failure = 0, None
        while True:
            try:
                await self.write("checkpoint", functools.partial(self._checkpoint_write, sequence_number, sub_sequence,
                                                                 self.throughput()))
                return
            except LeaseLostError:
                raise
            except KinesisError as e:
                if not e.retriable:
                    raise
                attempt += 1
                now = self._clock()
                first_failure = now if first_failure is None else first_failure
                if self.in_doubt() or now - first_failure > self.spec.renew_deadline_s:
                    self.mark_lost(f"checkpoint failing past the deadline ({e!r:.200})")
                    raise LeaseLostError(f"lease {self._lease.key}: checkpoint not written by the deadline") from e
                log.info("shard %s: checkpoint failed (%r); retry %d", self.spec.shard_id, e, attempt)
                await sleep_alive(min(CHECKPOINT_BACKOFF.delay_s(attempt, rng=self._rng), self.spec.renew_interval_s))

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
        renewal is spread over half an interval, so consumers opened together do not renew in
        one burst forever after (they share slots, not one instant)."""
        spec = self.spec
        first, failures = True, 0
        while self.lost is None:
            due = self._last_write + spec.renew_interval_s
            if first:
                due += self._rng() * spec.renew_interval_s / 2
                first = False
            await self._sleep(max(0.0, renewal_slot(due, spec.renew_interval_s) - self._clock()))
            now = self._clock()
            silent = now - self.last_sign_of_life()
            if silent > spec.lease_duration_s:  # the loop is stuck (a hung call): let the lease lapse
                log.warning("shard %s: read loop silent for %.1f s; not renewing", spec.shard_id, silent)
                if self.in_doubt():
                    self.mark_lost("read loop stuck past the lease deadline")
                    return
                await self._sleep(min(spec.renew_interval_s, 0.5))
                continue
            try:
                await self.renew()
                failures = 0
                self._io.note_renewal(self._clock() - now, spec.renew_interval_s)
            except LeaseLostError:
                return
            except Exception as e:  # throttled or unreachable: not a lost lease, until our deadline
                if self.in_doubt():
                    self.mark_lost(f"renewals failing past the deadline ({e!r:.200})")
                    return
                failures += 1
                log.info("shard %s: renew failed (%r); retrying", spec.shard_id, e)
                await self._sleep(min(CHECKPOINT_BACKOFF.delay_s(failures, rng=self._rng), spec.renew_interval_s / 3,
                                      1.0))


class CheckpointPacer:
    """The acknowledged-but-not-checkpointed position of one lease, and when to write it.

    Args:
        keeper: the consumer's :class:`LeaseKeeper` (its fenced, retried
            :meth:`LeaseKeeper.checkpoint` write).
        interval_s: ``min_checkpoint_interval_s``, seconds (>= 0; 0: every acknowledged batch).
        clock: monotonic seconds (the consumer's injected clock).
        sleep_alive: ``async sleep_alive(seconds)`` for the keeper's retry waits (keeps the
            loop's heartbeat going while it waits).
        stats: the consumer's stats dict (``checkpoint`` and ``checkpoints_written`` are kept there).
    """

    def __init__(self, keeper: LeaseKeeper, interval_s: float, *, clock: Callable[[], float],
                 sleep_alive: Callable[[float], Awaitable[Any]], stats: dict[str, Any]) -> None:
        self._keeper = keeper
        self._interval_s = interval_s
        self._clock = clock
        self._sleep_alive = sleep_alive
        self._stats = stats
        self.pending: tuple[str, int | None] | None = None  # (sequence, sub-sequence) acknowledged, not written
        self._written_at = float("-inf")  # when the last checkpoint was written (injected clock, s)

    def acknowledged(self, sequence_number: str, sub_sequence: int | None) -> None:
        """The downstream acknowledged every record up to this one: it may be checkpointed."""
        self.pending = (sequence_number, sub_sequence)

    def clear(self) -> None:
        """Drop what is pending (``SHARD_END`` or a seek writes its own position instead)."""
        self.pending = None

    async def flush(self, *, due_only: bool = False) -> None:
        """Write the checkpoint of the last acknowledged record, if not written yet. With
        ``due_only``, only once ``min_checkpoint_interval_s`` passed since the last write
        (always, when it is 0).

        Raises:
            LeaseLostError, KinesisError: as :meth:`LeaseKeeper.checkpoint`.
        """
        pending = self.pending
        if pending is None:
            return
        if due_only and self._clock() - self._written_at < self._interval_s:
            return
        await self._keeper.checkpoint(*pending, self._sleep_alive)
        self._written_at = self._clock()
        if self.pending == pending:
            self.pending = None
        self._stats["checkpoint"] = pending[0]
        self._stats["checkpoints_written"] += 1
