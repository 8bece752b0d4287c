"""Placements: which reader each lease this instance holds lives on (place, re-home, open).

A lease is held by exactly one :class:`Held` from its take until its reader reports how
it ended, so no lease poll takes it a second time while it moves. Each is in one
:class:`HeldState`::

    taken --room--> OPENING --add answered "processing"--> OPEN
      |                ^                                     |
      | no room        | re-taken under our owner id         | its reader died
      v                |                                     v
    WAITING --room--> PLACING <------------------------ WAITING
        ^                 |
        `-----------------' re-take failed, or its new reader died too

    any state --the reader reported how the consumer ended / no longer ours--> (forgotten)

WAITING has no reader; PLACING, OPENING and OPEN have one, and that is the only record
of which leases a reader holds (:meth:`Placements.load`): nothing else is kept in step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..kinesis import ShardInfo
from ..leases.protocol import Lease
from ..reader import ConsumerState, ReaderSpec, ShardEvent
from .handles import ReaderGone, ReaderHandle, ReaderUnreachable
from .poll import PollOutcome
from .pool import PooledReader, ReaderPool
from .tasks import TaskSet

__all__ = ["HeldState", "Held", "Placements"]

log = logging.getLogger("kinesis_actors.coordinator")

_RETAKES = 3  # a write of the old reader's loop may race a re-take: read the row again this often


class HeldState(enum.Enum):
    """Where one held lease is (transitions in the module docstring)."""

    WAITING = "waiting"
    PLACING = "placing"
    OPENING = "opening"
    OPEN = "open"


TRANSITIONS: Mapping[HeldState, frozenset[HeldState]] = {
    HeldState.WAITING: frozenset({HeldState.PLACING, HeldState.OPENING}),
    HeldState.PLACING: frozenset({HeldState.OPENING, HeldState.WAITING}),
    HeldState.OPENING: frozenset({HeldState.OPEN, HeldState.WAITING}),
    HeldState.OPEN: frozenset({HeldState.WAITING}),
}


@dataclasses.dataclass(eq=False)
class Held:
    """One lease this instance holds.

    Attributes:
        shard: the shard.
        state: its :class:`HeldState`.
        reader: the reader it is placed on (None exactly in WAITING).
        lease: the lease to open (from the last take), None once opened.
        taken_at: when the take that produced ``lease`` was sent (injected clock, seconds).
    """

    shard: ShardInfo
    state: HeldState = HeldState.WAITING
    reader: PooledReader | None = None
    lease: Lease | None = None
    taken_at: float = 0.0

    def move(self, to: HeldState, reader: PooledReader | None = None) -> None:
        """Change state along :data:`TRANSITIONS`; ``reader`` is kept outside WAITING only."""
        assert to in TRANSITIONS[self.state], f"shard {self.shard.shard_id}: {self.state.name} -> {to.name}"
        self.state = to
        if to is HeldState.WAITING:
            self.reader = None
        elif reader is not None:
            self.reader = reader


class Placements:
    """The leases this instance holds and the reader each is on.

    Args:
        pool: the reader pool (rooms and readers).
        take: re-takes a shard's row under our owner id (None: not ours to take).
        io: runs a blocking store call in the Coordinator's threads.
        store: the lease store (``get`` and ``release``).
        stream: the stream name.
        owner_id: our owner id.
        spec: the ReaderSpec of a shard.
        on_finished: a shard's row says ``SHARD_END``.
        closing: True once the Coordinator closes (its :class:`~.lifecycle.Lifecycle`):
            no waiting lease is placed any more.
        counters / clock: counters (``shards_rehomed``, ``task_errors``), the injected clock.
        call_timeout_s: how long an open waits for the reader, seconds (by default).
    """

    def __init__(self, *, pool: ReaderPool, take: Callable[[str], Awaitable[Lease | None]],
                 io: Callable[..., Awaitable[Any]], store: Any, stream: str, owner_id: str,
                 spec: Callable[[ShardInfo], ReaderSpec], on_finished: Callable[[str], None],
                 closing: Callable[[], bool], counters: dict[str, int], clock: Callable[[], float],
                 call_timeout_s: float) -> None:
        self._pool, self._take, self._io, self._store = pool, take, io, store
        self._stream, self._owner = stream, owner_id
        self._spec, self._on_finished = spec, on_finished
        self._closing, self.counters, self._clock = closing, counters, clock
        self.opens = TaskSet(counters)  # opens, placing rounds and moves under way (the close lets them land)
        self._call_timeout_s = call_timeout_s
        self.held: dict[str, Held] = {}

    @property
    def closing(self) -> bool:
        """The Coordinator is closing (read from its lifecycle)."""
        return self._closing()

    # ------------------------------------------------------------------ queries
    def load(self, reader_id: int) -> int:
        """Leases placed on reader ``reader_id`` (PLACING, OPENING or OPEN there)."""
        return sum(1 for h in self.held.values() if h.reader is not None and h.reader.id == reader_id)

    def in_state(self, state: HeldState) -> list[Held]:
        """The held leases in ``state``."""
        return [h for h in self.held.values() if h.state is state]

    def handle_of(self, shard_id: str, *, open_only: bool = False) -> ReaderHandle | None:
        """The handle of the reader ``shard_id`` is placed on (only when OPEN with ``open_only``)."""
        held = self.held.get(shard_id)
        if held is None or held.reader is None or (open_only and held.state is not HeldState.OPEN):
            return None
        return held.reader.handle

    # ------------------------------------------------------------------ place and open
    def track(self, shard: ShardInfo, lease: Lease, taken_at: float) -> Held:
        """Hold a freshly taken lease: placed on the reader with most room at once (OPENING;
        the caller opens it with :meth:`open`), or WAITING when no reader has room."""
        held = self.held[shard.shard_id] = Held(shard, lease=lease, taken_at=taken_at)
        reader = self._pool.pick()
        if reader is not None:
            held.move(HeldState.OPENING, reader)
        return held

    async def open(self, held: Held, *, timeout_s: float | None = None) -> ShardEvent | None:
        """Open ``held.lease`` on its reader; returns what the reader said, or None when the
        reader died or did not answer within ``timeout_s`` (default ``call_timeout_s``):
        its watch then re-homes the lease or reports how the consumer ended."""
        reader, lease = held.reader, held.lease
        if reader is None or reader.handle is None or lease is None or held.state is not HeldState.OPENING:
            return None  # its reader died meanwhile: it waits for a new one
        shard_id = held.shard.shard_id
        add = asyncio.ensure_future(reader.handle.add(self._spec(held.shard), lease,
                                                      lease_age_s=max(0.0, self._clock() - held.taken_at)))
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
        if ConsumerState(event.state) is ConsumerState.PROCESSING and held.state is HeldState.OPENING \
                and held.reader is reader:
            held.move(HeldState.OPEN)
            held.lease = None
            log.debug("shard %s: open on reader %d (lease counter %d)", shard_id, reader.id, lease.counter)
        return event

    def update(self) -> None:
        """Place the WAITING leases on readers with room, in the background (rounds may
        overlap: each moves the leases it places out of WAITING before any await)."""
        if not self.closing and self.in_state(HeldState.WAITING):
            self.opens.spawn(self.place_waiting(), "place")

    async def place_waiting(self) -> None:
        """Re-take and open every WAITING lease on readers with room (PLACING, then OPENING)."""
        placing = []
        for held in self.in_state(HeldState.WAITING):
            reader = self._pool.pick()
            if reader is None:
                break  # no room yet: placed when a reader becomes ready
            held.move(HeldState.PLACING, reader)  # the room is ours before any await
            placing.append(held)
        await asyncio.gather(*(self._rehome(h) for h in placing))

    async def _rehome(self, held: Held, *, moved: bool = False) -> None:
        """Re-take ``held``'s row under this owner (the counter rises: the old loops are
        fenced) and open it on the reader it was placed on. If that reader dies meanwhile,
        the lease is WAITING again and placed again at once. Counted in ``shards_moved``
        for a move by load (``moved``), else in ``shards_rehomed``."""
        shard_id, reader = held.shard.shard_id, held.reader
        try:
            held.taken_at = self._clock()
            lease = await self._retake(shard_id)
            if lease is None or lease.finished:
                log.info("shard %s: no longer ours to re-home", shard_id)
                self.forget(held)
                if lease is not None:
                    self._on_finished(shard_id)
                    await self._io(self._store.release, lease)
                return
            if held.state is HeldState.PLACING and held.reader is reader:
                self.counters["shards_moved" if moved else "shards_rehomed"] += 1
                held.lease = lease
                held.move(HeldState.OPENING)
                await self.open(held)
        except Exception as e:  # a lease-store error (throttled, unreachable): logged, counted, placed again
            self.counters["store_errors"] = self.counters.get("store_errors", 0) + 1
            log.warning("shard %s: re-homing failed (%r); placed again", shard_id, e)
            if self.held.get(shard_id) is held and held.state is HeldState.PLACING:
                held.move(HeldState.WAITING)
        if self.held.get(shard_id) is held and held.state is HeldState.WAITING and not self.closing:
            log.info("shard %s: its new reader is gone or the re-take failed; placing it again", shard_id)
            self.opens.spawn(self.place_waiting(), "place")

    async def _retake(self, shard_id: str) -> Lease | None:
        for _ in range(_RETAKES):
            lease = await self._take(shard_id)
            if lease is not None:
                return lease
            row = await self._io(self._store.get, self._stream, shard_id)
            if row is None or row.owner != self._owner:
                return None
        return None

    async def move(self, shard_id: str, source_id: int, target_id: int, *, grace_s: float) -> bool:
        """Move an OPEN lease from reader ``source_id`` to READY reader ``target_id`` (a graceful
        handoff inside the instance): the lease is placed on the target first (PLACING, so no
        other round places it and the source's report of the ending is stale), the source's
        consumer stops without releasing (it finishes the batch in flight within ``grace_s``
        and checkpoints what was acknowledged), then the row is re-taken under our owner id
        (the counter rises) and opened on the target after that checkpoint. False when the
        lease is not OPEN on the source, or the target is not READY."""
        held, target = self.held.get(shard_id), self._pool.readers.get(target_id)
        source = held.reader if held is not None else None
        if (held is None or source is None or source.id != source_id or held.state is not HeldState.OPEN
                or target is None or not target.ready or self.closing or source.handle is None):
            return False
        held.move(HeldState.WAITING)
        held.move(HeldState.PLACING, target)
        self.counters.setdefault("shards_moved", 0)
        try:
            await asyncio.wait_for(source.handle.stop(shard_id, False, grace_s), grace_s + self._call_timeout_s)
        except (ReaderGone, ReaderUnreachable, asyncio.TimeoutError) as e:  # the re-take fences what is left
            log.info("shard %s: reader %d did not confirm the stop (%r); re-taking it", shard_id, source.id, e)
        log.info("shard %s: moving from reader %d to reader %d", shard_id, source.id, target.id)
        await self._rehome(held, moved=True)
        return True

    # ------------------------------------------------------------------ endings
    def reader_gone(self, reader: PooledReader) -> list[str]:
        """Every lease placed on ``reader`` goes back to WAITING; returns their shard ids."""
        moved = sorted(sid for sid, h in self.held.items() if h.reader is reader)
        for sid in moved:
            self.held[sid].move(HeldState.WAITING)
        return moved

    def ended(self, reader: PooledReader, shard_id: str) -> bool:
        """The consumer of ``shard_id`` on ``reader`` ended: forget the lease. False when the
        report is stale (the lease moved to another reader already)."""
        held = self.held.get(shard_id)
        if held is None or held.reader is not reader:
            return False
        self.forget(held)
        return True

    def forget(self, held: Held) -> None:
        """Stop holding ``held`` (its place is free at once)."""
        if self.held.get(held.shard.shard_id) is held:
            del self.held[held.shard.shard_id]
        self._pool.room.set()

    async def open_first_pass(self, opens: list[Held], *, news: int, no_room: int, deadline: float) -> PollOutcome:
        """The first pass: open ``opens`` and wait for them until ``deadline`` (injected clock);
        say how many opened and why not the others. Opens still under way at the deadline
        go on in kept tasks.

        Args:
            opens: the held leases to open (state ``OPENING``).
            news: leases the poll took; no_room: leases it wanted but had no room for.
            deadline: the first pass's deadline, seconds on the injected clock.

        Raises:
            The first fatal error a reader reported on open (a ``KinesisError``), or an open's own error.
        """
        budget = max(self._call_timeout_s, deadline - self._clock())
        tasks = [asyncio.ensure_future(self.open(h, timeout_s=budget)) for h in opens]
        done, _ = await asyncio.wait(tasks, timeout=max(0.0, deadline - self._clock())) if tasks else (set(), set())
        for task in tasks:
            if task not in done:
                self.opens.keep(task)
        events = [t.result() for t in done if t.exception() is None]
        failures = [t.exception() for t in done if t.exception() is not None]
        unconfirmed = sum(1 for e in events if e is None)
        states = [(ConsumerState(e.state), e.error) for e in events if e is not None]
        opened = sum(1 for s, _ in states if s is ConsumerState.PROCESSING)
        ended = sum(1 for s, err in states if s is not ConsumerState.PROCESSING and err is None)
        failed = [err for _, err in states if err is not None] + failures
        if failed:
            raise failed[0]  # type: ignore[misc]
        without_reader = no_room + news - len(opens)
        return PollOutcome(wanted=news - ended + no_room, opened=opened,
                           why=_why_not_open(self._pool, self.counters, len(tasks) - len(done) + unconfirmed,
                                             without_reader))


def _why_not_open(pool: ReaderPool, counters: dict[str, int], still_opening: int, without_reader: int) -> str:
    parts = []
    if without_reader:
        parts.append(f"{without_reader} leases had no room: {pool.starting()} readers still starting")
    if pool.last_start_error is not None:
        parts.append(f"{counters['reader_start_failures']} reader starts failed, the last with "
                     f"{pool.last_start_error!r:.300}")
    if still_opening:
        parts.append(f"{still_opening} shards still opening (GetShardIterator or the lease table slow)")
    return "; ".join(parts) or "no reason recorded"
