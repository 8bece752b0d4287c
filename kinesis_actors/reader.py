"""ShardReader: one shard lease, one read loop: GetRecords -> deliver -> acknowledge -> checkpoint.

Fault model (what is checkpointed, what is idempotent):

* The checkpoint is written only after the downstream acknowledged the batch, so a
  crash anywhere re-delivers at most the batch in flight (at-least-once).
* Every store write is conditional on the lease owner and counter (fencing). Writes of
  one reader are serialised and always use the latest :class:`Lease`.
* The renew task runs beside the read loop. It renews only while the loop shows signs
  of life (a heartbeat stamped at every step and every ``renew_interval_s`` while it
  waits on the downstream): a stuck loop lets its lease lapse; a slow downstream never does.
* ``LeaseLostError`` stops the reader at once: nothing more is written, the batch in
  flight is not acknowledged. Throttled or failing renewals are retried until the
  reader's own deadline (last successful write + lease duration - a margin), then the
  reader stops the same way.
* Graceful handoff (lease balancing): when a write returns the lease with
  ``lease_next_owner`` set (another instance asked for it), the loop stops at its next
  step boundary: the batch in flight is delivered, acknowledged and checkpointed, records
  fetched but not delivered are dropped, then one fenced ``hand_over`` write gives the
  row to the asker, who resumes after that checkpoint (no duplicate).
* ``GetRecords`` runs in a worker thread with a socket timeout shorter than the lease;
  ``ExpiredIteratorException`` gets a new iterator after the last acknowledged record;
  throttling backs off exponentially with jitter (first wait >= 0.2 s, cap 5 s). Calls
  on one shard are never closer than 0.2 s (the 5 calls/s/shard limit).

:class:`ShardReaderCore` is a plain asyncio class (a unit test drives it with an
in-process store and a fake Kinesis client); :class:`ShardReader` is the thin Ray actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .aws import AwsSettings
from .errors import KinesisError, LeaseLostError, SinkError, StreamError, aws_error_code, is_throttling, translate_aws_error
from .leases.protocol import SHARD_END, Lease, LeaseStore
from .metrics import reader_tick
from .records import Record, StartAt, records_from_response, seq_key

__all__ = ["ReaderSpec", "ShardReaderCore", "ShardReader", "ReaderOutcome"]

log = logging.getLogger(__name__)

MIN_CALL_SPACING_S = 0.2
"""Shortest gap between two GetRecords on one shard: 5 calls per second, the AWS limit."""


class ReaderOutcome:
    """How a read loop ended (the value ``run()`` returns)."""

    SHARD_END = "shard_end"  # read to its end, acknowledged, SHARD_END written, lease released
    LOST = "lost"  # lease lost or lapsed: stopped without writing
    CLOSED = "closed"  # stopped on request; checkpointed and released (or kept, if asked)
    HANDED_OVER = "handed_over"  # another instance asked: checkpointed, then handed over to it


@dataclasses.dataclass(frozen=True)
class ReaderSpec:
    """What a reader needs besides its lease (all picklable).

    Attributes:
        stream, shard_id: what to read. owner_id: the lease owner it reads for.
        start_at: position for a shard with no checkpoint and no recorded start position.
        ending_sequence_number: set for a closed shard: reaching it is shard end.
        lease_duration_s / renew_interval_s: lease timing, seconds.
        max_records: ``GetRecords`` ``Limit`` and the most records per delivered batch.
        idle_wait_s: wait at the tip before the next ``GetRecords``, seconds.
        max_sink_retries: retries of a failing batch before ``SinkError``.
        aws: settings to build the reader's Kinesis client.
        sink_method: the sink actor's method name (Ray shell only).
        dead_letter: a Publisher for batches the sink refused, or None.
    """

    stream: str
    shard_id: str
    owner_id: str
    start_at: StartAt
    lease_duration_s: float
    renew_interval_s: float
    aws: AwsSettings | None = None
    ending_sequence_number: str | None = None
    max_records: int = 10_000
    idle_wait_s: float = 0.25
    max_sink_retries: int = 5
    sink_method: str = "process_batch"
    dead_letter: Any = None

    @property
    def call_timeout_s(self) -> float:
        """Connect and read timeout of the reader's Kinesis calls: shorter than the lease
        (half of it, at most 10 s; up to 1 s for very short leases), seconds."""
        lease = self.lease_duration_s
        return min(10.0, max(0.5 * lease, min(1.0, 0.75 * lease)))

    @property
    def renew_deadline_s(self) -> float:
        """How long after its last successful write a reader keeps retrying a failing renewal."""
        return max(self.lease_duration_s - max(self.renew_interval_s, 0.1 * self.lease_duration_s), 0.5 * self.lease_duration_s)


Deliver = Callable[[list[Record]], Awaitable[Any]]


class ShardReaderCore:
    """The read loop of one shard lease, with its renew task (plain asyncio, no Ray).

    Args:
        spec: see :class:`ReaderSpec`.
        lease: the lease as the Coordinator took it (its owner and counter fence every write).
        store: the lease store (blocking calls, run in worker threads).
        deliver: ``async deliver(records)``; returning is the acknowledgement, raising a failure.
        kinesis: a boto3 Kinesis client (blocking; called in worker threads).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, spec: ReaderSpec, lease: Lease, store: LeaseStore, deliver: Deliver, kinesis: Any,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self._lease = lease
        self._store = store
        self._deliver = deliver
        self._kinesis = kinesis
        self._clock = clock
        self._write_lock = asyncio.Lock()
        # When the last successful store write was SENT (monotonic s): the lease is valid from
        # then, not from when the answer came back (a write applied during a pause of this
        # process must not make the lease look fresh). The lease given here was written by
        # the Coordinator at most one renew interval ago; assume the worst.
        self._last_write = clock() - spec.renew_interval_s
        self._beat = clock()
        self._lost = False
        self._stopping = False
        self._release_on_stop = True
        self._handoff_to: str | None = None  # lease_next_owner seen on a write: hand over at the next step
        self._iterator: str | None = None
        self._resume: StartAt | None = None  # where to reopen: after the last acknowledged record
        self._skip_through: tuple[int, int] | None = None  # drop records at or before this position
        self._seek_to: StartAt | None = None
        self._throttled = 0  # GetRecords throttled in a row (backoff exponent)
        self._loop_task: asyncio.Task[str] | None = None
        self._renew_task: asyncio.Task[None] | None = None
        self._next_call_at = 0.0
        self.stats: dict[str, Any] = {
            "shard_id": spec.shard_id, "records": 0, "bytes": 0, "batches": 0, "get_records_calls": 0,
            "throttles": 0, "expired_iterators": 0, "sink_failures": 0, "millis_behind_latest": None,
            "checkpoint": lease.checkpoint, "lease_counter": lease.counter, "state": "new",
        }

    # ---------------------------------------------------------------- store writes
    @property
    def lease(self) -> Lease:
        """The latest Lease this reader wrote (its counter is the fencing token)."""
        return self._lease

    async def _write(self, op: str, *args: Any, **kwargs: Any) -> Lease:
        """One conditional store write, serialised, with the latest Lease; LeaseLostError marks us lost."""
        async with self._write_lock:
            if self._lost:
                raise LeaseLostError(f"lease {self._lease.key} was lost; not writing")
            # A write already sent must update our Lease even if we are cancelled meanwhile,
            # or the next write (the release at close) would carry a stale counter.
            sent = self._clock()
            write = asyncio.ensure_future(asyncio.to_thread(getattr(self._store, op), self._lease, *args, **kwargs))
            try:
                new = await asyncio.shield(write)
            except asyncio.CancelledError:
                try:
                    self._applied(await write, sent)
                except BaseException:
                    pass
                raise
            except LeaseLostError:
                self._mark_lost(f"{op} refused: the lease changed owner or counter")
                raise
            return self._applied(new, sent)

    def _applied(self, new: Lease | None, sent: float) -> Lease:
        """Adopt the Lease a write returned; ``sent``: when that write was sent (monotonic s)."""
        if new is not None:
            self._lease = new
            self.stats["lease_counter"] = new.counter
            asker = new.next_owner
            if asker and asker != self.spec.owner_id and new.owner == self.spec.owner_id and self._handoff_to is None:
                self._handoff_to = asker
                self._stopping = True  # the loop finishes the batch in flight, then hands over
                log.info("shard %s: %s asked for this lease; handing over after the batch in flight",
                         self.spec.shard_id, asker)
        self._last_write = max(self._last_write, sent)
        return self._lease

    def _mark_lost(self, why: str) -> None:
        if not self._lost:
            self._lost = True
            self.stats["state"] = "lost"
            log.warning("shard %s: lease lost (%s); stopping without writing", self.spec.shard_id, why)
            if self._loop_task is not None and not self._loop_task.done() and asyncio.current_task() is not self._loop_task:
                self._loop_task.cancel()

    # ---------------------------------------------------------------- open
    def _position(self) -> StartAt | None:
        """Where this lease says to open: after the checkpoint, else the recorded start position."""
        lease = self._lease
        if lease.checkpoint and lease.checkpoint != SHARD_END:
            return StartAt.after_sequence_number(lease.checkpoint, lease.checkpoint_sub_sequence)
        if lease.start_position:
            return StartAt.parse(lease.start_position)
        return None

    async def open(self, lease: Lease | None = None) -> None:
        """Fetch the first shard iterator (and record ``start_position`` on a first open).

        ``lease``: a newer Lease of the same holder (the Coordinator renewed it while this
        actor was starting); it replaces the one given at construction.

        ``LATEST`` is resolved once: the reader records ``AT_TIMESTAMP`` of the moment it
        asked (so a replacement reopens there, never at a later tip) and reads from the
        ``LATEST`` iterator itself.

        Raises:
            LeaseLostError: the lease was taken away meanwhile. StreamError/KinesisError:
            ``GetShardIterator`` failed past retries.
        """
        if (lease is not None and lease.key == self._lease.key and lease.owner == self._lease.owner
                and lease.counter > self._lease.counter):
            # renewed by the Coordinator while this actor started, at most one interval ago
            self._applied(lease, self._clock() - self.spec.renew_interval_s)
        position = self._position()
        if self._lease.checkpoint == SHARD_END:
            self._iterator = None
            return
        first = position is None
        if first:
            start = self.spec.start_at
            recorded = StartAt("AT_TIMESTAMP", timestamp_ms=int(time.time() * 1000)) if start.kind == "LATEST" else start
            await self._write("set_start_position", recorded.to_str())
            self._set_resume(recorded)  # an expired iterator reopens there, never at a later tip
            self._iterator = await self._get_iterator(start)
            self.stats["state"] = "open"
            return
        assert position is not None
        self._set_resume(position)
        self._iterator = await self._get_iterator(position)
        self.stats["state"] = "open"

    def _set_resume(self, position: StartAt) -> None:
        self._resume = position

    async def _get_iterator(self, position: StartAt) -> str:
        """A new iterator at ``position``; records up to it are dropped from the first answers
        (resuming inside a KPL aggregate re-reads the aggregate from its sequence number)."""
        args = position.iterator_args()
        if position.kind == "AFTER_SEQUENCE_NUMBER" and position.sequence_number is not None:
            sub = position.sub_sequence_number
            self._skip_through = (seq_key(position.sequence_number), 2**62 if sub is None else sub)
        else:
            self._skip_through = None

        def call() -> str:
            return self._kinesis.get_shard_iterator(StreamName=self.spec.stream, ShardId=self.spec.shard_id, **args)["ShardIterator"]

        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(call)
            except Exception as e:
                attempt += 1
                if not is_throttling(e) or self._lost:
                    raise translate_aws_error(e, operation="GetShardIterator", resource=f"{self.spec.stream}/{self.spec.shard_id}") from e
                self.stats["throttles"] += 1
                await self._sleep_alive(self._backoff(attempt))  # throttled or unreachable: retried while we hold the lease

    # ---------------------------------------------------------------- run
    async def run(self) -> str:
        """Read until shard end, a lost lease or :meth:`stop`; returns a :class:`ReaderOutcome` value.

        Raises:
            SinkError: the downstream refused a batch ``max_sink_retries`` times (no dead letter).
            StreamError: the stream was deleted. KinesisError: other fatal errors.
        """
        if self._loop_task is not None:
            raise RuntimeError("run() already called")
        self._loop_task = asyncio.current_task()
        self._renew_task = asyncio.create_task(self._renew_loop(), name=f"renew-{self.spec.shard_id}")
        self.stats["state"] = "reading"
        try:
            outcome = await self._read_loop()
        except asyncio.CancelledError:
            if self._lost:
                return ReaderOutcome.LOST
            if self._stopping:
                return await self._finish_stop()
            raise
        except LeaseLostError:
            return ReaderOutcome.LOST
        finally:
            self._renew_task.cancel()
            await asyncio.gather(self._renew_task, return_exceptions=True)
        if outcome == ReaderOutcome.CLOSED:
            return await self._finish_stop()
        return outcome

    async def _finish_stop(self) -> str:
        if self._release_on_stop and not self._lost:
            handoff = self._handoff_to
            try:
                if handoff is not None:
                    handoff = await self._current_asker(handoff)
                if handoff is not None:
                    await self._write("hand_over", to=handoff)
                    self.stats["state"] = "handed_over"
                    log.info("shard %s: handed over to %s at checkpoint %s", self.spec.shard_id, handoff,
                             self._lease.checkpoint)
                    return ReaderOutcome.HANDED_OVER
                await self._write("release")
            except LeaseLostError:
                return ReaderOutcome.LOST
            except KinesisError as e:
                log.warning("shard %s: %s failed (%s); the lease will expire", self.spec.shard_id,
                            "hand-over" if handoff else "release", e)
        self.stats["state"] = "closed"
        return ReaderOutcome.CLOSED

    async def _current_asker(self, asker: str) -> str | None:
        """Who asks for this lease now: the asker may have withdrawn (it closed) or been
        replaced by another since the write that told us. None: release instead."""
        try:
            row = await asyncio.to_thread(self._store.get, self.spec.stream, self.spec.shard_id)
        except Exception:
            return asker
        if row is None or row.owner != self.spec.owner_id or row.counter != self._lease.counter:
            return asker  # the hand-over write will find out
        return row.next_owner if row.next_owner != self.spec.owner_id else None

    def _alive(self) -> None:
        self._beat = self._clock()
        reader_tick(self.spec, self.stats)  # metrics: per step, rate-limited, never per record

    async def _read_loop(self) -> str:
        spec = self.spec
        if self._lease.checkpoint == SHARD_END:
            return ReaderOutcome.SHARD_END
        while not self._stopping:
            self._alive()
            if self._seek_to is not None:
                await self._apply_seek()
            if self._iterator is None:
                return await self._shard_end()
            await self._pace()
            if self._stopping:  # woken early to stop (close, handoff): no further GetRecords
                continue
            response = await self._get_records()
            if response is None:
                continue
            self._alive()
            self._iterator = response.get("NextShardIterator")
            records = records_from_response(response.get("Records", ()), shard_id=spec.shard_id, stream=spec.stream)
            self._note_lag(response, records)
            if self._skip_through is not None and records:
                skip, self._skip_through = self._skip_through, None
                records = [r for r in records if r.position > skip]
            for start in range(0, len(records), spec.max_records):
                if self._stopping or self._seek_to is not None:
                    break
                await self._deliver_and_checkpoint(records[start : start + spec.max_records])
            if self._seek_to is not None or self._stopping:
                continue
            if self._at_end(response, records):
                return await self._shard_end()
            self._next_call_at = max(self._next_call_at, self._clock() + (0 if records else spec.idle_wait_s))
        return ReaderOutcome.CLOSED

    def _at_end(self, response: dict[str, Any], records: list[Record]) -> bool:
        if response.get("NextShardIterator") is None:
            return True
        end = self.spec.ending_sequence_number
        if end is None:
            return False
        done = self._lease.checkpoint
        if done and done != SHARD_END and seq_key(done) >= seq_key(end):
            return True
        # A closed shard takes no writes: an empty answer at its tip is its end (moto never returns null).
        return not records and not response.get("Records") and response.get("MillisBehindLatest", 0) == 0

    async def _shard_end(self) -> str:
        await self._write("checkpoint", SHARD_END)
        self.stats["checkpoint"] = SHARD_END
        await self._write("release")
        self.stats["state"] = "shard_end"
        log.info("shard %s: read to its end; SHARD_END written, lease released", self.spec.shard_id)
        return ReaderOutcome.SHARD_END

    async def _pace(self) -> None:
        await self._sleep_alive(self._next_call_at - self._clock(), unless_stopping=True)

    async def _sleep_alive(self, seconds: float, *, unless_stopping: bool = False) -> None:
        """Sleep on purpose (pacing, backoff), stamping the heartbeat: the loop is alive.
        ``unless_stopping``: wake early once the loop is asked to stop (e.g. a handoff)."""
        end = self._clock() + seconds
        while (left := end - self._clock()) > 0 and not (unless_stopping and self._stopping):
            await asyncio.sleep(min(left, max(0.05, self.spec.renew_interval_s / 2)))
            self._alive()

    @staticmethod
    def _backoff(attempt: int) -> float:
        """Exponential backoff with jitter: first wait in [0.2, 0.4) s, capped at 5 s."""
        base = min(5.0, 0.2 * 2 ** (attempt - 1))
        return min(5.0, base + random.uniform(0, base))

    async def _get_records(self) -> dict[str, Any] | None:
        """One GetRecords call; None after handling a throttle or an expired iterator."""
        iterator = self._iterator
        self._next_call_at = self._clock() + MIN_CALL_SPACING_S
        self.stats["get_records_calls"] += 1
        try:
            response = await asyncio.to_thread(self._kinesis.get_records, ShardIterator=iterator, Limit=self.spec.max_records)
        except Exception as e:
            code = aws_error_code(e)
            if code == "ExpiredIteratorException" or (code == "InvalidArgumentException" and "expired" in str(e).lower()):
                self.stats["expired_iterators"] += 1
                log.info("shard %s: iterator expired; reopening after the last acknowledged record", self.spec.shard_id)
                self._iterator = await self._get_iterator(self._resume or self.spec.start_at)
                return None
            if is_throttling(e):
                self.stats["throttles"] += 1
                self._throttled += 1
                # never sooner than the 0.2 s spacing already due: <= 5 calls/s whatever the backoff
                self._next_call_at = max(self._next_call_at, self._clock() + self._backoff(self._throttled))
                return None
            err = translate_aws_error(e, operation="GetRecords", resource=f"{self.spec.stream}/{self.spec.shard_id}")
            if err.aws_code == "ResourceNotFoundException":
                raise StreamError(f"stream {self.spec.stream!r} or shard {self.spec.shard_id} was deleted while being read",
                                  aws_code=err.aws_code) from e
            raise err from e
        self._throttled = 0
        return response

    def _note_lag(self, response: dict[str, Any], records: list[Record]) -> None:
        lag = response.get("MillisBehindLatest")
        if records and records[-1].approximate_arrival_timestamp is not None:
            # Emulators report 0 or a gap between records; the age of the newest record is honest.
            age = int((time.time() - records[-1].approximate_arrival_timestamp.timestamp()) * 1000)
            lag = max(int(lag or 0), age) if lag else age
        self.stats["millis_behind_latest"] = lag

    async def _deliver_and_checkpoint(self, batch: list[Record]) -> None:
        if not batch:
            return
        await self._confirm_lease()
        await self._deliver_with_retries(batch)
        last = batch[-1]
        await self._checkpoint(last.sequence_number, last.sub_sequence_number)
        self.stats["checkpoint"] = last.sequence_number
        self._set_resume(StartAt.after_sequence_number(last.sequence_number, last.sub_sequence_number))
        self.stats["records"] += len(batch)
        self.stats["bytes"] += sum(len(r.data) for r in batch)
        self.stats["batches"] += 1

    def _lease_in_doubt(self) -> bool:
        """True when the last successful store write is older than ``renew_deadline_s``: the
        lease may have lapsed (a paused process, a long outage) and another owner may read."""
        return self._clock() - self._last_write > self.spec.renew_deadline_s

    async def _confirm_lease(self) -> None:
        """Before handing a batch downstream: if the lease is in doubt, renew it first (a
        conditional write). A zombie (e.g. a process resumed after SIGSTOP) is fenced here
        and delivers nothing; a live reader pays one write only after a long silence.

        Raises:
            LeaseLostError: the renewal was refused, or the store stays unreachable past
            the deadline (the reader then stops without writing).
        """
        if not self._lease_in_doubt():
            return
        try:
            await self._write("renew")
        except LeaseLostError:
            raise
        except Exception as e:
            self._mark_lost(f"lease in doubt and the store unreachable ({e!r:.200})")
            raise LeaseLostError(f"lease {self._lease.key} in doubt; not delivering") from e

    async def _checkpoint(self, sequence_number: str, sub_sequence: int | None) -> None:
        """Write the checkpoint of an acknowledged batch. A transient store error (throttled,
        unreachable) is retried with backoff for up to ``renew_deadline_s`` (and only while
        the lease is not in doubt); then the reader stops as a lost lease, writing nothing
        more (the lease expires; the next owner re-delivers the batch).

        Raises:
            LeaseLostError: refused (fenced) or given up at the deadline.
            KinesisError: a non-retriable store error.
        """
        attempt, first_failure = 0, None
        while True:
            try:
                await self._write("checkpoint", sequence_number, sub_sequence=sub_sequence)
                return
            except LeaseLostError:
                raise
            except KinesisError as e:
                if not e.retriable:
                    raise
                attempt += 1
                now = self._clock()
                first_failure = now if first_failure is None else first_failure
                if self._lease_in_doubt() or now - first_failure > self.spec.renew_deadline_s:
                    self._mark_lost(f"checkpoint failing past the deadline ({e!r:.200})")
                    raise LeaseLostError(f"lease {self._lease.key}: checkpoint not written by the deadline") from e
                log.info("shard %s: checkpoint failed (%r); retry %d", self.spec.shard_id, e, attempt)
                await self._sleep_alive(min(self._backoff(attempt), self.spec.renew_interval_s))

    async def _await_alive(self, awaitable: Awaitable[Any]) -> Any:
        """Await the downstream while stamping the heartbeat, so a slow sink keeps the lease."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=max(0.05, self.spec.renew_interval_s / 2))
                self._alive()
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()

    async def _deliver_with_retries(self, batch: list[Record]) -> None:
        attempt = 0
        while True:
            try:
                await self._await_alive(self._deliver(batch))
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                attempt += 1
                self.stats["sink_failures"] += 1
                if attempt > self.spec.max_sink_retries:
                    if self.spec.dead_letter is not None:
                        await self._await_alive(asyncio.to_thread(
                            self.spec.dead_letter.put_many, [(r.data, r.partition_key) for r in batch]))
                        log.warning("shard %s: batch of %d sent to the dead-letter stream after %d failures",
                                    self.spec.shard_id, len(batch), attempt)
                        return
                    raise SinkError(f"the sink refused a batch of shard {self.spec.shard_id} {attempt} times: {e!r:.300}") from e
                pause = min(10.0, 0.1 * 2 ** (attempt - 1))
                log.info("shard %s: sink failed (%r); retry %d in %.1f s", self.spec.shard_id, e, attempt, pause)
                await self._sleep_alive(pause)  # a failing downstream keeps the lease, like a slow one

    # ---------------------------------------------------------------- renew
    async def _renew_loop(self) -> None:
        spec = self.spec
        while not self._lost:
            due = self._last_write + spec.renew_interval_s
            await asyncio.sleep(max(0.0, due - self._clock()))
            now = self._clock()
            if now - self._beat > spec.lease_duration_s:
                # The loop is stuck (e.g. a hung call): do not renew; let the lease lapse.
                log.warning("shard %s: read loop silent for %.1f s; not renewing", spec.shard_id, now - self._beat)
                if self._lease_in_doubt():
                    self._mark_lost("read loop stuck past the lease deadline")
                    return
                await asyncio.sleep(min(spec.renew_interval_s, 0.5))
                continue
            try:
                await self._write("renew")
            except LeaseLostError:
                return
            except Exception as e:  # throttled or unreachable: not a lost lease, until our deadline
                if self._lease_in_doubt():
                    self._mark_lost(f"renewals failing past the deadline ({e!r:.200})")
                    return
                log.info("shard %s: renew failed (%r); retrying", spec.shard_id, e)
                await asyncio.sleep(min(spec.renew_interval_s / 3, 1.0))

    # ---------------------------------------------------------------- control
    async def stop(self, *, release: bool = True, grace_s: float = 5.0) -> None:
        """Stop the loop at its next step boundary: a batch being delivered gets ``grace_s``
        to be acknowledged and checkpointed; then the lease is released (unless
        ``release=False``). The loop is cancelled only if it does not stop within ``grace_s``
        (cancelling between an acknowledgement and its checkpoint would deliver the batch
        again to the next owner)."""
        self._stopping = True
        self._release_on_stop = release
        task = self._loop_task
        if task is None or task.done():
            return
        await asyncio.wait({task}, timeout=grace_s)
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def seek(self, position: StartAt) -> None:
        """Reopen at ``position`` after the batch in flight; the checkpoint is cleared and
        ``start_position`` rewritten (the one allowed move backwards)."""
        self._seek_to = position
        for _ in range(int(max(5.0, self.spec.lease_duration_s) / 0.02)):
            if self._seek_to is None or self._lost or self._loop_task is None or self._loop_task.done():
                break
            await asyncio.sleep(0.02)

    async def _apply_seek(self) -> None:
        position, self._seek_to = self._seek_to, None
        assert position is not None
        await self._write("set_start_position", position.to_str())
        self.stats["checkpoint"] = None
        self._set_resume(position)
        self._iterator = await self._get_iterator(position)
        log.info("shard %s: seek to %s", self.spec.shard_id, position)


def _make_ray_actor() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
    class ShardReader:
        """Ray actor shell over :class:`ShardReaderCore` (process name ``ray::ShardReader``).

        Created by its Coordinator (and dies with it); ``open()`` fetches the first
        iterator, ``run()`` runs until shard end, lost lease or ``stop()``.
        """

        def __init__(self, spec: ReaderSpec, lease: Lease, store: LeaseStore, sink: Any) -> None:
            logging.basicConfig(level=logging.INFO)
            # Our blocking calls (boto3, MemoryLeaseStore's ray.get) run in worker threads via
            # asyncio.to_thread, never on the event loop; Ray's once-per-process warning does not apply.
            import ray._private.worker as _ray_worker

            _ray_worker.blocking_get_inside_async_warned = True
            # Every attempt is the loop's own (paced, <= 5/s): no botocore retries. Each call
            # times out well within the lease, so only a truly stuck loop lets it lapse.
            timeout_s = spec.call_timeout_s
            aws = dataclasses.replace(spec.aws, connect_timeout_s=min(spec.aws.connect_timeout_s, timeout_s))
            kinesis = aws.client("kinesis", read_timeout_s=timeout_s, max_attempts=0)

            async def deliver(records: list[Record]) -> Any:
                return await getattr(sink, spec.sink_method).remote(records)

            self.core = ShardReaderCore(spec, lease, store, deliver, kinesis)
            # Where this reader runs, for operators and chaos tests (``Subscription.stats()``).
            self.core.stats.update(node_id=ray.get_runtime_context().get_node_id(), pid=os.getpid())

        async def open(self, lease: Lease | None = None) -> None:
            await self.core.open(lease)

        async def start(self) -> None:
            """Start the read loop as a task of this actor's event loop; returns at once."""
            self._run = asyncio.get_running_loop().create_task(self.core.run(), name="read-loop")

        async def join(self) -> str:
            """Wait for the read loop's outcome (``ReaderOutcome``); re-raises its fatal error."""
            return await asyncio.shield(self._run)

        async def stop(self, release: bool = True, grace_s: float = 5.0) -> None:
            await self.core.stop(release=release, grace_s=grace_s)

        async def seek(self, position: StartAt) -> None:
            await self.core.seek(position)

        def stats(self) -> dict[str, Any]:
            return dict(self.core.stats)

        def lease(self) -> Lease:
            return self.core.lease

        def ping(self) -> bool:
            return True

    return ShardReader


_ACTOR: Any = None


def __getattr__(name: str) -> Any:  # lazy: `import kinesis_actors` does not import Ray
    global _ACTOR
    if name == "ShardReader":
        if _ACTOR is None:
            _ACTOR = _make_ray_actor()
        return _ACTOR
    raise AttributeError(name)
