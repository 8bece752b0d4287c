"""ShardConsumer: the life of one shard lease in a reader (a state machine, see :mod:`.states`)
and its one read loop.

Fault model (every invariant holds per consumer, whatever else the process runs):

* The checkpoint is written only after the downstream acknowledged the records before it,
  so a crash anywhere re-delivers at most what was acknowledged since the last checkpoint
  (at-least-once); the :class:`~.lease.CheckpointPacer` paces the writes.
* Store writes go through the consumer's :class:`~.lease.LeaseKeeper` (fenced, serialised).
* A lost lease ends the consumer at once (``LOST``): nothing more is written, the batch in
  flight is not acknowledged. A consumer whose lease is in doubt renews it before handing
  a batch downstream, so a resumed zombie is fenced before it delivers.
* Graceful handoff: a write that returns the lease with ``lease_next_owner`` set (or
  :meth:`ShardConsumer.request_handoff`) stops the consumer with ``HANDOFF``: the batch in
  flight is delivered, acknowledged and checkpointed, records fetched but not delivered are
  dropped, then one fenced ``hand_over`` write gives the row to the asker.

The read loop (:meth:`ShardConsumer.process`) serves every ``parallelization_factor``: it hands
fetched records to the consumer's :class:`~kinesis_actors.delivery.Lanes`,
:class:`~kinesis_actors.delivery.OneLane` (one batch in flight: the default) or a
:class:`~kinesis_actors.delivery.ShardPipeline` (``parallelization_factor > 1``, a
batching window or a byte limit), and keeps these rules, each written once:

* Fetch ahead: at most one fetch in flight, started while the lanes hold less than one
  response (so the next response is read while the current one is delivered); a shard
  whose lanes are idle polls inline. Nothing is fetched past the response that ended the shard.
* Stop: the batches in flight finish (the stop's grace bounds the wait); the fetch in flight
  and what is gathered are dropped, so nothing is checkpointed past what was delivered.
* Seek: the same, then the fetcher reopens at the position.
* Shard end: every gathered record is delivered and every batch acknowledged before the
  ``SHARD_END`` stop; a lane whose batch failed is never idle, so its error is raised
  instead and ``SHARD_END`` is never written past unacknowledged records.
* Bytes: a response's byte-budget bytes go back once every record of it is acknowledged;
  dropped records' bytes go back at the stop or seek.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .. import metrics, mutation
from ..batch import payload_bytes
from ..clock import monotonic_s, wall_s
from ..errors import LeaseLostError
from ..kinesis import Fetched
from ..leases.protocol import Lease, LeaseStore
from ..records import Record, StartAt
from ..sinks.hooks import ShardHook
from . import tasks
from .delivery import BatchDelivery
from .io import ReaderIo, ToThreadIo
from .lease import CheckpointPacer, LeaseKeeper
from .reading import FANOUT_BUDGET_DROP_S, ByteBudget, Reading
from .spec import Deliver, ReaderSpec, Rng, Sleep
from .states import BEHAVIOURS, TERMINAL, TRANSITIONS, ConsumerState, Stop, StopReason
from .timers import wait_first

__all__ = ["ShardConsumer", "FANOUT_BUDGET_DROP_S", "STOP_SLACK_S", "TICK_S"]

log = logging.getLogger("kinesis_actors.reader")

STOP_SLACK_S = 0.5
"""How long past its grace a stop waits for a consumer it cancelled, seconds (a lease write
hanging there is not awaited longer: it lands, or the lease expires)."""

TICK_S = 1.0
"""How often a consumer refreshes its figures (``checkpoint_age_s``) and offers them to the
metrics export, seconds at most (half the export interval when that is shorter)."""

_S, _R = ConsumerState, StopReason

_EARLY_SHARD_END = mutation.register("shard_end_before_last_ack", "SHARD_END is written with batches in flight")


class ShardConsumer:
    """One shard lease in a reader, from its first iterator to its terminal state (plain asyncio, no Ray).

    :meth:`run` steps through :data:`~.states.BEHAVIOURS`: each state's task runs, then the
    consumer moves as the state says for the stop then in force (None while it runs on).

    Args:
        spec: see :class:`ReaderSpec`. lease: the lease as the Coordinator took it.
        store: the lease store (blocking calls, run in ``io``'s store pool).
        deliver: ``async deliver(records)``; returning is the acknowledgement, raising a failure.
        kinesis: a boto3 Kinesis client (blocking; called in ``io``'s Kinesis pool).
        io: the process's :class:`ReaderIo`; default ``asyncio.to_thread``.
        budget: the process's :class:`ByteBudget`, or None (unbounded). rng: an :data:`~.spec.Rng` or None.
        clock: monotonic seconds. wall_clock: epoch seconds (record ages, ``LATEST`` resolved).
        sleep: ``async sleep`` on ``clock`` (every timer of the consumer).
        on_open: called once, when the consumer enters ``PROCESSING`` (first iterator held).
        lease_age_s: a lower bound on the lease's age, seconds (since the write that produced
            it was sent); None: at most one renew interval, assumed.
        hook: the sink's :class:`~kinesis_actors.sinks.hooks.ShardHook` for this lease (its
            ``deliver``, when set, replaces ``deliver``); None: an ordinary sink, which
            has no part and pays nothing for the seam (no hook call at any transition nor
            per batch; each acknowledged batch may be checkpointed).
    """

    def __init__(self, spec: ReaderSpec, lease: Lease, store: LeaseStore, deliver: Deliver, kinesis: Any, *,
                 io: ReaderIo | ToThreadIo | None = None, budget: ByteBudget | None = None, rng: Rng | None = None,
                 clock: Callable[[], float] = monotonic_s, wall_clock: Callable[[], float] = wall_s,
                 sleep: Sleep = asyncio.sleep, on_open: Callable[[], None] | None = None,
                 lease_age_s: float | None = None, hook: ShardHook | None = None) -> None:
        self.spec, self.hook = spec, hook
        self._kinesis = kinesis
        self._deliver = hook.deliver if hook is not None and hook.deliver is not None else deliver
        self._io = io if io is not None else ToThreadIo()
        self._clock, self._wall_clock, self._sleep = clock, wall_clock, sleep
        self._on_open = on_open
        self._step_s = max(0.05, spec.renew_interval_s / 2)
        self._tick_at = float("-inf")
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
        self._stop: Stop | None = None
        self._seek: tuple[StartAt, asyncio.Future[None]] | None = None  # a pending seek request
        self.keeper = LeaseKeeper(spec, lease, store, self._io, clock=clock, sleep=sleep, lease_age_s=lease_age_s,
                                  on_lost=self._lost, on_handoff=self._asked, stats=self.stats, rng=rng)
        self.delivery = BatchDelivery(spec, self._sink, run_blocking=self._io.kinesis, clock=clock,
                                      wall_clock=wall_clock, sleep=sleep, alive=self._alive, stats=self.stats, rng=rng)
        self.checkpoints = CheckpointPacer(self.keeper, spec.min_checkpoint_interval_s, clock=clock,
                                           sleep_alive=self.delivery.sleep_alive, stats=self.stats)
        self.reading = Reading(spec, self._io, budget, self.keeper, self.stats, clock=clock, sleep=sleep,
                               interrupted=self._interrupted, alive=self._alive, prepare=self.delivery.prepare)
        self._lanes = self.delivery.lanes(self._checkpoint_after, self._count_acked, sleep=sleep)
        # (position of the last record, budget bytes) of each fetched response not yet all acknowledged
        self._responses: collections.deque[tuple[tuple[int, int], int]] = collections.deque()
        self._flush_lock = asyncio.Lock()
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

    @property
    def seeking(self) -> bool:
        """True while a seek is asked and not applied yet."""
        return self._seek is not None

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

    def _alive(self) -> None:
        """The loop's heartbeat: the keeper's liveness, and the figures every :data:`TICK_S`."""
        self.keeper.alive()
        now = self._clock()
        if now >= self._tick_at:
            self._tick_at = now + min(TICK_S, metrics.EXPORT_INTERVAL_S / 2)
            metrics.reader_tick(self.spec, self.stats, now=now)

    # ---------------------------------------------------------------- the state machine
    async def open(self) -> None:
        """Run ``INITIALIZING`` now (:meth:`run` does it if not done before): record
        ``start_position`` on a first open, then fetch the first shard iterator. Leaves the
        consumer in ``PROCESSING``, or on its way out (stopped meanwhile, a row already at
        ``SHARD_END``, a lost lease, a failure kept in :attr:`error`)."""
        if self.state is ConsumerState.INITIALIZING and self._task is None:
            await self._advance()

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
            while True:
                ended = self.state in TERMINAL
                await self._advance()
                if ended:
                    break
        finally:
            await self._end_tasks()
        if self.error is not None and self.state is ConsumerState.FAILED:
            raise self.error
        return self.state

    async def _advance(self) -> None:
        """Run the current state's task, then move as :data:`BEHAVIOURS` says for the stop in force."""
        behaviour = BEHAVIOURS[self.state]
        if behaviour.task is not None:
            await self._run_task(behaviour.task)
        if behaviour.next:
            reason = None if self._stop is None else self._stop.reason
            if reason not in behaviour.next:
                raise AssertionError(f"shard {self.spec.shard_id}: {self.state.name} ended with no stop")
            self._to(behaviour.next[reason])

    async def _run_task(self, name: str) -> None:
        """Run one state's task; what ends it becomes the stop (a lost lease, a failure)."""
        try:
            await getattr(self, name)()
        except asyncio.CancelledError:
            stop = self._stop
            if stop is None:
                raise  # aborted where it stands (what a SIGKILL does)
            if self.state is ConsumerState.SHUTTING_DOWN and stop.reason in (_R.REQUESTED, _R.HANDOFF, _R.SHARD_END):
                log.warning("shard %s: stopped before the lease was let go (%s); the lease will expire",
                            self.spec.shard_id, stop.reason.value)
                self._stop = Stop(StopReason.REQUESTED, release=False, why="cancelled while letting the lease go")
        except LeaseLostError as e:
            self._request(Stop(StopReason.LEASE_LOST, why=str(e)))
        except Exception as e:
            self._request(Stop(StopReason.FAILED, why=repr(e)))
            if self._stop is not None and self._stop.reason is StopReason.FAILED:
                self.error = e
            else:
                log.info("shard %s: %r after the lease was lost", self.spec.shard_id, e)

    async def initialize(self) -> None:
        """``INITIALIZING``'s task (:func:`.tasks.initialize`)."""
        stop = await tasks.initialize(self.spec, self._kinesis, self.keeper, self.reading, clock=self._clock,
                                      wall_clock=self._wall_clock, stopping=self._stopping, alive=self._alive,
                                      hook=self.hook, checkpoints=self.checkpoints,
                                      await_alive=self.delivery.await_alive)
        if stop is not None:
            self._request(stop)

    async def shut_down(self) -> None:
        """``SHUTTING_DOWN``'s task (:func:`.tasks.shut_down`): let the lease go as the stop says."""
        stop = self._stop
        assert stop is not None
        if self.hook is not None:
            await tasks.finish_sink(stop, self.spec, self.hook, self.checkpoints, self.delivery.await_alive)
        ended = await tasks.shut_down(stop, self.spec, self.keeper, self.checkpoints, self._io, self.stats)
        if self._stop is stop:
            self._stop = ended

    async def leave_after_failure(self) -> None:
        """``FAILED``'s task (:func:`.tasks.leave_after_failure`)."""
        await tasks.leave_after_failure(self.spec, self.keeper, self.checkpoints)

    async def _end_tasks(self) -> None:
        self.reading.close()
        assert self._renew_task is not None
        self._renew_task.cancel()
        try:
            await asyncio.gather(self._renew_task, return_exceptions=True)
            self.reading.give_back()
            if self.keeper.lost is not None and not self.state.terminal:
                self._to(ConsumerState.LOST)
            if self._seek is not None and not self._seek[1].done():
                self._seek[1].set_result(None)
        finally:
            if self.hook is not None:
                await self.hook.release()

    # ---------------------------------------------------------------- PROCESSING
    async def process(self) -> None:
        """``PROCESSING``'s task: the read loop (see the module docstring), until a stop. Once
        the shard is read to its end and every record acknowledged it stops with ``SHARD_END``.

        Raises:
            SinkError: a batch failed for good (nothing is checkpointed past it).
            LeaseLostError: the lease was lost. KinesisError: the fetcher's call failed for good.
        """
        lanes, reading = self._lanes, self.reading
        try:
            while True:
                self._alive()
                if self._stop is not None:
                    await reading.end(wait_for_call=False)
                    await self._settle()
                    return
                if self._seek is not None:
                    await self._apply_seek()
                    continue
                await self._flush_due()
                lanes.dispatch()
                if lanes.idle:  # nothing to deliver meanwhile: fetch inline
                    got = await reading.next()
                else:
                    if lanes.can_fetch():
                        reading.start()
                    due = lanes.due_in()
                    await lanes.wait(self._step_s if due is None else min(due, self._step_s), also=reading.task)
                    got = reading.take()
                if got is None:
                    continue
                self._took(got)
                if got.shard_end and (_EARLY_SHARD_END in mutation.ACTIVE or await self._drained()):
                    self._request(Stop(StopReason.SHARD_END, why="read to its end"))
                    return
        finally:
            await reading.end(wait_for_call=False)
            await lanes.cancel()

    def _took(self, got: Fetched) -> None:
        """A fetched response: its lag, its bytes to give back later, its records to the lanes."""
        records = got.records
        lag = got.millis_behind_latest
        if len(records):
            last = records[-1]
            arrival = last.arrival_epoch_s
            if arrival is not None:  # emulators report 0 or a gap between records: the newest record's age is honest
                age = int((self._wall_clock() - arrival) * 1000)
                lag = max(int(lag or 0), age) if lag else age
            self._responses.append((last.position, got.bytes))
            self._lanes.add(records)
        self.stats["millis_behind_latest"] = lag

    async def _settle(self) -> None:
        """Wait (alive) until no batch is in flight; raise a failed batch's error (the stop's grace bounds it)."""
        while self._lanes.in_flight:
            self._alive()
            await self._lanes.wait(self._step_s)
        await self._lanes.wait(0.0)  # collects a batch that failed before the stop was seen (no wait)

    async def _drained(self) -> bool:
        """Shard end: deliver everything held and wait until every batch is acknowledged; True
        once they are (False if stopped or asked to seek meanwhile).

        Raises:
            The error of a batch that failed.
        """
        lanes = self._lanes
        while not lanes.idle and not self._interrupted():
            self._alive()
            lanes.dispatch(force=True)
            await lanes.wait(self._step_s)
        return lanes.idle and not self._interrupted()

    async def _apply_seek(self) -> None:
        """End the fetch and the batches in flight, drop what is held, then :func:`.tasks.seek`."""
        await self.reading.end()
        await self._settle()
        await self._lanes.cancel()
        self._responses.clear()
        assert self._seek is not None
        (position, applied), self._seek = self._seek, None
        try:
            await tasks.seek(position, self.spec, self.keeper, self.checkpoints, self.reading, self.stats)
        finally:
            if not applied.done():
                applied.set_result(None)

    async def _sink(self, records: Sequence[Record]) -> Any:
        """The sink call: the lease is confirmed first (renewed when in doubt)."""
        await self.keeper.confirm()
        return await self._deliver(records)

    def _count_acked(self, records: Sequence[Record]) -> None:
        """Count acknowledged records in the stats."""
        self.stats["records"] += len(records)
        self.stats["bytes"] += payload_bytes(records)

    async def _checkpoint_after(self, last: Record, partial: bool = False) -> None:
        """Every record up to ``last`` is acknowledged: give back the bytes of the responses it
        completes, and checkpoint what the sink's hook allows (when due; at once after a
        ``partial`` acknowledgement of a batch, whose rest is retried)."""
        hook = self.hook
        point = (last.sequence_number, last.sub_sequence_number) if hook is None else hook.checkpointable(last)
        if point is not None:
            self.checkpoints.acknowledged(*point, partial=partial)
        responses = self._responses
        if responses:
            position = last.position
            while responses and responses[0][0] <= position:
                self.reading.give_back(responses.popleft()[1])
        await self._flush_due()

    async def _flush_due(self) -> None:
        """Write the acknowledged position if due; one flush at a time (the loop and its
        lanes run as separate tasks, and two flushes of one position would write it twice)."""
        async with self._flush_lock:
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
        """Reopen at ``position`` after the batches in flight; the checkpoint is cleared and
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
