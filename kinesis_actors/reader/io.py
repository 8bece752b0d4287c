"""Where the blocking calls of one reader process run: the thread pools (:class:`ReaderIo`) and
the Kinesis call limit (:class:`CallLimit`). The byte budget the consumers share is
:class:`~.reading.ByteBudget`."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ..clock import monotonic_s
from ..config import DEFAULT_MAX_SHARDS_PER_READER
from .spec import DEFAULT_THREADS, Sleep
from .timers import wait_first

__all__ = ["CallLimit", "ReaderIo", "ToThreadIo", "STUCK_CALL_S"]

log = logging.getLogger("kinesis_actors.reader")
T = TypeVar("T")


STUCK_CALL_S = 1.0
"""A Kinesis call in flight longer than this, seconds, no longer counts against :class:`CallLimit`."""


@dataclasses.dataclass(eq=False)
class _Call:
    """One Kinesis call admitted by :class:`CallLimit`: when, for which shard, and whether it counts."""

    started: float
    key: str | None
    counted: bool


class CallLimit:
    """How many Kinesis calls of one process may be in flight: AIMD on lease-renewal latency,
    where a stuck call holds its own shard's slot only.

    Renewals keep leases; polls only move data. When the service (or an emulator that
    serves Kinesis and DynamoDB on the same cores) cannot keep up with both, the renewals
    must not wait behind the polls. So every renewal reports its latency: one slower than
    a third of the renew interval halves the limit (at most once per third of an
    interval); one faster than a tenth of it raises the limit by ``1 / limit`` (additive
    increase, about +1 per window of calls), up to ``maximum``. Against AWS, renewals take
    milliseconds and the limit stays at its maximum.

    A call that stays in flight longer than ``stuck_after_s`` (a ``GetRecords`` hung until
    its socket timeout) stops counting, and its shard's (``key``'s) next calls run outside
    the limit until one of them returns within ``stuck_after_s``: a hung call puts no
    load on the service, and each shard has one call in flight at most, so a stuck shard
    never holds up another, however low the limit.

    Args:
        maximum: the most calls in flight (the pool's threads). minimum: the fewest.
        stuck_after_s: seconds after which a call in flight no longer counts.
        clock: monotonic seconds. sleep: ``async sleep(seconds)`` on that clock.
    """

    def __init__(self, maximum: int, *, minimum: int = 1, stuck_after_s: float = STUCK_CALL_S,
                 clock: Callable[[], float] = monotonic_s,
                 sleep: Sleep = asyncio.sleep) -> None:
        self.maximum = maximum
        self.minimum = minimum
        self.stuck_after_s = stuck_after_s
        self.limit = float(maximum)
        self.cuts = 0
        self._clock = clock
        self._sleep = sleep
        self._last_cut = float("-inf")
        self._calls: set[_Call] = set()
        self._slow: set[str] = set()  # shards whose last call outlived stuck_after_s: outside the limit
        self._queue: collections.deque[tuple[asyncio.Future[_Call], str | None]] = collections.deque()

    @property
    def in_flight(self) -> int:
        """Calls in flight that count against the limit (admitted, younger than ``stuck_after_s``)."""
        now = self._clock()
        return sum(1 for c in self._calls if c.counted and now - c.started < self.stuck_after_s)

    @property
    def outside_limit(self) -> frozenset[str]:
        """The shards whose last call outlived ``stuck_after_s``: their calls run outside the limit."""
        return frozenset(self._slow)

    @property
    def queued(self) -> int:
        """Calls waiting for a place."""
        return sum(1 for future, _ in self._queue if not future.done())

    def _admit(self, key: str | None) -> _Call:
        call = _Call(self._clock(), key, counted=True)
        self._calls.add(call)
        return call

    def _grant(self) -> None:
        """Admit the waiters at the head of the queue, in arrival order, while places are free."""
        while self._queue and self.in_flight < int(self.limit):
            future, key = self._queue.popleft()
            if not future.done():  # a cancelled wait is leaving
                future.set_result(self._admit(key))

    def _next_stuck_in(self) -> float:
        """Seconds until the oldest counted call turns stuck (its place then frees)."""
        now = self._clock()
        due = min((c.started + self.stuck_after_s - now for c in self._calls if c.counted), default=self.stuck_after_s)
        return max(0.0, due) + 1e-3

    async def acquire(self, key: str | None = None) -> _Call:
        """Wait for a place, then take it; returns the token :meth:`release` takes.

        Waiters are admitted in arrival order (a call that arrives while others wait queues
        behind them), so no shard starves behind shards that poll again and again.
        ``key``: the shard the call is for (a shard whose last call was stuck waits for no place).
        """
        if key is not None and key in self._slow:
            call = _Call(self._clock(), key, counted=False)
            self._calls.add(call)
            return call
        if not self._queue and self.in_flight < int(self.limit):
            return self._admit(key)
        future: asyncio.Future[_Call] = asyncio.get_running_loop().create_future()
        entry = (future, key)
        self._queue.append(entry)
        self._grant()
        try:
            while not future.done():
                await wait_first({future}, self._next_stuck_in(), self._sleep)
                self._grant()  # a counted call may have turned stuck: its place is free
        except BaseException:
            if future.done() and not future.cancelled():  # admitted, but nobody will call
                self.release(future.result())
            else:
                future.cancel()
                with contextlib.suppress(ValueError):
                    self._queue.remove(entry)
                self._grant()
            raise
        return future.result()

    def release(self, call: _Call) -> None:
        """Give a place back: the call ended (returned or raised)."""
        self._calls.discard(call)
        if call.key is not None:
            if self._clock() - call.started >= self.stuck_after_s:
                self._slow.add(call.key)
            else:
                self._slow.discard(call.key)
        self._grant()

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
            self._grant()


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
        clock, sleep: monotonic seconds and ``async sleep`` on them (for :class:`CallLimit`).
    """

    def __init__(self, *, kinesis_threads: int = DEFAULT_THREADS, store_threads: int = DEFAULT_THREADS,
                 stream_threads: int = DEFAULT_MAX_SHARDS_PER_READER, clock: Callable[[], float] = monotonic_s,
                 sleep: Sleep = asyncio.sleep) -> None:
        self.kinesis_threads = kinesis_threads
        self.store_threads = store_threads
        self.limit = CallLimit(kinesis_threads, clock=clock, sleep=sleep)
        self._kinesis = concurrent.futures.ThreadPoolExecutor(kinesis_threads, thread_name_prefix="ka-kinesis")
        self._store = concurrent.futures.ThreadPoolExecutor(store_threads, thread_name_prefix="ka-store")
        self._streams = concurrent.futures.ThreadPoolExecutor(stream_threads, thread_name_prefix="ka-subscription")

    async def kinesis(self, fn: Callable[..., T], *args: Any, limited: bool = True, shard: str | None = None) -> T:
        """Run ``fn(*args)`` (a Kinesis call) in the Kinesis pool, within :attr:`limit` unless
        ``limited=False`` (opening a shard: once per lease, not a recurring poll). ``shard``:
        the shard the call is for (see :class:`CallLimit`: a stuck call holds that shard only)."""
        if not limited:
            return await asyncio.get_running_loop().run_in_executor(self._kinesis, fn, *args)
        call = await self.limit.acquire(shard)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._kinesis, fn, *args)
        finally:
            self.limit.release(call)

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


class ToThreadIo:
    """:class:`ReaderIo`'s interface over ``asyncio.to_thread`` (a consumer used on its own, in tests):
    no call limit, no pools of its own."""

    async def kinesis(self, fn: Callable[..., T], *args: Any, limited: bool = True, shard: str | None = None) -> T:
        return await asyncio.to_thread(fn, *args)

    async def store(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def stream(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        pass
