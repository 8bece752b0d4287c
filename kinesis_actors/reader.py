"""ShardReader: one process that holds many shard leases, one read loop (a :class:`ShardConsumer`) per lease.

Layers, each testable alone:

* :class:`ShardConsumer`: the life of one lease as an explicit state machine
  (:class:`ConsumerState`): open the shard, then GetRecords -> deliver -> acknowledge ->
  checkpoint, with its own renew task, until shard end, a lost lease, a stop or a handoff.
  It reads through :class:`~kinesis_actors.kinesis.ShardFetcher`, the read path it
  shares with ``read_kinesis``, or with ``retrieval="fanout"`` through
  :class:`~kinesis_actors.fanout.FanOutFetcher` (``SubscribeToShard``) behind the same seam.
* :class:`ShardReaderCore`: the consumers of one process (plain asyncio, no Ray): adds and
  stops them, reports how each ended, and owns what they share: the thread pools of
  blocking calls (:class:`ReaderIo`) and the byte budget (:class:`ByteBudget`).
* :class:`ShardReader`: the thin Ray actor over :class:`ShardReaderCore`.

Fault model (per consumer; every invariant of SPEC.md holds per loop, whatever else the
process runs):

* The checkpoint is written only after the downstream acknowledged the batch, so a
  crash anywhere re-delivers at most the batch in flight (at-least-once).
* Every store write is conditional on the lease owner and counter (fencing). Writes of
  one consumer are serialised and always use the latest :class:`Lease`; a lease is
  valid from when its last successful write was SENT.
* The renew task runs beside the loop. It renews only while the loop shows signs of life
  (a heartbeat stamped at every step and every ``renew_interval_s / 2`` while it waits
  on the downstream, on a backoff, on the byte budget or on a thread of the pool): a
  stuck loop lets its lease lapse; a slow downstream never does.
* ``LeaseLostError`` ends the consumer at once (``LOST``): nothing more is written, the
  batch in flight is not acknowledged. Failing renewals (throttled, unreachable) are
  retried until the consumer's deadline (last successful write + lease duration - a
  margin), then it ends the same way. A consumer whose lease is in doubt (no successful
  write for that deadline: a paused process) renews before handing a batch downstream,
  so a resumed zombie is fenced before it delivers.
* Graceful handoff: a write that returns the lease with ``lease_next_owner`` set (another
  instance asked) moves the consumer to ``SHUTTING_DOWN``: the batch in flight is
  delivered, acknowledged and checkpointed, records fetched but not delivered are
  dropped, then one fenced ``hand_over`` write gives the row to the asker.
* ``LATEST`` is resolved once: a first open records ``AT_TIMESTAMP`` of that moment in
  ``start_position`` and reads from the ``LATEST`` iterator itself.

What consumers of one process share, and why none holds up another:

* Blocking calls run in two bounded thread pools (:class:`ReaderIo`): Kinesis calls in
  one, lease-store calls in the other, so a stuck ``GetRecords`` never delays a
  renewal. Every Kinesis call has a socket timeout shorter than the lease (see
  :attr:`ReaderSpec.call_timeout_s`); a stuck call holds one thread, not the pool.
  Threads over botocore, not an async client: boto3 is what the rest of the library
  and its users run, and aiobotocore pins an older botocore (see ENVIRONMENT.md). Each
  pool has as many threads as its client has HTTP connections, so no connection is
  ever opened and thrown away.
* Fetched records wait for their acknowledgement inside one :class:`ByteBudget` per
  process (``max_buffered_bytes``): a consumer fetches only when the budget admits it,
  and the budget never holds more than ``max_buffered_bytes`` plus one ``GetRecords``
  response, whatever the number of shards.
* Enhanced fan-out: the loop reads one event per step, in a third pool (one thread per
  subscribed shard, as each HTTP/1.1 subscription is one blocking connection), and
  delivers it before it reads the next; meanwhile events wait in the connection's socket
  buffers (TCP flow control slows the service's writes), never in an unbounded queue.
  Each event read reserves :data:`~kinesis_actors.fanout.FANOUT_EVENT_RESERVE_BYTES` in
  the byte budget. When the budget stays full for :data:`FANOUT_BUDGET_DROP_S`, the
  subscription is dropped and opened again, once the budget admits the read, after the
  last acknowledged record. A lost lease closes the subscription at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .aws import AwsSettings
from .config import DEFAULT_MAX_SHARDS_PER_READER
from .errors import InvalidError, KinesisError, LeaseLostError, SinkError
from .fanout import FANOUT_EVENT_RESERVE_BYTES, FanOutFetcher
from .kinesis import GET_RECORDS_MAX_BYTES, Fetched, ShardFetcher, backoff_s
from .leases.protocol import SHARD_END, Lease, LeaseStore
from .metrics import reader_tick
from .records import Record, StartAt
from .sinks.protocol import Sink

__all__ = ["ConsumerState", "TRANSITIONS", "ReaderSpec", "kinesis_call_timeout_s", "ShardConsumer", "ShardReaderCore",
           "ShardEvent", "ByteBudget", "CallLimit", "ReaderIo",
           "ShardReader", "DEFAULT_MAX_BUFFERED_BYTES", "DEFAULT_THREADS"]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_MAX_BUFFERED_BYTES = 64 * 2**20
"""Default byte budget of one reader process (``KinesisStream.max_buffered_bytes``), bytes."""

DEFAULT_THREADS = 16
"""Threads (and HTTP connections) of each of a reader's two pools: Kinesis and lease store."""

FANOUT_BUDGET_DROP_S = 1.0
"""How long an enhanced fan-out loop waits on a full byte budget with its subscription open
before it drops the subscription, seconds (it resubscribes once the budget admits it)."""


class ConsumerState(enum.Enum):
    """The life of one shard lease in a reader (compare KCL's ``ConsumerStates``).

    Transitions (:data:`TRANSITIONS` is the one place that allows them)::

        INITIALIZING ──► PROCESSING ──► SHUTTING_DOWN ──► CLOSED
             │               │                 └────────► HANDED_OVER
             │               ├─────► SHARD_ENDED
             └───────────────┴─────► LOST, FAILED    (from any live state)

    * ``INITIALIZING``: the lease is held; recording where a never-read shard opens and
      fetching the first iterator.
    * ``PROCESSING``: GetRecords -> deliver -> acknowledge -> checkpoint.
    * ``SHUTTING_DOWN``: asked to stop (close, or another instance asked for the lease):
      the batch in flight is acknowledged and checkpointed, nothing new is fetched.
    * Terminal: ``SHARD_ENDED`` (read to its end, every batch acknowledged, ``SHARD_END``
      written, released), ``CLOSED`` (stopped; released unless asked to keep it),
      ``HANDED_OVER`` (given to the instance that asked), ``LOST`` (fenced or lapsed:
      wrote nothing more), ``FAILED`` (a fatal error: the sink gave up, the stream is gone).
    """

    INITIALIZING = "initializing"
    PROCESSING = "processing"
    SHUTTING_DOWN = "shutting_down"
    SHARD_ENDED = "shard_ended"
    CLOSED = "closed"
    HANDED_OVER = "handed_over"
    LOST = "lost"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        """True for the states a consumer never leaves."""
        return not TRANSITIONS[self]


