"""Placement by load inside one instance: which reader process each held shard is on.

:class:`LoadPlacer` is asked, at every lease poll, for a :class:`LoadPlan` over the READY
readers and their figures (:class:`ReaderLoad`: the process's CPU in cores, averaged over
``load_window_s``, and each shard's bytes/s and records/s). The rules:

* **Shed.** A reader whose CPU average is above ``target_cpu`` (its figure covers a whole
  window, and its set of shards has not changed for a window, so the figure is its own)
  moves its hottest shard away: one per window, never a shard moved by load within
  ``3 x load_window_s``, never one with no estimated CPU (no traffic: moving it cannot cool
  the reader) or carrying all but :data:`MIN_MOVE_CPU` of the reader's CPU (its companions
  are idle: the problem would only move with it), and never the last shard of a reader (a single-shard reader is
  not split). The shard goes to the least loaded other reader if that reader holds no shard
  or stays at or under the target with it; otherwise the plan asks for one new reader (at
  most one per window, none while one is starting, within ``max_readers``; None caps at
  the lease count) and the shard moves there once it is ready.
* **Merge.** When every figure is known, nothing moved for a window, the pool is above
  the count floor, and the total CPU fits in fewer readers at half the target each, the
  least loaded reader is drained (its shards to the least loaded readers that stay under
  the target) and the pool keeps one reader less. Never below the count floor
  ``max(2, ceil(leases / max_shards_per_reader) + 1)``.
* **Re-spread.** After a reader died (:meth:`LoadPlacer.reader_died`) and its
  replacement is READY (or ``3 x load_window_s`` passed without one), the shards are
  spread back: by load (moving from the most to the least loaded reader while that
  narrows the gap) or, with ``target_cpu=None`` or no measurable load, by count (until
  counts differ by at most one).

**A reader's load** is its CPU, or more when its event loop was busy most of the window:
``max(cpu, target_cpu x busy / BUSY_SATURATED)`` cores, so saturation is
``max(cpu / target_cpu, busy / BUSY_SATURATED)`` and a loop busy ``BUSY_SATURATED`` (0.9) of the
window counts as exactly the target. ``reader_target_cpu`` keeps its meaning, cores per
reader process: with a core free for it, a loop's busy fraction is about its thread's CPU,
at most the process's, so ``busy / 0.9 < cpu / target_cpu`` for any target below 0.9 and the
CPU decides. The busy term wins only when the OS gives the process less CPU than its loop
wants (a shared node): its loop never idles, yet its CPU stays under the target. Every rule
below reads "CPU" as this load (None while the CPU figure is not known).

A shard's CPU is not measured on its own (one process, one GIL, shared threads): it is
estimated as its reader's CPU times the shard's share of the reader's traffic (the mean
of its share of bytes/s and of records/s), and remembered, so a shard that just moved
keeps its estimate until its new reader has a full window. Every decision is
deterministic for the same inputs. ``max_shards_per_reader`` stays a cap on every move.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from .busy import BUSY_SATURATED

__all__ = ["ShardLoad", "ReaderLoad", "Move", "LoadPlan", "LoadPlacer", "IDLE_CPU", "MIN_MOVE_CPU", "count_floor"]

IDLE_CPU = 0.05
"""Cores: below this for the whole pool, load says nothing and re-spreading goes by count."""

MIN_MOVE_CPU = 0.01
"""Cores: a shard is shed only if at least this much of its reader's CPU stays behind (else its
companions are idle, and the reader's load would only move with it)."""

_NEVER = float("-inf")


def count_floor(leases: int, max_shards_per_reader: int) -> int:
    """Readers count placement keeps for ``leases`` leases: ``max(2, ceil(leases / cap) + 1)``,
    room for all of them with one reader to spare (the pool's size,
    :func:`kinesis_actors.coordinator.pool.pool_size`, and the floor merging never goes below)."""
    return max(2, math.ceil(leases / max_shards_per_reader) + 1)


@dataclasses.dataclass(frozen=True)
class ShardLoad:
    """One shard's traffic on its reader.

    Attributes:
        shard_id: the shard.
        bytes_per_s / records_per_s: moving averages over ``load_window_s``.
        known: a full window was measured (else the rates are not yet meaningful).
    """

    shard_id: str
    bytes_per_s: float = 0.0
    records_per_s: float = 0.0
    known: bool = True


