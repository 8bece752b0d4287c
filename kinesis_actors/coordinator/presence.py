"""Presence and stats: this instance's presence row, and the figures it reports.

The presence row is heartbeated every ``renew_interval_s`` (it lasts one lease
duration) and deleted on a clean close; other instances count the fresh rows as live
when they compute the balancing target. The heartbeat is in one :class:`PresenceState`::

    ABSENT --heartbeat written--> PRESENT --close: row deleted--> REMOVED
       ^                             |
       `---a heartbeat failed--------'  (retried at the next renew interval)
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .pool import PooledReader

__all__ = ["PresenceState", "Presence", "collect_stats"]

log = logging.getLogger("kinesis_actors.coordinator")

STATS_TIMEOUT_S = 5.0  # a reader that does not answer ``stats`` within this is reported unreachable


class PresenceState(enum.Enum):
    """Whether this instance's presence row is fresh (transitions in the module docstring)."""

    ABSENT = "absent"
    PRESENT = "present"
    REMOVED = "removed"


class Presence:
    """This instance's presence row.

    Args:
        store / io: the lease store and the runner of its blocking calls.
        stream / owner_id: the stream name and our owner id.
        duration_s: how long one heartbeat lasts, seconds.
        counters: ``heartbeats_failed`` is counted here.
    """

    def __init__(self, *, store: Any, io: Callable[..., Awaitable[Any]], stream: str, owner_id: str,
                 duration_s: float, counters: dict[str, int]) -> None:
        self._store, self._io, self._stream, self._owner = store, io, stream, owner_id
        self._duration_s, self.counters = duration_s, counters
        counters.setdefault("heartbeats_failed", 0)
        self.state = PresenceState.ABSENT

    async def update(self) -> None:
        """One heartbeat (the tick calls it every ``renew_interval_s``); a failure is logged and counted."""
        if self.state is PresenceState.REMOVED:
            return
        try:
            await self._io(self._store.heartbeat, self._stream, self._owner, duration_s=self._duration_s)
        except Exception as e:  # a lease-store error: the row lasts one lease duration; retried next interval
            self.counters["heartbeats_failed"] += 1
            self.state = PresenceState.ABSENT
            log.info("%s: presence heartbeat failed (%r); retrying", self._stream, e)
            return
        if self.state is PresenceState.ABSENT:  # not REMOVED by a close meanwhile
            self.state = PresenceState.PRESENT

    async def remove(self) -> None:
        """Delete the row (a clean close). Raises what the store raises (the caller logs it)."""
        self.state = PresenceState.REMOVED
        await self._io(self._store.remove_presence, self._stream, self._owner)


async def collect_stats(readers: list[PooledReader], loads: dict[int, int], last: dict[str, dict[str, Any]],
                        held: set[str]) -> list[dict[str, Any]]:
    """Ask every READY reader for its figures in parallel (each within :data:`STATS_TIMEOUT_S`).

    Updates ``last`` (shard id -> its last figures, with ``node_id``, ``pid`` and ``reader``)
    and drops from it the shards no longer ``held``; returns the per-reader figures (``id``,
    the ``reader`` of its shards; ``pid``, ``node_id``, ``cpu`` in cores; ``shards``, a
    count), with ``unreachable`` (the error) for a reader that did not answer in time or
    died, which keeps its last known ``cpu``, ``pid`` and ``node_id`` (kept on
    :attr:`PooledReader.figures`).
    """
    from .handles import ReaderGone, ReaderUnreachable

    out: list[dict[str, Any]] = []

    async def one(reader: PooledReader) -> None:
        assert reader.handle is not None
        try:
            got = await asyncio.wait_for(reader.handle.stats(), STATS_TIMEOUT_S)
        except (ReaderGone, ReaderUnreachable, asyncio.TimeoutError) as e:  # say so; keep its shards' figures
            known: dict[str, Any] = {k: reader.figures[k] for k in ("cpu", "loop_busy", "pid", "node_id")
                                     if k in reader.figures}
            out.append({"reader": reader.id, "id": reader.id, "cpu": 0.0, **known, "unreachable": repr(e)[:200],
                        "shards": loads.get(reader.id, 0)})
            return
        reader.figures = dict(got["reader"])
        out.append({"reader": reader.id, "id": reader.id, "cpu": 0.0, **got["reader"]})
        for sid, figures in got["shards"].items():
            last[sid] = {**figures, **{k: got["reader"].get(k) for k in ("node_id", "pid")}, "reader": reader.id}

    await asyncio.gather(*(one(r) for r in readers))
    for sid in [s for s in last if s not in held]:
        del last[sid]  # ended, lost or handed over: not this instance's any more
    return sorted(out, key=lambda r: r["reader"])