_S = ConsumerState
TRANSITIONS: dict[ConsumerState, frozenset[ConsumerState]] = {
    _S.INITIALIZING: frozenset({_S.PROCESSING, _S.SHUTTING_DOWN, _S.SHARD_ENDED, _S.LOST, _S.FAILED}),
    _S.PROCESSING: frozenset({_S.SHUTTING_DOWN, _S.SHARD_ENDED, _S.LOST, _S.FAILED}),
    _S.SHUTTING_DOWN: frozenset({_S.CLOSED, _S.HANDED_OVER, _S.LOST, _S.FAILED}),
    _S.SHARD_ENDED: frozenset(), _S.CLOSED: frozenset(), _S.HANDED_OVER: frozenset(),
    _S.LOST: frozenset(), _S.FAILED: frozenset(),
}
"""The allowed moves of :class:`ConsumerState`; a terminal state allows none."""


def kinesis_call_timeout_s(lease_duration_s: float) -> float:
    """Connect and read timeout of a reader's Kinesis calls: shorter than the lease (half of
    it, at most 10 s; up to 1 s for very short leases), seconds."""
    return min(10.0, max(0.5 * lease_duration_s, min(1.0, 0.75 * lease_duration_s)))


@dataclasses.dataclass(frozen=True)
class ReaderSpec:
    """What one consumer needs besides its lease (all picklable).

    Attributes:
        stream, shard_id: what to read. owner_id: the lease owner it reads for.
        start_at: position for a shard with no checkpoint and no recorded start position.
        lease_duration_s / renew_interval_s: lease timing, seconds.
        ending_sequence_number: set for a closed shard: reaching it is shard end.
        max_records: ``GetRecords`` ``Limit`` and the most records per delivered batch.
        idle_wait_s / max_idle_wait_s: the first and the longest wait at the tip, seconds
            (the wait doubles while the shard stays empty).
        max_sink_retries: retries of a failing batch before ``SinkError``.
        dead_letter: a Publisher for batches the sink refused, or None.
        consumer_arn: the registered stream consumer for enhanced fan-out
            (``retrieval="fanout"``); None reads with ``GetRecords``.
        min_checkpoint_interval_s: shortest gap between two checkpoint writes, seconds
            (``KinesisStream.min_checkpoint_interval_s``); 0 checkpoints every acknowledged batch.
    """

    stream: str
    shard_id: str
    owner_id: str
    start_at: StartAt
    lease_duration_s: float
    renew_interval_s: float
    ending_sequence_number: str | None = None
    max_records: int = 10_000
    idle_wait_s: float = 0.25
    max_idle_wait_s: float = 1.0
    max_sink_retries: int = 5
    dead_letter: Any = None
    consumer_arn: str | None = None
    min_checkpoint_interval_s: float = 0.0

    @property
    def call_timeout_s(self) -> float:
        """Connect and read timeout of Kinesis calls, seconds: :func:`kinesis_call_timeout_s`."""
        return kinesis_call_timeout_s(self.lease_duration_s)

    @property
    def renew_deadline_s(self) -> float:
        """How long after its last successful write a consumer keeps retrying a failing renewal, seconds."""
        return max(self.lease_duration_s - max(self.renew_interval_s, 0.1 * self.lease_duration_s),
                   0.5 * self.lease_duration_s)


Deliver = Callable[[list[Record]], Awaitable[Any]]