@dataclasses.dataclass(frozen=True)
class ReaderLoad:
    """One READY reader: its id, its CPU (cores over the window; None before a full
    window), the shards placed on it, and its event loop's busy fraction over the window
    (0..1; None when not known: :mod:`.busy`)."""

    id: int
    cpu: float | None
    shards: tuple[ShardLoad, ...] = ()
    busy: float | None = None

    @property
    def shard_ids(self) -> list[str]:
        """The ids of its shards."""
        return [s.shard_id for s in self.shards]


@dataclasses.dataclass(frozen=True)
class Move:
    """Move ``shard_id`` from reader ``source`` to reader ``target`` (a graceful handoff
    inside the instance); ``why`` is ``"load"``, ``"merge"`` or ``"respread"``."""

    shard_id: str
    source: int
    target: int
    why: str


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """What one pass decided.

    Attributes:
        readers: how many readers the pool keeps (never below the count floor); a reader
            being merged away is not counted, so once it is empty the pool, which stops
            idle readers beyond this number, stops it.
        moves: shards to move now.
        start_reader: one more reader was asked for (``readers`` counts it).
    """

    readers: int
    moves: tuple[Move, ...] = ()
    start_reader: bool = False


class LoadPlacer:
    """The placement-by-load decisions of one instance (rules in the module docstring).

    Args:
        target_cpu: ``reader_target_cpu``, cores per reader process; None keeps count
            placement (only the re-spread after a reader death runs, by count).
        max_readers: most readers load placement grows the pool to (None: the lease count).
        max_shards_per_reader: the cap of shards per reader.
        load_window_s: ``load_window_s``, seconds.
    """

    def __init__(self, *, target_cpu: float | None, max_readers: int | None, max_shards_per_reader: int,
                 load_window_s: float) -> None:
        self.target_cpu, self.max_readers = target_cpu, max_readers
        self.cap, self.window_s = max_shards_per_reader, load_window_s
        self.shard_cpu: dict[str, float] = {}  # last estimate of each shard's CPU, cores
        self._moved: dict[str, tuple[int, float]] = {}  # shard -> (target, when) of a move within 3 windows
        self._changed_at: dict[int, float] = {}  # reader -> when its set of shards last changed by a move
        self._last_start = _NEVER
        self._wanted = 0  # readers wanted for load (0: the count floor is enough)
        self.draining: int | None = None
        self._survivors: frozenset[int] | None = None  # READY readers when one died (re-spread pending)
        self._died_at = _NEVER

    # ------------------------------------------------------------------ events
    def reader_died(self, survivors: Sequence[int], now: float) -> None:
        """A reader died; ``survivors`` are the ids of the READY readers left, ``now`` the
        caller's monotonic seconds. The pool is re-spread once a reader not among them is
        READY (or ``3 x load_window_s`` after ``now`` without one)."""
        self._survivors = frozenset(survivors)
        self._died_at = now

    # ------------------------------------------------------------------ the pass
    def plan(self, readers: Sequence[ReaderLoad], now: float, *, starting: int = 0) -> LoadPlan:
        """Decide this pass over the READY readers.

        Args:
            readers: every READY reader with its figures and the shards placed on it.
            now: the caller's monotonic clock, seconds.
            starting: readers asked for and not READY yet (no new one is asked meanwhile).

        Returns:
            The :class:`LoadPlan`. Its moves are recorded as done (the damping counts from
            ``now``): the caller carries them out.
        """
        readers = sorted(readers, key=lambda r: r.id)
        self._forget_old(now)
        self._estimate(readers)
        leases = sum(len(r.shards) for r in readers)
        floor = count_floor(leases, self.cap)
        if self.draining is not None and not any(r.id == self.draining and r.shards for r in readers):
            self.draining = None  # empty (the pool stops it) or gone
        if self._respread_due(readers, now, starting):
            self._survivors = None
            moves = self._respread(readers, now)
            return LoadPlan(readers=max(floor, self._wanted), moves=tuple(moves))
        if self.target_cpu is None:
            return LoadPlan(readers=floor)
        moves, start = self._shed(readers, now, starting, leases)
        if not moves and not start and self.draining is None:
            moves = self._merge(readers, now, floor)
        return LoadPlan(readers=max(floor, self._wanted), moves=tuple(moves), start_reader=start)

    # ------------------------------------------------------------------ shedding
    def _shed(self, readers: list[ReaderLoad], now: float, starting: int, leases: int) -> tuple[list[Move], bool]:
        assert self.target_cpu is not None
        target = self.target_cpu
        proj = {r.id: self.projected(r, now) for r in readers}
        counts = {r.id: len(r.shards) for r in readers}
        hot = [r for r in readers if (self.load(r) or 0.0) > target and len(r.shards) > 1
               and now - self._changed_at.get(r.id, _NEVER) >= self.window_s and r.id != self.draining]
        moves: list[Move] = []
        start = False
        for r in sorted(hot, key=lambda r: (-(self.load(r) or 0.0), r.id)):
            shard = self._hottest(r, now)
            if shard is None:
                continue
            est = self.shard_cpu.get(shard, 0.0)
            room = [o for o in readers if o.id != r.id and o.id != self.draining and counts[o.id] < self.cap]
            dest = min(room, key=lambda o: (proj[o.id], counts[o.id], o.id), default=None)
            if dest is not None and (counts[dest.id] == 0 or proj[dest.id] + est <= target):
                moves.append(self._record(Move(shard, r.id, dest.id, "load"), now))
                proj[dest.id] += est
                counts[dest.id] += 1
                counts[r.id] -= 1
            elif not start and self._may_start(len(readers), starting, leases, now):
                start = True
                self._last_start = now
                self._wanted = len(readers) + 1
        return moves, start

    def _may_start(self, ready: int, starting: int, leases: int, now: float) -> bool:
        cap = leases if self.max_readers is None else min(self.max_readers, leases)
        return starting == 0 and ready < cap and now - self._last_start >= self.window_s

    def _hottest(self, reader: ReaderLoad, now: float) -> str | None:
        cpu = self.load(reader) or 0.0
        movable = [s for s in reader.shards if not self._settling(s.shard_id, now)
                   and 0.0 < self.shard_cpu.get(s.shard_id, 0.0) <= cpu - MIN_MOVE_CPU]
        if not movable:
            return None
        best = max(movable, key=lambda s: (self.shard_cpu.get(s.shard_id, 0.0), s.bytes_per_s, s.records_per_s,
                                           s.shard_id))
        return best.shard_id

    # ------------------------------------------------------------------ merging
    def _merge(self, readers: list[ReaderLoad], now: float, floor: int) -> list[Move]:
        assert self.target_cpu is not None
        target = self.target_cpu
        if len(readers) <= floor or any(now - at < self.window_s for _, at in self._moved.values()):
            return []
        if any(r.cpu is None or not all(s.known for s in r.shards) for r in readers):
            return []
        total = sum(self.load(r) or 0.0 for r in readers)
        if math.ceil(total / (target / 2)) >= len(readers):
            return []
        proj = {r.id: self.projected(r, now) for r in readers}
        for victim in sorted(readers, key=lambda r: (proj[r.id], len(r.shards), -r.id)):
            if any(self._settling(sid, now) for sid in victim.shard_ids):
                continue
            plan = self._drain_plan(victim, [r for r in readers if r.id != victim.id], proj, target)
            if plan is None:
                continue
            self.draining = victim.id
            self._wanted = len(readers) - 1
            return [self._record(m, now) for m in plan]
        return []

    def _drain_plan(self, victim: ReaderLoad, others: list[ReaderLoad], proj: dict[int, float],
                    target: float) -> list[Move] | None:
        """Each of ``victim``'s shards (hottest first) on the least loaded other reader that
        stays under ``target`` with it; None if one of them fits nowhere."""
        proj = {o.id: proj[o.id] for o in others}
        counts = {o.id: len(o.shards) for o in others}
        moves = []
        for sid in sorted(victim.shard_ids, key=lambda s: (-self.shard_cpu.get(s, 0.0), s)):
            est = self.shard_cpu.get(sid, 0.0)
            room = [o for o in others if counts[o.id] < self.cap and proj[o.id] + est <= target]
            dest = min(room, key=lambda o: (proj[o.id], counts[o.id], o.id), default=None)
            if dest is None:
                return None
            moves.append(Move(sid, victim.id, dest.id, "merge"))
            proj[dest.id] += est
            counts[dest.id] += 1
        return moves

    # ------------------------------------------------------------------ re-spreading
    def _respread_due(self, readers: list[ReaderLoad], now: float, starting: int) -> bool:
        if self._survivors is None or starting:
            return False
        replaced = any(r.id not in self._survivors for r in readers)
        return replaced or now - self._died_at >= 3 * self.window_s

    def _respread(self, readers: list[ReaderLoad], now: float) -> list[Move]:
        shards = {r.id: list(r.shard_ids) for r in readers}
        by_load = self.target_cpu is not None and sum(self.shard_cpu.get(s, 0.0) for r in readers
                                                      for s in r.shard_ids) >= IDLE_CPU
        moves: list[Move] = []
        for _ in range(sum(len(v) for v in shards.values())):
            move = self._respread_step(shards, by_load)
            if move is None:
                break
            shards[move.source].remove(move.shard_id)
            shards[move.target].append(move.shard_id)
            moves.append(self._record(move, now))
        return moves

    def _respread_step(self, shards: dict[int, list[str]], by_load: bool) -> Move | None:
        if by_load:
            load = {rid: sum(self.shard_cpu.get(s, 0.0) for s in sids) for rid, sids in shards.items()}
        else:
            load = {rid: float(len(sids)) for rid, sids in shards.items()}
        src = max((rid for rid in shards if len(shards[rid]) > 1), key=lambda rid: (load[rid], -rid), default=None)
        dst = min((rid for rid in shards if len(shards[rid]) < self.cap and rid != src),
                  key=lambda rid: (load[rid], len(shards[rid]), rid), default=None)
        if src is None or dst is None:
            return None
        gap = load[src] - load[dst]

        def weight(sid: str) -> float:
            return self.shard_cpu.get(sid, 0.0) if by_load else 1.0

        fits = [sid for sid in shards[src] if 0.0 < weight(sid) < gap - 1e-9]
        if not fits:
            return None
        best = min(fits, key=lambda sid: (abs(gap - 2 * weight(sid)), self.shard_cpu.get(sid, 0.0), sid))
        return Move(best, src, dst, "respread")

    # ------------------------------------------------------------------ figures
    def load(self, reader: ReaderLoad) -> float | None:
        """``reader``'s load, cores: ``max(cpu, target_cpu x busy / BUSY_SATURATED)`` (the CPU alone
        without a target or a busy figure); None while its CPU figure is not known."""
        if reader.cpu is None or reader.busy is None or self.target_cpu is None:
            return reader.cpu
        return max(reader.cpu, self.target_cpu * reader.busy / BUSY_SATURATED)

    def _estimate(self, readers: list[ReaderLoad]) -> None:
        """Remember each shard's CPU estimate from readers whose figures are all known."""
        for r in readers:
            cpu = self.load(r)
            if cpu is None or not r.shards or not all(s.known for s in r.shards):
                continue
            total_b = sum(s.bytes_per_s for s in r.shards)
            total_r = sum(s.records_per_s for s in r.shards)
            for s in r.shards:
                share_b = s.bytes_per_s / total_b if total_b > 0 else 1.0 / len(r.shards)
                share_r = s.records_per_s / total_r if total_r > 0 else 1.0 / len(r.shards)
                self.shard_cpu[s.shard_id] = cpu * (share_b + share_r) / 2

    def projected(self, reader: ReaderLoad, now: float) -> float:
        """``reader``'s CPU, cores, with the moves of the last window counted: its own figure once
        its shards have not changed for a window, else the sum of its shards' estimates;
        plus the estimates of shards moved to it within the window that it does not list yet."""
        cpu = self.load(reader)
        settled = cpu is not None and now - self._changed_at.get(reader.id, _NEVER) >= self.window_s
        own = cpu if settled and cpu is not None else \
            sum(self.shard_cpu.get(s, 0.0) for s in reader.shard_ids)
        listed = set(reader.shard_ids)
        coming = sum(self.shard_cpu.get(sid, 0.0) for sid, (rid, at) in self._moved.items()
                     if rid == reader.id and sid not in listed and now - at < self.window_s)
        return own + coming

    def _settling(self, shard_id: str, now: float) -> bool:
        """``shard_id`` moved within ``3 x load_window_s``: it is not moved again for load."""
        return shard_id in self._moved and now - self._moved[shard_id][1] < 3 * self.window_s

    def _forget_old(self, now: float) -> None:
        for sid in [s for s, (_, at) in self._moved.items() if now - at >= 3 * self.window_s]:
            del self._moved[sid]

    def _record(self, move: Move, now: float) -> Move:
        self._moved[move.shard_id] = (move.target, now)
        self._changed_at[move.source] = self._changed_at[move.target] = now
        return move
