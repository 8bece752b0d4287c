"""The Coordinator's close under one deadline.

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

from .placements import HeldState
from .pool import PooledReader

if TYPE_CHECKING:
    from .core import CoordinatorCore

__all__ = ["close_parts"]

log = logging.getLogger("kinesis_actors.coordinator")

_STOP_MARGIN_S = 0.5  # of the deadline kept for a reader's answer after its grace


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