class CallLimit:
    """How many Kinesis calls of one process may be in flight: AIMD on lease-renewal latency.

    Renewals keep leases; polls only move data. When the service (or an emulator that
    serves Kinesis and DynamoDB on the same cores) cannot keep up with both, the renewals
    must not wait behind the polls. So every renewal reports its latency: one slower than
    a third of the renew interval halves the limit (at most once per third of an
    interval); one faster than a tenth of it raises the limit by ``1 / limit`` (additive
    increase, about +1 per window of calls), up to ``maximum``. Against AWS, renewals take
    milliseconds and the limit stays at its maximum.

    Args:
        maximum: the most calls in flight (the pool's threads). minimum: the fewest.
        clock: monotonic seconds.
    """

    def __init__(self, maximum: int, *, minimum: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.maximum = maximum
        self.minimum = minimum
        self.limit = float(maximum)
        self.in_flight = 0
        self.cuts = 0
        self._clock = clock
        self._last_cut = float("-inf")
        self._freed: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._freed is None:
            self._freed = asyncio.Event()
        return self._freed

    async def acquire(self) -> None:
        """Wait for a free place, then take it."""
        while self.in_flight >= int(self.limit):
            event = self._event()
            event.clear()
            await event.wait()
        self.in_flight += 1

    def release(self) -> None:
        """Give a place back."""
        self.in_flight -= 1
        self._event().set()

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        """A lease renewal of this process took ``latency_s`` seconds."""
        if latency_s > renew_interval_s / 3:
            now = self._clock()
            if now - self._last_cut >= renew_interval_s / 3:
                self._last_cut = now
                self.limit = max(float(self.minimum), self.limit / 2)
                self.cuts += 1
                log.info("renewals slow (%.2f s): at most %d Kinesis calls in flight now", latency_s, int(self.limit))
        elif latency_s < renew_interval_s / 10 and self.limit < self.maximum:
            self.limit = min(float(self.maximum), self.limit + 1 / self.limit)
            self._event().set()


class ReaderIo:
    """The thread pools of one reader process: Kinesis calls and lease-store calls apart.

    A blocking call (boto3, ``MemoryLeaseStore``'s ``ray.get``) never runs on the event
    loop. With separate pools, a ``GetRecords`` stuck until its socket timeout takes a
    thread from the Kinesis pool only, never from the renewals; and :class:`CallLimit`
    holds Kinesis calls back while renewals are slow.

    A third pool reads enhanced fan-out subscriptions (a read waits for the next event):
    its threads are started only when used, one per subscribed shard at most.

    Args:
        kinesis_threads: threads for Kinesis calls (size the client's HTTP pool the same).
        store_threads: threads for lease-store calls.
        stream_threads: most threads reading subscriptions (the reader's shard cap).
    """

    def __init__(self, *, kinesis_threads: int = DEFAULT_THREADS, store_threads: int = DEFAULT_THREADS,
                 stream_threads: int = DEFAULT_MAX_SHARDS_PER_READER) -> None:
        self.kinesis_threads = kinesis_threads
        self.store_threads = store_threads
        self.limit = CallLimit(kinesis_threads)
        self._kinesis = concurrent.futures.ThreadPoolExecutor(kinesis_threads, thread_name_prefix="ka-kinesis")
        self._store = concurrent.futures.ThreadPoolExecutor(store_threads, thread_name_prefix="ka-store")
        self._streams = concurrent.futures.ThreadPoolExecutor(stream_threads, thread_name_prefix="ka-subscription")

    async def kinesis(self, fn: Callable[..., T], *args: Any, limited: bool = True) -> T:
        """Run ``fn(*args)`` (a Kinesis call) in the Kinesis pool, within :attr:`limit` unless
        ``limited=False`` (opening a shard: once per lease, not a recurring poll)."""
        if not limited:
            return await asyncio.get_running_loop().run_in_executor(self._kinesis, fn, *args)
        await self.limit.acquire()
        try:
            return await asyncio.get_running_loop().run_in_executor(self._kinesis, fn, *args)
        finally:
            self.limit.release()

    async def store(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` (a lease-store call) in the store pool."""
        return await asyncio.get_running_loop().run_in_executor(self._store, fn, *args)

    async def stream(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` (a read of a subscription: waits for its next event) in the subscription pool."""
        return await asyncio.get_running_loop().run_in_executor(self._streams, fn, *args)

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        """Tell :attr:`limit` how long a renewal took."""
        self.limit.note_renewal(latency_s, renew_interval_s)

    def close(self) -> None:
        """Stop the pools once their calls end (no new calls are taken)."""
        self._kinesis.shutdown(wait=False, cancel_futures=True)
        self._store.shutdown(wait=False, cancel_futures=True)
        self._streams.shutdown(wait=False, cancel_futures=True)


class ByteBudget:
    """Bytes of fetched, unacknowledged records in one reader process, bounded.

    A fetch reserves the most one ``GetRecords`` response can carry (``max_response``,
    10 MiB on AWS) before it starts; its answer turns the reservation into what it
    really holds; acknowledging (or dropping) the records gives the bytes back. A fetch
    is admitted while ``used + reserved + max_response <= limit``, or, when nothing is in
    flight, while ``used < limit``. Hence ``used + reserved`` never exceeds ``limit +
    max_response``: the budget plus one response, whatever the number of shards
    (compare KCL's ``maxByteSize``, which bounds each shard's prefetch queue instead).

    Bytes are counted as :func:`~kinesis_actors.kinesis.record_bytes` (payload and
    partition key), not Python object overhead.

    Args:
        limit: the budget, bytes (> 0).
        max_response: the largest response one fetch may bring, bytes.
    """

    def __init__(self, limit: int, *, max_response: int = GET_RECORDS_MAX_BYTES) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise InvalidError(f"max_buffered_bytes must be a positive int, got {limit!r}")
        self.limit = limit
        self.max_response = max_response
        self.used = 0
        self.reserved = 0
        self.peak = 0  # most bytes held at once
        self.waits = 0
        self._changed: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def try_reserve(self, amount: int | None = None) -> bool:
        """Reserve room for one fetch if the rule above admits it; True if it did.
        ``amount``: the most this fetch may bring, bytes (default ``max_response``)."""
        amount = self.max_response if amount is None else amount
        room = self.used + self.reserved + amount <= self.limit
        if room or (self.reserved == 0 and self.used < self.limit):
            self.reserved += amount
            return True
        return False

    async def wait_changed(self, timeout_s: float) -> None:
        """Wait until bytes are given back (or ``timeout_s`` seconds pass)."""
        event = self._event()
        event.clear()
        self.waits += 1
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    def settle(self, nbytes: int, amount: int | None = None) -> None:
        """A fetch that reserved ``amount`` (default ``max_response``) returned ``nbytes``
        bytes of records (0 if it failed): now held."""
        amount = self.max_response if amount is None else amount
        self.reserved -= amount
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        if nbytes < amount:
            self._event().set()

    def release(self, nbytes: int) -> None:
        """``nbytes`` of held records were acknowledged or dropped."""
        if nbytes:
            self.used -= nbytes
            self._event().set()


class _ToThreadIo:
    """:class:`ReaderIo`'s interface over ``asyncio.to_thread`` (a consumer used on its own, in tests)."""

    async def kinesis(self, fn: Callable[..., T], *args: Any, limited: bool = True) -> T:
        return await asyncio.to_thread(fn, *args)

    async def store(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def stream(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        pass


class ShardConsumer:
    """The read loop of one shard lease, with its renew task (plain asyncio, no Ray).

    Args:
        spec: see :class:`ReaderSpec`.
        lease: the lease as the Coordinator took it (its owner and counter fence every write).
        store: the lease store (blocking calls, run in ``io``'s store pool).
        deliver: ``async deliver(records)``; returning is the acknowledgement, raising a failure.
        kinesis: a boto3 Kinesis client (blocking; called in ``io``'s Kinesis pool).
        io: the process's :class:`ReaderIo`; default ``asyncio.to_thread``.
        budget: the process's :class:`ByteBudget`, or None (unbounded).
        clock: monotonic seconds (injectable for tests).
        on_open: called once, when the consumer enters ``PROCESSING`` (first iterator held).
    """

    def __init__(self, spec: ReaderSpec, lease: Lease, store: LeaseStore, deliver: Deliver, kinesis: Any, *,
                 io: ReaderIo | _ToThreadIo | None = None, budget: ByteBudget | None = None,
                 clock: Callable[[], float] = time.monotonic, on_open: Callable[[], None] | None = None) -> None:
        self.spec = spec
        self._lease = lease
        self._store = store
        self._deliver = deliver
        self._kinesis = kinesis
        self._io = io if io is not None else _ToThreadIo()
        self._budget = budget
        self._clock = clock
        self._on_open = on_open
        self.state = ConsumerState.INITIALIZING
        self.error: BaseException | None = None
        self._write_lock = asyncio.Lock()
        # When the last successful store write was SENT (monotonic s): the lease is valid from
        # then, not from when the answer came back (a write applied during a pause of this
        # process must not make the lease look fresh). The lease given here was written by
        # the Coordinator at most one renew interval ago; assume the worst.
        self._last_write = clock() - spec.renew_interval_s
        self._beat = clock()
        self._waiting = 0  # > 0 while the loop waits on a store write (bounded by its timeouts): alive
        self._call_started: list[float] | None = None  # a Kinesis call of the loop: [] while queued for a thread
        self._lost = False
        self._stopping = False
        self._release_on_stop = True
        self._handoff_to: str | None = None  # lease_next_owner seen on a write: hand over at the next step
        self._fetcher: ShardFetcher | FanOutFetcher | None = None
        self._held_bytes = 0  # budget bytes of records fetched and not yet acknowledged
        self._seek_to: StartAt | None = None
        # Acknowledged but not yet checkpointed (min_checkpoint_interval_s > 0): (sequence, sub-sequence).
        self._pending_checkpoint: tuple[str, int | None] | None = None
        self._checkpointed_at = float("-inf")  # monotonic s of the last checkpoint write
        self._shutdown_begun = False
        self._task: asyncio.Task[Any] | None = None
        self._renew_task: asyncio.Task[None] | None = None
        self.stats: dict[str, Any] = {
            "shard_id": spec.shard_id, "records": 0, "bytes": 0, "batches": 0, "get_records_calls": 0,
            "throttles": 0, "expired_iterators": 0, "sink_failures": 0, "millis_behind_latest": None,
            "checkpoint": lease.checkpoint, "lease_counter": lease.counter, "state": self.state.value,
            "checkpoints_written": 0, "dead_letter_records": 0,
        }
        if spec.consumer_arn:
            self.stats.update(retrieval="fanout", subscriptions=0, subscription_renewals=0, subscription_drops=0,
                              budget_drops=0)

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
        return self._lease

    @property
    def held_bytes(self) -> int:
        """Budget bytes of records fetched and not yet acknowledged."""
        return self._held_bytes

    # ---------------------------------------------------------------- store writes
    async def _write(self, what: str, call: Callable[[Lease], Lease | None]) -> Lease:
        """One conditional store write ``call(latest lease)``, serialised; ``LeaseLostError``
        marks the consumer lost. ``what`` names the write in messages.

        The read loop waiting here is not silent: the store call is bounded by its own
        timeouts, and a checkpoint that keeps failing ends the lease at its deadline."""
        if asyncio.current_task() is not self._task:
            return await self._write_now(what, call)
        self._waiting += 1
        try:
            return await self._write_now(what, call)
        finally:
            self._waiting -= 1
            self._beat = max(self._beat, self._clock())

    async def _write_now(self, what: str, call: Callable[[Lease], Lease | None]) -> Lease:
        async with self._write_lock:
            if self._lost:
                raise LeaseLostError(f"lease {self._lease.key} was lost; not writing")
            # A write already sent must update our Lease even if we are cancelled meanwhile,
            # or the next write (the release at close) would carry a stale counter.
            sent = self._clock()
            write = asyncio.ensure_future(self._io.store(call, self._lease))
            try:
                new = await asyncio.shield(write)
            except asyncio.CancelledError:
                try:
                    self._applied(await write, sent)
                except BaseException:
                    pass
                raise
            except LeaseLostError:
                self._mark_lost(f"{what} refused: the lease changed owner or counter")
                raise
            return self._applied(new, sent)

    def _renew(self) -> Awaitable[Lease]:
        return self._write("renew", lambda lease: self._store.renew(lease))

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
            log.warning("shard %s: lease lost (%s); stopping without writing", self.spec.shard_id, why)
            if isinstance(self._fetcher, FanOutFetcher):
                self._fetcher.close()  # ends the subscription at once, even during a read
            task = self._task
            if task is not None and not task.done() and asyncio.current_task() is not task:
                task.cancel()

    def _lease_in_doubt(self) -> bool:
        """True when the last successful store write is older than ``renew_deadline_s``: the
        lease may have lapsed (a paused process, a long outage) and another owner may read."""
        return self._clock() - self._last_write > self.spec.renew_deadline_s

    # ---------------------------------------------------------------- INITIALIZING
    def _position(self) -> StartAt | None:
        """Where this lease says to open: after the checkpoint, else the recorded start position."""
        lease = self._lease
        if lease.checkpoint and lease.checkpoint != SHARD_END:
            return StartAt.after_sequence_number(lease.checkpoint, lease.checkpoint_sub_sequence)
        if lease.start_position:
            return StartAt.parse(lease.start_position)
        return None

    async def open(self) -> None:
        """``INITIALIZING``: record ``start_position`` on a first open, then fetch the first
        shard iterator (throttling is retried while the lease is held). Called by
        :meth:`run` if not called before. Leaves the consumer in ``PROCESSING``, or in
        ``SHARD_ENDED`` for a row already at ``SHARD_END``.

        ``LATEST`` is resolved once: the consumer records ``AT_TIMESTAMP`` of the moment it
        asked (so a replacement reopens there, never at a later tip) and reads from the
        ``LATEST`` iterator itself.

        Raises:
            LeaseLostError: the lease was taken away meanwhile. StreamError/KinesisError:
            ``GetShardIterator`` failed and is not transient.
        """
        if self.state is not ConsumerState.INITIALIZING or self._fetcher is not None:
            return
        spec = self.spec
        if self._lease.checkpoint == SHARD_END:  # finished before: nothing to read, let the row go
            self._fetcher = self._new_fetcher(spec.start_at)
            await self._write("release", lambda lease: self._store.release(lease))
            self._to(ConsumerState.SHARD_ENDED)
            return
        position = self._position()
        start = position
        if position is None:  # a first open: record where, resolved once
            start = spec.start_at
            recorded = start
            if start.kind == "LATEST":
                recorded = StartAt("AT_TIMESTAMP", timestamp_ms=int(time.time() * 1000))
            at = recorded.to_str()
            await self._write("set_start_position", lambda lease: self._store.set_start_position(lease, at))
            position = recorded
        assert start is not None
        # Opens at `start` (LATEST itself on a first open); an iterator that expires before
        # any record reopens at the recorded position, never at a later tip.
        self._fetcher = fetcher = self._new_fetcher(start, restart_at=position)
        while not fetcher.has_iterator:
            await self._pace()
            if self._stopping:  # stopped (or asked for) before it ever read: nothing to checkpoint
                self._to(ConsumerState.SHUTTING_DOWN)
                return
            await self._step()
            self._alive()
        self._to(ConsumerState.PROCESSING)

    def _new_fetcher(self, start: StartAt, *, restart_at: StartAt | None = None) -> ShardFetcher | FanOutFetcher:
        spec = self.spec
        if spec.consumer_arn:
            return FanOutFetcher(self._kinesis, spec.stream, spec.shard_id, start, consumer_arn=spec.consumer_arn,
                                 restart_at=restart_at, ending_sequence_number=spec.ending_sequence_number,
                                 clock=self._clock)
        return ShardFetcher(self._kinesis, spec.stream, spec.shard_id, start, restart_at=restart_at,
                            ending_sequence_number=spec.ending_sequence_number, max_records=spec.max_records,
                            idle_wait_s=spec.idle_wait_s, max_idle_wait_s=spec.max_idle_wait_s, clock=self._clock)

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
        self._task = asyncio.current_task()
        self._renew_task = asyncio.create_task(self._renew_loop(), name=f"renew-{self.spec.shard_id}")
        try:
            try:
                await self.open()
                if self.state is ConsumerState.PROCESSING:
                    await self._process()
                if self.state is ConsumerState.SHUTTING_DOWN:
                    await self._shut_down()
            except asyncio.CancelledError:
                if self._lost:
                    self._to(ConsumerState.LOST)
                elif self._stopping and not self.state.terminal:
                    if self.state is ConsumerState.SHUTTING_DOWN and self._shutdown_begun:
                        self._to(ConsumerState.CLOSED)  # cancelled while releasing: the lease will expire
                    else:
                        self._to(ConsumerState.SHUTTING_DOWN)
                        await self._shut_down()
                else:
                    raise
            except LeaseLostError:
                self._to(ConsumerState.LOST)
            except Exception as e:
                self.error = e
                self._to(ConsumerState.FAILED)
                await self._release_after_failure()
                raise
        finally:
            if isinstance(self._fetcher, FanOutFetcher):
                self._fetcher.close()
            self._renew_task.cancel()
            await asyncio.gather(self._renew_task, return_exceptions=True)
            self._give_back(self._held_bytes)
        if self._lost and self.state is not ConsumerState.LOST and not self.state.terminal:
            self._to(ConsumerState.LOST)
        return self.state

    async def _process(self) -> None:
        """``PROCESSING``: fetch -> deliver -> acknowledge -> checkpoint, until stopped or shard end."""
        fetcher = self._fetcher
        assert fetcher is not None
        while True:
            self._alive()
            if self._stopping:
                self._to(ConsumerState.SHUTTING_DOWN)
                return
            if self._seek_to is not None:
                await self._apply_seek()
            await self._flush_checkpoint(due_only=True)
            got = await self._fetch()
            if got is None:
                continue
            self._note_lag(got)
            records, spec = got.records, self.spec
            for start in range(0, len(records), spec.max_records):
                if self._stopping or self._seek_to is not None:
                    break
                await self._deliver_and_checkpoint(records[start : start + spec.max_records])
            self._give_back(self._held_bytes)  # delivered and acknowledged, or dropped (stop, seek)
            if self._stopping or self._seek_to is not None:
                continue
            if got.shard_end:
                await self._shard_end()
                return

    async def _fetch(self) -> Fetched | None:
        """One step of the fetcher, paced, within the byte budget; None if nothing to deliver."""
        fetcher = self._fetcher
        assert fetcher is not None
        await self._pace()
        if self._stopping or self._seek_to is not None:
            return None
        amount = FANOUT_EVENT_RESERVE_BYTES if isinstance(fetcher, FanOutFetcher) else None
        reserved = fetcher.has_iterator and await self._reserve_budget(amount)
        got: Fetched | None = None
        try:
            got = await self._step()
        finally:
            if reserved and self._budget is not None:
                nbytes = got.bytes if got is not None else 0
                self._budget.settle(nbytes, amount)
                self._held_bytes += nbytes
        return got

    async def _step(self) -> Fetched | None:
        """One fetcher step (one AWS call) in the Kinesis pool; its counters go to the stats.

        Waiting for a place in the pool is not silence (other loops hold it); the call
        itself is, from when its thread starts it: it must end within its socket timeout."""
        fetcher = self._fetcher
        assert fetcher is not None

        started: list[float] = []  # set by the pool's thread when the call begins

        def call() -> Fetched | None:
            started.append(self._clock())
            return fetcher.step()

        self._call_started = started
        try:
            if isinstance(fetcher, FanOutFetcher):
                if fetcher.blocking_read:
                    return await self._io.stream(call)
                return await self._io.kinesis(call, limited=False)  # SubscribeToShard: at most 1/s per shard
            return await self._io.kinesis(call, limited=fetcher.has_iterator)
        finally:
            self._call_started = None
            self._beat = max(self._beat, self._clock())
            self.stats.update(get_records_calls=fetcher.get_records_calls, throttles=fetcher.throttles,
                              expired_iterators=fetcher.expired_iterators)
            if isinstance(fetcher, FanOutFetcher):
                self.stats.update(subscriptions=fetcher.subscriptions, subscription_renewals=fetcher.renewals,
                                  subscription_drops=fetcher.drops)

    async def _reserve_budget(self, amount: int | None = None) -> bool:
        """Wait (alive) until the process's byte budget admits one more fetch of ``amount``
        bytes (default one ``GetRecords`` response); True once reserved. An enhanced fan-out
        subscription is dropped after :data:`FANOUT_BUDGET_DROP_S` of waiting."""
        budget = self._budget
        if budget is None:
            return False
        since = self._clock()
        while not budget.try_reserve(amount):
            await budget.wait_changed(max(0.05, min(self.spec.renew_interval_s / 2, FANOUT_BUDGET_DROP_S)))
            self._alive()
            fetcher = self._fetcher
            if isinstance(fetcher, FanOutFetcher) and fetcher.has_iterator \
                    and self._clock() - since >= FANOUT_BUDGET_DROP_S:
                fetcher.pause()
                self.stats["budget_drops"] += 1
        return True

    def _give_back(self, nbytes: int) -> None:
        if nbytes and self._budget is not None:
            self._budget.release(nbytes)
        self._held_bytes -= nbytes

    async def _shard_end(self) -> None:
        self._pending_checkpoint = None  # SHARD_END is past every acknowledged record
        await self._write("checkpoint SHARD_END", lambda lease: self._store.checkpoint(lease, SHARD_END))
        self.stats["checkpoint"] = SHARD_END
        await self._write("release", lambda lease: self._store.release(lease))
        self._to(ConsumerState.SHARD_ENDED)
        log.info("shard %s: read to its end; SHARD_END written, lease released", self.spec.shard_id)

    # ---------------------------------------------------------------- SHUTTING_DOWN
    async def _shut_down(self) -> None:
        """Hand the lease to the asker, or release it (unless asked to keep it)."""
        self._shutdown_begun = True
        if not self._lost:  # close and handoff: the acknowledged records are checkpointed first
            try:
                await self._flush_checkpoint()
            except LeaseLostError:
                self._to(ConsumerState.LOST)
                return
            except KinesisError as e:
                log.warning("shard %s: the last checkpoint failed (%s)", self.spec.shard_id, e)
        if not self._release_on_stop or self._lost:
            self._to(ConsumerState.CLOSED)
            return
        handoff = self._handoff_to
        try:
            if handoff is not None:
                handoff = await self._current_asker(handoff)
            if handoff is not None:
                to = handoff
                await self._write("hand-over", lambda lease: self._store.hand_over(lease, to=to))
                self._to(ConsumerState.HANDED_OVER)
                log.info("shard %s: handed over to %s at checkpoint %s", self.spec.shard_id, handoff,
                         self._lease.checkpoint)
                return
            await self._write("release", lambda lease: self._store.release(lease))
        except LeaseLostError:
            self._to(ConsumerState.LOST)
            return
        except KinesisError as e:
            log.warning("shard %s: %s failed (%s); the lease will expire", self.spec.shard_id,
                        "hand-over" if handoff else "release", e)
        self._to(ConsumerState.CLOSED)

    async def _release_after_failure(self) -> None:
        try:
            if not self._lost:
                await self._flush_checkpoint()
                await self._write("release", lambda lease: self._store.release(lease))
        except Exception as e:
            log.info("shard %s: release after the failure did not happen (%r); the lease will expire",
                     self.spec.shard_id, e)

    async def _current_asker(self, asker: str) -> str | None:
        """Who asks for this lease now: the asker may have withdrawn (it closed) or been
        replaced by another since the write that told us. None: release instead."""
        spec = self.spec
        try:
            row = await self._io.store(self._store.get, spec.stream, spec.shard_id)
        except Exception:
            return asker
        if row is None or row.owner != spec.owner_id or row.counter != self._lease.counter:
            return asker  # the hand-over write will find out
        return row.next_owner if row.next_owner != spec.owner_id else None

    # ---------------------------------------------------------------- delivery
    def _alive(self) -> None:
        self._beat = self._clock()
        reader_tick(self.spec, self.stats)  # metrics: per step, rate-limited, never per record

    async def _pace(self) -> None:
        fetcher = self._fetcher
        if fetcher is not None:
            await self._sleep_alive(fetcher.due_in(), unless_stopping=True)

    async def _sleep_alive(self, seconds: float, *, unless_stopping: bool = False) -> None:
        """Sleep on purpose (pacing, backoff), stamping the heartbeat: the loop is alive.
        ``unless_stopping``: wake early once the loop is asked to stop (e.g. a handoff)."""
        end = self._clock() + seconds
        while (left := end - self._clock()) > 0 and not (unless_stopping and self._stopping):
            await asyncio.sleep(min(left, max(0.05, self.spec.renew_interval_s / 2)))
            self._alive()

    def _note_lag(self, got: Fetched) -> None:
        lag = got.millis_behind_latest
        records = got.records
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
        self._pending_checkpoint = (last.sequence_number, last.sub_sequence_number)
        await self._flush_checkpoint(due_only=True)
        self.stats["records"] += len(batch)
        self.stats["bytes"] += sum(len(r.data) for r in batch)
        self.stats["batches"] += 1

    async def _confirm_lease(self) -> None:
        """Before handing a batch downstream: if the lease is in doubt, renew it first (a
        conditional write). A zombie (e.g. a process resumed after SIGSTOP) is fenced here
        and delivers nothing; a live consumer pays one write only after a long silence.

        Raises:
            LeaseLostError: the renewal was refused, or the store stays unreachable past
            the deadline (the consumer then stops without writing).
        """
        if not self._lease_in_doubt():
            return
        try:
            await self._renew()
        except LeaseLostError:
            raise
        except Exception as e:
            self._mark_lost(f"lease in doubt and the store unreachable ({e!r:.200})")
            raise LeaseLostError(f"lease {self._lease.key} in doubt; not delivering") from e

    async def _flush_checkpoint(self, *, due_only: bool = False) -> None:
        """Write the checkpoint of the last acknowledged record, if not written yet. With
        ``due_only``, only once ``min_checkpoint_interval_s`` passed since the last write
        (always, when it is 0). Raises as :meth:`_checkpoint`."""
        pending = self._pending_checkpoint
        if pending is None:
            return
        if due_only and self._clock() - self._checkpointed_at < self.spec.min_checkpoint_interval_s:
            return
        await self._checkpoint(*pending)
        self._checkpointed_at = self._clock()
        if self._pending_checkpoint == pending:
            self._pending_checkpoint = None
        self.stats["checkpoint"] = pending[0]
        self.stats["checkpoints_written"] += 1

    async def _checkpoint(self, sequence_number: str, sub_sequence: int | None) -> None:
        """Write the checkpoint of an acknowledged batch. A transient store error (throttled,
        unreachable) is retried with backoff for up to ``renew_deadline_s`` (and only while
        the lease is not in doubt); then the consumer stops as a lost lease, writing nothing
        more (the lease expires; the next owner re-delivers the batch).

        Raises:
            LeaseLostError: refused (fenced) or given up at the deadline.
            KinesisError: a non-retriable store error.
        """
        attempt, first_failure = 0, None
        while True:
            try:
                await self._write("checkpoint", lambda lease: self._store.checkpoint(
                    lease, sequence_number, sub_sequence=sub_sequence))
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
                await self._sleep_alive(min(backoff_s(attempt), self.spec.renew_interval_s))

    async def _await_alive(self, awaitable: Awaitable[T]) -> T:
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
                    dead_letter = self.spec.dead_letter
                    if dead_letter is not None:
                        await self._await_alive(self._io.kinesis(
                            dead_letter.put_many, [(r.data, r.partition_key) for r in batch]))
                        self.stats["dead_letter_records"] += len(batch)
                        log.warning("shard %s: batch of %d sent to the dead-letter stream after %d failures",
                                    self.spec.shard_id, len(batch), attempt)
                        return
                    raise SinkError(f"the sink refused a batch of shard {self.spec.shard_id} {attempt} times: "
                                    f"{e!r:.300}") from e
                pause = min(10.0, 0.1 * 2 ** (attempt - 1))
                log.info("shard %s: sink failed (%r); retry %d in %.1f s", self.spec.shard_id, e, attempt, pause)
                await self._sleep_alive(pause)  # a failing downstream keeps the lease, like a slow one

    # ---------------------------------------------------------------- renew
    def _last_sign_of_life(self) -> float:
        """When the loop last showed it is alive (monotonic s). Waiting for a place in the
        Kinesis pool or on a store write counts as alive (other loops hold the resource;
        the wait is bounded); a Kinesis call counts from when its thread started it, and
        must end within its socket timeout."""
        call = self._call_started
        if self._waiting or (call is not None and not call):
            return self._clock()
        return max(self._beat, call[0]) if call else self._beat

    async def _renew_loop(self) -> None:
        spec = self.spec
        # The first renewal is spread over half an interval: consumers opened together do
        # not renew in one burst forever after.
        first = True
        while not self._lost:
            due = self._last_write + spec.renew_interval_s
            if first:
                due += random.uniform(0, spec.renew_interval_s / 2)
                first = False
            await asyncio.sleep(max(0.0, due - self._clock()))
            now = self._clock()
            if now - self._last_sign_of_life() > spec.lease_duration_s:
                # The loop is stuck (e.g. a hung call): do not renew; let the lease lapse.
                log.warning("shard %s: read loop silent for %.1f s; not renewing", spec.shard_id,
                            now - self._last_sign_of_life())
                if self._lease_in_doubt():
                    self._mark_lost("read loop stuck past the lease deadline")
                    return
                await asyncio.sleep(min(spec.renew_interval_s, 0.5))
                continue
            try:
                await self._renew()
                self._io.note_renewal(self._clock() - now, spec.renew_interval_s)
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
        """Stop at the next step boundary (``SHUTTING_DOWN``): a batch being delivered gets
        ``grace_s`` seconds to be acknowledged and checkpointed; then the lease is released
        (unless ``release=False``). The loop is cancelled only if it does not stop within
        ``grace_s`` (cancelling between an acknowledgement and its checkpoint would deliver
        the batch again to the next owner)."""
        self._stopping = True
        self._release_on_stop = release
        task = self._task
        if task is None or task.done():
            return
        await asyncio.wait({task}, timeout=grace_s)
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def seek(self, position: StartAt) -> None:
        """Reopen at ``position`` after the batch in flight; the checkpoint is cleared and
        ``start_position`` rewritten (the one allowed move backwards). Returns once applied
        (or the consumer ended), within ``max(5 s, lease_duration_s)``."""
        self._seek_to = position
        end = time.monotonic() + max(5.0, self.spec.lease_duration_s)
        while time.monotonic() < end:
            if self._seek_to is None or self._lost or self._task is None or self._task.done():
                break
            await asyncio.sleep(0.02)

    async def _apply_seek(self) -> None:
        position, self._seek_to = self._seek_to, None
        assert position is not None and self._fetcher is not None
        await self._write("seek", lambda lease: self._store.set_start_position(lease, position.to_str()))
        self._pending_checkpoint = None
        self.stats["checkpoint"] = None
        self._fetcher.seek(position)
        log.info("shard %s: seek to %s", self.spec.shard_id, position)


@dataclasses.dataclass(frozen=True)
class ShardEvent:
    """What a reader reports of one consumer: how it ended, or (from ``add``) how far it got.

    Attributes:
        shard_id: the shard.
        state: a :class:`ConsumerState` value (``"processing"`` from ``add`` when it opened).
        error: the fatal error of a ``FAILED`` consumer, else None.
        checkpoint: the consumer's last checkpoint (a sequence number, ``SHARD_END``) or None.
    """

    shard_id: str
    state: str
    error: BaseException | None = None
    checkpoint: str | None = None


class ShardReaderCore:
    """The shard consumers of one reader process (plain asyncio; :class:`ShardReader` is its Ray shell).

    Every consumer reports its terminal state exactly once, through :meth:`events`;
    :meth:`add` also says how far a new consumer got (``"processing"``: its first
    iterator is held).

    Per-shard cost in this process: two asyncio tasks (the loop and its renew task), one
    :class:`~kinesis_actors.kinesis.ShardFetcher` and its stats; no thread and no
    connection of its own (the :class:`ReaderIo` pools are per process), at most one
    unacknowledged batch, and bytes counted in the process's :class:`ByteBudget`.

    Args:
        store: the lease store (blocking calls).
        deliver: ``async deliver(records)`` shared by every consumer; returning acknowledges.
        kinesis: a boto3 Kinesis client shared by every consumer (thread-safe; its HTTP
            pool sized like ``io``'s Kinesis pool).
        max_buffered_bytes: the byte budget of this process, bytes.
        io: the thread pools (default :class:`ReaderIo` with :data:`DEFAULT_THREADS` each).
        clock: monotonic seconds.
    """

    def __init__(self, *, store: LeaseStore, deliver: Deliver, kinesis: Any,
                 max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES, io: ReaderIo | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._deliver = deliver
        self._kinesis = kinesis
        self._io = io if io is not None else ReaderIo()
        self._clock = clock
        self.budget = ByteBudget(max_buffered_bytes)
        self._consumers: dict[str, ShardConsumer] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._events: list[ShardEvent] = []
        self._events_changed: asyncio.Event | None = None
        self._ended: dict[str, dict[str, Any]] = {}  # last stats of consumers that ended (bounded below)
        self.info: dict[str, Any] = {}

    def _changed(self) -> asyncio.Event:
        if self._events_changed is None:
            self._events_changed = asyncio.Event()
        return self._events_changed

    def shard_ids(self) -> list[str]:
        """The shards with a live consumer here."""
        return sorted(self._consumers)

    async def add(self, spec: ReaderSpec, lease: Lease) -> ShardEvent:
        """Start a consumer for ``lease`` and wait until it holds its first iterator.

        Returns:
            ``ShardEvent(state="processing")`` once the shard is open, or the consumer's
            terminal state if it ended first (``lost``, ``failed`` with its error,
            ``shard_ended``); the terminal state is reported by :meth:`events` as well.

        Raises:
            InvalidError: this reader already reads ``spec.shard_id``.
        """
        shard_id = spec.shard_id
        if shard_id in self._consumers:
            raise InvalidError(f"shard {shard_id} is already read by this reader")
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_open() -> None:
            if not opened.done():
                opened.set_result(None)

        consumer = ShardConsumer(spec, lease, self._store, self._deliver, self._kinesis, io=self._io,
                                 budget=self.budget, clock=self._clock, on_open=on_open)
        self._consumers[shard_id] = consumer
        task = asyncio.create_task(self._run(consumer), name=f"shard-{shard_id}")
        self._tasks[shard_id] = task
        await asyncio.wait({task, opened}, return_when=asyncio.FIRST_COMPLETED)
        if opened.done():
            return ShardEvent(shard_id, ConsumerState.PROCESSING.value, checkpoint=consumer.lease.checkpoint)
        return self._event_of(consumer)

    @staticmethod
    def _event_of(consumer: ShardConsumer) -> ShardEvent:
        return ShardEvent(consumer.spec.shard_id, consumer.state.value, consumer.error, consumer.lease.checkpoint)

    async def _run(self, consumer: ShardConsumer) -> None:
        shard_id = consumer.spec.shard_id
        try:
            await consumer.run()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # FAILED: the consumer kept the error
            log.error("shard %s: read loop failed: %r", shard_id, e)
        finally:
            self._consumers.pop(shard_id, None)
            self._tasks.pop(shard_id, None)
            self._ended[shard_id] = dict(consumer.stats)
            while len(self._ended) > 4 * max(1, len(self._consumers)) + 64:
                self._ended.pop(next(iter(self._ended)))
            self._events.append(self._event_of(consumer))
            self._changed().set()

    async def events(self, timeout_s: float) -> list[ShardEvent]:
        """The terminal states reported since the last call; waits up to ``timeout_s``
        seconds for the first one. Returns ``[]`` on timeout."""
        if not self._events:
            event = self._changed()
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        out, self._events = self._events, []
        return out

    async def stop(self, shard_id: str | None = None, *, release: bool = True, grace_s: float = 5.0) -> None:
        """Stop one consumer (or every one, ``shard_id=None``) as :meth:`ShardConsumer.stop`
        does, all at once; returns when they ended (within about ``grace_s`` seconds plus
        one store write)."""
        targets = [c for sid, c in list(self._consumers.items()) if shard_id is None or sid == shard_id]
        await asyncio.gather(*(c.stop(release=release, grace_s=grace_s) for c in targets), return_exceptions=True)
        tasks = [t for sid, t in list(self._tasks.items()) if shard_id is None or sid == shard_id]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s + 1.0)

    async def seek(self, shard_id: str, position: StartAt) -> bool:
        """Reopen ``shard_id`` at ``position`` (see :meth:`ShardConsumer.seek`); False if not read here."""
        consumer = self._consumers.get(shard_id)
        if consumer is None:
            return False
        await consumer.seek(position)
        return True

    def stats(self) -> dict[str, Any]:
        """``{"shards": {shard id: figures}, "reader": figures of this process}``.

        Shard figures: records, bytes, batches, get_records_calls, throttles,
        expired_iterators, sink_failures, millis_behind_latest (ms), checkpoint,
        checkpoint_age_s (None without a checkpoint), checkpoints_written, dead_letter_records,
        lease_counter, state; with enhanced fan-out also retrieval
        ("fanout"), subscriptions (accepted), subscription_renewals, subscription_drops
        and budget_drops. Reader figures: shards, buffered_bytes,
        peak_buffered_bytes, max_buffered_bytes, budget_waits, kinesis_call_limit and
        kinesis_call_limit_cuts (:class:`CallLimit`), and :attr:`info` (the shell adds
        node_id and pid).
        """
        budget = self.budget
        shards = {sid: dict(c.stats) for sid, c in self._consumers.items()}
        return {"shards": shards, "ended": dict(self._ended),
                "reader": {**self.info, "shards": len(shards), "buffered_bytes": budget.used,
                           "peak_buffered_bytes": budget.peak, "max_buffered_bytes": budget.limit,
                           "budget_waits": budget.waits, "kinesis_call_limit": int(self._io.limit.limit),
                           "kinesis_call_limit_cuts": self._io.limit.cuts}}

    def abort(self) -> None:
        """Cancel every consumer where it stands, writing nothing more (a store write
        already sent still lands): what a SIGKILL of the process does, for tests."""
        for task in list(self._tasks.values()):
            task.cancel()

    async def close(self, *, release: bool = True, grace_s: float = 5.0) -> None:
        """Stop every consumer, then the thread pools."""
        await self.stop(None, release=release, grace_s=grace_s)
        close = getattr(self._io, "close", None)
        if callable(close):
            close()


def _make_ray_actor() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0,  # type: ignore[call-overload]  # Ray types task options only
                max_concurrency=4096)
    class ShardReader:
        """Ray actor shell over :class:`ShardReaderCore` (process name ``ray::ShardReader``).

        Created by its Coordinator (and dies with it), one per pool slot; the Coordinator
        adds shard leases to it (at most ``max_shards_per_reader``). Async actor: every
        method runs on the process's one event loop, blocking calls in :class:`ReaderIo`.

        Args:
            store: the lease store. sink: where batches go (a :class:`~kinesis_actors.sinks.Sink`).
            aws: settings for the Kinesis client.
            call_timeout_s: connect and read timeout of every Kinesis call, seconds.
            max_buffered_bytes: this process's byte budget.
            threads: threads (and HTTP connections) of each pool.
            stream_threads: most threads reading enhanced fan-out subscriptions (the shard cap).
        """

        def __init__(self, store: LeaseStore, sink: Sink, aws: AwsSettings, call_timeout_s: float,
                     max_buffered_bytes: int, threads: int = DEFAULT_THREADS,
                     stream_threads: int = DEFAULT_MAX_SHARDS_PER_READER) -> None:
            logging.basicConfig(level=logging.INFO)
            # Our blocking calls (boto3, MemoryLeaseStore's ray.get) run in worker threads, never on the
            # event loop: Ray's warning about a blocking ray.get in an async actor does not apply. Ray reads
            # this switch at each ray.get.
            os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] = "0"
            # Every attempt is the loop's own (paced, <= 5/s): no botocore retries. Each call
            # times out well within the lease, so only a truly stuck loop lets it lapse.
            settings = dataclasses.replace(aws, connect_timeout_s=min(aws.connect_timeout_s, call_timeout_s))
            kinesis = settings.client("kinesis", read_timeout_s=call_timeout_s, max_attempts=0,
                                      max_pool_connections=threads)
            self.core = ShardReaderCore(store=store, deliver=sink.deliver, kinesis=kinesis,
                                        max_buffered_bytes=max_buffered_bytes,
                                        io=ReaderIo(kinesis_threads=threads, store_threads=threads,
                                                    stream_threads=stream_threads))
            # Where this reader runs, for operators and chaos tests (``Subscription.stats()``).
            self.core.info.update(node_id=ray.get_runtime_context().get_node_id(), pid=os.getpid())

        async def add(self, spec: ReaderSpec, lease: Lease) -> ShardEvent:
            return await self.core.add(spec, lease)

        async def events(self, timeout_s: float) -> list[ShardEvent]:
            return await self.core.events(timeout_s)

        async def stop(self, shard_id: str | None, release: bool = True, grace_s: float = 5.0) -> None:
            await self.core.stop(shard_id, release=release, grace_s=grace_s)

        async def seek(self, shard_id: str, position: StartAt) -> bool:
            return await self.core.seek(shard_id, position)

        def stats(self) -> dict[str, Any]:
            return self.core.stats()

        def shard_ids(self) -> list[str]:
            return self.core.shard_ids()

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
