"""Coordinator: one per subscription. Lists shards, reads the lease table, takes leases,
runs one ShardReader per leased shard, replaces dead readers.

Fault model:

* Everything durable is in the lease table; the Coordinator's memory is a cache. A new
  Coordinator (after a crash, restarted by the subscription's handle) re-takes the rows
  its owner id holds (the owner may re-take its own row at once) and starts readers
  that resume after the checkpoints.
* Readers are actors the Coordinator creates, so Ray kills them with it (fate sharing).
  A reader that dies is replaced at once under the same owner id: the Coordinator
  re-takes its own row, which raises the lease counter and fences the old reader.
* Each step of the control loop (``ListShards``, lease poll) has its own try/except and
  log line: a failing step is retried at its next tick, it does not stop the loop.
* A fatal error (``SinkError``, a deleted stream) is parked: the subscription reports it
  on the user's next call; the readers stop and release what they hold.

Balancing (issue 6): the Coordinator heartbeats a presence row every ``renew_interval_s``
(deleted on a clean close) and, at each lease poll, runs the pure planner of
:mod:`kinesis_actors.balancing` over the table: it takes free, expired and own leases,
and below ``ceil(readable shards / live instances)`` asks the most loaded instance for
a graceful handoff (``lease_next_owner``). That instance's reader checkpoints the batch
in flight and hands the row over in one fenced write (never free in between); the row
is then ours and the next poll re-takes it and starts a reader after the checkpoint. A
request not honoured within ``handoff_timeout_s`` is forced (``force_handoff``), like
taking an expired lease. Requests are withdrawn on a clean close. New readers start in
the background (the poll never waits for a slow actor start) and the Coordinator renews
their lease until the actor answers, handing it straight over if asked meanwhile.

Resharding: a shard is readable only when every parent that ``ListShards`` still lists
has checkpoint ``SHARD_END`` in the table (a missing parent row is not a finished
parent); children open at ``TRIM_HORIZON``. A row whose shard is no longer listed
never starts a reader and never blocks a child.

Stream identity: the first pass notes the stream's ARN and creation time
(``DescribeStreamSummary``); every take writes them on the row. A row of another
incarnation (the stream was deleted and re-created under the same name) counts as
absent: it finishes no parent, and taking it restarts it at ``start_at`` (its stale
checkpoint is never applied).

:class:`CoordinatorCore` is plain asyncio over an injectable reader launcher;
:class:`Coordinator` is the thin Ray actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from .aws import AwsSettings
from .balancing import BalancePlan, ShardState, plan_leases
from .config import KinesisStream
from .errors import KinesisError, LeaseLostError
from .kinesis import ShardInfo, describe_stream, list_shards
from .leases.protocol import Lease, LeaseStore
from .metrics import coordinator_tick
from .reader import ReaderOutcome, ReaderSpec
from .records import StartAt

__all__ = ["CoordinatorCore", "ReaderHandle", "Coordinator"]

log = logging.getLogger(__name__)


class ReaderHandle(Protocol):
    """What the Coordinator needs of a running reader (a Ray actor, or in-process in unit tests).

    ``join`` raises ``ReaderGone`` when the reader died (crash, node lost) and
    ``ReaderUnreachable`` when it may come back (Ray's ``ActorUnavailableError``).
    """

    async def open(self, lease: Lease | None = None) -> None: ...
    async def start(self) -> None: ...
    async def join(self) -> str: ...
    async def stop(self, release: bool, grace_s: float) -> None: ...
    async def seek(self, position: StartAt) -> None: ...
    async def stats(self) -> dict[str, Any]: ...
    async def ping(self) -> None: ...
    def kill(self) -> None: ...


class ReaderGone(Exception):
    """The reader's process is gone: replace it."""


class ReaderUnreachable(Exception):
    """The reader cannot be reached now but may come back: retry."""


class _HandedOver(Exception):
    """A lease was handed over (to the owner id in the message) while its reader was starting."""


Launcher = Callable[[ReaderSpec, Lease], ReaderHandle]


@dataclasses.dataclass
class _Slot:
    shard: ShardInfo
    handle: ReaderHandle
    watch: asyncio.Task[None] | None = None


class CoordinatorCore:
    """The control loop of one subscription (plain asyncio; see the module docstring).

    Args:
        stream: the subscription's :class:`KinesisStream`.
        aws: settings for ``ListShards`` and the readers.
        store: the lease store (blocking calls run in worker threads).
        owner_id: this instance's lease owner id.
        lease_duration_s / renew_interval_s: lease timing, seconds.
        launcher: creates a reader for ``(spec, lease)``.
        kinesis: a boto3 Kinesis client (for ``ListShards``).
        on_fatal: called with a fatal error (e.g. to fail the pull queue).
        call_timeout_s: timeout of every call to a reader, seconds.
        handoff_timeout_s: how long a handoff request may stay unanswered before it is
            forced, seconds (default 2 x ``lease_duration_s``).
        clock: monotonic clock, seconds (handoff timing).
    """

    def __init__(self, stream: KinesisStream, *, aws: AwsSettings, store: LeaseStore, owner_id: str,
                 lease_duration_s: float, renew_interval_s: float, launcher: Launcher, kinesis: Any,
                 on_fatal: Callable[[BaseException], Any] | None = None, call_timeout_s: float = 30.0,
                 handoff_timeout_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.aws = aws
        self.store = store
        self.owner_id = owner_id
        self.lease_duration_s = lease_duration_s
        self.renew_interval_s = renew_interval_s
        self._launch = launcher
        self._kinesis = kinesis
        self._on_fatal = on_fatal
        self._call_timeout_s = call_timeout_s
        self._shards: dict[str, ShardInfo] = {}
        self._slots: dict[str, _Slot] = {}
        self._starting: dict[str, asyncio.Task[Exception | None]] = {}  # readers being started by the control loop
        self._finished: set[str] = set()
        self._error: BaseException | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_stats: dict[str, dict[str, Any]] = {}
        self._identity: tuple[str, int] | None = None  # (stream ARN, creation epoch ms)
        self._identity_known = False
        self._foreign: set[str] = set()  # shards whose row of another incarnation was reported
        self.counters = {"leases_taken": 0, "leases_lost": 0, "readers_replaced": 0, "shards_ended": 0,
                         "handoffs_requested": 0, "handoffs_received": 0, "handoffs_forced": 0,
                         "leases_handed_over": 0}
        self._clock = clock
        self._handoff_timeout_s = handoff_timeout_s if handoff_timeout_s is not None else 2 * lease_duration_s
        self._handoffs: dict[str, tuple[str, float]] = {}  # shard id -> (holder asked, when)
        self._last_steal = float("-inf")
        self._presence_task: asyncio.Task[None] | None = None
        self.last_plan: BalancePlan | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """The first pass: ListShards, read the table, take leases, open a reader per lease
        (each holds its first iterator when this returns); then the control loop starts.

        Errors of the first pass are parked (reported by :meth:`error`), not raised.
        """
        if callable(getattr(self.store, "heartbeat", None)):
            self._presence_task = asyncio.create_task(self._presence_loop(), name=f"presence-{self.stream.name}")
        try:
            await self.sync_shards()
            await self.poll_leases()
        except Exception as e:  # parked: the subscription reports it on the next call
            log.exception("%s: first pass failed", self.stream.name)
            await self.fail(e)
            return
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
            next_poll = now + cfg.lease_poll_interval_s
            try:
                await self.poll_leases(wait_readers=False)
            except Exception as e:
                log.warning("%s: lease poll failed (%r); retrying next interval", cfg.name, e)

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
        if self._starting:  # let readers being started become slots, so they are stopped and released
            await asyncio.wait(list(self._starting.values()), timeout=self._call_timeout_s)
        slots = list(self._slots.values())
        self._slots.clear()
        await asyncio.gather(*(self._stop_slot(s, release, grace_s) for s in slots), return_exceptions=True)
        if release and self._handoffs:
            await self._withdraw_handoffs()
        if release and self._presence_task is not None:
            try:
                await asyncio.to_thread(self.store.remove_presence, self.stream.name, self.owner_id)  # type: ignore[attr-defined]
            except Exception as e:
                log.info("%s: could not delete the presence row (%r); it will go stale", self.stream.name, e)
        self._closed.set()

    async def _withdraw_handoffs(self) -> None:
        """Closing: take back our handoff requests, and release a row handed over meanwhile
        (so nobody waits a lease duration for an instance that is gone)."""
        store, stream, me = self.store, self.stream.name, self.owner_id
        for shard_id in sorted(self._handoffs):
            try:
                for _ in range(3):
                    if await asyncio.to_thread(store.withdraw_handoff, stream, shard_id, owner=me):  # type: ignore[attr-defined]
                        break
                    row = await asyncio.to_thread(store.get, stream, shard_id)
                    if row is not None and row.owner == me:
                        lease = await asyncio.to_thread(store.take, stream, shard_id, owner=me,
                                                        duration_s=self.lease_duration_s)
                        if lease is not None:
                            await asyncio.to_thread(store.release, lease)
                        break
            except Exception as e:
                log.info("shard %s: could not withdraw the handoff request (%r)", shard_id, e)
        self._handoffs.clear()

    async def _presence_loop(self) -> None:
        """Heartbeat this instance's presence row every ``renew_interval_s`` (it lasts one lease duration)."""
        while not self._closing:
            try:
                await asyncio.to_thread(self.store.heartbeat, self.stream.name, self.owner_id,  # type: ignore[attr-defined]
                                        duration_s=self.lease_duration_s)
            except Exception as e:
                log.info("%s: presence heartbeat failed (%r); retrying", self.stream.name, e)
            await asyncio.sleep(self.renew_interval_s)

    async def _stop_slot(self, slot: _Slot, release: bool, grace_s: float) -> None:
        if slot.watch is not None:
            slot.watch.cancel()
        try:
            await asyncio.wait_for(slot.handle.stop(release, grace_s), grace_s + self._call_timeout_s)
        except Exception as e:
            log.info("shard %s: reader did not stop cleanly (%r)", slot.shard.shard_id, e)
        slot.handle.kill()

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

    # ------------------------------------------------------------------ steps
    async def sync_shards(self) -> None:
        """``ListShards`` (every ``shard_sync_interval_s``); ``DescribeStreamSummary`` once,
        for the stream's identity."""
        if not self._identity_known:
            self._identity = await asyncio.to_thread(self._describe_identity)
            self._identity_known = True
        shards = await asyncio.to_thread(list_shards, self._kinesis, self.stream.name)
        self._shards = {s.shard_id: s for s in shards}

    def _describe_identity(self) -> tuple[str, int] | None:
        summary = describe_stream(self._kinesis, self.stream.name)
        arn, created = summary.get("StreamARN"), summary.get("StreamCreationTimestamp")
        if not arn or created is None:
            return None
        seconds = created.timestamp() if hasattr(created, "timestamp") else float(created)
        return (arn, int(round(seconds * 1000)))

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

    async def poll_leases(self, *, wait_readers: bool = True) -> None:
        """Read the lease table; take free, expired and own leases of readable shards and start
        readers; below the balancing target, ask the most loaded instance for handoffs.

        ``wait_readers``: wait until the new readers hold their first iterator (the first
        pass); the control loop starts them in the background instead, so a slow actor
        start never delays the next poll (a handed-over row must be taken promptly).
        """
        rows, live = await asyncio.to_thread(self._read_table)
        rows = self._this_incarnation(rows)
        coordinator_tick(self)  # metrics: lease figures, once per poll
        self._finished |= {sid for sid, row in rows.items() if row.finished}
        readable = [sid for sid in sorted(self._shards)
                    if sid not in self._finished and self._parents_done(self._shards[sid], rows)]
        now = self._clock()
        may_steal = live is not None and now - self._last_steal >= 0.9 * self.stream.lease_poll_interval_s
        plan = plan_leases(self.owner_id, [self._shard_state(sid, rows.get(sid)) for sid in readable],
                           held=self._slots.keys() | self._starting.keys(), live_instances=live or (),
                           max_leases=self.stream.max_leases,
                           max_leases_to_steal=self.stream.max_leases_to_steal if may_steal else 0)
        self.last_plan = plan
        taken = await self._settle_handoffs(rows, now)
        for shard_id in plan.take:
            if self._closing:
                return
            shard = self._shards[shard_id]
            lease = await asyncio.to_thread(self.store.take, self.stream.name, shard_id, owner=self.owner_id,
                                            duration_s=self.lease_duration_s, parent_shard_ids=shard.parent_shard_ids,
                                            stream_identity=self._identity)
            if lease is None:
                continue
            if lease.finished:
                self._finished.add(shard_id)
                await asyncio.to_thread(self.store.release, lease)
                continue
            self.counters["leases_taken"] += 1
            if self._handoffs.pop(shard_id, None) is not None:
                self.counters["handoffs_received"] += 1
            taken.append((shard, lease))
        if plan.steal:
            self._last_steal = now
        for shard_id, victim in plan.steal:
            row = rows[shard_id]
            if await asyncio.to_thread(self.store.request_handoff, self.stream.name, shard_id,  # type: ignore[attr-defined]
                                       owner=self.owner_id, expect_counter=row.counter):
                self._handoffs[shard_id] = (victim, now)
                self.counters["handoffs_requested"] += 1
                log.info("shard %s: asked %s for a handoff (target %d, live %s)", shard_id, victim, plan.target,
                         ",".join(plan.live))
        # Readers start concurrently (Ray starts actors about two at a time on 2 cores).
        starts = [self._begin_start(s, lease) for s, lease in taken]
        if wait_readers:
            errors = [e for e in await asyncio.gather(*starts) if e is not None]
            if errors:
                raise errors[0]

    def _begin_start(self, shard: ShardInfo, lease: Lease) -> asyncio.Task[Exception | None]:
        """Start a reader as a task (its error is its result); the shard counts as held meanwhile."""
        shard_id = shard.shard_id

        async def run() -> Exception | None:
            try:
                await self._start_reader(shard, lease)
                return None
            except Exception as e:
                log.warning("shard %s: starting its reader failed (%r); the lease poll will retry", shard_id, e)
                return e
            finally:
                self._starting.pop(shard_id, None)

        task = asyncio.create_task(run(), name=f"start-{shard_id}")
        self._starting[shard_id] = task
        return task

    def _read_table(self) -> tuple[dict[str, Lease], list[str] | None]:
        """The stream's shard rows and the live instances (None: the store has no presence rows)."""
        snapshot = getattr(self.store, "snapshot", None)
        if callable(snapshot):
            snap = snapshot(self.stream.name)
            return {lease.shard_id: lease for lease in snap.leases}, [i.owner for i in snap.instances]
        return {lease.shard_id: lease for lease in self.store.list(self.stream.name)}, None

    def _shard_state(self, shard_id: str, row: Lease | None) -> ShardState:
        if row is None:
            return ShardState(shard_id)
        expired = row.owner not in (None, self.owner_id) and self.store.is_expired(row)
        return ShardState(shard_id, row.owner, row.next_owner, expired)

    async def _settle_handoffs(self, rows: dict[str, Lease], now: float) -> list[tuple[ShardInfo, Lease]]:
        """Follow our handoff requests: forget those the table no longer shows, force those
        unanswered past ``handoff_timeout_s``. Returns forced leases (readers to start)."""
        for shard_id, row in rows.items():  # requests we made before a restart
            if row.next_owner == self.owner_id and row.owner not in (None, self.owner_id):
                self._handoffs.setdefault(shard_id, (row.owner, now))
        forced: list[tuple[ShardInfo, Lease]] = []
        for shard_id, (victim, since) in list(self._handoffs.items()):
            row = rows.get(shard_id)
            if row is None or row.finished or shard_id in self._slots or shard_id in self._starting:
                self._handoffs.pop(shard_id, None)
                continue
            if row.owner == self.owner_id:
                continue  # handed over: the take below starts its reader
            if row.next_owner != self.owner_id or row.owner is None:
                self._handoffs.pop(shard_id, None)  # taken, released or asked by another since
                continue
            if now - since < self._handoff_timeout_s or shard_id not in self._shards:
                continue
            self._handoffs.pop(shard_id, None)
            lease = await asyncio.to_thread(self.store.force_handoff, self.stream.name, shard_id,  # type: ignore[attr-defined]
                                            owner=self.owner_id, duration_s=self.lease_duration_s)
            if lease is not None:
                self.counters["handoffs_forced"] += 1
                self.counters["leases_taken"] += 1
                log.warning("shard %s: %s did not hand over within %.1f s; lease taken", shard_id, victim,
                            self._handoff_timeout_s)
                forced.append((self._shards[shard_id], lease))
        return forced

    async def _start_reader(self, shard: ShardInfo, lease: Lease) -> None:
        cfg = self.stream
        spec = ReaderSpec(
            stream=cfg.name, shard_id=shard.shard_id, owner_id=self.owner_id,
            start_at=StartAt.trim_horizon() if shard.parent_shard_ids else cfg.start_at,
            lease_duration_s=self.lease_duration_s, renew_interval_s=self.renew_interval_s, aws=self.aws,
            ending_sequence_number=shard.ending_sequence_number, max_records=cfg.max_records,
            idle_wait_s=cfg.idle_wait_s, max_sink_retries=cfg.max_sink_retries, sink_method=cfg.sink_method,
            dead_letter=cfg.dead_letter,
        )
        handle = self._launch(spec, lease)
        try:
            lease = await asyncio.wait_for(self._keep_until_ready(handle, lease), self._call_timeout_s)
            await asyncio.wait_for(handle.open(lease), self._call_timeout_s)
            await asyncio.wait_for(handle.start(), self._call_timeout_s)
        except Exception as e:
            handle.kill()
            if isinstance(e, LeaseLostError):
                log.info("shard %s: lease lost while opening", shard.shard_id)
                return
            if isinstance(e, _HandedOver):
                self.counters["leases_handed_over"] += 1
                log.info("shard %s: handed over to %s before its reader started", shard.shard_id, e)
                return
            raise
        slot = _Slot(shard, handle)
        self._slots[shard.shard_id] = slot
        slot.watch = asyncio.create_task(self._watch(slot), name=f"watch-{shard.shard_id}")
        log.info("shard %s: reader started (lease counter %d)", shard.shard_id, lease.counter)

    async def _keep_until_ready(self, handle: ReaderHandle, lease: Lease) -> Lease:
        """Renew ``lease`` every ``renew_interval_s`` until the reader's actor answers (starting
        an actor can take longer than a short lease); returns the latest Lease for ``open``.

        A handoff requested meanwhile is honoured at once (nothing was read yet): the row
        goes to the asker and ``_HandedOver`` is raised.

        Raises:
            LeaseLostError: the lease was taken meanwhile. ReaderGone: the actor died.
        """
        ready = asyncio.ensure_future(handle.ping())
        try:
            while True:
                done, _ = await asyncio.wait({ready}, timeout=self.renew_interval_s)
                if done:
                    ready.result()
                    return lease
                try:
                    lease = await asyncio.to_thread(self.store.renew, lease)
                except LeaseLostError:
                    raise
                except Exception as e:  # throttled or unreachable: the reader will find out
                    log.info("shard %s: renewing while the reader starts failed (%r)", lease.shard_id, e)
                    continue
                if lease.next_owner and lease.next_owner != self.owner_id:
                    await asyncio.to_thread(self.store.hand_over, lease)  # type: ignore[attr-defined]
                    raise _HandedOver(lease.next_owner)
        finally:
            if not ready.done():
                ready.cancel()

    async def _watch(self, slot: _Slot) -> None:
        """Await the reader's end; replace it at once if it died."""
        shard_id = slot.shard.shard_id
        while True:
            try:
                outcome = await slot.handle.join()
                break
            except ReaderUnreachable:
                await asyncio.sleep(min(1.0, self.renew_interval_s))
                continue
            except ReaderGone as e:
                log.warning("shard %s: reader died (%s); replacing it under owner %s", shard_id, e, self.owner_id)
                self._slots.pop(shard_id, None)
                slot.handle.kill()
                if self._closing:
                    return
                self.counters["readers_replaced"] += 1
                await self._replace(slot.shard)
                return
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # fatal: SinkError, StreamError, ...
                self._slots.pop(shard_id, None)
                await self.fail(e if isinstance(e, KinesisError) else KinesisError(f"shard {shard_id}: {e!r}"))
                return
        self._slots.pop(shard_id, None)
        slot.handle.kill()
        if outcome == ReaderOutcome.SHARD_END:
            self._finished.add(shard_id)
            self.counters["shards_ended"] += 1
            self._wake.set()  # children may be readable now
        elif outcome == ReaderOutcome.LOST:
            self.counters["leases_lost"] += 1
        elif outcome == ReaderOutcome.HANDED_OVER:
            self.counters["leases_handed_over"] += 1

    async def _replace(self, shard: ShardInfo) -> None:
        try:
            lease = await asyncio.to_thread(self.store.take, self.stream.name, shard.shard_id,
                                            owner=self.owner_id, duration_s=self.lease_duration_s)
            if lease is not None and not lease.finished:
                await self._start_reader(shard, lease)
        except Exception as e:
            log.warning("shard %s: replacement failed (%r); the lease poll will retry", shard.shard_id, e)

    # ------------------------------------------------------------------ queries and control
    async def stats(self) -> dict[str, Any]:
        """Per-shard figures of the running readers plus this instance's lease counts."""
        async def one(slot: _Slot) -> None:
            try:
                self._last_stats[slot.shard.shard_id] = await asyncio.wait_for(slot.handle.stats(), 5.0)
            except Exception:
                pass
        await asyncio.gather(*(one(s) for s in list(self._slots.values())))
        plan = self.last_plan
        return {"owner_id": self.owner_id, "stream": self.stream.name, "leases_held": len(self._slots),
                "target": plan.target if plan else None, "live_instances": list(plan.live) if plan else [],
                "handoffs_pending": sorted(self._handoffs),
                **self.counters, "shards": {k: v for k, v in self._last_stats.items()}}

    def held(self) -> list[str]:
        """Shard ids with a running reader."""
        return sorted(self._slots)

    async def seek(self, position: StartAt, shard_id: str | None) -> list[str]:
        """Reopen the held shards (or one) at ``position``; returns the shard ids sought."""
        targets = [s for sid, s in self._slots.items() if shard_id is None or sid == shard_id]
        await asyncio.gather(*(asyncio.wait_for(s.handle.seek(position), self._call_timeout_s) for s in targets))
        return sorted(s.shard.shard_id for s in targets)


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
        except rex.RayTaskError as e:  # the reader's own error (SinkError, LeaseLostError...), unwrapped
            cause = e.cause if isinstance(e.cause, BaseException) else e
            raise cause from None

    async def open(self, lease: Lease | None = None) -> None:
        await self._call("open", lease)

    async def start(self) -> None:
        await self._call("start")

    async def join(self) -> str:
        return await self._call("join")

    async def stop(self, release: bool, grace_s: float) -> None:
        await self._call("stop", release, grace_s)

    async def seek(self, position: StartAt) -> None:
        await self._call("seek", position)

    async def stats(self) -> dict[str, Any]:
        return await self._call("stats")

    async def ping(self) -> None:
        await self._call("ping")

    def kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:
            pass


def _make_ray_actor() -> Any:
    import ray

    from .reader import ShardReader

    @ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1000)
    class Coordinator:
        """Ray actor shell over :class:`CoordinatorCore` (process name ``ray::Coordinator``).

        Owned by the subscription's handle, which restarts it if it dies.
        """

        def __init__(self, stream: KinesisStream, aws: AwsSettings, store: LeaseStore, owner_id: str,
                     lease_duration_s: float, renew_interval_s: float, sink: Any, pull_queue: Any) -> None:
            logging.basicConfig(level=logging.INFO)
            # Our blocking calls (boto3, MemoryLeaseStore's ray.get) run in worker threads via
            # asyncio.to_thread, never on the event loop; Ray's once-per-process warning does not apply.
            import ray._private.worker as _ray_worker

            _ray_worker.blocking_get_inside_async_warned = True
            options = stream.actor_options()
            target = sink if sink is not None else pull_queue

            def launch(spec: ReaderSpec, lease: Lease) -> ReaderHandle:
                return _RayReaderHandle(ShardReader.options(**options).remote(spec, lease, store, target))

            on_fatal = (lambda err: pull_queue.fail.remote(err)) if pull_queue is not None else None
            self.core = CoordinatorCore(stream, aws=aws, store=store, owner_id=owner_id,
                                        lease_duration_s=lease_duration_s, renew_interval_s=renew_interval_s,
                                        launcher=launch, kinesis=aws.client("kinesis"), on_fatal=on_fatal)

        async def start(self) -> None:
            await self.core.start()

        async def close(self, release: bool = True, grace_s: float = 5.0) -> None:
            await self.core.close(release=release, grace_s=grace_s)

        def error(self) -> BaseException | None:
            return self.core.error()

        async def wait(self, timeout_s: float | None) -> bool:
            return await self.core.wait(timeout_s)

        async def stats(self) -> dict[str, Any]:
            return await self.core.stats()

        def held(self) -> list[str]:
            return self.core.held()

        async def seek(self, position: StartAt, shard_id: str | None) -> list[str]:
            return await self.core.seek(position, shard_id)

        def ping(self) -> bool:
            return True

        def reader_handles(self) -> dict[str, Any]:
            """Test hook: the ShardReader actor handle of each held shard."""
            return {sid: slot.handle.actor for sid, slot in self.core._slots.items()}  # type: ignore[attr-defined]

    return Coordinator


_ACTOR: Any = None


def __getattr__(name: str) -> Any:  # lazy: importing the module does not import Ray
    global _ACTOR
    if name == "Coordinator":
        if _ACTOR is None:
            _ACTOR = _make_ray_actor()
        return _ACTOR
    raise AttributeError(name)
