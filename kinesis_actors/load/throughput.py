"""Balancing across instances by throughput (``balance_by="load"``): which leases to steal.

Each lease row carries its shard's recent throughput (KB/s, written by its holder with
the lease's renewal; KCL 3.x's ``throughputKBps``). :func:`plan_by_throughput` runs where
:func:`~kinesis_actors.balancing.plan_leases` does, over the same :class:`ShardState`
rows plus those figures:

* Takes (free, expired and our own rows) are exactly the count planner's, and no steal
  happens in a round that takes a free or expired row (KCL's rule).
* No measurable load (every shard below :data:`MEASURABLE_KBPS`): the count planner
  decides, so idle streams split evenly.
* Otherwise each instance's share is the stream's total throughput over the live
  instances. An instance steals only while it is below its share by more than
  ``balance_threshold`` (a fraction of the share), at most ``max_leases_to_steal`` per
  pass, each time the lease that brings it closest to its share, and never one that
  would put it above its share by more than the threshold, nor one at least as large as
  the gap between the victim and itself (so a shard hotter than a fair share stays where
  it is and the others take the rest). A lease moved within the damping time
  (``3 x load_window_s``, :class:`BalanceMemory`) is not stolen.

No oscillation: a steal of ``t`` from ``v`` by ``m`` (``t < load(v) - load(m)``) lowers the
sum over instances of ``(load - share)^2`` by ``2t(load(v) - load(m) - t) > 0``; with the
throughputs steady, there are finitely many placements, so steals stop, and the same
rows give the same plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence

from ..balancing import BalancePlan, ShardState, plan_leases, steal_order

__all__ = ["MEASURABLE_KBPS", "plan_by_throughput", "BalanceMemory"]

MEASURABLE_KBPS = 1.0
"""KB/s: a stream whose every shard is below this has no measurable load (balance counts)."""


def plan_by_throughput(me: str, shards: Sequence[ShardState], throughput_kbps: Mapping[str, float | None], *,
                       held: Iterable[str] = (), live_instances: Iterable[str] = (), max_leases: int | None = None,
                       max_leases_to_steal: int = 1, balance_threshold: float = 0.1,
                       settling: Collection[str] = ()) -> BalancePlan:
    """Decide what ``me`` takes and steals this lease poll (rules in the module docstring).

    Args:
        me: our owner id.
        shards: the readable shards with what the table says of each.
        throughput_kbps: each shard's throughput, KB/s (missing or None: 0).
        held: shard ids we run a reader for now.
        live_instances: owner ids of the fresh presence rows.
        max_leases: most leases we may hold (None: no limit).
        max_leases_to_steal: most handoff requests this poll.
        balance_threshold: how far below or above its share an instance may sit, a
            fraction of the share (0.1: 10 %).
        settling: shard ids moved within the damping time (never stolen now).

    Returns:
        A :class:`BalancePlan` (``target`` and ``counts`` are the count planner's).
    """
    held_set = set(held)
    kbps = {s.shard_id: float(throughput_kbps.get(s.shard_id) or 0.0) for s in shards}
    if all(v < MEASURABLE_KBPS for v in kbps.values()):  # the count planner, KCL's no-steal-when-taking rule included
        return plan_leases(me, shards, held=held_set, live_instances=live_instances, max_leases=max_leases,
                           max_leases_to_steal=max_leases_to_steal)
    base = plan_leases(me, shards, held=held_set, live_instances=live_instances, max_leases=max_leases,
                       max_leases_to_steal=0)
    by_id = {s.shard_id: s for s in shards}
    if any(by_id[sid].owner != me for sid in base.take):
        return base  # a round that takes a free or expired row steals nothing
    load = dict.fromkeys(base.live, 0.0)
    taking = set(base.take)
    for s in sorted(shards, key=lambda s: s.shard_id):
        who = _holder_after(me, s, held_set, taking)
        if who is not None:
            load[who] = load.get(who, 0.0) + kbps[s.shard_id]
    share = sum(load.values()) / max(1, len(load))
    counts = dict(base.counts)
    steal: list[tuple[str, str]] = []
    room = None if max_leases is None else max_leases - counts.get(me, 0)
    for _ in range(max_leases_to_steal if room is None else min(max_leases_to_steal, room)):
        pick = _best_steal(me, shards, kbps, load, share, balance_threshold, held_set, set(settling),
                           {sid for sid, _ in steal})
        if pick is None:
            break
        sid, victim = pick
        steal.append(pick)
        load[me] += kbps[sid]
        load[victim] -= kbps[sid]
        counts[me] = counts.get(me, 0) + 1
        counts[victim] = counts.get(victim, 0) - 1
    if not steal:
        return base
    return dataclasses.replace(base, counts=counts, steal=tuple(steal))


def _holder_after(me: str, s: ShardState, held: set[str], take: set[str]) -> str | None:
    """Who holds ``s`` once this poll's takes and pending handoffs are done (None: nobody)."""
    if s.shard_id in take:
        return me
    if s.shard_id in held:
        return s.next_owner if s.next_owner and s.next_owner != me else me
    if s.expired or s.owner is None:
        return None
    return s.next_owner or s.owner


def _best_steal(me: str, shards: Sequence[ShardState], kbps: Mapping[str, float], load: dict[str, float],
                share: float, threshold: float, held: set[str], settling: set[str],
                chosen: set[str]) -> tuple[str, str] | None:
    """The (shard id, victim) that brings ``me`` closest to ``share``, or None."""
    mine = load.get(me, 0.0)
    if mine >= share * (1 - threshold):
        return None
    best: tuple[float, str, str, str] | None = None
    for s in shards:
        sid, victim = s.shard_id, s.owner
        if (victim is None or victim == me or s.next_owner is not None or s.expired or sid in held
                or sid in settling or sid in chosen):
            continue
        t = kbps[sid]
        if mine + t > share * (1 + threshold) or t >= load.get(victim, 0.0) - mine:
            continue
        key = (abs(mine + t - share), steal_order(me, sid), sid, victim)
        if best is None or key < best:
            best = key
    return None if best is None else (best[2], best[3])


class BalanceMemory:
    """What the throughput planner remembers between polls (one per instance).

    * Each shard's last known throughput: a row without a figure (its new holder has not
      measured a full window yet) keeps the last one seen.
    * When each shard's owner last changed, as this instance saw it: a shard whose owner
      changed within ``hold_s`` (``3 x load_window_s``) is settling and is not stolen.
      Owners seen at the first poll count as unchanged.

    Args:
        hold_s: the damping time, seconds.
    """

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._kbps: dict[str, float] = {}
        self._owner: dict[str, str | None] = {}
        self._changed_at: dict[str, float] = {}

    def observe(self, rows: Mapping[str, tuple[str | None, float | None]],
                now: float) -> tuple[dict[str, float], set[str]]:
        """Note ``rows`` (shard id -> (owner, KB/s or None)) at ``now`` (seconds); returns the
        throughput to plan with and the settling shard ids."""
        for sid, (owner, kbps) in rows.items():
            if kbps is not None:
                self._kbps[sid] = kbps
            if sid in self._owner and self._owner[sid] != owner:
                self._changed_at[sid] = now
            self._owner[sid] = owner
        for sid in [s for s in self._owner if s not in rows]:
            self._owner.pop(sid, None)
            self._kbps.pop(sid, None)
            self._changed_at.pop(sid, None)
        settling = {sid for sid, at in self._changed_at.items() if now - at < self.hold_s}
        return {sid: self._kbps.get(sid, 0.0) for sid in rows}, settling
