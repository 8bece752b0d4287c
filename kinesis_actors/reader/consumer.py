"""ShardConsumer: the life of one shard lease in a reader, as a state machine (see :mod:`.states`).

Fault model (every invariant of SPEC.md holds per consumer, whatever else the process runs):

* The checkpoint is written only after the downstream acknowledged the batch
  (:class:`~.delivery.BatchDelivery` says how far), so a crash anywhere re-delivers at
  most what was acknowledged since the last checkpoint (at-least-once); the
  :class:`~.lease.CheckpointPacer` paces the writes (``min_checkpoint_interval_s``).
* Store writes go through the consumer's :class:`~.lease.LeaseKeeper` (fenced, serialised).
* A lost lease ends the consumer at once (``LOST``): nothing more is written, the batch
  in flight is not acknowledged. A consumer whose lease is in doubt renews it before
  handing a batch downstream, so a resumed zombie is fenced before it delivers.
* Graceful handoff: a write that returns the lease with ``lease_next_owner`` set (or
  :meth:`ShardConsumer.request_handoff`) stops the consumer with ``HANDOFF``: the batch
  in flight is delivered, acknowledged and checkpointed, records fetched but not
  delivered are dropped, then one fenced ``hand_over`` write gives the row to the asker.
* ``LATEST`` is resolved once: a first open records ``AT_TIMESTAMP`` of that moment in
  ``start_position`` and reads from the ``LATEST`` iterator itself.
* Enhanced fan-out: one event per step, read in the subscription pool (the next one
  while the current one is delivered, as for polling: :mod:`.prefetch`); when the byte
  budget stays full for :data:`FANOUT_BUDGET_DROP_S`, the subscription is dropped
  (:meth:`~.fetcher.Fetcher.pause`) and opened again later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..batch import payload_bytes
from ..errors import KinesisError, LeaseLostError
from ..kinesis import Fetched
from ..leases.protocol import SHARD_END, Lease, LeaseStore
from ..metrics import reader_tick
from ..records import Record, StartAt
from .delivery import BatchDelivery
from .fetcher import new_fetcher
from .io import ByteBudget, ReaderIo, ToThreadIo
from .lanes import process_in_lanes
from .lease import CheckpointPacer, LeaseKeeper
from .prefetch import process_one_lane
from .reading import FANOUT_BUDGET_DROP_S, Reading
from .spec import Deliver, ReaderSpec, Rng, Sleep
from .states import TRANSITIONS, ConsumerState, Stop, StopReason
from .timers import wait_first

__all__ = ["ShardConsumer", "FANOUT_BUDGET_DROP_S", "STOP_SLACK_S"]

log = logging.getLogger("kinesis_actors.reader")

STOP_SLACK_S = 0.5
"""How long past its grace a stop waits for a consumer it cancelled, seconds (a lease write
hanging there is not awaited longer: it lands, or the lease expires)."""

_S = ConsumerState


def resume_position(lease: Lease) -> StartAt | None:
    """Where ``lease`` says to open: after its checkpoint, else its recorded start position
    (None: a first open, nothing recorded yet)."""
    if lease.checkpoint and lease.checkpoint != SHARD_END:
        return StartAt.after_sequence_number(lease.checkpoint, lease.checkpoint_sub_sequence)
    if lease.start_position:
        return StartAt.parse(lease.start_position)
    return None


def lag_ms(got: Fetched) -> int | None:
    """``millis_behind_latest`` of a fetch: the service's figure, or the newest record's age
    (wall clock against its ``ApproximateArrivalTimestamp``) if larger, in milliseconds."""
    lag = got.millis_behind_latest
    records = got.records
    if records and records[-1].approximate_arrival_timestamp is not None:
        # Emulators report 0 or a gap between records; the age of the newest record is honest.
        age = int((time.time() - records[-1].approximate_arrival_timestamp.timestamp()) * 1000)
        lag = max(int(lag or 0), age) if lag else age
    return lag


class ShardConsumer:
    """The read loop of one shard lease, with its renew task (plain asyncio, no Ray).

    Moves (the only ones :data:`~.states.TRANSITIONS` allows)::

        INITIALIZING -> PROCESSING -> (stop) -> SHUTTING_DOWN -> CLOSED | HANDED_OVER
        any live state -> SHARD_ENDED | LOST | FAILED

    What a live consumer does next depends on its state and its one :class:`~.states.Stop`
    (None while it runs): ``REQUESTED``/``HANDOFF`` finish the batch in flight, then
    release or hand over; ``LEASE_LOST`` writes nothing more.

    Args:
        spec: see :class:`ReaderSpec`. lease: the lease as the Coordinator took it.
        store: the lease store (blocking calls, run in ``io``'s store pool).
        deliver: ``async deliver(records)``; returning is the acknowledgement, raising a failure.
        kinesis: a boto3 Kinesis client (blocking; called in ``io``'s Kinesis pool).
        io: the process's :class:`ReaderIo`; default ``asyncio.to_thread``.
        budget: the process's :class:`ByteBudget`, or None (unbounded). rng: an :data:`~.spec.Rng` or None.
        clock: monotonic seconds. sleep: ``async sleep`` on that clock (every timer of the consumer).
        on_open: called once, when the consumer enters ``PROCESSING`` (first iterator held).
        lease_age_s: a lower bound on the lease's age, seconds (since the write that produced
            it was sent); None: at most one renew interval, assumed.
    """

    def __init__(self, spec: ReaderSpec, lease: Lease, store: LeaseStore, deliver: Deliver, kinesis: Any, *,
                 io: ReaderIo | ToThreadIo | None = None, budget: ByteBudget | None = None, rng: Rng | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep,
                 on_open: Callable[[], None] | None = None, lease_age_s: float | None = None) -> None:
        self.spec = spec
        self._kinesis = kinesis
        self._io = io if io is not None else ToThreadIo()
        self._budget = budget
        self._clock = clock
        self._sleep = sleep
        self._on_open = on_open
        self.state = ConsumerState.INITIALIZING
        self.error: BaseException | None = None
        self.stats: dict[str, Any] = {
            "shard_id": spec.shard_id, "records": 0, "bytes": 0, "batches": 0, "get_records_calls": 0,
            "throttles": 0, "expired_iterators": 0, "sink_failures": 0, "millis_behind_latest": None,
            "checkpoint": lease.checkpoint, "lease_counter": lease.counter, "state": self.state.value,
            "checkpoints_written": 0, "dead_letter_records": 0,
        }
        if spec.consumer_arn:
            self.stats.update(retrieval="fanout", subscriptions=0, subscription_renewals=0, subscription_drops=0,
                              budget_drops=0)
        self.keeper = LeaseKeeper(spec, lease, store, self._io, clock=clock, sleep=sleep, lease_age_s=lease_age_s,
                                  on_lost=self._lost, on_handoff=self._asked, stats=self.stats, rng=rng)
        self.delivery = BatchDelivery(spec, deliver, run_blocking=self._io.kinesis, clock=clock, sleep=sleep,
                                      alive=self._alive, stats=self.stats, confirm=self.keeper.confirm, rng=rng)
        self._stop: Stop | None = None
        self.reading = Reading(spec, self._io, budget, self.keeper, self.stats, clock=clock, sleep=sleep,
                               stopping=self._stopping, alive=self._alive)
        self._seek: tuple[StartAt, asyncio.Future[None]] | None = None  # a pending seek request
        self.checkpoints = CheckpointPacer(self.keeper, spec.min_checkpoint_interval_s, clock=clock,
                                           sleep_alive=self.delivery.sleep_alive, stats=self.stats)
        self._task: asyncio.Task[Any] | None = None
        self._renew_task: asyncio.Task[None] | None = None

    # ---------------------------------------------------------------- state
    def _to(self, state: ConsumerState) -> None:
        """Move to ``state``; only the moves of :data:`TRANSITIONS` are allowed."""
        if state is self.state:
            return
        if state not in TRANSITIONS[self.state]:
            raise AssertionError(f"shard {self.spec.shard_id}: no transition {self.state.name} -> {state.name}")
        self.state = state
        self.stats["state"] = state.value
        if state is ConsumerState.PROCESSING and self._on_open is not None:
            self._on_open()

    @property
    def lease(self) -> Lease:
        """The latest Lease this consumer wrote (its counter is the fencing token)."""
        return self.keeper.lease

    @property
    def held_bytes(self) -> int:
        """Budget bytes of records fetched and not yet acknowledged."""
        return self.reading.held_bytes

    @property
    def stop_request(self) -> Stop | None:
        """Why this consumer is stopping (None while it runs on)."""
        return self._stop

    def _request(self, stop: Stop) -> None:
        """Merge ``stop`` into the consumer's one stop (see :meth:`Stop.merge`)."""
        self._stop = stop if self._stop is None else self._stop.merge(stop)

    def _lost(self, why: str) -> None:
        self._request(Stop(StopReason.LEASE_LOST, why=why))
        self.reading.close()  # ends a subscription at once, even during a read
        task = self._task
        if task is not None and not task.done() and asyncio.current_task() is not task:
            task.cancel()

    def _asked(self, asker: str) -> None:
        if self._stop is None or (self._stop.reason is StopReason.REQUESTED and self._stop.release):
            log.info("shard %s: %s asked for this lease; handing over after the batch in flight",
                     self.spec.shard_id, asker)
        self._request(Stop(StopReason.HANDOFF, to=asker))

    def request_handoff(self, asker: str) -> bool:
        """Another instance (``asker``, its owner id) asked for this lease: finish the batch in
        flight, checkpoint, then one fenced ``hand_over`` to it (what a store write returning
        ``lease_next_owner=asker`` does). False when the consumer already ended or is losing its lease."""
        if self.state.terminal or (self._stop is not None and self._stop.reason is StopReason.LEASE_LOST):
            return False
        if asker == self.spec.owner_id:
            return False
        self._asked(asker)
        return True

    def _stopping(self) -> bool:
        return self._stop is not None

    def _interrupted(self) -> bool:
        """True once the read loop must leave its step: a stop, or a seek to apply."""
        return self._stop is not None or self._seek is not None

    # ---------------------------------------------------------------- INITIALIZING
    async def open(self) -> None:
        """``INITIALIZING``: record ``start_position`` on a first open, then fetch the first
        shard iterator (throttling is retried while the lease is held). Called by
        :meth:`run` if not called before. Leaves the consumer in ``PROCESSING``, in
        ``SHARD_ENDED`` for a row already at ``SHARD_END``, or stopping.

        Raises:
            LeaseLostError: the lease was taken away meanwhile. StreamError/KinesisError:
            ``GetShardIterator`` failed and is not transient.
        """
        if self.state is not ConsumerState.INITIALIZING or self.reading.fetcher is not None:
            return
        spec, store = self.spec, self.keeper.store
        if self.lease.checkpoint == SHARD_END:  # finished before: nothing to read, let the row go
            self.reading.fetcher = new_fetcher(spec, self._kinesis, spec.start_at, clock=self._clock)
            await self.keeper.write("release", lambda lease: store.release(lease))
            self._to(ConsumerState.SHARD_ENDED)
            return
        position = resume_position(self.lease)
        start = position
        if position is None:  # a first open: record where, resolved once
            start = recorded = spec.start_at
            if start.kind == "LATEST":
                recorded = StartAt("AT_TIMESTAMP", timestamp_ms=int(time.time() * 1000))
            at = recorded.to_str()
            await self.keeper.write("set_start_position", lambda lease: store.set_start_position(lease, at))
            position = recorded
        assert start is not None
        # Opens at `start` (LATEST itself on a first open); an iterator that expires before
        # any record reopens at the recorded position, never at a later tip.
        self.reading.fetcher = fetcher = new_fetcher(spec, self._kinesis, start, restart_at=position,
                                                     clock=self._clock)
        while not fetcher.has_iterator:
            await self.reading.pace()
            if self._stopping():  # stopped (or asked for) before it ever read: nothing to checkpoint
                return
            await self.reading.step()
            self._alive()
        self._to(ConsumerState.PROCESSING)

    # ---------------------------------------------------------------- run
    async def run(self) -> ConsumerState:
        """Run the lease's life to a terminal state (see :class:`ConsumerState`) and return it.

        Starts the renew task first, so the lease is renewed while the shard opens.

        Raises:
            SinkError: the downstream refused a batch ``max_sink_retries`` times (no dead
            letter). StreamError: the stream or shard is gone. KinesisError: other fatal
            errors. The state is then ``FAILED`` (:attr:`error` holds the error) and the
            lease is released, best effort, at the last checkpoint.
        """
        if self._task is not None:
            raise RuntimeError("run() already called")
        self._task = self.keeper.loop_task = asyncio.current_task()
        self._renew_task = asyncio.create_task(self.keeper.renew_loop(), name=f"renew-{self.spec.shard_id}")
        try:
            try:
                await self.open()
                if self.state is ConsumerState.PROCESSING:
                    await self._process()
                await self._finish()
            except asyncio.CancelledError:
                if self._stop is None:
                    raise  # aborted (a SIGKILL in tests): where it stands
                try:
                    await self._finish(cancelled=True)
                except asyncio.CancelledError:  # cancelled again by the stop's deadline: as it stands
                    await self._finish(cancelled=True)
            except LeaseLostError:
                self._to(ConsumerState.LOST)
            except Exception as e:
                self.error = e
                self._request(Stop(StopReason.FAILED, why=repr(e)))
                self._to(ConsumerState.FAILED)
                await self._release_after_failure()
                raise
        finally:
            await self._end_tasks()
        return self.state

    async def _finish(self, *, cancelled: bool = False) -> None:
        """Leave a live state as the stop says: lost, shut down (release or hand over), or ended."""
        stop = self._stop
        if self.state.terminal or stop is None:
            return
        if stop.reason is StopReason.LEASE_LOST:
            self._to(ConsumerState.LOST)
        elif cancelled and self.state is ConsumerState.SHUTTING_DOWN:
            log.warning("shard %s: stopped before the %s was confirmed; the lease will expire", self.spec.shard_id,
                        "hand-over" if stop.reason is StopReason.HANDOFF else "release")
            self._to(ConsumerState.CLOSED)
        else:
            self._to(ConsumerState.SHUTTING_DOWN)
            await self._shut_down(stop)

    async def _end_tasks(self) -> None:
        self.reading.close()
        assert self._renew_task is not None
        self._renew_task.cancel()
        await asyncio.gather(self._renew_task, return_exceptions=True)
        self.reading.give_back()
        if self.keeper.lost is not None and not self.state.terminal:
            self._to(ConsumerState.LOST)
        if self._seek is not None and not self._seek[1].done():
            self._seek[1].set_result(None)

    async def _process(self) -> None:
        """``PROCESSING``: fetch -> deliver -> acknowledge -> checkpoint, until stopped or shard end:
        :func:`~.prefetch.process_one_lane`, or with lanes, a window or a byte limit
        :func:`~.lanes.process_in_lanes` (both fetch the next response while one is delivered)."""
        if self.delivery.gathers:
            await process_in_lanes(self)
        else:
            await process_one_lane(self)

    async def _shard_end(self) -> None:
        self.checkpoints.clear()  # SHARD_END is past every acknowledged record
        store = self.keeper.store
        await self.keeper.write("checkpoint SHARD_END", lambda lease: store.checkpoint(lease, SHARD_END))
        self.stats["checkpoint"] = SHARD_END
        await self.keeper.write("release", lambda lease: store.release(lease))
        self._to(ConsumerState.SHARD_ENDED)
        log.info("shard %s: read to its end; SHARD_END written, lease released", self.spec.shard_id)

    # ---------------------------------------------------------------- SHUTTING_DOWN
    async def _shut_down(self, stop: Stop) -> None:
        """Checkpoint what was acknowledged, then hand the lease to the asker, or release it
        (unless asked to keep it)."""
        try:  # close and handoff: the acknowledged records are checkpointed first
            await self.checkpoints.flush()
        except LeaseLostError:
            self._to(ConsumerState.LOST)
            return
        except KinesisError as e:
            log.warning("shard %s: the last checkpoint failed (%s)", self.spec.shard_id, e)
        if stop.reason is StopReason.REQUESTED and not stop.release:
            self._to(ConsumerState.CLOSED)
            return
        store, handoff = self.keeper.store, stop.to if stop.reason is StopReason.HANDOFF else None
        try:
            if handoff is not None:
                handoff = await self._current_asker(handoff)
            if handoff is not None:
                to = handoff
                await self.keeper.write("hand-over", lambda lease: store.hand_over(lease, to=to))
                self._to(ConsumerState.HANDED_OVER)
                log.info("shard %s: handed over to %s at checkpoint %s", self.spec.shard_id, to,
                         self.lease.checkpoint)
                return
            await self.keeper.write("release", lambda lease: store.release(lease))
        except LeaseLostError:
            self._to(ConsumerState.LOST)
            return
        except KinesisError as e:
            log.warning("shard %s: %s failed (%s); the lease will expire", self.spec.shard_id,
                        "hand-over" if handoff else "release", e)
        self._to(ConsumerState.CLOSED)

    async def _release_after_failure(self) -> None:
        try:
            if self.keeper.lost is None:
                await self.checkpoints.flush()
                await self.keeper.write("release", lambda lease: self.keeper.store.release(lease))
        except Exception as e:  # best effort after a fatal error: logged, the lease expires
            log.info("shard %s: release after the failure did not happen (%r); the lease will expire",
                     self.spec.shard_id, e)

    async def _current_asker(self, asker: str) -> str | None:
        """Who asks for this lease now: the asker may have withdrawn (it closed) or been
        replaced by another since the write that told us. None: release instead."""
        spec = self.spec
        try:
            row = await self._io.store(self.keeper.store.get, spec.stream, spec.shard_id)
        except Exception:  # the store unreadable now: the hand-over write (fenced) will find out
            return asker
        if row is None or row.owner != spec.owner_id or row.counter != self.lease.counter:
            return asker  # the hand-over write will find out
        return row.next_owner if row.next_owner != spec.owner_id else None

    # ---------------------------------------------------------------- delivery
    def _alive(self) -> None:
        self.keeper.alive()
        reader_tick(self.spec, self.stats, now=self._clock())  # metrics: per step, rate-limited (injected clock)

    async def _deliver_and_checkpoint(self, batch: Sequence[Record]) -> None:
        """The one place a batch goes downstream (one lane, no window): through the
        :class:`BatchDelivery` (which confirms the lease before each sink call), checkpointing
        each acknowledged prefix it reports (a partial acknowledgement moves it mid-batch)."""
        if not batch:
            return
        done = 0

        async def on_ack(n: int) -> None:
            nonlocal done
            self._count_acked(batch[done:n])
            done = n
            await self._checkpoint_after(batch[n - 1], partial=n < len(batch))

        await self.delivery.deliver(batch, on_ack)
        self.stats["batches"] += 1

    def _count_acked(self, records: Sequence[Record]) -> int:
        """Count acknowledged records in the stats; their payload bytes."""
        nbytes = payload_bytes(records)
        self.stats["records"] += len(records)
        self.stats["bytes"] += nbytes
        return nbytes

    async def _checkpoint_after(self, last: Record, *, partial: bool = False) -> None:
        """``last`` and everything before it is acknowledged: checkpoint it (when due; at once
        after a ``partial`` acknowledgement of a batch)."""
        self.checkpoints.acknowledged(last.sequence_number, last.sub_sequence_number, partial=partial)
        await self.checkpoints.flush(due_only=True)

    # ---------------------------------------------------------------- control
    async def stop(self, *, release: bool = True, grace_s: float = 5.0) -> None:
        """Stop at the next step boundary (``SHUTTING_DOWN``): a batch being delivered gets
        ``grace_s`` seconds to be acknowledged and checkpointed; then the lease is released
        (unless ``release=False``). Past ``grace_s`` the loop is cancelled (cancelling
        between an acknowledgement and its checkpoint would deliver the batch again to the
        next owner); a lease write still hanging is not awaited more than
        :data:`STOP_SLACK_S`: returns within ``grace_s + STOP_SLACK_S`` seconds."""
        self._request(Stop(StopReason.REQUESTED, release=release))
        task = self._task
        if task is None or task.done():
            return
        await wait_first({task}, grace_s, self._sleep)
        tries = 4  # each cancel ends one wait: the batch in flight, a write in flight, the release
        while not task.done() and tries:
            task.cancel()
            tries -= 1
            await wait_first({task}, STOP_SLACK_S / 4, self._sleep)
        if not task.done():
            log.warning("shard %s: not stopped %.1f s past its grace; the lease will expire", self.spec.shard_id,
                        STOP_SLACK_S)

    async def seek(self, position: StartAt) -> None:
        """Reopen at ``position`` after the batch in flight; the checkpoint is cleared and
        ``start_position`` rewritten (the one allowed move backwards). Returns once applied
        (or the consumer ended), within ``max(5 s, lease_duration_s)``."""
        task = self._task
        if task is None or task.done() or self.keeper.lost is not None:
            return
        applied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._seek is not None and not self._seek[1].done():
            self._seek[1].set_result(None)  # superseded
        self._seek = (position, applied)
        await wait_first({applied, task}, max(5.0, self.spec.lease_duration_s), self._sleep)

    async def _apply_seek(self) -> None:
        """Apply the asked seek: records fetched and not acknowledged are dropped (their
        budget bytes given back; the caller has ended any fetch in flight), the start
        position is rewritten (fenced), the checkpoint cleared, the fetcher reopened there."""
        self.reading.give_back()
        fetcher = self.reading.fetcher
        assert self._seek is not None and fetcher is not None
        (position, applied), self._seek = self._seek, None
        try:
            at = position.to_str()
            await self.keeper.write("seek", lambda lease: self.keeper.store.set_start_position(lease, at))
            self.checkpoints.clear()
            self.stats["checkpoint"] = None
            fetcher.seek(position)
            log.info("shard %s: seek to %s", self.spec.shard_id, position)
        finally:
            if not applied.done():
                applied.set_result(None)
