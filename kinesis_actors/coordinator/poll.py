"""The lease-table poll: the stream's shards and identity, which shards are readable, the
balancing plan, and the takes it chose.

Resharding: a shard is readable only when every parent that ``ListShards`` still lists
has checkpoint ``SHARD_END`` in the table (a missing parent row is not a finished
parent); children open at ``TRIM_HORIZON``. A row whose shard is no longer listed never
opens and never blocks a child.

Stream identity: the first ``ListShards`` notes the stream's ARN and creation time
(``DescribeStreamSummary``); every take writes them on the row. A row of another
incarnation (the stream was deleted and re-created under the same name) counts as
absent: it finishes no parent, and taking it restarts it at ``start_at``.

The first pass's table read retries a transient store error (throttled, a timeout) with
backoff until the pass's deadline: the lease table's client makes one attempt per call, and
the first pass's errors are the subscription's. A later poll's read is not retried: the tick
polls again when next due.

A failed take costs no other take of the same round: it is logged and counted
(``takes_failed``) and the shard is taken at a later poll.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from .. import mutation
from ..backoff import Backoff, Retry
from ..balancing import BalancePlan, ShardState, plan_leases
from ..config import KinesisStream
from ..errors import KinesisError, is_unreachable
from ..kinesis import ShardInfo, describe_stream, list_shards
from ..leases.protocol import Lease, LeaseStore
from ..load.throughput import BalanceMemory, plan_by_throughput

__all__ = ["TableView", "Taken", "PollOutcome", "LeasePoll"]

log = logging.getLogger("kinesis_actors.coordinator")

_CHILD_FIRST = mutation.register("child_before_parent_end", "a child shard is readable before its parents end")

TABLE_BACKOFF = Backoff(base_s=0.2, cap_s=2.0, floor_s=0.05)
"""Waits between the first pass's reads of the lease table after a transient store error."""


def transient_store_error(error: Exception) -> bool:
    """True for a lease-store error worth another read: ``retriable``, not ``fatal`` (a live
    KCL fleet), and not an endpoint that refused the connection (nothing listens there)."""
    return (isinstance(error, KinesisError) and error.retriable and not getattr(error, "fatal", False)
            and not is_unreachable(error.__cause__ or error))


@dataclasses.dataclass(frozen=True)
class TableView:
    """One read of the lease table: the rows of this incarnation, the live instances, the
    readable shard ids, and when it was read (injected clock, seconds)."""

    rows: dict[str, Lease]
    live: list[str]
    readable: list[str]
    read_at: float


@dataclasses.dataclass(frozen=True)
class Taken:
    """A lease this poll took: the shard, the lease, and when its take was sent (injected clock, s)."""

    shard: ShardInfo
    lease: Lease
    taken_at: float


@dataclasses.dataclass(frozen=True)
class PollOutcome:
    """What one lease poll did.

    Attributes:
        wanted: leases it took or wanted to take but had no room for (minus those that
            ended while opening).
        opened: of those, how many its reader confirmed open (only counted when the
            poll waited for its opens: the first pass).
        why: why the others are not open (empty when all are).
    """

    wanted: int
    opened: int
    why: str


