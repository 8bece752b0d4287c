"""CoordinatorCore: one subscription's control loop, composed of one part per role.

Parts (each in its own module, a state enum for each life): the reader pool
(:mod:`.pool`), the placements of held leases (:mod:`.placements`), the handoffs
(:mod:`.handoffs`), the lease-table poll (:mod:`.poll`), presence and stats
(:mod:`.presence`). The core's :class:`~.tick.Tick`, like Ray Serve's
``DeploymentStateManager.update``, calls each part's update when it is due on the
injected clock (presence every ``renew_interval_s``, ``ListShards`` every
``shard_sync_interval_s``, the lease poll and pool upkeep every ``lease_poll_interval_s``),
each in its own kept task with its own try/except: a failing part is logged, counted
(``step_failures``) and retried when next due, a slow one never delays another.

The core's phase is one :class:`~.lifecycle.CoordinatorState` (its moves listed once, in
:data:`~.lifecycle.TRANSITIONS`), read by the pool and the placements through the core's
:class:`~.lifecycle.Lifecycle`. Its background tasks are held in task sets by concern
(the tick, its steps, the pool's reader starts, the placements' opens and moves, the load
rounds, the rest), which the close cancels or waits for as a whole.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .. import metrics
from ..aws import AwsSettings
from ..clock import monotonic_s
from ..config import KinesisStream
from ..errors import KinesisError, StartError
from ..fanout import ensure_stream_consumer
from ..kinesis import ShardInfo
from ..leases.protocol import LeaseStore
from ..reader import ConsumerState, ReaderSpec, ShardEvent
from ..records import StartAt
from .closing import CoreClosing
from .handles import Launcher, ReaderHandle
from .handoffs import Handoffs
from .lifecycle import CoordinatorState, Lifecycle
from .loads import LoadMoves
from .placements import HeldState, Placements
from .poll import LeasePoll, PollOutcome, Taken
from .pool import PooledReader, ReaderPool
from .presence import Presence, collect_stats
from .tasks import Sleep, TaskSet
from .tick import Tick

__all__ = ["CoordinatorCore"]

log = logging.getLogger("kinesis_actors.coordinator")
T = TypeVar("T")

_START_FAILURES_FATAL = 3  # reader starts failing in a row that end a first pass early
_STRAGGLER_WAIT_S = 5.0  # first pass: how long to wait for a slow reader once the others have room
_STORE_THREADS = 16  # threads for the Coordinator's lease-store calls (takes of a poll run in parallel)
_COUNTERS = ("leases_taken", "leases_lost", "readers_replaced", "shards_rehomed", "shards_moved", "shards_ended",
             "reader_start_failures", "handoffs_requested", "handoffs_received", "handoffs_forced",
             "leases_handed_over", "step_failures", "store_errors")


def reader_spec(cfg: KinesisStream, shard: ShardInfo, *, owner_id: str, lease_duration_s: float,
                renew_interval_s: float, consumer_arn: str | None) -> ReaderSpec:
    """The :class:`ReaderSpec` a reader opens ``shard`` with (children of a reshard at ``TRIM_HORIZON``)."""
    return ReaderSpec(
        stream=cfg.name, shard_id=shard.shard_id, owner_id=owner_id,
        start_at=StartAt.trim_horizon() if shard.parent_shard_ids else cfg.start_at,
        lease_duration_s=lease_duration_s, renew_interval_s=renew_interval_s,
        ending_sequence_number=shard.ending_sequence_number, max_records=cfg.max_records,
        idle_wait_s=cfg.idle_wait_s, max_idle_wait_s=cfg.max_idle_wait_s, max_sink_retries=cfg.max_sink_retries,
        dead_letter=cfg.dead_letter, consumer_arn=consumer_arn,
        min_checkpoint_interval_s=cfg.min_checkpoint_interval_s, delivery=cfg.delivery_options(),
    )


class CoordinatorCore:
    """The control loop of one subscription (plain asyncio; see the package docstring).

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
        clock: monotonic clock, seconds; sleep: the matching sleep (every timer uses them).
        reader_demand: a :class:`~kinesis_actors.load.autoscale.ReaderDemand` asking Ray's
            autoscaler for nodes that can hold readers (None: never).
        io: ``async io(fn, *args, **kwargs)`` running one blocking call (lease store,
            ``ListShards``) and returning its result or raising its error; None: in this
            Coordinator's thread pool (``threads``). A simulator passes an inline one so that
            no thread decides the order of events.

    Attributes:
        leases / pool / placements / handoffs / presence / loads: the parts (:class:`LeasePoll`,
            :class:`ReaderPool`, :class:`Placements`, :class:`Handoffs`, :class:`Presence`,
            :class:`~.loads.LoadMoves`).
        counters: this instance's counters (leases taken, lost, handed over, handoffs,
            reader starts failed, ``step_failures``, ``store_errors``, ...).
        lifecycle: the :class:`~.lifecycle.Lifecycle` (its ``state``, a :class:`~.lifecycle.CoordinatorState`).
        tick: the :class:`~.tick.Tick` that runs presence, ``ListShards`` and the lease poll when due.
        closing: the :class:`~.closing.CoreClosing` (the close under way, the parked fatal error).
        threads: the thread pool of the blocking calls (lease store, ``ListShards``).
    """

    def __init__(self, stream: KinesisStream, *, aws: AwsSettings, store: LeaseStore, owner_id: str,
                 lease_duration_s: float, renew_interval_s: float, launcher: Launcher, kinesis: Any,
                 on_fatal: Callable[[BaseException], Any] | None = None, call_timeout_s: float = 30.0,
                 handoff_timeout_s: float | None = None, reader_start_timeout_s: float = 60.0,
                 clock: Callable[[], float] = monotonic_s, sleep: Sleep = asyncio.sleep,
                 reader_demand: Any = None, io: Callable[..., Awaitable[Any]] | None = None) -> None:
        self._run_blocking = io
        self.stream, self.aws, self.store, self.owner_id = stream, aws, store, owner_id
        self.lease_duration_s, self.renew_interval_s = lease_duration_s, renew_interval_s
        self.max_shards_per_reader = stream.max_shards_per_reader
        self._kinesis, self._call_timeout_s = kinesis, call_timeout_s
        self._clock, self._sleep = clock, sleep
        self.counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self.lifecycle = Lifecycle(stream.name)
        self._tasks = TaskSet(self.counters)  # handoff calls, reader watches
        self.threads = concurrent.futures.ThreadPoolExecutor(_STORE_THREADS, thread_name_prefix="ka-coordinator")
        self.leases = LeasePoll(stream=stream, store=store, io=self._io, kinesis=kinesis, owner_id=owner_id,
                                lease_duration_s=lease_duration_s, clock=clock, counters=self.counters, sleep=sleep)
        self.pool = ReaderPool(launch=launcher, max_shards_per_reader=stream.max_shards_per_reader,
                               load=lambda rid: self.placements.load(rid), on_event=self._apply,
                               on_gone=self._reader_gone, on_ready=lambda: self.placements.update(),
                               tasks=self._tasks, closing=lambda: self.lifecycle.closing, counters=self.counters,
                               clock=clock, sleep=sleep,
                               call_timeout_s=call_timeout_s, start_timeout_s=reader_start_timeout_s,
                               retry_s=min(1.0, renew_interval_s), demand=reader_demand)
        self.placements = Placements(pool=self.pool, take=self.leases.take, io=self._io, store=store,
                                     stream=stream.name, owner_id=owner_id, spec=self._spec,
                                     on_finished=self.leases.finished.add, closing=lambda: self.lifecycle.closing,
                                     counters=self.counters, clock=clock, call_timeout_s=call_timeout_s)
        self.handoffs = Handoffs(store=store, io=self._io, take=self.leases.take, stream=stream.name,
                                 owner_id=owner_id, lease_duration_s=lease_duration_s,
                                 timeout_s=handoff_timeout_s if handoff_timeout_s is not None else 2 * lease_duration_s,
                                 tasks=self._tasks, counters=self.counters, call_timeout_s=call_timeout_s)
        self.presence = Presence(store=store, io=self._io, stream=stream.name, owner_id=owner_id,
                                 duration_s=lease_duration_s, counters=self.counters)
        self.loads = LoadMoves(stream=stream, pool=self.pool, placements=self.placements, counters=self.counters,
                               clock=clock, grace_s=5.0)
        self.closing = CoreClosing(self, on_fatal=on_fatal, clock=clock)
        self.tick = Tick(stream.name, lifecycle=self.lifecycle, clock=clock, sleep=sleep, counters=self.counters,
                         on_fatal=self.fail)
        self.tick.add("presence", self.presence.update, lambda: renew_interval_s, first_in_s=0.0, before_running=True)
        self.tick.add("shards", self.sync_shards, lambda: stream.shard_sync_interval_s,
                      first_in_s=stream.shard_sync_interval_s)
        # a slow table read spaces the polls out: at most half of the store's time goes to reading it
        self.tick.add("poll", self._poll_and_upkeep,
                      lambda: max(stream.lease_poll_interval_s, 2 * self.leases.last_read_s),
                      first_in_s=stream.lease_poll_interval_s)
        self._last_stats: dict[str, dict[str, Any]] = {}
        self.consumer_arn: str | None = None  # the stream consumer (retrieval="fanout"), registered by start()

    @property
    def last_plan(self) -> Any:
        """The balancing plan of the last lease poll (a :class:`~kinesis_actors.balancing.BalancePlan`), or None."""
        return self.leases.last_plan

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call (lease store, ListShards) through ``io``, else in this Coordinator's threads."""
        if self._run_blocking is not None:
            result: T = await self._run_blocking(fn, *args, **kwargs)
            return result
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.threads, lambda: fn(*args, **kwargs))

    # ------------------------------------------------------------------ lifecycle
    async def start(self, timeout_s: float = 120.0) -> None:
        """The first pass: start the smallest reader pool (in the background), ``ListShards``,
        read the table, grow the pool to the leases, take them and open each on a reader (each
        holds its first iterator when this returns); then the tick runs every part.

        Args:
            timeout_s: the deadline of the whole pass, seconds.

        Raises:
            StartError: not every lease taken was open by the deadline (readers slow or
                failing to start, opens timing out); says how many were and why. Nothing
                was delivered to the caller yet; :meth:`close` releases what was taken.

        Other errors of the first pass (``ListShards``, the lease table) are parked
        (reported by :meth:`error`), not raised.
        """
        if self.lifecycle.closing:  # failed or closed before it started: the error (if any) is parked
            return
        deadline = self._clock() + timeout_s
        self.lifecycle.move(CoordinatorState.STARTING)
        self.tick.start()
        # The smallest pool starts now, in the background: reader processes start (a second or
        # more each) while this pass lists the shards and reads the lease table; the pass grows
        # the pool further once it knows how many leases it takes.
        self.pool.grow(1)
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
        log.info("%s: first pass opened %d of %d leased shards on %d readers in %.1f s", self.stream.name,
                 outcome.opened, outcome.wanted, len(self.pool.ready()), timeout_s - (deadline - self._clock()))
        if outcome.opened < outcome.wanted:
            raise StartError(f"{self.stream.name}: {outcome.opened} of {outcome.wanted} shards opened within "
                             f"{timeout_s:.0f} s ({outcome.why})", started=outcome.opened, total=outcome.wanted)
        if self.lifecycle.state is CoordinatorState.STARTING:  # not closing meanwhile
            self.lifecycle.move(CoordinatorState.RUNNING)
        self.tick.due_now()

    async def _poll_and_upkeep(self) -> None:
        try:
            await self.poll_leases()
        finally:
            self.pool.update(len(self.placements.held))
            self.placements.update()
            self.loads.update()  # placement by load: figures, plan, moves (in the background)

    async def close(self, *, release: bool = True, grace_s: float = 5.0, timeout_s: float = 15.0) -> None:
        """Stop the tick and every reader within ``timeout_s``; with ``release`` the leases
        are released after checkpointing what was acknowledged (otherwise they expire),
        handoff requests withdrawn and the presence row deleted (otherwise it goes stale).

        Args:
            release: release leases and the presence row.
            grace_s: how long each reader may take to finish its batch in flight, seconds
                (capped by what is left of ``timeout_s``).
            timeout_s: the deadline of the whole close, seconds (injected clock). What is
                not done by then (a hanging lease table) is left to expire, and the log
                says which.

        Never raises for a failing store or reader (each step logs what it left).
        """
        await self.closing.close(release, grace_s, timeout_s)

    async def fail(self, error: BaseException) -> None:
        """Park a fatal error, tell ``on_fatal``, and begin the close (releasing) at once:
        the state is CLOSING when this returns; the close runs on."""
        await self.closing.fail(error)

    def error(self) -> BaseException | None:
        """The parked fatal error, or None."""
        return self.closing.error

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait until closed or failed; True if it ended within ``timeout_s``."""
        return await self.closing.wait(timeout_s)

    # ------------------------------------------------------------------ reader reports
    async def _apply(self, reader: PooledReader, event: ShardEvent) -> None:
        """A consumer of ``reader`` ended: free its place and count how."""
        shard_id = event.shard_id
        if not self.placements.ended(reader, shard_id):
            return  # stale: the lease moved on already
        state = ConsumerState(event.state)
        if state is ConsumerState.SHARD_ENDED:
            self.leases.finished.add(shard_id)
            self.counters["shards_ended"] += 1
            self.tick.due_now("poll")  # children may be readable now
        elif state is ConsumerState.LOST:
            self.counters["leases_lost"] += 1
        elif state is ConsumerState.HANDED_OVER:
            self.counters["leases_handed_over"] += 1
        elif state is ConsumerState.FAILED:
            error = event.error
            await self.fail(error if isinstance(error, KinesisError) else KinesisError(f"shard {shard_id}: {error!r}"))

    async def _reader_gone(self, reader: PooledReader, why: BaseException) -> None:
        """Re-home the leases of a dead reader on live readers at once; start a replacement
        in the background (the leases do not wait for it when there is room)."""
        moved = self.placements.reader_gone(reader)
        log.warning("reader %d gone (%s); re-homing %d leases under owner %s", reader.id, why, len(moved),
                    self.owner_id)
        self.pool.grow(len(self.placements.held))
        await self.placements.place_waiting()

    # ------------------------------------------------------------------ steps
    async def sync_shards(self) -> None:
        """``ListShards`` (every ``shard_sync_interval_s``); ``DescribeStreamSummary`` once,
        for the stream's identity. Raises what the Kinesis calls raise."""
        await self.leases.sync_shards()

    async def poll_leases(self, *, deadline: float | None = None) -> PollOutcome:
        """One lease poll: read the table; take free, expired and own leases of readable
        shards (as many as the READY readers have room for) and open them; force handoff
        requests unanswered too long; below the balancing target, ask the most loaded
        instance for handoffs; pass requests for our own rows on to their readers.

        Args:
            deadline: the first pass (injected clock): retry a transient table read, grow the
                pool and wait for room for every lease to take, then until each is open.
                Without it the opens run in the background, so a slow reader never delays
                the next poll (``PollOutcome.opened`` is then 0).

        Returns:
            The :class:`PollOutcome`.

        Raises:
            What the table read raises; with ``deadline``, a reader's fatal error on open.
            A failed take, forced takeover or handoff request is logged and costs no other.
        """
        view = await self.leases.read(deadline=deadline)
        metrics.coordinator_tick(self)  # lease figures, once per poll (looked up in its module at each call)
        held = self.placements.held
        plan = self.leases.plan(view, held.keys())
        forced = await self.handoffs.settle(view.rows, view.read_at, held, self.leases.shards)
        self.counters["leases_taken"] += len(forced)
        wanted = list(plan.take)
        if deadline is not None:
            await self.pool.wait_for_room(len(wanted) + len(forced), len(held), deadline,
                                          straggler_wait_s=_STRAGGLER_WAIT_S, fatal_failures=_START_FAILURES_FATAL)
        else:
            self.pool.grow(len(held) + len(wanted) + len(forced))
        no_room = max(0, len(wanted) - max(0, self.pool.room_left() - len(forced)))
        if no_room:
            log.info("%s: room for %d of %d leases to take now; the pool is growing", self.stream.name,
                     len(wanted) - no_room, len(wanted))
            wanted = wanted[:len(wanted) - no_room]
        taken = await self.leases.take_all(wanted, skip=lambda sid: self.lifecycle.closing or sid in held)
        for t in taken:
            self.handoffs.received(t.shard.shard_id)
        if not no_room:  # no more moves asked for while leases already ours wait for room on a reader
            await self.handoffs.ask(plan.steal, view.rows, view.read_at,
                                    why=f"target {plan.target}, live {','.join(plan.live)}")
        self.handoffs.pass_on(view.rows, lambda sid: self.placements.handle_of(sid, open_only=True))
        news = [Taken(self.leases.shards[f.shard_id], f, view.read_at) for f in forced] + taken
        opens = [h for h in (self.placements.track(t.shard, t.lease, t.taken_at) for t in news
                             if not self.lifecycle.closing) if h.state is HeldState.OPENING]
        if deadline is None:
            for h in opens:
                self.placements.opens.spawn(self.placements.open(h), f"open-{h.shard.shard_id}")
            return PollOutcome(wanted=len(news) + no_room, opened=0, why="")
        return await self.placements.open_first_pass(opens, news=len(news), no_room=no_room, deadline=deadline)

    def _spec(self, shard: ShardInfo) -> ReaderSpec:
        return reader_spec(self.stream, shard, owner_id=self.owner_id, lease_duration_s=self.lease_duration_s,
                           renew_interval_s=self.renew_interval_s, consumer_arn=self.consumer_arn)

    # ------------------------------------------------------------------ queries and control
    async def stats(self) -> dict[str, Any]:
        """Per-shard figures of the shards this instance holds (the last figures its reader
        gave when it does not answer now), per-reader figures (``unreachable`` set for a
        reader that did not answer within 5 s), and this instance's lease counts."""
        readers = await collect_stats(self.pool.ready(), self.pool.loads(), self._last_stats,
                                      set(self.placements.held))
        plan = self.last_plan
        return {"owner_id": self.owner_id, "stream": self.stream.name, "leases_held": len(self.placements.held),
                "target": plan.target if plan else None, "live_instances": list(plan.live) if plan else [],
                "handoffs_pending": sorted(self.handoffs.requests), "readers": readers,
                "max_shards_per_reader": self.max_shards_per_reader,
                **self.counters, "shards": dict(self._last_stats)}

    def held(self) -> list[str]:
        """Shard ids this instance holds (open, opening, or waiting for room on a reader)."""
        return sorted(self.placements.held)

    async def seek(self, position: StartAt, shard_id: str | None) -> list[str]:
        """Reopen the open shards (or one) at ``position``; returns the shard ids sought.
        Raises ``ReaderGone``/``ReaderUnreachable``/``TimeoutError`` of a reader that failed."""
        targets = [sid for sid in self.placements.held if shard_id is None or sid == shard_id]

        async def one(sid: str) -> str | None:
            handle = self.placements.handle_of(sid, open_only=True)
            if handle is None:
                return None
            done = await asyncio.wait_for(handle.seek(sid, position), self._call_timeout_s)
            return sid if done else None

        moved = await asyncio.gather(*(one(sid) for sid in targets))
        return sorted(sid for sid in moved if sid is not None)

    def reader_of(self) -> dict[str, ReaderHandle]:
        """The reader handle of each held shard that has one."""
        out = {}
        for sid in self.placements.held:
            handle = self.placements.handle_of(sid)
            if handle is not None:
                out[sid] = handle
        return out
