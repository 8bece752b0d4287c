"""TableCommitter: the one committer of a subscription's table sink (plain asyncio; the sink's
Ray actor is a thin shell over it). What it holds per shard between commits is in :mod:`.staging`.

Fault model:

* Staging IS the acknowledgement: :meth:`TableCommitter.stage` returns once a batch's rows are
  held for the next commit, so reading never waits for a commit. What a reader may checkpoint
  is the shard's COMMITTED position (returned by every call), never what it staged: the
  lease-table checkpoint follows the table.
* One commit round every ``commit_interval_s`` (at once for a fence or a flush) carries the
  staged rows of every shard and the position of every shard the committer holds, each with
  the lease counter its owner opened it with (:mod:`.rounds`).
* Fencing: :meth:`open_shard` commits the new owner's counter before the shard is read, so a
  commit by an older owner that arrives later is refused by the rule of :mod:`.rounds` (the
  table's optimistic concurrency makes the re-read happen before any retry). A refused shard
  is ``lost`` here: its calls raise :class:`~kinesis_actors.errors.LeaseLostError`.
* A failed commit is retried (:func:`.rounds.land`: a conflict at once, anything else with
  capped backoff) with the same rows: nothing staged is dropped unless its shard was refused
  or released. An attempt whose outcome is unknown is found again by its commit id, so it
  never lands twice.
* Staged bytes are bounded (``max_staged_bytes``): :meth:`stage` waits for a commit to make
  room, so a slow catalog slows reading instead of filling memory; past ``stage_timeout_s`` it
  raises a retriable :class:`~kinesis_actors.errors.SinkError` naming the last commit error.
* A round that ends without landing or being refused (cancelled, or an exception escaping it)
  stops the sink (a non-retriable :class:`~kinesis_actors.errors.SinkError`): its rows left
  staging, so a later round would record a position past them. :meth:`close` cancels a
  round in flight without that (no round follows it).
* A process that dies loses only staged rows, which no checkpoint passed: the next owner
  reads them again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from ...clock import Clock, monotonic_s
from ...errors import InvalidError, LeaseLostError, SinkError
from ..hooks import Point
from .backend import TableBackend
from .positions import ShardKey, TablePosition
from .rounds import RoundResult, RoundRunner, RoundShard, land
from .staging import HeldShard, RowsSchema

__all__ = ["TableCommitter", "DEFAULT_MAX_STAGED_BYTES"]

log = logging.getLogger("kinesis_actors.sinks.tables")

DEFAULT_MAX_STAGED_BYTES = 256 << 20
"""Arrow bytes a committer holds before :meth:`TableCommitter.stage` waits for a commit."""

class TableCommitter:
    """Stages readers' batches and commits them, with their shards' positions, to one table.

    Args:
        backend: the table (blocking calls, run in a worker thread one at a time).
        commit_interval_s: seconds between commit rounds (> 0).
        create_if_missing: create a missing table from the first rows.
        max_staged_bytes: Arrow bytes staged before :meth:`stage` waits.
        stage_timeout_s: longest wait of :meth:`stage` for room, seconds.
        clock: monotonic seconds. sleep: ``async sleep`` on that clock. rng: uniform [0, 1).
        blocking: runs one attempt's blocking table calls, ``await blocking(fn, *args)`` -> ``fn(*args)``
            (None: ``asyncio.to_thread``, a worker thread; a simulator passes one on its own clock).
    """

    def __init__(self, backend: TableBackend, *, commit_interval_s: float = 10.0, create_if_missing: bool = True,
                 max_staged_bytes: int = DEFAULT_MAX_STAGED_BYTES, stage_timeout_s: float = 60.0,
                 clock: Clock = monotonic_s, sleep: Callable[[float], Any] = asyncio.sleep,
                 rng: Callable[[], float] | None = None,
                 blocking: Callable[..., Awaitable[Any]] | None = None) -> None:
        self.runner = RoundRunner(backend, create_if_missing=create_if_missing)
        self.name = backend.name
        self.commit_interval_s = commit_interval_s
        self.max_staged_bytes = max_staged_bytes
        self.stage_timeout_s = stage_timeout_s
        self._clock, self._sleep = clock, sleep
        self._rng = rng if rng is not None else random.random
        self._blocking = blocking if blocking is not None else asyncio.to_thread
        self._fatal: SinkError | None = None
        self._held: dict[ShardKey, HeldShard] = {}
        self._staged_bytes = 0
        self._started_rounds = 0  # rounds taken so far
        self._done_rounds = 0  # rounds finished (committed, or nothing to commit)
        self._progress: asyncio.Event | None = None
        self._urgent: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_round_at = clock()
        self._closing = False
        self._hurry = False  # the subscription is closing: every staged batch starts a round at once
        self._schema = RowsSchema(backend.name)
        self.counters: dict[str, Any] = {"commits": 0, "rows_committed": 0, "conflicts": 0, "commit_failures": 0,
                                         "shards_refused": 0, "batches_staged": 0, "rows_staged": 0,
                                         "last_error": None, "last_commit_s": None}

    # ------------------------------------------------------------------ readers' side
    async def open_shard(self, key: ShardKey, lease_counter: int, *, timeout_s: float = 60.0) -> TablePosition | None:
        """Fence ``key`` for its new owner: commit its ``lease_counter`` before the shard is read.

        Returns:
            The table's position of the shard before this owner (None: none, or no table yet);
            the owner resumes after it when it is ahead of the lease-table checkpoint
            (:func:`~.positions.resume_after`).

        Raises:
            LeaseLostError: the table holds a higher counter for the shard (a newer owner).
            SinkError: the fence was not committed within ``timeout_s`` (retriable); the sink
                stopped (not retriable: see the module docstring).
        """
        held = self._held.get(key)
        if held is not None and held.counter > lease_counter:
            raise LeaseLostError(f"{key}: the table sink holds lease counter {held.counter} > {lease_counter}")
        if held is None or held.counter < lease_counter:
            if held is not None:
                self._drop_rows(held)
            held = self._held[key] = HeldShard(lease_counter)
        if not held.opening:
            return held.base_position()
        await self._await_round(timeout_s, f"fencing {key}")
        self._raise_if_lost(key, held)
        return held.base_position()

    async def stage(self, key: ShardKey, lease_counter: int, rows: Any, last: Point | None) -> TablePosition | None:
        """Hold one batch's ``rows`` (a ``pyarrow.Table``; may be empty) for the next commit:
        the acknowledgement. ``last`` is the position of the batch's last record.

        Returns:
            The shard's committed position (what its reader may checkpoint), or None.

        Raises:
            LeaseLostError: the shard is held under a higher counter, or was refused by the table.
            InvalidError: the shard was never opened here under this counter.
            SinkError: ``rows`` cannot take the schema of the rows staged before, or the sink
                stopped (not retriable); no room within ``stage_timeout_s`` (retriable, names the
                commit error).
        """
        held = self._check(key, lease_counter)
        rows = self._schema.conform(rows)
        if self._staged_bytes > self.max_staged_bytes:
            await self._await_room()
            held = self._check(key, lease_counter)
        if rows.num_rows:
            held.rows.append(rows)
            self._staged_bytes += rows.nbytes
            self.counters["rows_staged"] += rows.num_rows
        if last is not None:
            held.last = last
        self.counters["batches_staged"] += 1
        self._ensure_loop()
        if self._hurry or self._clock() - self._last_round_at >= self.commit_interval_s:
            self._event("_urgent").set()  # closing, or idle for a whole interval: this batch starts a round now
        return held.committed

    async def flush_shard(self, key: ShardKey, lease_counter: int, *, timeout_s: float = 10.0) -> TablePosition | None:
        """Commit now what ``key`` has staged (with every other shard's) and wait for it, up to
        ``timeout_s``. Returns the shard's committed position: on time it covers everything
        staged; late, an older one (what was committed is all a checkpoint may pass).

        Raises:
            LeaseLostError / InvalidError: as :meth:`stage`.
            SinkError: the sink stopped (not retriable).
        """
        held = self._check(key, lease_counter)
        if held.rows or held.last is not None or not held.fenced or self._in_flight():
            try:
                await self._await_round(timeout_s, f"flushing {key}")
            except SinkError as e:
                log.warning("table %s: %s", self.name, e)
            self._raise_if_lost(key, held)
        return held.committed

    def committed(self, key: ShardKey, lease_counter: int) -> TablePosition | None:
        """The shard's committed position (None: nothing committed, or not held under this counter)."""
        held = self._held.get(key)
        return held.committed if held is not None and held.counter == lease_counter else None

    def release_shard(self, key: ShardKey, lease_counter: int) -> int:
        """Stop holding ``key`` (its owner released, handed over or lost the lease): its rows
        not yet in a commit are dropped unwritten, and later commits no longer record it.
        Returns the rows dropped. A call under another counter does nothing."""
        held = self._held.get(key)
        if held is None or held.counter != lease_counter:
            return 0
        del self._held[key]
        dropped = self._drop_rows(held)
        if dropped:
            log.info("table %s: %s released with %d staged rows dropped unwritten", self.name, key, dropped)
        return dropped

    # ------------------------------------------------------------------ owner's side
    async def flush(self, timeout_s: float = 30.0) -> bool:
        """Commit everything staged now; True when done within ``timeout_s``."""
        if not self._has_work() and not self._in_flight():
            return True
        try:
            await self._await_round(timeout_s, "flushing")
            return True
        except SinkError:
            return False

    async def begin_close(self, timeout_s: float) -> bool:
        """The subscription is closing: commit what is staged now (waiting up to ``timeout_s``),
        and from now on every staged batch starts a round at once. True when done in time."""
        self._hurry = True
        return await self.flush(timeout_s)

    def drop_staged(self) -> int:
        """Drop every shard's staged rows unwritten (their readers stopped without a commit
        holding them, so no checkpoint passed them); a round already being committed lands.
        Returns the rows dropped."""
        dropped = sum(self._drop_rows(held) for held in self._held.values())
        if dropped:
            log.info("table %s: %d staged rows dropped unwritten at the close", self.name, dropped)
        return dropped

    async def close(self, timeout_s: float = 30.0) -> bool:
        """Flush, then stop the commit loop. Returns whether the flush finished in time
        (after :meth:`drop_staged`, the flush only waits for a round in flight)."""
        done = await self.flush(timeout_s)
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        return done

    def stats(self) -> dict[str, Any]:
        """Counters (commits, rows_committed, conflicts, commit_failures, shards_refused,
        batches_staged, rows_staged, last_error, last_commit_s: the clock's seconds) plus
        staged_bytes (Arrow bytes), max_staged_bytes (its bound), shards (held) and positions
        (``"<stream>/<shard id>"`` -> its committed sequence number)."""
        return {**self.counters, "staged_bytes": self._staged_bytes, "max_staged_bytes": self.max_staged_bytes,
                "shards": len(self._held),
                "positions": {str(k): h.committed.sequence_number for k, h in self._held.items() if h.committed}}

    # ------------------------------------------------------------------ internals
    def _check(self, key: ShardKey, lease_counter: int) -> HeldShard:
        if self._fatal is not None:
            raise self._fatal
        held = self._held.get(key)
        if held is None or held.counter < lease_counter:
            raise InvalidError(f"{key}: not opened on the table sink under lease counter {lease_counter} "
                               "(open_shard first)")
        if held.counter > lease_counter:
            raise LeaseLostError(f"{key}: the table sink holds lease counter {held.counter} > {lease_counter}")
        self._raise_if_lost(key, held)
        return held

    def _raise_if_lost(self, key: ShardKey, held: HeldShard) -> None:
        if self._fatal is not None:
            raise self._fatal
        if held.lost is not None:
            raise LeaseLostError(f"{key}: refused by the table ({held.lost}); a newer owner holds the shard")

    def _drop_rows(self, held: HeldShard) -> int:
        rows, nbytes = held.drop_rows()
        self._staged_bytes -= nbytes
        return rows

    def _event(self, name: str) -> asyncio.Event:
        event: asyncio.Event | None = getattr(self, name)
        if event is None:
            event = asyncio.Event()
            setattr(self, name, event)
        return event

    def _ensure_loop(self) -> None:
        if self._fatal is not None:
            return  # a stopped sink commits nothing more
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"table-commits-{self.name}")

    async def _await_round(self, timeout_s: float, what: str) -> None:
        """Ask for a round at once and wait until one that starts after now has finished."""
        target = self._started_rounds + 1
        self._ensure_loop()
        self._event("_urgent").set()
        await self._await_progress(lambda: self._done_rounds >= target, timeout_s, lambda: SinkError(
            f"table {self.name}: {what} not committed within {timeout_s:.1f} s "
            f"(last error: {self.counters['last_error']})", retriable=True))

    async def _await_room(self) -> None:
        self._event("_urgent").set()
        await self._await_progress(lambda: self._staged_bytes <= self.max_staged_bytes, self.stage_timeout_s,
                                   lambda: SinkError(
                                       f"table {self.name}: {self._staged_bytes} bytes staged and no commit within "
                                       f"{self.stage_timeout_s:.0f} s (last error: {self.counters['last_error']})",
                                       retriable=True))

    async def _await_progress(self, done: Callable[[], bool], timeout_s: float,
                              late: Callable[[], SinkError]) -> None:
        """Wait until ``done()``, checked at each round's end and at least every second.

        Raises:
            SinkError: the sink stopped (``self._fatal``), or ``late()`` after ``timeout_s``.
        """
        deadline = self._clock() + timeout_s
        while not done():
            if self._fatal is not None:
                raise self._fatal
            left = deadline - self._clock()
            if left <= 0:
                raise late()
            progress = self._event("_progress")
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    def _in_flight(self) -> bool:
        """A round is being committed (its rows are no longer staged, not committed yet)."""
        return self._done_rounds < self._started_rounds

    def _has_work(self) -> bool:
        return any(h.rows or h.last is not None or h.opening for h in self._held.values())

    async def _loop(self) -> None:
        while not self._closing and self._fatal is None:
            urgent = self._event("_urgent")
            wait_s = self._last_round_at + self.commit_interval_s - self._clock()
            if not urgent.is_set() and (wait_s > 0 or not self._has_work()):
                try:
                    await asyncio.wait_for(urgent.wait(), max(wait_s, 0.05) if self._has_work() else 1.0)
                except asyncio.TimeoutError:
                    pass
                continue
            urgent.clear()
            self._last_round_at = self._clock()
            await self._round()

    def _take(self) -> dict[ShardKey, RoundShard]:
        shards: dict[ShardKey, RoundShard] = {}
        for key, h in self._held.items():
            if h.lost is not None:
                continue
            shards[key] = RoundShard(h.counter, h.fenced, h.base, h.committed, h.rows, h.last, h.opening)
            h.rows, h.last = [], None
        return shards

    async def _round(self) -> None:
        """Commit what :meth:`_take` takes, retrying until it lands or is refused. Rows taken
        leave staging only that way: a round interrupted before (cancelled, or an exception
        escaping) stops the sink, since a later round would record a position past its rows."""
        self._started_rounds += 1
        shards = self._take()
        finished = False
        try:
            if shards:
                self._apply(shards, await land(self.runner, shards, blocking=self._blocking, sleep=self._sleep,
                                               rng=self._rng, counters=self.counters))
            finished = True
        except SinkError as e:  # not retriable (land retries the others)
            self._fatal = e
            log.error("table %s: %s; the sink stops", self.name, e)
        finally:
            if not finished and self._fatal is None and not self._closing:
                self._fatal = SinkError(f"table {self.name}: a commit round was interrupted with its rows taken; the "
                                        "sink stops (no checkpoint passed them: the shards' next owners read them "
                                        "again)", retriable=False)
                log.error("%s", self._fatal)
            self._staged_bytes -= sum(t.nbytes for s in shards.values() for t in s.rows)
            self._done_rounds = self._started_rounds
            self._event("_progress").set()

    def _apply(self, shards: dict[ShardKey, RoundShard], result: RoundResult) -> None:
        if result.committed:
            self.counters["commits"] += 1
            self.counters["rows_committed"] += result.rows
            self.counters["last_commit_s"] = self._clock()
            log.debug("table %s: committed %s", self.name, RoundRunner.describe(result))
        for key, shard in shards.items():
            if key in result.dropped:
                self.counters["shards_refused"] += 1  # also when its reader has released it meanwhile
            held = self._held.get(key)
            if held is None or held.counter != shard.counter:
                continue  # released or re-opened by a newer owner meanwhile
            if shard.opening:
                held.opening = False
                seen = result.seen.get(key)
                held.base = seen.point if seen is not None else None
            if key in result.dropped:
                held.lost = result.dropped[key]
                self._drop_rows(held)
                log.warning("table %s: %s refused (%s): a newer owner fenced it; its rows stay invisible",
                            self.name, key, held.lost)
            elif key in result.committed:
                held.committed = result.committed[key]
                held.fenced = True
