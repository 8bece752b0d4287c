"""The Coordinator's close under one deadline, and its fatal error.

:class:`CoreClosing` holds the close of a :class:`~.core.CoordinatorCore`: it starts once
(the first ``close`` or fatal error moves the core to CLOSING), every ``close`` awaits the
same run, and it ends in CLOSED, or FAILED when a fatal error was parked.

Stopping the readers (each checkpoints what was acknowledged and, with ``release``,
releases its leases), releasing the leases waiting for a reader, withdrawing our handoff
requests and deleting the presence row run in parallel, all within what is left of the
close's ``timeout_s``. Whatever has not finished by then (a lease table that hangs) is
cancelled and left to expire (leases after ``lease_duration_s``, the presence row after
one lease duration, handoff requests when the row next moves); the log says which.
A cancelled store call running in a thread is not waited for: it lands or it does not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .lifecycle import CoordinatorState
from .placements import HeldState
from .pool import PooledReader

if TYPE_CHECKING:
    from .core import CoordinatorCore

__all__ = ["CoreClosing", "close_parts"]

log = logging.getLogger("kinesis_actors.coordinator")

_STOP_MARGIN_S = 0.5  # of the deadline kept for a reader's answer after its grace


class CoreClosing:
    """The close of one :class:`~.core.CoordinatorCore` and its parked fatal error.

    Args:
        core: the core whose parts it stops.
        on_fatal: called with a fatal error once (e.g. to fail the pull queue), or None.
        clock: the core's injected monotonic clock, seconds.

    Attributes:
        error: the parked fatal error (the state is FAILED once closed), or None.
    """

    def __init__(self, core: CoordinatorCore, *, on_fatal: Callable[[BaseException], Any] | None,
                 clock: Callable[[], float]) -> None:
        self.core, self.on_fatal, self.clock = core, on_fatal, clock
        self.error: BaseException | None = None
        self.ended = asyncio.Event()  # set on reaching CLOSED or FAILED
        self.closer: asyncio.Future[None] | None = None  # the close under way, awaited by every close()

    async def close(self, release: bool, grace_s: float, timeout_s: float) -> None:
        """Begin the close (once) and wait for it, up to ``timeout_s`` + 1 s; as
        :meth:`~.core.CoordinatorCore.close`. Never raises for a failing store or reader."""
        closer = self.begin(release, grace_s, timeout_s)
        try:
            await asyncio.wait_for(asyncio.shield(closer), timeout_s + 1.0)
        except asyncio.TimeoutError:
            log.warning("%s: close did not finish within %.1f s", self.core.stream.name, timeout_s)

    def begin(self, release: bool, grace_s: float, timeout_s: float) -> asyncio.Future[None]:
        """Move to CLOSING and start the close, once; returns the close under way."""
        if self.closer is None:
            self.core.lifecycle.move(CoordinatorState.CLOSING)
            self.closer = asyncio.ensure_future(self._run(release, grace_s, timeout_s))
        return self.closer

    async def _run(self, release: bool, grace_s: float, timeout_s: float) -> None:
        core = self.core
        deadline = self.clock() + timeout_s
        await core.tick.stop()
        await core.pool.starts.cancel()
        await core.loads.rounds.cancel()  # a load round's moves already run with the opens
        # opens under way: let them land (bounded), so they are stopped too
        await core.placements.opens.settle(max(0.0, min(grace_s, deadline - self.clock())))
        await close_parts(core, release=release, grace_s=grace_s, deadline=deadline, clock=self.clock,
                          started=core.tick.started)
        core.placements.held.clear()
        core.threads.shutdown(wait=False)
        core.lifecycle.move(CoordinatorState.FAILED if self.error is not None else CoordinatorState.CLOSED)
        self.ended.set()

    async def fail(self, error: BaseException) -> None:
        """Park ``error`` (the first one only), tell ``on_fatal``, and begin the close
        (releasing, 5 s grace, 15 s deadline) without waiting for it."""
        if self.error is None:
            self.error = error
            log.error("%s: subscription failed: %r", self.core.stream.name, error)
            if self.on_fatal is not None:
                try:
                    self.on_fatal(error)
                except Exception:  # the callback's own failure: logged, the close goes on
                    log.exception("on_fatal callback failed")
        self.begin(release=True, grace_s=5.0, timeout_s=15.0)

    async def wait(self, timeout_s: float | None) -> bool:
        """Wait until closed or failed; True if it ended within ``timeout_s``."""
        try:
            await asyncio.wait_for(self.ended.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False


async def close_parts(core: CoordinatorCore, *, release: bool, grace_s: float, deadline: float,
                      clock: Callable[[], float], started: bool) -> None:
    """Stop every reader and (with ``release``) give back what this instance holds, within
    ``deadline`` (on ``clock``, the core's injected clock); the presence row is removed
    only when the core ``started``. Never raises: each part logs what it left."""
    readers = [r for r in core.pool.readers.values() if r.handle is not None]
    remaining = max(0.0, deadline - clock())
    grace = min(grace_s, max(0.0, remaining - _STOP_MARGIN_S))
    jobs: dict[str, Coroutine[Any, Any, None]] = {
        f"stopping reader {r.id}": _stop_reader(core, r, release, grace) for r in readers}
    if release:
        waiting = [h.shard.shard_id for h in core.placements.in_state(HeldState.WAITING)]
        jobs.update({f"releasing lease {sid} (no reader)": _release(core, sid) for sid in waiting})
        if core.handoffs.requests:
            jobs[f"withdrawing handoff requests {sorted(core.handoffs.requests)}"] = core.handoffs.withdraw_all()
        if started:
            jobs["removing the presence row"] = core.presence.remove()
    tasks = {name: asyncio.ensure_future(job) for name, job in jobs.items()}
    if tasks:
        await asyncio.wait(tasks.values(), timeout=max(0.0, deadline - clock()))
    for name, task in tasks.items():
        if not task.done():
            task.cancel()
            log.warning("%s: close deadline passed while %s; left to expire", core.stream.name, name)
        elif not task.cancelled() and task.exception() is not None:
            log.info("%s: %s failed (%r); left to expire", core.stream.name, name, task.exception())
    if tasks:
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    for reader in readers:
        core.pool.drop(reader)


async def _stop_reader(core: CoordinatorCore, reader: PooledReader, release: bool, grace_s: float) -> None:
    """Stop every consumer of ``reader`` (checkpoint, release when ``release``), then kill it."""
    assert reader.handle is not None
    if reader.watch is not None:
        reader.watch.cancel()
    shards = sorted(sid for sid, h in core.placements.held.items() if h.reader is reader)
    try:
        if reader.ready and shards:
            await reader.handle.stop(None, release, grace_s)
    except asyncio.CancelledError:
        log.warning("reader %d: not stopped by the close deadline; leases %s left to expire", reader.id, shards)
        raise
    finally:
        core.pool.drop(reader)


async def _release(core: CoordinatorCore, shard_id: str) -> None:
    """Closing: release a row we hold with no reader (re-take, then release), so another
    instance does not wait a lease duration for it."""
    lease = await core.leases.take(shard_id)
    if lease is not None:
        await core.leases.release(lease)
