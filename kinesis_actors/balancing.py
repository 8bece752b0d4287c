"""Lease balancing: which leases an instance takes and which it steals (pure functions, no I/O).

Every Coordinator runs :func:`plan_leases` at each lease poll over what it just read
from the lease table. The rules (KCL's, made deterministic):

* **Take** every readable shard whose row is missing, free, expired (for this
  instance's store) or already ours, whatever the target: an unowned shard is worse
  than an uneven split. ``max_leases`` caps what we hold.
* **Target** = ``ceil(readable shards / live instances)`` (capped by ``max_leases``).
  Readable shards exclude ``SHARD_END`` rows and children whose parents are not
  finished; live instances are the fresh presence rows, plus the owners of live
  leases, plus ourselves.
* **Steal** only when there is no free or expired lease to take (our own rows, such as
  one just handed over to us, do not hold a steal back) and we hold fewer than the target:
  from the most loaded other instance (ties: the smallest owner id), as many as it holds
  above the target, or one if it is exactly at the target and we need two or more; at
  most ``max_leases_to_steal`` per poll. A steal is a *handoff request*, counted as
  ours from the moment it is written (``lease_next_owner``), so no instance over-asks.
* Which of the victim's shards: the one that sorts first by a hash of (thief, shard id),
  so two thieves asking the same victim pick different shards, yet every run picks the
  same one.

No ping-pong: a steal happens only from an instance holding at least two more than
the thief, so the sum of squared lease counts strictly falls with each move; once the
counts differ by at most one (or the thief is one short of a target the victim sits
at), no instance wants to move anything while nothing changes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence

__all__ = ["ShardState", "BalancePlan", "plan_leases", "steal_count", "steal_order"]


@dataclasses.dataclass(frozen=True)
class ShardState:
    """What the planner needs to know of one readable shard's row.

    Attributes:
        shard_id: the shard id.
        owner: the row's lease owner, or None (free, or no row yet).
        next_owner: ``lease_next_owner`` (an instance waiting for a handoff), or None.
        expired: the row's counter has not moved for its duration, as our store saw it.
    """

    shard_id: str
    owner: str | None = None
    next_owner: str | None = None
    expired: bool = False


@dataclasses.dataclass(frozen=True)
class BalancePlan:
    """The outcome of :func:`plan_leases`.

    Attributes:
        target: how many leases each instance should hold.
        live: the instances counted (sorted owner ids).
        counts: leases per instance after this plan's takes (handoff requests counted
            for the thief).
        take: shard ids to take now (free, expired, or our own rows), sorted.
        steal: ``(shard id, victim)`` pairs to request a handoff for.
    """

    target: int
    live: tuple[str, ...]
    counts: Mapping[str, int]
    take: tuple[str, ...] = ()
    steal: tuple[tuple[str, str], ...] = ()


def steal_count(mine: int, victim: int, target: int, max_leases_to_steal: int) -> int:
    """How many leases to steal from an instance holding ``victim`` when we hold ``mine``.

    KCL's rule: the victim's leases above the target (no more than we need), or one if
    the victim sits exactly at the target and we need two or more; at most
    ``max_leases_to_steal``.
    """
    needed = target - mine
    if needed <= 0 or victim < target or max_leases_to_steal <= 0:
        return 0
    n = min(needed, victim - target)
    if n == 0 and needed > 1:
        n = 1
    return min(n, max_leases_to_steal)


def steal_order(me: str, shard_id: str) -> str:
    """A per-thief stable order of shards (a hash of both ids, hex): ties among candidate
    steals break the same way at every poll, and differently for each thief, so two
    instances stealing at once rarely pick the same lease."""
    return hashlib.sha1(f"{me}\x00{shard_id}".encode()).hexdigest()


def plan_leases(
    me: str,
    shards: Sequence[ShardState],
    *,
    held: Iterable[str] = (),
    live_instances: Iterable[str] = (),
    max_leases: int | None = None,
    max_leases_to_steal: int = 1,
) -> BalancePlan:
    """Decide what ``me`` takes and steals this lease poll (see the module docstring).

    Args:
        me: our owner id.
        shards: the readable shards (no ``SHARD_END`` rows, no child waiting on a parent),
            with what the table says of each.
        held: shard ids we run a reader for now (ours whatever the row says).
        live_instances: owner ids of the fresh presence rows.
        max_leases: most leases we may hold (None: no limit).
        max_leases_to_steal: most handoff requests this poll.

    Returns:
        The :class:`BalancePlan`.
    """
    held_set = set(held)
    readable = sorted(shards, key=lambda s: s.shard_id)
    room = None if max_leases is None else max(0, max_leases - len(held_set))
    take, unowned = _free_leases_to_take(me, readable, held_set, room)
    live = set(live_instances) | {me}
    counts = _count_leases_per_owner(me, readable, held_set, set(take), live)
    target = math.ceil(len(readable) / len(live)) if readable else 0
    if max_leases is not None:
        target = min(target, max_leases)
    plan = BalancePlan(target=target, live=tuple(sorted(live)), counts=dict(counts), take=tuple(take))
    if unowned:  # KCL: no stealing in a round that takes free or expired leases
        return plan
    steal = _leases_to_steal(me, readable, held_set, counts, target, max_leases_to_steal)
    if not steal:
        return plan
    victim = steal[0][1]
    counts[me] += len(steal)
    counts[victim] -= len(steal)
    return dataclasses.replace(plan, counts=dict(counts), steal=steal)


def _free_leases_to_take(me: str, readable: Sequence[ShardState], held: set[str],
                         room: int | None) -> tuple[list[str], bool]:
    """The free, expired and own rows to take (at most ``room``), and whether any of them is
    not ours already (a free or expired row)."""
    take: list[str] = []
    unowned = False
    for s in readable:
        if s.shard_id in held:
            continue
        if s.owner is None or s.owner == me or s.expired:
            if room is not None and len(take) >= room:
                continue
            take.append(s.shard_id)
            unowned = unowned or s.owner != me
    return take, unowned


def _count_leases_per_owner(me: str, readable: Sequence[ShardState], held: set[str], take: set[str],
                            live: set[str]) -> dict[str, int]:
    """Leases per owner once this poll's takes and the pending handoffs are done (a lease
    leaving by handoff counts for its next owner); every live owner appears, and the owner
    of a live row is added to ``live``."""
    counts: dict[str, int] = {}
    for s in readable:
        if s.shard_id in take:
            who: str | None = me
        elif s.shard_id in held:
            who = s.next_owner if s.next_owner and s.next_owner != me else me  # leaving us: a handoff
        elif s.expired or s.owner is None:
            who = None  # unowned (only when max_leases kept us from taking it)
        else:
            live.add(s.owner)
            who = s.next_owner or s.owner
        if who is not None:
            counts[who] = counts.get(who, 0) + 1
    for owner in live:
        counts.setdefault(owner, 0)
    return counts


def _leases_to_steal(me: str, readable: Sequence[ShardState], held: set[str], counts: dict[str, int],
                     target: int, max_leases_to_steal: int) -> tuple[tuple[str, str], ...]:
    """(shard id, owner) pairs to ask the most loaded other owner for: its rows not being
    handed off already, in a per-instance stable order, as many as :func:`steal_count` says."""
    others = sorted((owner for owner in counts if owner != me), key=lambda o: (-counts[o], o))
    if not others:
        return ()
    victim = others[0]
    n = steal_count(counts[me], counts[victim], target, max_leases_to_steal)
    if n <= 0:
        return ()
    candidates = [
        s.shard_id
        for s in readable
        if s.owner == victim and s.next_owner is None and not s.expired and s.shard_id not in held
    ]
    candidates.sort(key=lambda sid: steal_order(me, sid))
    return tuple((sid, victim) for sid in candidates[:n])
