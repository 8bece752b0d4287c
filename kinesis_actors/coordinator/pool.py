"""The reader pool: starts ShardReaders, follows what they report, notices when one dies.

Each reader of the pool is a :class:`PooledReader` in one :class:`ReaderState`::

    STARTING --ping answered--> READY --ActorDiedError / killed--> GONE
        \\                                                         ^
         `--start failed, timed out or cancelled-------------------'

Only READY readers take leases. Which leases a reader holds is not kept here: the
placements are the one source of truth, and the pool asks them (``load``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..backoff import Backoff
from ..load.autoscale import ReaderDemand
from ..load.placement import count_floor
from ..reader import ShardEvent
from ..reader.timers import wait_event, wait_first
from .handles import Launcher, ReaderGone, ReaderHandle, ReaderUnreachable
from .tasks import Sleep, TaskSet

__all__ = ["ReaderState", "PooledReader", "ReaderPool", "pool_size", "pick_reader"]

log = logging.getLogger("kinesis_actors.coordinator")

EVENTS_POLL_S = 5.0  # how long one ``events`` call of a reader waits for news
START_BACKOFF = Backoff(base_s=0.5, cap_s=30.0, floor_s=0.25)  # after a failed reader start
UNREACHABLE_BACKOFF = Backoff(base_s=0.05, cap_s=1.0, floor_s=0.01)  # asking an unreachable reader again


class ReaderState(enum.Enum):
    """The life of one reader of the pool (transitions in the module docstring)."""

    STARTING = "starting"
    READY = "ready"
    GONE = "gone"


TRANSITIONS: Mapping[ReaderState, frozenset[ReaderState]] = {
    ReaderState.STARTING: frozenset({ReaderState.READY, ReaderState.GONE}),
    ReaderState.READY: frozenset({ReaderState.GONE}),
    ReaderState.GONE: frozenset(),
}


@dataclasses.dataclass(eq=False)
class PooledReader:
    """One reader of the pool: its id, its handle (None until launched), its state.

    ``gone`` is set when the state becomes GONE, so opens waiting on it give up at once;
    ``figures`` are the reader's last answered figures (``cpu``, ``pid``, ``node_id``...).
    """

    id: int
    handle: ReaderHandle | None = None
    state: ReaderState = ReaderState.STARTING
    watch: asyncio.Task[None] | None = None
    gone: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    def move(self, to: ReaderState) -> None:
        """Change state along :data:`TRANSITIONS`. Raises AssertionError on any other move."""
        assert to in TRANSITIONS[self.state], f"reader {self.id}: {self.state.name} -> {to.name}"
        self.state = to
        if to is ReaderState.GONE:
            self.gone.set()

    @property
    def ready(self) -> bool:
        """True in state READY."""
        return self.state is ReaderState.READY


def pool_size(leases: int, max_shards_per_reader: int) -> int:
    """Readers the pool keeps for ``leases`` leases: room for all of them with one reader
    to spare, and at least 2, so the leases of any one dead reader fit on the others
    (:func:`~kinesis_actors.load.placement.count_floor`, the floor load placement keeps too)."""
    return count_floor(leases, max_shards_per_reader)


def pick_reader(loads: Mapping[int, int], max_shards_per_reader: int) -> int | None:
    """The reader (id) with the fewest leases that has room for one more (lowest id on a
    tie), or None. ``loads`` maps each READY reader's id to the leases placed on it:
    leases spread evenly over the pool, so losing one reader moves few."""
    room = [(load, rid) for rid, load in loads.items() if load < max_shards_per_reader]
    return min(room)[1] if room else None


class ReaderPool:
    """The readers of one Coordinator (plain asyncio over an injected :data:`Launcher`).

    Args:
        launch: creates reader ``n``.
        max_shards_per_reader: leases one reader holds at most.
        load: leases placed on reader ``id`` now (from the placements).
        on_event: a consumer of a reader ended (what its ``events`` reported).
        on_gone: a READY reader died; its leases need a new home.
        on_ready: a reader became READY (room for waiting leases).
        tasks: where the readers' watches are kept (the pool keeps its reader starts in
            :attr:`starts`, which the close cancels).
        closing: True once the Coordinator closes (its :class:`~.lifecycle.Lifecycle`):
            no reader is started, a reader that answers then is dropped.
        counters: ``reader_start_failures`` and ``readers_replaced`` are counted here.
        clock / sleep: the injected monotonic clock (s) and sleep.
        call_timeout_s: the timeout of each reader call, seconds.
        start_timeout_s: how long a new reader may take to answer, seconds.
        retry_s: the pause after a failed ``events`` call, seconds.
        demand: asks Ray's autoscaler for nodes when no node can hold a reader (None: never);
            a reader is started only once it admits it, so no pending actor waits for a node.
    """

    def __init__(self, *, launch: Launcher, max_shards_per_reader: int, load: Callable[[int], int],
                 on_event: Callable[[PooledReader, ShardEvent], Awaitable[None]],
                 on_gone: Callable[[PooledReader, BaseException], Awaitable[None]],
                 on_ready: Callable[[], None], tasks: TaskSet, closing: Callable[[], bool], counters: dict[str, int],
                 clock: Callable[[], float], sleep: Sleep, call_timeout_s: float, start_timeout_s: float,
                 retry_s: float, demand: ReaderDemand | None = None) -> None:
        self._launch = launch
        self.demand = demand
        self.cap = max_shards_per_reader
        self._load = load
        self._on_event, self._on_gone, self._on_ready = on_event, on_gone, on_ready
        self._tasks, self._closing = tasks, closing
        self.starts = TaskSet(counters)  # the readers starting now
        self.counters = counters
        self._clock, self._sleep = clock, sleep
        self._call_timeout_s, self._start_timeout_s, self._retry_s = call_timeout_s, start_timeout_s, retry_s
        self.readers: dict[int, PooledReader] = {}
        self._ids = itertools.count(1)
        self._backoff_until = 0.0
        self.failures_in_a_row = 0
        self.last_start_error: BaseException | None = None
        self.room = asyncio.Event()  # set when a reader becomes ready or a lease ends
        self.wanted = 0  # readers placement by load wants (the pool keeps at least this many)

    @property
    def closing(self) -> bool:
        """The Coordinator is closing (read from its lifecycle)."""
        return self._closing()

    # ------------------------------------------------------------------ queries
    def ready(self) -> list[PooledReader]:
        """The READY readers."""
        return [r for r in self.readers.values() if r.ready]

    def starting(self) -> int:
        """How many readers are still STARTING."""
        return sum(1 for r in self.readers.values() if r.state is ReaderState.STARTING)

    def loads(self) -> dict[int, int]:
        """Leases placed on each READY reader."""
        return {r.id: self._load(r.id) for r in self.ready()}

    def room_left(self) -> int:
        """Leases the READY readers can still take."""
        return sum(max(0, self.cap - n) for n in self.loads().values())

    def pick(self) -> PooledReader | None:
        """The READY reader a new lease goes to (:func:`pick_reader`), or None when all are full."""
        rid = pick_reader(self.loads(), self.cap)
        return None if rid is None else self.readers[rid]

    # ------------------------------------------------------------------ upkeep
    def size(self, leases: int) -> int:
        """Readers to keep for ``leases``: :func:`pool_size`, or more when load placement wants them."""
        return max(pool_size(leases, self.cap), self.wanted)

    def update(self, leases: int) -> None:
        """Keep the pool at :meth:`size` of ``leases``: start readers in the background
        (after a failed start, once its backoff passed), kill idle READY readers beyond it."""
        if self.closing:
            return
        self.grow(leases)
        target = self.size(leases)
        idle = [r for r in self.ready() if self._load(r.id) == 0]
        for reader in sorted(idle, key=lambda r: -r.id)[:max(0, len(self.readers) - target)]:
            log.info("reader %d idle beyond the pool size (%d); stopping it", reader.id, target)
            self.drop(reader)

    def grow(self, leases: int) -> None:
        """Start readers in parallel until the pool has :meth:`size` of ``leases``."""
        if self.closing or self._clock() < self._backoff_until:
            return
        want = self.size(leases)
        if want > len(self.readers) and self.demand is not None and not self.demand.admit(want):
            return  # no node can hold a reader: asked of the autoscaler, started at a later upkeep
        for _ in range(max(0, want - len(self.readers))):
            reader = PooledReader(next(self._ids))
            self.readers[reader.id] = reader
            self.starts.spawn(self._start(reader), f"reader-{reader.id}")

    def drop(self, reader: PooledReader) -> None:
        """Forget ``reader`` and kill its actor (state GONE)."""
        if reader.watch is not None:
            reader.watch.cancel()
        if reader.state is not ReaderState.GONE:
            reader.move(ReaderState.GONE)
        if reader.handle is not None:
            reader.handle.kill()
        self.readers.pop(reader.id, None)
        if self.demand is not None:
            self.demand.follow(len(self.readers))  # the autoscaler's request shrinks as readers go

    async def _start(self, reader: PooledReader) -> None:
        """Launch ``reader`` and wait until it answers; on failure drop it and back off.

        A reader that has not answered within ``start_timeout_s`` while another reader of
        the pool has is slow (many actors starting at once on a loaded node), not failing:
        it is waited for. Only when no reader answered in that time does it count as failed."""
        try:
            reader.handle = self._launch(reader.id)
            await self._first_answer(reader.handle)
        except asyncio.CancelledError:  # closing while it started
            self.drop(reader)
            raise
        except Exception as e:  # any failure to launch or to answer: logged and counted, retried with backoff
            self.drop(reader)
            self.counters["reader_start_failures"] += 1
            self.failures_in_a_row += 1
            self.last_start_error = e
            pause = START_BACKOFF.delay_s(self.failures_in_a_row)
            self._backoff_until = self._clock() + pause
            log.warning("reader %d failed to start (%r); the pool retries in %.1f s", reader.id, e, pause)
            return
        if self.closing:
            self.drop(reader)
            return
        self.failures_in_a_row = 0
        reader.move(ReaderState.READY)
        reader.watch = self._tasks.spawn(self._watch(reader), f"watch-{reader.id}")
        log.info("reader %d ready (%d in the pool)", reader.id, len(self.readers))
        self.room.set()
        self._on_ready()

    async def _first_answer(self, handle: ReaderHandle) -> None:
        ping = asyncio.ensure_future(handle.ping())
        try:
            while True:
                if await wait_first({ping}, self._start_timeout_s, self._sleep):  # on the injected clock
                    ping.result()  # raises what the ping raised
                    return
                if not self.ready():
                    raise TimeoutError(f"no answer within {self._start_timeout_s} s")
                log.info("a reader is still starting after %.0f s; waiting for it (another answered)",
                         self._start_timeout_s)
        finally:
            if not ping.done():
                ping.cancel()

    async def wait_for_room(self, leases: int, held: int, deadline: float, *, straggler_wait_s: float,
                            fatal_failures: int) -> None:
        """First pass: wait until the READY readers have room for ``leases`` more and the
        readers started with them are READY too (so leases spread over the whole pool), but
        for stragglers at most ``straggler_wait_s`` once there is room. Gives up at
        ``deadline`` (injected clock) or after ``fatal_failures`` failed starts in a row."""
        room_since: float | None = None
        while self._clock() < deadline and not self.closing and self.failures_in_a_row < fatal_failures:
            if self.room_left() >= leases:
                room_since = self._clock() if room_since is None else room_since
                if not self.starting() or self._clock() - room_since >= straggler_wait_s:
                    return
            self.room.clear()
            self.grow(held + leases)
            await wait_event(self.room, min(0.5, max(0.0, deadline - self._clock())), self._sleep)

    # ------------------------------------------------------------------ reports
    async def _watch(self, reader: PooledReader) -> None:
        """Follow one reader: hand what its consumers report to ``on_event``; ``on_gone`` if it dies."""
        handle = reader.handle
        assert handle is not None
        unreachable = 0
        while not self.closing:
            try:
                events = await asyncio.wait_for(handle.events(EVENTS_POLL_S), EVENTS_POLL_S + self._call_timeout_s)
            except ReaderUnreachable:
                # Ray says "maybe back" first while it learns whether the process died: ask
                # again soon (a dead reader's leases wait for the answer), then less often.
                unreachable += 1
                await self._sleep(min(UNREACHABLE_BACKOFF.delay_s(unreachable), self._retry_s))
                continue
            except ReaderGone as e:
                if not self.closing:
                    await self.died(reader, e)
                return
            except asyncio.TimeoutError as e:  # a slow answer: ask again
                log.info("reader %d: events call failed (%r); retrying", reader.id, e)
                await self._sleep(self._retry_s)
                continue
            unreachable = 0
            for event in events:
                await self._on_event(reader, event)

    async def died(self, reader: PooledReader, why: BaseException) -> None:
        """``reader`` is dead: drop it, count it, let ``on_gone`` re-home its leases."""
        watch, reader.watch = reader.watch, None  # this may run inside the watch: do not cancel it
        self.drop(reader)
        reader.watch = watch
        self.counters["readers_replaced"] += 1
        log.warning("reader %d died (%s)", reader.id, why)
        await self._on_gone(reader, why)

    def handles(self) -> dict[int, Any]:
        """Each launched reader's handle, by reader id."""
        return {r.id: r.handle for r in self.readers.values() if r.handle is not None}
