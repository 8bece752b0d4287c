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

    async def open(self) -> None: ...
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
    """

    def __init__(self, stream: KinesisStream, *, aws: AwsSettings, store: LeaseStore, owner_id: str,
                 lease_duration_s: float, renew_interval_s: float, launcher: Launcher, kinesis: Any,
                 on_fatal: Callable[[BaseException], Any] | None = None, call_timeout_s: float = 30.0) -> None:
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
        self.counters = {"leases_taken": 0, "leases_lost": 0, "readers_replaced": 0, "shards_ended": 0}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """The first pass: ListShards, read the table, take leases, open a reader per lease
        (each holds its first iterator when this returns); then the control loop starts.

        Errors of the first pass are parked (reported by :meth:`error`), not raised.
        """
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
                await self.poll_leases()
            except Exception as e:
                log.warning("%s: lease poll failed (%r); retrying next interval", cfg.name, e)

    async def close(self, *, release: bool = True, grace_s: float = 5.0) -> None:
        """Stop the loop and every reader; with ``release`` their leases are released after
        checkpointing what was acknowledged (otherwise they expire)."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        slots = list(self._slots.values())
        self._slots.clear()
        await asyncio.gather(*(self._stop_slot(s, release, grace_s) for s in slots), return_exceptions=True)
        self._closed.set()

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

    async def poll_leases(self) -> None:
        """Read the lease table; take free, expired and own leases of readable shards; start readers."""
        rows = {lease.shard_id: lease for lease in await asyncio.to_thread(self.store.list, self.stream.name)}
        rows = self._this_incarnation(rows)
        coordinator_tick(self)  # metrics: lease figures, once per poll
        self._finished |= {sid for sid, row in rows.items() if row.finished}
        taken: list[tuple[ShardInfo, Lease]] = []
        for shard_id in sorted(self._shards):
            if self._closing:
                return
            shard = self._shards[shard_id]
            if shard_id in self._slots or shard_id in self._finished:
                continue
            if not self._parents_done(shard, rows):
                continue
            if self.stream.max_leases is not None and len(self._slots) + len(taken) >= self.stream.max_leases:
                break
            row = rows.get(shard_id)
            if row is not None and row.owner not in (None, self.owner_id) and not self.store.is_expired(row):
                continue
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
            taken.append((shard, lease))
        # Readers start concurrently (Ray starts actors about two at a time on 2 cores).
        results = await asyncio.gather(*(self._start_reader(s, lease) for s, lease in taken), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

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
            await asyncio.wait_for(handle.open(), self._call_timeout_s)
            await asyncio.wait_for(handle.start(), self._call_timeout_s)
        except Exception as e:
            handle.kill()
            if isinstance(e, LeaseLostError):
                log.info("shard %s: lease lost while opening", shard.shard_id)
                return
            raise
        slot = _Slot(shard, handle)
        self._slots[shard.shard_id] = slot
        slot.watch = asyncio.create_task(self._watch(slot), name=f"watch-{shard.shard_id}")
        log.info("shard %s: reader started (lease counter %d)", shard.shard_id, lease.counter)

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
        return {"owner_id": self.owner_id, "stream": self.stream.name, "leases_held": len(self._slots),
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

    async def open(self) -> None:
        await self._call("open")

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
