"""One consumer's fetches and the bytes they hold: :class:`Reading` and the process's :class:`ByteBudget`.

Fetched records wait for their acknowledgement inside the process's :class:`ByteBudget`: a
fetch reserves room before it calls AWS, its answer turns the reservation into what it
holds, and :meth:`Reading.give_back` returns the bytes once the records are acknowledged
or dropped. A step runs where its :class:`~.fetcher.Fetcher` says
(:attr:`~.fetcher.Fetcher.io_kind`): a poll within the process's call limit, an open
outside it, a subscription read in the subscription pool.

:class:`Reading` holds at most one fetch of the shard in flight as an asyncio task
(:meth:`Reading.start`), so the shard's next response is read while the current one is
delivered, as KCL's prefetching retriever does (one response ahead). A fetch nothing
overlaps (an idle shard's poll) runs inline, without a task (:meth:`Reading.next`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..clock import monotonic_s
from ..errors import InvalidError
from ..kinesis import GET_RECORDS_MAX_BYTES, Fetched
from .fetcher import Fetcher
from .lease import LeaseKeeper
from .spec import ReaderSpec, Sleep
from .timers import wait_first

if TYPE_CHECKING:
    from .io import ReaderIo, ToThreadIo

__all__ = ["Reading", "ByteBudget", "FANOUT_BUDGET_DROP_S"]

FANOUT_BUDGET_DROP_S = 1.0
"""How long an enhanced fan-out loop waits on a full byte budget with its subscription open
before it drops the subscription, seconds (it resubscribes once the budget admits it)."""


class Reading:
    """The fetch side of one consumer (see the module docstring).

    Args:
        spec: the consumer's spec. io: the process's pools. budget: its byte budget or None.
        keeper: the consumer's lease keeper (a call in flight is tracked there for liveness).
        stats: the consumer's stats (the fetcher's counters land there).
        clock, sleep: the injected clock and ``async sleep``.
        interrupted: True once the consumer stops or seeks: pacing ends early, and a fetch
            not yet calling AWS returns None.
        alive: the consumer's heartbeat, called while it waits.
        prepare: run on each answer in a pool thread after the call, outside the call limit
            (see :meth:`step`), or None.
    """

    def __init__(self, spec: ReaderSpec, io: ReaderIo | ToThreadIo, budget: ByteBudget | None,
                 keeper: LeaseKeeper, stats: dict[str, Any], *, clock: Callable[[], float] = monotonic_s,
                 sleep: Sleep, interrupted: Callable[[], bool], alive: Callable[[], None],
                 prepare: Callable[[Fetched], object] | None = None) -> None:
        self.spec = spec
        self._io = io
        self._budget = budget
        self._keeper = keeper
        self._stats = stats
        self._clock = clock
        self._sleep = sleep
        self._interrupted = interrupted
        self._alive = alive
        self._prepare = prepare
        self._beat_s = max(0.05, spec.renew_interval_s / 2)
        self.fetcher: Fetcher | None = None
        self.held_bytes = 0  # budget bytes of records fetched and not yet acknowledged
        self.task: asyncio.Task[Fetched | None] | None = None  # the fetch in flight, if any
        self._call: list[float] | None = None  # the step's call: [] while queued, [start] once running
        self._lock = threading.Lock()
        self._abandoned = False

    # ------------------------------------------------------------ the fetch ahead
    def start(self) -> None:
        """Start the next fetch as a task unless one is in flight."""
        if self.task is None:
            self.task = asyncio.create_task(self._fetch(), name=f"fetch-{self.spec.shard_id}")

    def take(self) -> Fetched | None:
        """The answer of the fetch in flight once it ended (None while in flight, with none,
        or nothing to deliver).

        Raises:
            What the fetch raised (``KinesisError``, ``LeaseLostError``).
        """
        task = self.task
        if task is None or not task.done():
            return None
        self.task = None
        return task.result()

    async def next(self) -> Fetched | None:
        """The answer of the fetch in flight once it ends, else of a fetch made now, inline.

        Raises:
            What the fetch raised (``KinesisError``, ``LeaseLostError``).
        """
        task = self.task
        if task is None:
            return await self._fetch()
        try:
            return await task
        finally:
            if task.done():
                self.task = None

    async def end(self, *, wait_for_call: bool = True) -> None:
        """Drop the fetch in flight (a stop, a seek, the loop's end). It is cancelled while it
        is paced, waits for the byte budget (which the caller, waiting here, might never
        free) or is queued for a thread; a call already running in its thread is waited for
        (``wait_for_call``: a seek must not race the fetcher) or left to end on its own. Its
        records are dropped; their bytes go back with the rest (:meth:`give_back`)."""
        task, self.task = self.task, None
        if task is None:
            return
        if not task.done() and (self._abandon() or not wait_for_call):
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    def _abandon(self) -> bool:
        """Make sure a pending fetch no longer touches the fetcher, so its task may be
        cancelled. True if no call runs: one queued for a thread now returns None without
        calling AWS. False if a call already runs in its thread (it cannot be cancelled
        there; it ends within its socket timeout)."""
        with self._lock:
            if self._call:
                return False
            self._abandoned = True
            return True

    # ------------------------------------------------------------ one fetch
    def close(self) -> None:
        """End the fetcher's connection now (from any thread)."""
        if self.fetcher is not None:
            self.fetcher.close()

    async def pace(self, until: Callable[[], bool]) -> None:
        """Wait until the fetcher's next step is due (alive); ends early once ``until()``."""
        fetcher = self.fetcher
        if fetcher is None:
            return
        end = self._clock() + fetcher.due_in()
        while (left := end - self._clock()) > 0 and not until():
            await self._sleep(min(left, self._beat_s))
            self._alive()

    async def _fetch(self) -> Fetched | None:
        """One step of the fetcher, paced, within the byte budget; None if nothing to
        deliver (or interrupted before the call)."""
        fetcher = self.fetcher
        assert fetcher is not None
        await self.pace(self._interrupted)
        if self._interrupted():
            return None
        amount = fetcher.reserve_bytes
        reserved = fetcher.has_iterator and await self._reserve(amount)
        got: Fetched | None = None
        try:
            got = await self.step(self._prepare)
        finally:
            if reserved and self._budget is not None:
                nbytes = got.bytes if got is not None else 0
                self._budget.settle(nbytes, amount)
                self.held_bytes += nbytes
        return got

    async def step(self, prepare: Callable[[Fetched], object] | None = None) -> Fetched | None:
        """One fetcher step (one AWS call) where the fetcher says it runs. Waiting for a place
        in the pool is not silence (other loops hold it); the call itself is, from when its
        thread starts it: it must end within its socket timeout.

        ``prepare(answer)``, if given, runs in a pool thread after the call, outside the call
        limit (its slot is free again, and the work is not counted as call time by the stuck
        detection): per-record work the caller would otherwise do on the event loop, where
        one shard's 10,000-record response blocks every shard of the process for its duration
        (in a thread the interpreter hands the GIL back to the loop every switch interval)."""
        fetcher = self.fetcher
        assert fetcher is not None
        started: list[float] = []  # set by the pool's thread when the call begins

        def call() -> Fetched | None:
            with self._lock:
                if self._abandoned:
                    return None
                started.append(self._clock())
            return fetcher.step()

        self._abandoned = False
        self._keeper.call_started = self._call = started
        try:
            kind = fetcher.io_kind
            if kind == "stream":
                got = await self._io.stream(call)
            else:
                got = await self._io.kinesis(call, limited=kind == "poll", shard=self.spec.shard_id)
            if got is not None and prepare is not None:
                await self._io.kinesis(prepare, got, limited=False)
            return got
        finally:
            self._keeper.call_started = self._call = None
            self._keeper.alive()
            self._stats.update(fetcher.counters())

    async def _reserve(self, amount: int | None) -> bool:
        """Wait (alive) until the byte budget admits one more step of ``amount`` bytes; True
        once reserved. A fetcher holding a connection drops it after :data:`FANOUT_BUDGET_DROP_S`."""
        budget = self._budget
        if budget is None:
            return False
        if budget.try_reserve(amount):
            return True
        since = self._clock()

        def tick() -> None:
            self._alive()
            fetcher = self.fetcher
            if fetcher is not None and fetcher.has_iterator and self._clock() - since >= FANOUT_BUDGET_DROP_S \
                    and fetcher.pause():
                self._stats["budget_drops"] = self._stats.get("budget_drops", 0) + 1

        await budget.reserve(amount, heartbeat_s=max(0.05, min(self.spec.renew_interval_s / 2, FANOUT_BUDGET_DROP_S)),
                             tick=tick)
        self._alive()
        return True

    def give_back(self, nbytes: int | None = None) -> None:
        """``nbytes`` (default: all held) of fetched records were acknowledged or dropped;
        at most what is held is given back (a response fetched without a budget, or before
        a seek that gave everything back, holds none)."""
        nbytes = self.held_bytes if nbytes is None else min(nbytes, self.held_bytes)
        if nbytes and self._budget is not None:
            self._budget.release(nbytes)
        self.held_bytes -= nbytes


class ByteBudget:
    """Bytes of fetched, unacknowledged records in one reader process, bounded.

    A fetch reserves the most one ``GetRecords`` response can carry (``max_response``,
    10 MiB on AWS) before it starts; its answer turns the reservation into what it
    really holds; acknowledging (or dropping) the records gives the bytes back. A fetch
    is admitted while ``used + reserved + max_response <= limit``, or, when nothing is in
    flight, while ``used < limit``. Hence ``used + reserved`` never exceeds ``limit +
    max_response``: the budget plus one response, whatever the number of shards
    (compare KCL's ``maxByteSize``, which bounds each shard's prefetch queue instead).

    Fetches that find no room queue in arrival order and are granted room in that order:
    bytes given back reserve room for the waiters at the head of the queue (as many as the
    room admits) before they run, so a fetch that arrives later, or a fetcher that has
    just come back from the tip, never takes the room a queued fetch was waiting for.
    A shard therefore waits for at most the fetches queued before it, however many
    shards poll at the tip (with a waiter that re-queued at each heartbeat, shards that
    had not fetched yet could starve behind those cycling at the tip).

    Bytes are counted as :attr:`RecordBatch.nbytes <kinesis_actors.batch.RecordBatch.nbytes>`
    (the response's buffers: payloads, partition keys, sequence numbers, offsets, arrival
    times), not Python object overhead (``bench`` section ``scale`` reports the readers' USS).

    Args:
        limit: the budget, bytes (> 0).
        max_response: the largest response one fetch may bring, bytes.
        sleep: ``async sleep`` on the injected clock (the heartbeat of :meth:`reserve`).

    Raises:
        InvalidError: ``limit`` is not a positive int.
    """

    def __init__(self, limit: int, *, max_response: int = GET_RECORDS_MAX_BYTES, sleep: Sleep = asyncio.sleep) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise InvalidError(f"max_buffered_bytes must be a positive int, got {limit!r}")
        self.limit = limit
        self.max_response = max_response
        self.used = 0
        self.reserved = 0
        self.peak = 0  # most bytes held at once
        self.waits = 0
        self._sleep = sleep
        self._waiters: collections.deque[tuple[asyncio.Future[None], int]] = collections.deque()

    def _admits(self, amount: int, reserved: int) -> bool:
        return self.used + reserved + amount <= self.limit or (reserved == 0 and self.used < self.limit)

    def try_reserve(self, amount: int | None = None) -> bool:
        """Reserve room for one fetch at once if nobody is queued and the rule above admits
        it; True if it did. ``amount``: the most this fetch may bring, bytes (default
        ``max_response``)."""
        amount = self.max_response if amount is None else amount
        if not self._waiters and self._admits(amount, self.reserved):
            self.reserved += amount
            return True
        return False

    async def reserve(self, amount: int | None = None, *, heartbeat_s: float | None = None,
                      tick: Callable[[], None] = lambda: None) -> None:
        """Reserve room for one fetch of ``amount`` bytes (default ``max_response``), queueing
        in arrival order until it is granted.

        While queued, ``tick()`` is called every ``heartbeat_s`` seconds on the injected
        clock (None: never); the wait keeps its place in the queue across ticks. Cancelled
        (or ``tick`` raising), the wait leaves the queue, and room granted in the meantime
        is given back to the next waiter.
        """
        amount = self.max_response if amount is None else amount
        if self.try_reserve(amount):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (future, amount)
        self._waiters.append(entry)
        self.waits += 1
        self._grant()
        try:
            while not future.done():
                await wait_first({future}, heartbeat_s, self._sleep)
                if not future.done():
                    tick()
        except BaseException:
            if future.done() and not future.cancelled():  # granted, but nobody will fetch with it
                self.reserved -= amount
                self._grant()
            else:
                future.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._grant()  # a waiter behind this one may fit now
            raise

    @property
    def queued(self) -> int:
        """Fetches waiting for room."""
        return sum(1 for future, _ in self._waiters if not future.done())

    def _grant(self) -> None:
        """Reserve room for the waiters at the head of the queue, in arrival order, while the
        rule admits them; each granted waiter is woken with its room already reserved."""
        while self._waiters:
            future, amount = self._waiters[0]
            if future.done():  # cancelled: its reserve() is leaving
                self._waiters.popleft()
                continue
            if not self._admits(amount, self.reserved):
                return
            self._waiters.popleft()
            self.reserved += amount
            future.set_result(None)

    def settle(self, nbytes: int, amount: int | None = None) -> None:
        """A fetch that reserved ``amount`` (default ``max_response``) returned ``nbytes``
        bytes of records (0 if it failed): now held."""
        amount = self.max_response if amount is None else amount
        self.reserved -= amount
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        if nbytes < amount:
            self._grant()

    def release(self, nbytes: int) -> None:
        """``nbytes`` of held records were acknowledged or dropped."""
        if nbytes:
            self.used -= nbytes
            self._grant()
