"""One consumer's read path: pacing, the byte budget and where each fetcher step runs.

Fetched records wait for their acknowledgement inside the process's
:class:`~.io.ByteBudget`: a step reserves room before it calls AWS, its answer turns the
reservation into what it holds, and :meth:`Reading.give_back` returns the bytes once the
records are acknowledged or dropped. A step runs where its :class:`~.fetcher.Fetcher`
says (:attr:`~.fetcher.Fetcher.io_kind`): a poll within the process's call limit, an
open outside it, a subscription read in the subscription pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..kinesis import Fetched
from .fetcher import Fetcher
from .io import ByteBudget, ReaderIo, ToThreadIo
from .lease import LeaseKeeper
from .spec import ReaderSpec, Sleep

__all__ = ["Reading", "FANOUT_BUDGET_DROP_S"]

FANOUT_BUDGET_DROP_S = 1.0
"""How long an enhanced fan-out loop waits on a full byte budget with its subscription open
before it drops the subscription, seconds (it resubscribes once the budget admits it)."""


class Reading:
    """The fetch side of one consumer (see the module docstring).

    Args:
        spec: the consumer's spec. io: the process's pools. budget: its byte budget or None.
        keeper: the consumer's lease keeper (a step in flight is tracked there for liveness).
        stats: the consumer's stats (the fetcher's counters land there).
        clock, sleep: the injected clock and ``async sleep``.
        stopping: True once the consumer stops (pacing then ends early).
        alive: the consumer's heartbeat, called while it waits.
    """

    def __init__(self, spec: ReaderSpec, io: ReaderIo | ToThreadIo, budget: ByteBudget | None,
                 keeper: LeaseKeeper, stats: dict[str, Any], *, clock: Callable[[], float] = time.monotonic,
                 sleep: Sleep, stopping: Callable[[], bool], alive: Callable[[], None]) -> None:
        self.spec = spec
        self._io = io
        self._budget = budget
        self._keeper = keeper
        self._stats = stats
        self._clock = clock
        self._sleep = sleep
        self._stopping = stopping
        self._alive = alive
        self.fetcher: Fetcher | None = None
        self.held_bytes = 0  # budget bytes of records fetched and not yet acknowledged
        self._call: list[float] | None = None  # the step's call: [] while queued, [start] once running
        self._lock = threading.Lock()
        self._abandoned = False

    def abandon(self) -> bool:
        """Make sure a pending :meth:`fetch` no longer touches the fetcher, so its task may be
        cancelled (a stop or a seek that must not wait: the byte budget it waits for may only
        free once its caller goes on). True if no call runs: one queued for a thread now
        returns None without calling AWS. False if a call already runs in its thread (it
        cannot be cancelled there; it ends within its socket timeout): wait for it."""
        with self._lock:
            if self._call:
                return False
            self._abandoned = True
            return True

    def close(self) -> None:
        """End the fetcher's connection now (from any thread)."""
        if self.fetcher is not None:
            self.fetcher.close()

    async def pace(self) -> None:
        """Wait until the fetcher's next step is due (alive); ends early once stopping."""
        fetcher = self.fetcher
        if fetcher is None:
            return
        end = self._clock() + fetcher.due_in()
        while (left := end - self._clock()) > 0 and not self._stopping():
            await self._sleep(min(left, max(0.05, self.spec.renew_interval_s / 2)))
            self._alive()

    async def fetch(self, interrupted: Callable[[], bool],
                    prepare: Callable[[Fetched], object] | None = None) -> Fetched | None:
        """One step of the fetcher, paced, within the byte budget; None if nothing to
        deliver (or ``interrupted()`` after pacing). ``prepare`` runs on the answer in a pool
        thread after the call, outside the call limit (see :meth:`step`)."""
        fetcher = self.fetcher
        assert fetcher is not None
        await self.pace()
        if interrupted():
            return None
        amount = fetcher.reserve_bytes
        reserved = fetcher.has_iterator and await self._reserve(amount)
        got: Fetched | None = None
        try:
            got = await self.step(prepare)
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
        limit (its slot is free again, and the build is not counted as call time by the stuck
        detection): per-record work the caller would otherwise do on the event loop, where
        one shard's 10,000-record response blocks every shard of the process for its duration
        (in a thread the interpreter hands the GIL back to the loop every switch interval,
        5 ms)."""
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
