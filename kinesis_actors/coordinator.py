"""Coordinator: one per subscription. Lists shards, reads the lease table, takes leases,
keeps a pool of ShardReaders and packs the leases into them, re-homes a dead reader's leases.

Fault model:

* Everything durable is in the lease table; the Coordinator's memory is a cache. A new
  Coordinator (after a crash, restarted by the subscription's handle) re-takes the rows
  its owner id holds (the owner may re-take its own row at once) and opens them on new
  readers, which resume after the checkpoints.
* Readers are actors the Coordinator creates, so Ray kills them with it (fate sharing).
* The pool keeps one reader more than the leases need (:func:`pool_size`, at least 2),
  spread over the nodes (``SPREAD`` by default), so the leases of a dead reader have
  room on live readers at once. When a reader dies (its process killed, its node lost:
  Ray's ``ActorDiedError``), the Coordinator re-takes each of its leases under the same
  owner id (raising the lease counter, which fences the old loops should they still
  run) and opens them on live readers, without waiting for lease expiry or for a new
  actor; a replacement reader starts in the background to restore the spare. A shard
  is held by exactly one entry here (:class:`_Held`) from its take until its reader
  reports how it ended, so no lease poll can take it a second time while it moves.
* Each step of the control loop (``ListShards``, lease poll, pool upkeep) has its own
  try/except and log line: a failing step is retried at its next tick.
* A fatal error (``SinkError``, a deleted stream) is parked: the subscription reports it
  on the user's next call; the readers stop and release what they hold.

The first pass (:meth:`CoordinatorCore.start`) starts the pool in parallel, waits for
room, then takes the leases and opens them (each reader holds its first iterator
before it returns; with ``retrieval="fanout"`` the pass first registers or finds the
stream consumer, and "open" means the shard's first ``SubscribeToShard`` was accepted:
its first frame arrived and was not a refusal).
It never fails because an actor is slow: it waits up to its deadline, then raises
:class:`~kinesis_actors.errors.StartError` saying how many shards opened and why the
others did not. A reader that fails to start is retried by the pool upkeep with
backoff; a lease waits for room, never for a re-resolved ``LATEST`` (a consumer
records its start position before it reads).

Balancing: the Coordinator heartbeats a presence row every ``renew_interval_s``
(deleted on a clean close) and, at each lease poll, runs the pure planner of
:mod:`kinesis_actors.balancing` over the table: it takes free, expired and own leases,
and below ``ceil(readable shards / live instances)`` asks the most loaded instance for
a graceful handoff (``lease_next_owner``). That instance's consumer checkpoints the
batch in flight and hands the row over in one fenced write; the next poll re-takes it.
A request not honoured within ``handoff_timeout_s`` is forced (``force_handoff``).
Requests are withdrawn on a clean close.

Resharding: a shard is readable only when every parent that ``ListShards`` still lists
has checkpoint ``SHARD_END`` in the table (a missing parent row is not a finished
parent); children open at ``TRIM_HORIZON``. A row whose shard is no longer listed
never opens and never blocks a child.

Stream identity: the first pass notes the stream's ARN and creation time
(``DescribeStreamSummary``); every take writes them on the row. A row of another
incarnation (the stream was deleted and re-created under the same name) counts as
absent: it finishes no parent, and taking it restarts it at ``start_at``.

:class:`CoordinatorCore` is plain asyncio over an injectable reader launcher;
:class:`Coordinator` is the thin Ray actor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from .aws import AwsSettings
from .balancing import BalancePlan, ShardState, plan_leases
from .config import KinesisStream
from .errors import KinesisError, StartError
from .fanout import ensure_stream_consumer
from .kinesis import ShardInfo, describe_stream, list_shards
from .leases.protocol import Lease, LeaseStore
from .metrics import coordinator_tick
from .reader import ConsumerState, ReaderSpec, ShardEvent
from .records import StartAt
from .sinks import Sink

__all__ = ["CoordinatorCore", "ReaderHandle", "ReaderGone", "ReaderUnreachable", "Coordinator", "pool_size",
           "pick_reader"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_EVENTS_POLL_S = 5.0  # how long one ``events`` call of a reader waits for news
_START_FAILURES_FATAL = 3  # reader starts failing in a row that end a first pass early
_STRAGGLER_WAIT_S = 5.0  # first pass: how long to wait for a slow reader once the others have room
_STORE_THREADS = 16  # threads for the Coordinator's lease-store calls (takes of a first pass run in parallel)


class ReaderHandle(Protocol):
    """What the Coordinator needs of one reader (a Ray actor, or in-process in unit tests).

    Every call raises ``ReaderGone`` when the reader died (crash, node lost) and
    ``ReaderUnreachable`` when it may come back (Ray's ``ActorUnavailableError``).
    """

    async def ping(self) -> None: ...
    async def add(self, spec: ReaderSpec, lease: Lease) -> ShardEvent: ...
    async def events(self, timeout_s: float) -> list[ShardEvent]: ...
    async def stop(self, shard_id: str | None, release: bool, grace_s: float) -> None: ...
    async def seek(self, shard_id: str, position: StartAt) -> bool: ...
    async def stats(self) -> dict[str, Any]: ...
    def kill(self) -> None: ...


class ReaderGone(Exception):
    """The reader's process is gone: re-home its leases."""


class ReaderUnreachable(Exception):
    """The reader cannot be reached now but may come back: retry."""


Launcher = Callable[[int], ReaderHandle]
"""Creates reader number ``n`` of the pool (a Ray actor) and returns its handle at once."""


def pool_size(leases: int, max_shards_per_reader: int) -> int:
    """Readers the pool keeps for ``leases`` leases: room for all of them with one reader
    to spare, and at least 2, so the leases of any one dead reader fit on the others."""
    return max(2, math.ceil(leases / max_shards_per_reader) + 1)


@dataclasses.dataclass(eq=False)
class _Reader:
    """One reader of the pool."""

    id: int
    handle: ReaderHandle | None = None
    shards: set[str] = dataclasses.field(default_factory=set)
    ready: bool = False
    watch: asyncio.Task[None] | None = None
    gone: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # set once it is known dead


def pick_reader(readers: Iterable[_Reader], max_shards_per_reader: int) -> _Reader | None:
    """The ready reader with the fewest leases that has room for one more (lowest id on a
    tie), or None: leases spread evenly over the pool, so losing one reader moves few."""
    best: _Reader | None = None
    for r in readers:
        if r.ready and len(r.shards) < max_shards_per_reader and (
                best is None or (len(r.shards), r.id) < (len(best.shards), best.id)):
            best = r
    return best


@dataclasses.dataclass(eq=False)
class _Held:
    """One lease this instance holds, from its take until its reader reports how it ended.

    ``reader`` None: waiting for room on a reader (its old reader died, or the pool is
    still growing); ``placing``: being re-taken and opened right now.
    """

    shard: ShardInfo
    reader: _Reader | None = None
    opened: bool = False
    placing: bool = False


class CoordinatorCore:
    """The control loop of one subscription (plain asyncio; see the module docstring).

    Args:
        stream: the subscription's :class:`KinesisStream`.
        aws: settings for ``ListShards`` and the readers.
        store: the lease store (blocking calls run in this Coordinator's threads).
        owner_id: this instance's lease owner id.
        lease_duration_s / renew_interval_s: lease timing, seconds.
        launcher: creates reader ``n`` of the pool (see :data:`Launcher`).
        kinesis: a boto3 Kinesis client (for ``ListShards``).
        on_fatal: called with a fatal error (e.g. to fail the pull queue).
        call_timeout_s: timeout of every call to a reader, seconds.
        handoff_timeout_s: how long a handoff request may stay unanswered before it is
            forced, seconds (default 2 x ``lease_duration_s``).
        reader_start_timeout_s: how long a new reader may take to answer, seconds.
        clock: monotonic clock, seconds.
    """

    def __init__(self, stream: KinesisStream, *, aws: AwsSettings, store: LeaseStore, owner_id: str,
                 lease_duration_s: float, renew_interval_s: float, launcher: Launcher, kinesis: Any,
                 on_fatal: Callable[[BaseException], Any] | None = None, call_timeout_s: float = 30.0,
                 handoff_timeout_s: float | None = None, reader_start_timeout_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.aws = aws
        self.store = store
        self.owner_id = owner_id
        self.lease_duration_s = lease_duration_s
        self.renew_interval_s = renew_interval_s
        self.max_shards_per_reader = stream.max_shards_per_reader
        self._launch = launcher
        self._kinesis = kinesis
        self._on_fatal = on_fatal
        self._call_timeout_s = call_timeout_s
        self._reader_start_timeout_s = reader_start_timeout_s
        self._clock = clock
        self._shards: dict[str, ShardInfo] = {}
        self._held: dict[str, _Held] = {}
        self._readers: dict[int, _Reader] = {}
        self._reader_ids = itertools.count(1)
        self._background: set[asyncio.Task[Any]] = set()
        self._starts: set[asyncio.Task[Any]] = set()  # the reader starts among them
        self._finished: set[str] = set()
        self._error: BaseException | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()  # set when a reader becomes ready or a lease ends
        self._task: asyncio.Task[None] | None = None
        self._last_stats: dict[str, dict[str, Any]] = {}
        self._identity: tuple[str, int] | None = None  # (stream ARN, creation epoch ms)
        self._identity_known = False
        self._foreign: set[str] = set()  # shards whose row of another incarnation was reported
        self.counters = {"leases_taken": 0, "leases_lost": 0, "readers_replaced": 0, "shards_rehomed": 0,
                         "shards_ended": 0, "reader_start_failures": 0, "handoffs_requested": 0,
                         "handoffs_received": 0, "handoffs_forced": 0, "leases_handed_over": 0}
        self._handoff_timeout_s = handoff_timeout_s if handoff_timeout_s is not None else 2 * lease_duration_s
        self._handoffs: dict[str, tuple[str, float]] = {}  # shard id -> (holder asked, when)
        self._last_steal = float("-inf")
        self._presence_task: asyncio.Task[None] | None = None
        self._start_backoff_until = 0.0
        self._last_read_s = 0.0  # how long the last lease-table read took
        self._start_failures_in_a_row = 0
        self._last_start_error: BaseException | None = None
        self._threads = concurrent.futures.ThreadPoolExecutor(_STORE_THREADS, thread_name_prefix="ka-coordinator")
        self.last_plan: BalancePlan | None = None
        self.consumer_arn: str | None = None  # the stream consumer (retrieval="fanout"), registered by start()

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call (lease store, ListShards) in this Coordinator's threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, lambda: fn(*args, **kwargs))

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ------------------------------------------------------------------ lifecycle
    async def start(self, timeout_s: float = 120.0) -> None:
        """The first pass: ``ListShards``, read the table, start the reader pool, take the
        leases and open each on a reader (each holds its first iterator when this
        returns); then the control loop starts.

        Args:
            timeout_s: the deadline of the whole pass, seconds.

        Raises:
            StartError: not every lease taken was open by the deadline (readers slow or
                failing to start, opens timing out); says how many were and why. Nothing
                was delivered to the caller yet; :meth:`close` releases what was taken.

        Other errors of the first pass (``ListShards``, the lease table) are parked
        (reported by :meth:`error`), not raised.
        """
        deadline = self._clock() + timeout_s
        self._presence_task = asyncio.create_task(self._presence_loop(), name=f"presence-{self.stream.name}")
        try:
            if self.stream.retrieval == "fanout" and self.consumer_arn is None:
                assert self.stream.consumer_name is not None  # KinesisStream checks it
                self.consumer_arn = await self._io(ensure_stream_consumer, self._kinesis, self.stream.name,
                                                   self.stream.consumer_name,
                                                   wait_s=max(1.0, deadline - self._clock()))
            await self.sync_shards()
            outcome = await self.poll_leases(deadline=deadline)
        except Exception as e:  # parked: the subscription reports it on the next call
            log.exception("%s: first pass failed", self.stream.name)
            await self.fail(e)
            return
        if outcome is not None:
            opened, wanted, why = outcome
            log.info("%s: first pass opened %d of %d leased shards on %d readers in %.1f s", self.stream.name, opened,
                     wanted, sum(1 for r in self._readers.values() if r.ready), timeout_s - (deadline - self._clock()))
            if opened < wanted:
                raise StartError(f"{self.stream.name}: {opened} of {wanted} shards opened within {timeout_s:.0f} s"
                                 f" ({why})", started=opened, total=wanted)
        self._task = asyncio.create_task(self._control_loop(), name=f"coordinator-{self.stream.name}")

    async def _control_loop(self) -> None:
        cfg = self.stream
        now = time.monotonic()
        next_sync, next_poll = now + cfg.shard_sync_interval_s, now + cfg.lease_poll_interval_s
        while not self._closing:
            wait = min(next_sync, next_poll) - time.monotonic()
            if wait > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except asyncio.TimeoutError:
                    pass
            self._wake.clear()
            if self._closing:
                break
            now = time.monotonic()
            if now >= next_sync:
                next_sync = now + cfg.shard_sync_interval_s
                try:
                    await self.sync_shards()
                except Exception as e:
                    log.warning("%s: ListShards failed (%r); retrying next interval", cfg.name, e)
            try:
                await self.poll_leases()
            except Exception as e:
                log.warning("%s: lease poll failed (%r); retrying next interval", cfg.name, e)
            # A table read that takes long (a big table on a slow store) spaces the polls out,
            # so the Coordinator never spends more than half of the store's time reading it.
            next_poll = now + max(cfg.lease_poll_interval_s, 2 * self._last_read_s)
            try:
                self._upkeep()
            except Exception as e:
                log.warning("%s: reader pool upkeep failed (%r)", cfg.name, e)

    async def close(self, *, release: bool = True, grace_s: float = 5.0) -> None:
        """Stop the loop and every reader; with ``release`` their leases are released after
        checkpointing what was acknowledged (otherwise they expire), and the presence row
        is deleted (otherwise it goes stale)."""
        self._closing = True
        self._wake.set()
        tasks = [t for t in (self._task, self._presence_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in self._starts:  # readers still starting: not worth waiting for
            task.cancel()
        opening = [t for t in self._background if t not in self._starts]
        if opening:  # opens under way: let them land (bounded), so they are stopped too
            await asyncio.wait(opening, timeout=grace_s)
        readers = [r for r in self._readers.values() if r.handle is not None]
        await asyncio.gather(*(self._stop_reader(r, release, grace_s) for r in readers), return_exceptions=True)
        if release:
            await self._release_unplaced()
        if release and self._handoffs:
            await self._withdraw_handoffs()
        if release and self._presence_task is not None:
            try:
                await self._io(self.store.remove_presence, self.stream.name, self.owner_id)
            except Exception as e:
                log.info("%s: could not delete the presence row (%r); it will go stale", self.stream.name, e)
        self._held.clear()
        self._threads.shutdown(wait=False)
        self._closed.set()

    async def _stop_reader(self, reader: _Reader, release: bool, grace_s: float) -> None:
        assert reader.handle is not None
        if reader.watch is not None:
            reader.watch.cancel()
        if reader.ready and reader.shards:
            try:
                await asyncio.wait_for(reader.handle.stop(None, release, grace_s), grace_s + self._call_timeout_s)
            except Exception as e:
                log.info("reader %d did not stop cleanly (%r)", reader.id, e)
        reader.handle.kill()
        self._readers.pop(reader.id, None)

    async def _release_unplaced(self) -> None:
        """Closing: release the rows we hold with no reader (re-take, then release), so
        another instance does not wait a lease duration for them."""
        for shard_id, held in list(self._held.items()):
            if held.reader is not None:
                continue
            try:
                lease = await self._take(shard_id)
                if lease is not None:
                    await self._io(self.store.release, lease)
            except Exception as e:
                log.info("shard %s: could not release (%r); the lease will expire", shard_id, e)

    async def _withdraw_handoffs(self) -> None:
        """Closing: take back our handoff requests, and release a row handed over meanwhile
        (so nobody waits a lease duration for an instance that is gone)."""
        store, stream, me = self.store, self.stream.name, self.owner_id
        for shard_id in sorted(self._handoffs):
            try:
                for _ in range(3):
                    if await self._io(store.withdraw_handoff, stream, shard_id, owner=me):
                        break
                    row = await self._io(store.get, stream, shard_id)
                    if row is not None and row.owner == me:
                        lease = await self._take(shard_id)
                        if lease is not None:
                            await self._io(store.release, lease)
                        break
            except Exception as e:
                log.info("shard %s: could not withdraw the handoff request (%r)", shard_id, e)
        self._handoffs.clear()

    async def _presence_loop(self) -> None:
        """Heartbeat this instance's presence row every ``renew_interval_s`` (it lasts one lease duration)."""
        while not self._closing:
            try:
                await self._io(self.store.heartbeat, self.stream.name, self.owner_id,
                               duration_s=self.lease_duration_s)
            except Exception as e:
                log.info("%s: presence heartbeat failed (%r); retrying", self.stream.name, e)
            await asyncio.sleep(self.renew_interval_s)

    async def fail(self, error: BaseException) -> None:
        """Park a fatal error, tell ``on_fatal``, stop every reader (releasing)."""
        if self._error is None:
            self._error = error
            log.error("%s: subscription failed: %r", self.stream.name, error)
            if self._on_fatal is not None:
                try:
                    self._on_fatal(error)
                except Exception:
                    log.exception("on_fatal callback failed")
        if not self._closing:
            asyncio.get_running_loop().create_task(self.close(release=True))

    def error(self) -> BaseException | None:
        """The parked fatal error, or None."""
        return self._error

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait until closed or failed; True if it ended within ``timeout_s``."""
        try:
            await asyncio.wait_for(self._closed.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    # ------------------------------------------------------------------ the reader pool
    def _live_readers(self) -> list[_Reader]:
        return list(self._readers.values())

    def _room_left(self) -> int:
        """Leases the ready readers can still take."""
        cap = self.max_shards_per_reader
        return sum(max(0, cap - len(r.shards)) for r in self._readers.values() if r.ready)

    def _upkeep(self) -> None:
        """Keep the pool at :func:`pool_size` of the leases held (start readers in the
        background, with backoff after failures; stop idle readers beyond it), and place
        leases waiting for room."""
        if self._closing:
            return
        self._grow_pool(len(self._held))
        target = pool_size(len(self._held), self.max_shards_per_reader)
        idle = [r for r in self._readers.values() if r.ready and not r.shards]
        extra = len(self._readers) - target
        for reader in sorted(idle, key=lambda r: -r.id)[:max(0, extra)]:
            log.info("reader %d idle beyond the pool size (%d); stopping it", reader.id, target)
            if reader.watch is not None:
                reader.watch.cancel()
            assert reader.handle is not None
            reader.handle.kill()
            self._readers.pop(reader.id, None)
        if any(h.reader is None and not h.placing for h in self._held.values()):
            self._spawn(self._place_unplaced(), "place")

    def _grow_pool(self, leases: int) -> None:
        """Start readers (in parallel, in the background) until the pool has
        :func:`pool_size` of ``leases``; after a failed start, wait for the backoff."""
        if self._closing or self._clock() < self._start_backoff_until:
            return
        missing = pool_size(leases, self.max_shards_per_reader) - len(self._readers)
        for _ in range(max(0, missing)):
            reader = _Reader(next(self._reader_ids))
            self._readers[reader.id] = reader
            task = self._spawn(self._start_reader(reader), f"reader-{reader.id}")
            self._starts.add(task)
            task.add_done_callback(self._starts.discard)

    async def _start_reader(self, reader: _Reader) -> None:
        """Create reader ``reader.id`` and wait until it answers; on failure forget it (the
        upkeep retries with backoff, and the error is kept for :class:`StartError`).

        A reader that has not answered within ``reader_start_timeout_s`` while another
        reader of the pool has is slow (many actors starting at once on a loaded node), not
        failing: it is waited for, and the first pass's own deadline decides. Only when no
        reader of the pool answered in that time (resources no node has, a node that cannot
        start workers) does the timeout count as a failed start."""
        ping: asyncio.Future[Any] | None = None
        try:
            reader.handle = self._launch(reader.id)
            ping = asyncio.ensure_future(reader.handle.ping())
            while True:
                try:
                    await asyncio.wait_for(asyncio.shield(ping), self._reader_start_timeout_s)
                    break
                except asyncio.TimeoutError:
                    if not any(r.ready for r in self._readers.values()):
                        raise
                    log.info("reader %d still starting after %.0f s; waiting for it", reader.id,
                             self._reader_start_timeout_s)
        except asyncio.CancelledError:  # closing while it started
            if ping is not None:
                ping.cancel()
            self._readers.pop(reader.id, None)
            if reader.handle is not None:
                reader.handle.kill()
            raise
        except Exception as e:
            if ping is not None:
                ping.cancel()
            self._readers.pop(reader.id, None)
            if reader.handle is not None:
                reader.handle.kill()
            self.counters["reader_start_failures"] += 1
            self._start_failures_in_a_row += 1
            self._last_start_error = e
            pause = min(30.0, 0.5 * 2 ** (self._start_failures_in_a_row - 1))
            self._start_backoff_until = self._clock() + pause
            log.warning("reader %d failed to start (%r); the pool retries in %.1f s", reader.id, e, pause)
            return
        if self._closing:
            reader.handle.kill()
            self._readers.pop(reader.id, None)
            return
        self._start_failures_in_a_row = 0
        reader.ready = True
        reader.watch = asyncio.create_task(self._watch(reader), name=f"watch-{reader.id}")
        log.info("reader %d ready (%d in the pool)", reader.id, len(self._readers))
        self._room.set()
        if any(h.reader is None and not h.placing for h in self._held.values()):
            self._spawn(self._place_unplaced(), "place")

    async def _wait_for_room(self, leases: int, deadline: float) -> None:
        """First pass: wait until the ready readers have room for ``leases`` more and the
        readers started with them are ready too (so the leases spread over the whole pool:
        one dead reader then moves as few as possible), but for the others at most
        :data:`_STRAGGLER_WAIT_S` once there is room. Gives up at the deadline, or when
        reader starts failed :data:`_START_FAILURES_FATAL` times in a row (a bad
        ``runtime_env``, resources no node has: waiting longer would not help)."""
        room_since: float | None = None
        while self._clock() < deadline and not self._closing and self._start_failures_in_a_row < _START_FAILURES_FATAL:
            starting = any(not r.ready for r in self._readers.values())
            if self._room_left() >= leases:
                room_since = self._clock() if room_since is None else room_since
                if not starting or self._clock() - room_since >= _STRAGGLER_WAIT_S:
                    return
            self._room.clear()
            self._grow_pool(len(self._held) + leases)
            try:
                await asyncio.wait_for(self._room.wait(), min(0.5, max(0.0, deadline - self._clock())))
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------------ reader reports
    async def _watch(self, reader: _Reader) -> None:
        """Follow one reader: apply what its consumers report; re-home its leases if it dies."""
        handle = reader.handle
        assert handle is not None
        unreachable = 0
        while not self._closing:
            try:
                events = await asyncio.wait_for(handle.events(_EVENTS_POLL_S), _EVENTS_POLL_S + self._call_timeout_s)
            except ReaderUnreachable:
                # Ray says "maybe back" first while it learns whether the process died: ask
                # again soon (a dead reader's leases wait for the answer), then less often.
                unreachable += 1
                await asyncio.sleep(min(1.0, 0.05 * 2 ** (unreachable - 1), self.renew_interval_s))
                continue
            except ReaderGone as e:
                if not self._closing:
                    await self._reader_died(reader, e)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a slow answer: ask again
                log.info("reader %d: events call failed (%r); retrying", reader.id, e)
                await asyncio.sleep(min(1.0, self.renew_interval_s))
                continue
            unreachable = 0
            for event in events:
                await self._apply(reader, event)

    async def _apply(self, reader: _Reader, event: ShardEvent) -> None:
        """A consumer of ``reader`` ended: free its place and count how."""
        shard_id = event.shard_id
        held = self._held.get(shard_id)
        reader.shards.discard(shard_id)
        if held is None or held.reader is not reader:
            return  # stale: the lease moved on already
        del self._held[shard_id]
        self._room.set()
        state = ConsumerState(event.state)
        if state is ConsumerState.SHARD_ENDED:
            self._finished.add(shard_id)
            self.counters["shards_ended"] += 1
            self._wake.set()  # children may be readable now
        elif state is ConsumerState.LOST:
            self.counters["leases_lost"] += 1
        elif state is ConsumerState.HANDED_OVER:
            self.counters["leases_handed_over"] += 1
        elif state is ConsumerState.FAILED:
            error = event.error
            await self.fail(error if isinstance(error, KinesisError)
                            else KinesisError(f"shard {shard_id}: {error!r}"))

    async def _reader_died(self, reader: _Reader, why: BaseException) -> None:
        """Re-home the leases of a dead reader on live readers at once; start a replacement
        in the background (the leases do not wait for it when there is room)."""
        self._readers.pop(reader.id, None)
        reader.ready = False
        reader.gone.set()  # opens still waiting on it give up at once
        if reader.handle is not None:
            reader.handle.kill()
        moved = sorted(reader.shards)
        reader.shards.clear()
        self.counters["readers_replaced"] += 1
        log.warning("reader %d died (%s); re-homing %d leases under owner %s", reader.id, why, len(moved),
                    self.owner_id)
        for shard_id in moved:
            held = self._held.get(shard_id)
            if held is not None and held.reader is reader:
                held.reader, held.opened = None, False
        self._grow_pool(len(self._held))
        await self._place_unplaced()

    async def _place_unplaced(self) -> None:
        """Re-take and open every held lease that has no reader, on readers with room."""
        waiting = [h for h in self._held.values() if h.reader is None and not h.placing]
        placing = []
        for held in waiting:
            reader = pick_reader(self._readers.values(), self.max_shards_per_reader)
            if reader is None:
                break  # no room yet: placed when a reader becomes ready
            held.placing = True
            held.reader = reader
            reader.shards.add(held.shard.shard_id)  # the room is ours before any await
            placing.append(held)
        await asyncio.gather(*(self._rehome(h) for h in placing), return_exceptions=True)

    async def _rehome(self, held: _Held) -> None:
        """Re-take ``held``'s row under this owner and open it on the reader it was placed on.

        If that reader dies meanwhile (two readers lost at once: the first one's leases may
        have been placed on the second before its death was seen), the lease is placed
        again at once instead of waiting for the next lease poll."""
        shard_id = held.shard.shard_id
        reader = held.reader
        again = reader is None  # it died between the placing and this task's start
        try:
            if reader is None:
                return
            lease = None
            for _ in range(3):  # a write of the old loop may race the re-take: read again
                lease = await self._take(shard_id)
                if lease is not None:
                    break
                row = await self._io(self.store.get, self.stream.name, shard_id)
                if row is None or row.owner != self.owner_id:
                    break
            if lease is None or lease.finished:
                log.info("shard %s: no longer ours to re-home", shard_id)
                self._drop(held)
                if lease is not None:
                    self._finished.add(shard_id)
                    await self._io(self.store.release, lease)
                return
            if held.reader is reader:
                self.counters["shards_rehomed"] += 1
                await self._open_on(held, lease)
            again = held.reader is None  # the reader died before or during the open
        except Exception as e:
            log.warning("shard %s: re-homing failed (%r); retried at the next poll", shard_id, e)
            if reader is not None and self._held.get(shard_id) is held and held.reader is reader and not held.opened:
                reader.shards.discard(shard_id)
                held.reader = None
        finally:
            held.placing = False
        if again and self._held.get(shard_id) is held and not self._closing:
            log.info("shard %s: its new reader died too; placing it again", shard_id)
            self._spawn(self._place_unplaced(), "place")

    def _drop(self, held: _Held) -> None:
        shard_id = held.shard.shard_id
        if held.reader is not None:
            held.reader.shards.discard(shard_id)
        if self._held.get(shard_id) is held:
            del self._held[shard_id]
        self._room.set()

    # ------------------------------------------------------------------ steps
    async def sync_shards(self) -> None:
        """``ListShards`` (every ``shard_sync_interval_s``); ``DescribeStreamSummary`` once,
        for the stream's identity."""
        if not self._identity_known:
            self._identity = await self._io(self._describe_identity)
            self._identity_known = True
        shards = await self._io(list_shards, self._kinesis, self.stream.name)
        self._shards = {s.shard_id: s for s in shards}

    def _describe_identity(self) -> tuple[str, int] | None:
        summary = describe_stream(self._kinesis, self.stream.name)
        arn, created = summary.get("StreamARN"), summary.get("StreamCreationTimestamp")
        if not arn or created is None:
            return None
        seconds = created.timestamp() if hasattr(created, "timestamp") else float(created)
        return (arn, round(seconds * 1000))

    def _this_incarnation(self, rows: dict[str, Lease]) -> dict[str, Lease]:
        """The rows without those of another incarnation of the stream (as if absent)."""
        if self._identity is None:
            return rows
        current: dict[str, Lease] = {}
        for shard_id, row in rows.items():
            identity = row.stream_identity
            if identity is not None and identity != self._identity:
                if shard_id not in self._foreign:
                    self._foreign.add(shard_id)
                    log.warning("shard %s: the lease row belongs to another incarnation of stream %s (%s); its"
                                " checkpoint %r is not applied, the shard opens at start_at",
                                shard_id, self.stream.name, identity, row.checkpoint)
                continue
            current[shard_id] = row
        return current

    def _parents_done(self, shard: ShardInfo, rows: dict[str, Lease]) -> bool:
        for parent in shard.parent_shard_ids:
            if parent not in self._shards:
                continue  # trimmed away: ListShards no longer lists it
            row = rows.get(parent)
            if row is None or not row.finished:
                return False
        return True

    async def poll_leases(self, *, deadline: float | None = None) -> tuple[int, int, str] | None:
        """Read the lease table; take free, expired and own leases of readable shards (as
        many as the ready readers have room for) and open them; below the balancing
        target, ask the most loaded instance for handoffs.

        ``deadline`` (the first pass): grow the pool and wait for room for every lease to
        take, then wait until each is open or the deadline passes, and return
        ``(opened, taken, why the others did not open)``. Without it (the control loop)
        the opens run in the background, so a slow reader never delays the next poll.
        """
        read_at = self._clock()
        rows, live = await self._io(self._read_table)
        self._last_read_s = self._clock() - read_at
        rows = self._this_incarnation(rows)
        coordinator_tick(self)  # metrics: lease figures, once per poll
        self._finished |= {sid for sid, row in rows.items() if row.finished}
        readable = [sid for sid in sorted(self._shards)
                    if sid not in self._finished and self._parents_done(self._shards[sid], rows)]
        now = self._clock()
        may_steal = now - self._last_steal >= 0.9 * self.stream.lease_poll_interval_s
        plan = plan_leases(self.owner_id, [self._shard_state(sid, rows.get(sid)) for sid in readable],
                           held=self._held.keys(), live_instances=live,
                           max_leases=self.stream.max_leases,
                           max_leases_to_steal=self.stream.max_leases_to_steal if may_steal else 0)
        self.last_plan = plan
        forced = await self._settle_handoffs(rows, now)
        wanted = [sid for sid in plan.take]
        if deadline is not None:
            await self._wait_for_room(len(wanted) + len(forced), deadline)
        else:
            self._grow_pool(len(self._held) + len(wanted) + len(forced))
        room = self._room_left() - len(forced)
        no_room = max(0, len(wanted) - max(0, room))
        if no_room:
            log.info("%s: room for %d of %d leases to take now; the pool is growing", self.stream.name,
                     len(wanted) - no_room, len(wanted))
            wanted = wanted[:len(wanted) - no_room]
        taken = [t for t in await asyncio.gather(*(self._take_new(sid, rows) for sid in wanted)) if t is not None]
        if plan.steal:
            self._last_steal = now
        for shard_id, victim in plan.steal:
            row = rows[shard_id]
            if await self._io(self.store.request_handoff, self.stream.name, shard_id,
                              owner=self.owner_id, expect_counter=row.counter):
                self._handoffs[shard_id] = (victim, now)
                self.counters["handoffs_requested"] += 1
                log.info("shard %s: asked %s for a handoff (target %d, live %s)", shard_id, victim, plan.target,
                         ",".join(plan.live))
        opens = []
        for shard, lease in [*forced, *taken]:
            if self._closing:
                break
            reader = pick_reader(self._readers.values(), self.max_shards_per_reader)
            held = self._held[shard.shard_id] = _Held(shard)
            if reader is None:  # no room after all: the upkeep places it once a reader is ready
                continue
            held.reader = reader
            reader.shards.add(shard.shard_id)
            opens.append((held, lease))
        if deadline is None:
            for held, lease in opens:
                self._spawn(self._open_on(held, lease), f"open-{held.shard.shard_id}")
            return None
        budget = max(self._call_timeout_s, deadline - self._clock())
        tasks = [asyncio.ensure_future(self._open_on(held, lease, timeout_s=budget)) for held, lease in opens]
        done, _ = await asyncio.wait(tasks, timeout=max(0.0, deadline - self._clock())) if tasks else (set(), set())
        for task in tasks:
            if task not in done:
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        events = [t.result() for t in done if t.exception() is None]
        failures = [t.exception() for t in done if t.exception() is not None]
        unconfirmed = sum(1 for e in events if e is None)
        opened = sum(1 for e in events if e is not None and e.state == ConsumerState.PROCESSING.value)
        ended = sum(1 for e in events if e is not None and e.state != ConsumerState.PROCESSING.value
                    and e.error is None)  # lost or finished meanwhile: not ours to open
        failed = [e.error for e in events if e is not None and e.error is not None] + failures
        if failed:
            raise failed[0]  # type: ignore[misc]
        without_reader = no_room + len(forced) + len(taken) - len(opens)
        return (opened, len(forced) + len(taken) - ended + no_room,
                self._why_not_open(len(tasks) - len(done) + unconfirmed, without_reader))

    def _why_not_open(self, still_opening: int, without_reader: int) -> str:
        parts = []
        starting = sum(1 for r in self._readers.values() if not r.ready)
        if without_reader:
            parts.append(f"{without_reader} leases had no room: {starting} readers still starting")
        if self._last_start_error is not None:
            parts.append(f"{self.counters['reader_start_failures']} reader starts failed, the last with "
                         f"{self._last_start_error!r:.300}")
        if still_opening:
            parts.append(f"{still_opening} shards still opening (GetShardIterator or the lease table slow)")
        return "; ".join(parts) or "no reason recorded"

    async def _take(self, shard_id: str) -> Lease | None:
        shard = self._shards.get(shard_id)
        return await self._io(self.store.take, self.stream.name, shard_id, owner=self.owner_id,
                              duration_s=self.lease_duration_s,
                              parent_shard_ids=shard.parent_shard_ids if shard else (),
                              stream_identity=self._identity)

    async def _take_new(self, shard_id: str, rows: dict[str, Lease]) -> tuple[ShardInfo, Lease] | None:
        """Take one lease the plan chose; None if another instance holds it or it is finished."""
        lease = await self._take(shard_id)
        if lease is None or self._closing or shard_id in self._held:
            return None
        if lease.finished:
            self._finished.add(shard_id)
            await self._io(self.store.release, lease)
            return None
        self.counters["leases_taken"] += 1
        if self._handoffs.pop(shard_id, None) is not None:
            self.counters["handoffs_received"] += 1
        return self._shards[shard_id], lease

    async def _open_on(self, held: _Held, lease: Lease, *, timeout_s: float | None = None) -> ShardEvent | None:
        """Open ``lease`` on the reader ``held`` was placed on; returns what the reader said
        (None if the reader died or did not answer within ``timeout_s``, default
        ``call_timeout_s``: its watch re-homes it or reports how it ended)."""
        reader = held.reader
        if reader is None or reader.handle is None:
            return None  # the reader died while the lease was taken: it is placed again
        shard_id = held.shard.shard_id
        add = asyncio.ensure_future(reader.handle.add(self._spec(held.shard), lease))
        gone = asyncio.ensure_future(reader.gone.wait())
        try:
            wait_s = timeout_s if timeout_s is not None else self._call_timeout_s
            done, _ = await asyncio.wait({add, gone}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            if add not in done:
                raise ReaderGone(f"reader {reader.id} died") if gone in done else asyncio.TimeoutError()
            event = add.result()
        except (ReaderGone, ReaderUnreachable, asyncio.TimeoutError) as e:
            log.info("shard %s: reader %d did not confirm the open (%r)", shard_id, reader.id, e)
            return None
        finally:
            gone.cancel()
            if not add.done():
                add.cancel()
        if event.state == ConsumerState.PROCESSING.value:
            held.opened = True
            log.debug("shard %s: open on reader %d (lease counter %d)", shard_id, reader.id, lease.counter)
        return event

    def _spec(self, shard: ShardInfo) -> ReaderSpec:
        cfg = self.stream
        return ReaderSpec(
            stream=cfg.name, shard_id=shard.shard_id, owner_id=self.owner_id,
            start_at=StartAt.trim_horizon() if shard.parent_shard_ids else cfg.start_at,
            lease_duration_s=self.lease_duration_s, renew_interval_s=self.renew_interval_s,
            ending_sequence_number=shard.ending_sequence_number, max_records=cfg.max_records,
            idle_wait_s=cfg.idle_wait_s, max_idle_wait_s=cfg.max_idle_wait_s, max_sink_retries=cfg.max_sink_retries,
            dead_letter=cfg.dead_letter, consumer_arn=self.consumer_arn,
            min_checkpoint_interval_s=cfg.min_checkpoint_interval_s,
        )

    def _read_table(self) -> tuple[dict[str, Lease], list[str]]:
        """The stream's shard rows and the live instances, from one consistent read."""
        snap = self.store.snapshot(self.stream.name)
        return {lease.shard_id: lease for lease in snap.leases}, [i.owner for i in snap.instances]

    def _shard_state(self, shard_id: str, row: Lease | None) -> ShardState:
        if row is None:
            return ShardState(shard_id)
        expired = row.owner not in (None, self.owner_id) and self.store.is_expired(row)
        return ShardState(shard_id, row.owner, row.next_owner, expired)

    async def _settle_handoffs(self, rows: dict[str, Lease], now: float) -> list[tuple[ShardInfo, Lease]]:
        """Follow our handoff requests: forget those the table no longer shows, force those
        unanswered past ``handoff_timeout_s``. Returns forced leases (to open)."""
        for shard_id, row in rows.items():  # requests we made before a restart
            if row.next_owner == self.owner_id and row.owner not in (None, self.owner_id):
                self._handoffs.setdefault(shard_id, (row.owner, now))
        forced: list[tuple[ShardInfo, Lease]] = []
        for shard_id, (victim, since) in list(self._handoffs.items()):
            current = rows.get(shard_id)
            if current is None or current.finished or shard_id in self._held:
                self._handoffs.pop(shard_id, None)
                continue
            if current.owner == self.owner_id:
                continue  # handed over: the take below opens it
            if current.next_owner != self.owner_id or current.owner is None:
                self._handoffs.pop(shard_id, None)  # taken, released or asked by another since
                continue
            if now - since < self._handoff_timeout_s or shard_id not in self._shards:
                continue
            self._handoffs.pop(shard_id, None)
            lease = await self._io(self.store.force_handoff, self.stream.name, shard_id,
                                   owner=self.owner_id, duration_s=self.lease_duration_s)
            if lease is not None:
                self.counters["handoffs_forced"] += 1
                self.counters["leases_taken"] += 1
                log.warning("shard %s: %s did not hand over within %.1f s; lease taken", shard_id, victim,
                            self._handoff_timeout_s)
                forced.append((self._shards[shard_id], lease))
        return forced

    # ------------------------------------------------------------------ queries and control
    async def stats(self) -> dict[str, Any]:
        """Per-shard figures of the shards this instance holds (the last figures its reader
        gave when it does not answer now), per-reader figures (``unreachable`` set for a
        reader that did not answer within 5 s), and this instance's lease counts."""
        readers: list[dict[str, Any]] = []

        async def one(reader: _Reader) -> None:
            assert reader.handle is not None
            try:
                got = await asyncio.wait_for(reader.handle.stats(), 5.0)
            except Exception as e:  # dead, or too busy to answer within 5 s: say so, keep its shards' last figures
                readers.append({"reader": reader.id, "unreachable": repr(e)[:200], "shards": len(reader.shards)})
                return
            readers.append({"reader": reader.id, **got["reader"]})
            for sid, figures in got["shards"].items():
                self._last_stats[sid] = {**figures, **{k: got["reader"].get(k) for k in ("node_id", "pid")},
                                         "reader": reader.id}

        await asyncio.gather(*(one(r) for r in list(self._readers.values()) if r.ready))
        for sid in [s for s in self._last_stats if s not in self._held]:
            del self._last_stats[sid]  # ended, lost or handed over: not this instance's any more
        plan = self.last_plan
        return {"owner_id": self.owner_id, "stream": self.stream.name, "leases_held": len(self._held),
                "target": plan.target if plan else None, "live_instances": list(plan.live) if plan else [],
                "handoffs_pending": sorted(self._handoffs), "readers": sorted(readers, key=lambda r: r["reader"]),
                "max_shards_per_reader": self.max_shards_per_reader,
                **self.counters, "shards": {k: v for k, v in self._last_stats.items()}}

    def held(self) -> list[str]:
        """Shard ids this instance holds (open, opening, or waiting for room on a reader)."""
        return sorted(self._held)

    async def seek(self, position: StartAt, shard_id: str | None) -> list[str]:
        """Reopen the held shards (or one) at ``position``; returns the shard ids sought."""
        targets = [h for sid, h in self._held.items() if (shard_id is None or sid == shard_id)
                   and h.reader is not None and h.opened]

        async def one(held: _Held) -> str | None:
            assert held.reader is not None and held.reader.handle is not None
            done = await asyncio.wait_for(held.reader.handle.seek(held.shard.shard_id, position), self._call_timeout_s)
            return held.shard.shard_id if done else None

        moved = await asyncio.gather(*(one(h) for h in targets))
        return sorted(sid for sid in moved if sid is not None)

    def reader_of(self) -> dict[str, ReaderHandle]:
        """The reader handle of each held shard that has one."""
        return {sid: h.reader.handle for sid, h in self._held.items()
                if h.reader is not None and h.reader.handle is not None}


# ---------------------------------------------------------------------- Ray shells
class _RayReaderHandle:
    """:class:`ReaderHandle` over a ``ShardReader`` actor: Ray errors mapped to ReaderGone/ReaderUnreachable."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def _call(self, method: str, *args: Any) -> Any:
        import ray.exceptions as rex

        try:
            return await getattr(self.actor, method).remote(*args)
        except rex.ActorUnavailableError as e:
            raise ReaderUnreachable(repr(e)) from e
        except rex.RayActorError as e:
            raise ReaderGone(type(e).__name__) from e
        except rex.RayTaskError as e:  # the reader's own error, unwrapped
            cause = e.cause if isinstance(e.cause, BaseException) else e
            raise cause from None

    async def ping(self) -> None:
        await self._call("ping")

    async def add(self, spec: ReaderSpec, lease: Lease) -> ShardEvent:
        answer: ShardEvent = await self._call("add", spec, lease)
        return answer

    async def events(self, timeout_s: float) -> list[ShardEvent]:
        answer: list[ShardEvent] = await self._call("events", timeout_s)
        return answer

    async def stop(self, shard_id: str | None, release: bool, grace_s: float) -> None:
        await self._call("stop", shard_id, release, grace_s)

    async def seek(self, shard_id: str, position: StartAt) -> bool:
        answer: bool = await self._call("seek", shard_id, position)
        return answer

    async def stats(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("stats")
        return answer

    def kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:
            pass


def _make_ray_actor() -> Any:
    import ray

    from .reader import ShardReader

    @ray.remote(num_cpus=0, max_restarts=0,  # type: ignore[call-overload]  # Ray types task options only
                max_concurrency=1000)
    class Coordinator:
        """Ray actor shell over :class:`CoordinatorCore` (process name ``ray::Coordinator``).

        Owned by the subscription's handle, which restarts it if it dies.
        """

        def __init__(self, stream: KinesisStream, aws: AwsSettings, store: LeaseStore, owner_id: str,
                     lease_duration_s: float, renew_interval_s: float, sink: Sink | None, pull_queue: Any) -> None:
            logging.basicConfig(level=logging.INFO)
            # Our blocking calls (boto3, MemoryLeaseStore's ray.get) run in worker threads, never on the
            # event loop: Ray's warning about a blocking ray.get in an async actor does not apply. Ray reads
            # this switch at each ray.get.
            os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] = "0"

            from .reader import kinesis_call_timeout_s
            from .sinks import ActorSink

            options = stream.actor_options()
            target: Sink = sink if sink is not None else ActorSink(pull_queue, "process_batch")
            call_timeout_s = kinesis_call_timeout_s(lease_duration_s)

            def launch(_: int) -> ReaderHandle:
                return _RayReaderHandle(ShardReader.options(**options).remote(
                    store, target, aws, call_timeout_s, stream.max_buffered_bytes,
                    stream_threads=stream.max_shards_per_reader))

            on_fatal = (lambda err: pull_queue.fail.remote(err)) if pull_queue is not None else None
            self.core = CoordinatorCore(stream, aws=aws, store=store, owner_id=owner_id,
                                        lease_duration_s=lease_duration_s, renew_interval_s=renew_interval_s,
                                        launcher=launch, kinesis=aws.client("kinesis"), on_fatal=on_fatal)

        async def start(self, timeout_s: float = 120.0) -> None:
            await self.core.start(timeout_s)

        async def close(self, release: bool = True, grace_s: float = 5.0) -> None:
            await self.core.close(release=release, grace_s=grace_s)

        def error(self) -> BaseException | None:
            return self.core.error()

        async def wait(self, timeout_s: float | None) -> bool:
            return await self.core.wait(timeout_s)

        async def stats(self) -> dict[str, Any]:
            return {**await self.core.stats(), "coordinator": {"pid": os.getpid(),
                                                               "node_id": ray.get_runtime_context().get_node_id()}}

        def held(self) -> list[str]:
            return self.core.held()

        async def seek(self, position: StartAt, shard_id: str | None) -> list[str]:
            return await self.core.seek(position, shard_id)

        def ping(self) -> bool:
            return True

        def reader_handles(self) -> dict[str, Any]:
            """The ShardReader actor handle of each held shard (several shards share one)."""
            return {sid: handle.actor for sid, handle in self.core.reader_of().items()
                    if isinstance(handle, _RayReaderHandle)}

    return Coordinator


_ACTOR: Any = None


def __getattr__(name: str) -> Any:  # lazy: importing the module does not import Ray
    global _ACTOR
    if name == "Coordinator":
        if _ACTOR is None:
            _ACTOR = _make_ray_actor()
        return _ACTOR
    raise AttributeError(name)
