"""Placement by load for one Coordinator: the figures, the plan, the moves.

At every lease poll (after the pool's upkeep) :class:`LoadMoves` asks each READY reader for
its figures (``stats``: the process's ``cpu`` and its event loop's ``loop_busy`` over
``load_window_s``, and each shard's
``bytes_per_s`` and ``records_per_s``), hands them with the placements (the one record of
which shard is on which reader) to :class:`~kinesis_actors.load.placement.LoadPlacer`, and
carries the plan out: the pool keeps the readers it asks for (:attr:`ReaderPool.wanted`),
and each move is a graceful handoff inside the instance (:meth:`Placements.move`). A reader
death (the pool's ``readers_replaced`` counter moved) is told to the placer, which re-spreads
the shards once the replacement is READY. One round runs at a time, in :attr:`LoadMoves.rounds`
(the close cancels it); the moves run with the placements' opens (the close lets them land);
a reader that does not answer within the stats timeout is left out of that round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..config import KinesisStream
from ..load.placement import LoadPlacer, ReaderLoad, ShardLoad
from .handles import ReaderGone, ReaderUnreachable
from .placements import Placements
from .pool import PooledReader, ReaderPool
from .presence import STATS_TIMEOUT_S
from .tasks import TaskSet

__all__ = ["LoadMoves"]

log = logging.getLogger("kinesis_actors.coordinator")


class LoadMoves:
    """The placement-by-load part of a Coordinator (see the module docstring).

    Args:
        stream: the subscription's settings (``reader_target_cpu``, ``max_readers``,
            ``max_shards_per_reader``, ``load_window_s``).
        pool / placements: the reader pool and the placements.
        counters: ``readers_replaced`` is read, ``shards_moved`` counted (by the placements)
            and ``task_errors`` counts a round that failed.
        clock: the injected monotonic clock, seconds.
        grace_s: how long a moving shard's batch in flight may take, seconds.
    """

    def __init__(self, *, stream: KinesisStream, pool: ReaderPool, placements: Placements,
                 counters: dict[str, int], clock: Callable[[], float], grace_s: float) -> None:
        self.placer = LoadPlacer(target_cpu=stream.reader_target_cpu, max_readers=stream.max_readers,
                                 max_shards_per_reader=stream.max_shards_per_reader,
                                 load_window_s=stream.load_window_s)
        self._pool, self._placements = pool, placements
        self.counters, self._clock, self._grace_s = counters, clock, grace_s
        self._replaced = counters.get("readers_replaced", 0)
        self.rounds = TaskSet(counters)  # the round under way (at most one)

    def update(self) -> None:
        """Start a round in the background unless one is running."""
        if self._pool.closing or self.rounds.running():
            return
        self.rounds.spawn(self.run_once(), "load-moves")

    async def run_once(self) -> None:
        """One round: figures, plan, pool size, moves (the moves run in kept tasks)."""
        readers = self._pool.ready()
        figures = await asyncio.gather(*(self._figures(r) for r in readers))
        if self.counters.get("readers_replaced", 0) != self._replaced:
            self._replaced = self.counters.get("readers_replaced", 0)
            self.placer.reader_died([r.id for r in readers], self._clock())
        view = [self._view(r, got) for r, got in zip(readers, figures) if got is not None]
        if len(view) != len(readers) or self._pool.closing:
            return  # a reader did not answer: decide on whole figures only
        plan = self.placer.plan(view, self._clock(), starting=self._pool.starting())
        self._pool.wanted = plan.readers
        if plan.start_reader:
            log.info("readers above reader_target_cpu and none can take their hottest shard: starting one more"
                     " (%d wanted)", plan.readers)
            self._pool.grow(len(self._placements.held))
        for move in plan.moves:
            log.info("shard %s: moving from reader %d to reader %d (%s)", move.shard_id, move.source, move.target,
                     move.why)
            moving = self._placements.move(move.shard_id, move.source, move.target, grace_s=self._grace_s)
            self._placements.opens.spawn(moving, f"move-{move.shard_id}")

    async def _figures(self, reader: PooledReader) -> dict[str, Any] | None:
        if reader.handle is None:
            return None
        try:
            got: dict[str, Any] = await asyncio.wait_for(reader.handle.stats(), STATS_TIMEOUT_S)
        except (ReaderGone, ReaderUnreachable, asyncio.TimeoutError) as e:
            log.debug("reader %d: no figures this round (%r)", reader.id, e)
            return None
        reader.figures = dict(got.get("reader") or {})
        return got

    def _view(self, reader: PooledReader, got: dict[str, Any]) -> ReaderLoad:
        mine = sorted(sid for sid, h in self._placements.held.items() if h.reader is reader)
        shards = got.get("shards") or {}
        loads = []
        for sid in mine:
            f = shards.get(sid) or {}
            loads.append(ShardLoad(sid, bytes_per_s=float(f.get("bytes_per_s") or 0.0),
                                   records_per_s=float(f.get("records_per_s") or 0.0),
                                   known=bool(f.get("load_known"))))
        own = got.get("reader") or {}
        cpu = float(own.get("cpu") or 0.0) if own.get("load_known") else None
        busy = float(own.get("loop_busy") or 0.0) if own.get("loop_busy_known") else None
        return ReaderLoad(reader.id, cpu, tuple(loads), busy=busy)