class LeasePoll:
    """Reads the lease table and takes the leases the planner chose.

    Args:
        stream: the subscription's stream settings.
        store: the lease store; io: runs its blocking calls in the Coordinator's threads.
        kinesis: a boto3 Kinesis client (``ListShards``, ``DescribeStreamSummary``).
        owner_id / lease_duration_s: our owner id and the lease duration, seconds.
        clock / sleep: the injected monotonic clock (seconds) and its sleep.
        counters: ``leases_taken`` and ``takes_failed`` are counted here.

    Attributes:
        last_read_s: how long the last successful table read took, seconds: that attempt
            alone (the waits between the first pass's retries are not the table's latency;
            the Coordinator spaces its polls by it).
    """

    def __init__(self, *, stream: KinesisStream, store: LeaseStore, io: Callable[..., Awaitable[Any]], kinesis: Any,
                 owner_id: str, lease_duration_s: float, clock: Callable[[], float],
                 counters: dict[str, int], sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.stream, self._store, self._io, self._kinesis = stream, store, io, kinesis
        self.owner_id, self._duration_s, self._clock, self.counters = owner_id, lease_duration_s, clock, counters
        self._sleep = sleep
        counters.setdefault("takes_failed", 0)
        self.shards: dict[str, ShardInfo] = {}
        self.finished: set[str] = set()
        self.identity: tuple[str, int] | None = None  # (stream ARN, creation epoch ms)
        self._identity_known = False
        self._foreign: set[str] = set()  # shards whose row of another incarnation was reported
        self.last_read_s = 0.0
        self.last_plan: BalancePlan | None = None
        self._last_steal = float("-inf")
        self.memory = BalanceMemory(3 * stream.load_window_s)  # balance_by="load": figures and damping

    # ------------------------------------------------------------------ shards
    async def sync_shards(self) -> None:
        """``ListShards``; ``DescribeStreamSummary`` once, for the stream's identity."""
        if not self._identity_known:
            self.identity = await self._io(self._describe_identity)
            self._identity_known = True
        shards = await self._io(list_shards, self._kinesis, self.stream.name)
        self.shards = {s.shard_id: s for s in shards}

    def _describe_identity(self) -> tuple[str, int] | None:
        summary = describe_stream(self._kinesis, self.stream.name)
        arn, created = summary.get("StreamARN"), summary.get("StreamCreationTimestamp")
        if not arn or created is None:
            return None
        seconds = created.timestamp() if hasattr(created, "timestamp") else float(created)
        return (arn, round(seconds * 1000))

    # ------------------------------------------------------------------ the table
    async def read(self, *, deadline: float | None = None) -> TableView:
        """Read the table (one consistent snapshot); note finished shards; list the readable ones.

        Args:
            deadline: the first pass's (injected clock, seconds): a transient store error
                (:func:`transient_store_error`) is retried with :data:`TABLE_BACKOFF` until
                then. None: one read.

        Raises:
            What the store's ``snapshot`` raises (``LeaseStoreError``, ``KclFleetLiveError``).
        """
        async def attempt() -> Any:  # timed alone: the retries' backoff is not the table's latency
            sent = self._clock()
            got = await self._io(self._store.snapshot, self.stream.name)
            self.last_read_s = self._clock() - sent
            return got

        snap = await attempt() if deadline is None else \
            await Retry(TABLE_BACKOFF, deadline_s=max(0.0, deadline - self._clock()), clock=self._clock).call_async(
                attempt, retry_on=transient_store_error, on_retry=self._read_failed, sleep=self._sleep)
        rows = self._this_incarnation({lease.shard_id: lease for lease in snap.leases})
        self.finished |= {sid for sid, row in rows.items() if row.finished}
        readable = [sid for sid in sorted(self.shards)
                    if sid not in self.finished and self.parents_done(self.shards[sid], rows)]
        return TableView(rows, [i.owner for i in snap.instances], readable, self._clock())

    def _read_failed(self, error: Exception, failed: int, pause_s: float) -> None:
        log.info("%s: lease table read failed (%r); retry %d in %.2f s", self.stream.name, error, failed, pause_s)

    def _this_incarnation(self, rows: dict[str, Lease]) -> dict[str, Lease]:
        if self.identity is None:
            return rows
        current: dict[str, Lease] = {}
        for shard_id, row in rows.items():
            identity = row.stream_identity
            if identity is not None and identity != self.identity:
                if shard_id not in self._foreign:
                    self._foreign.add(shard_id)
                    log.warning("shard %s: the lease row belongs to another incarnation of stream %s (%s); its"
                                " checkpoint %r is not applied, the shard opens at start_at",
                                shard_id, self.stream.name, identity, row.checkpoint)
                continue
            current[shard_id] = row
        return current

    def parents_done(self, shard: ShardInfo, rows: dict[str, Lease]) -> bool:
        """Whether ``shard`` may be read given the table's ``rows``: it was read before (a
        checkpoint on its own row), or every parent still listed is at ``SHARD_END``."""
        own = rows.get(shard.shard_id)
        if (own is not None and own.checkpoint is not None) or _CHILD_FIRST in mutation.ACTIVE:
            return True  # read before, so its parents were done (KCL deletes a finished parent's lease)
        for parent in shard.parent_shard_ids:
            if parent not in self.shards:
                continue  # trimmed away: ListShards no longer lists it
            row = rows.get(parent)
            if row is None or not row.finished:
                return False
        return True

    def plan(self, view: TableView, held: Iterable[str]) -> BalancePlan:
        """The balancing plan over ``view`` (steals at most once per lease-poll interval): by
        the rows' throughput with ``balance_by="load"``
        (:func:`~kinesis_actors.load.throughput.plan_by_throughput`), else by count."""
        may_steal = view.read_at - self._last_steal >= 0.9 * self.stream.lease_poll_interval_s
        states = [self._shard_state(sid, view.rows.get(sid)) for sid in view.readable]
        steal = self.stream.max_leases_to_steal if may_steal else 0
        if self.stream.balance_by == "load":
            seen = {sid: (row.owner, row.throughput_kbps) for sid, row in view.rows.items()}
            kbps, settling = self.memory.observe(seen, view.read_at)
            plan = plan_by_throughput(self.owner_id, states, kbps, held=held, live_instances=view.live,
                                      max_leases=self.stream.max_leases, max_leases_to_steal=steal,
                                      balance_threshold=self.stream.balance_threshold, settling=settling)
        else:
            plan = plan_leases(self.owner_id, states, held=held, live_instances=view.live,
                               max_leases=self.stream.max_leases, max_leases_to_steal=steal)
        if plan.steal:
            self._last_steal = view.read_at
        self.last_plan = plan
        return plan

    def _shard_state(self, shard_id: str, row: Lease | None) -> ShardState:
        if row is None:
            return ShardState(shard_id)
        expired = row.owner not in (None, self.owner_id) and self._store.is_expired(row)
        return ShardState(shard_id, row.owner, row.next_owner, expired)

    # ------------------------------------------------------------------ takes
    async def take(self, shard_id: str) -> Lease | None:
        """Take (or re-take) ``shard_id``'s row under our owner id; None if another holds it."""
        shard = self.shards.get(shard_id)
        lease: Lease | None = await self._io(self._store.take, self.stream.name, shard_id, owner=self.owner_id,
                                             duration_s=self._duration_s,
                                             parent_shard_ids=shard.parent_shard_ids if shard else (),
                                             stream_identity=self.identity)
        return lease

    async def take_all(self, shard_ids: list[str], skip: Callable[[str], bool]) -> list[Taken]:
        """Take ``shard_ids`` in parallel; returns those taken and not finished (finished rows
        are released). ``skip(shard_id)`` after a take: drop it (closing, or held meanwhile)."""
        sent = self._clock()
        outcomes = await asyncio.gather(*(self.take(sid) for sid in shard_ids), return_exceptions=True)
        taken: list[Taken] = []
        for shard_id, got in zip(shard_ids, outcomes):
            if isinstance(got, Exception):  # one failed take costs none of the others
                self.counters["takes_failed"] += 1
                log.warning("shard %s: take failed (%r); retried at the next poll", shard_id, got)
            elif isinstance(got, BaseException):
                raise got
            elif got is None or skip(shard_id):
                continue
            elif got.finished:
                self.finished.add(shard_id)
                await self.release(got)
            else:
                self.counters["leases_taken"] += 1
                taken.append(Taken(self.shards[shard_id], got, sent))
        return taken

    async def release(self, lease: Lease) -> None:
        """Release ``lease``; a lease-store error is logged and counted (the row then expires)."""
        try:
            await self._io(self._store.release, lease)
        except Exception as e:  # a lease-store error: the finished row expires on its own
            self.counters["store_errors"] = self.counters.get("store_errors", 0) + 1
            log.info("shard %s: could not release the row (%r); it expires", lease.shard_id, e)
