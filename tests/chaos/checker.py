"""The one checker every chaos scenario uses: what was published against what the downstream saw.

Pure Python (no Ray, no AWS), so ``tests/unit/test_chaos_checker.py`` can show that it
fails on loss, on a skipped record and on a record nobody published.

Inputs:

* ``published``: every event the publisher put, as :class:`Published` (event number ``n``,
  the shard and sequence number ``PutRecords`` returned, the epoch time it returned);
* ``delivered``: every record any downstream acknowledged, as :class:`Delivered`, in the
  order each downstream acknowledged them (several downstreams are merged by time).

Figures (a :class:`Verdict`):

* ``lost``: events published but never delivered (must be 0: at-least-once);
* ``duplicated``: deliveries beyond the first of an event, also per shard, and
  ``batches_redelivered_by_shard``: how many distinct acknowledged batches (the records one
  downstream acknowledged at one time) were delivered again, and
  ``redelivered_acked_at_by_shard``: when each record delivered again was first acknowledged
  (:meth:`Verdict.redelivery_windows` counts the windows of one length that cover them). The
  promise: per shard and failure, the unacknowledged batch plus what was acknowledged since
  the shard's last checkpoint write, which rides the lease renewals by default (at most one
  renew interval of records) and follows every batch with ``min_checkpoint_interval_s=0``;
* ``gaps``: per shard, a delivery that jumped over a record not delivered yet (must be
  none: per-shard order, nothing skipped even if it arrives later);
* ``unexpected``: delivered events nobody published (must be 0);
* ``recovery_s``: from the fault to the first record delivered again from each affected
  shard, the worst shard. A batch already in flight when the fault struck may land a
  few milliseconds after it; deliveries within ``in_flight_s`` of the fault (default
  50 ms) therefore do not count as recovery.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = ["Published", "Delivered", "Verdict", "check", "checkpoints_monotonic"]


@dataclasses.dataclass(frozen=True)
class Published:
    """One event as ``PutRecords`` accepted it: number, shard id, sequence number, epoch seconds."""

    n: int
    shard_id: str
    sequence_number: str
    t: float


@dataclasses.dataclass(frozen=True)
class Delivered:
    """One record as a downstream acknowledged it (epoch seconds); ``via``: which downstream."""

    n: int
    shard_id: str
    sequence_number: str
    t: float
    via: str = ""


@dataclasses.dataclass
class Verdict:
    """What the checker found for one scenario (see the module docstring)."""

    scenario: str
    published: int
    deliveries: int
    distinct_delivered: int
    lost: int
    duplicated: int
    unexpected: int
    gaps: list[dict[str, Any]]
    recovery_s: float | None = None
    recovery_by_shard_s: dict[str, float | None] = dataclasses.field(default_factory=dict)
    lost_sample: list[int] = dataclasses.field(default_factory=list)
    duplicates_by_shard: dict[str, int] = dataclasses.field(default_factory=dict)
    largest_batch_by_shard: dict[str, int] = dataclasses.field(default_factory=dict)
    batches_redelivered_by_shard: dict[str, int] = dataclasses.field(default_factory=dict)
    redelivered_acked_at_by_shard: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    def redelivery_windows(self, shard: str, window_s: float) -> int:
        """How many windows of ``window_s`` seconds it takes to cover the first acknowledgements
        of every record of ``shard`` delivered again (greedy from the earliest: optimal on a
        line). One failure whose redelivery is bounded by ``window_s`` needs one window."""
        windows, end = 0, float("-inf")
        for t in self.redelivered_acked_at_by_shard.get(shard, []):
            if t > end:
                windows, end = windows + 1, t + window_s
        return windows

    def duplicate_batches(self, shard: str) -> float:
        """Duplicated records of ``shard`` in units of its largest delivered batch (a batch is
        the records one downstream acknowledged with one timestamp)."""
        largest = self.largest_batch_by_shard.get(shard, 0)
        return self.duplicates_by_shard.get(shard, 0) / largest if largest else 0.0

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing skipped, nothing invented; recovered if a fault was given."""
        recovered = not self.recovery_by_shard_s or all(v is not None for v in self.recovery_by_shard_s.values())
        return self.lost == 0 and not self.gaps and self.unexpected == 0 and recovered

    @property
    def duplicate_rate(self) -> float:
        """Duplicated deliveries per published event."""
        return self.duplicated / self.published if self.published else 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the chaos results file holds one per scenario)."""
        out = dataclasses.asdict(self)
        out["duplicate_rate"] = round(self.duplicate_rate, 6)
        out["ok"] = self.ok
        out["gaps"] = self.gaps[:20]
        return out

    def summary(self) -> str:
        """One line for test output and assertion messages."""
        rec = "n/a" if self.recovery_s is None else f"{self.recovery_s:.2f} s"
        missing = [s for s, v in self.recovery_by_shard_s.items() if v is None]
        return (f"{self.scenario}: published {self.published}, delivered {self.deliveries} "
                f"({self.distinct_delivered} distinct), lost {self.lost} {self.lost_sample[:10]}, "
                f"duplicated {self.duplicated}, gaps {len(self.gaps)} {self.gaps[:3]}, unexpected {self.unexpected}, "
                f"recovery {rec}{f' (never: {missing})' if missing else ''}")


def _seq(s: str) -> int:
    return int(s)


def check(scenario: str, published: Iterable[Published], delivered: Iterable[Delivered], *,
          fault_at: float | None = None, affected: Iterable[str] | None = None,
          faults: Iterable[tuple[float, Iterable[str]]] = (), in_flight_s: float = 0.05) -> Verdict:
    """Compare ``published`` with ``delivered``; see the module docstring for the figures.

    Args:
        scenario: name stored in the verdict.
        published: every accepted event (an event published twice keeps both entries).
        delivered: every acknowledged record, each downstream in acknowledgement order.
        fault_at: epoch seconds of the fault, for ``recovery_s``; None: no recovery figure.
        affected: shard ids the fault hit (default: every published shard).
        faults: several faults, each ``(epoch seconds, shard ids hit)``; the recovery of
            shard ``s`` after fault ``i`` is keyed ``"s@i"`` and ``recovery_s`` is the worst.
        in_flight_s: deliveries this soon after the fault are a batch already in flight.

    Returns:
        A :class:`Verdict`; ``verdict.ok`` is the pass condition.
    """
    pub = list(published)
    dlv = sorted(delivered, key=lambda d: d.t)  # stable: each downstream keeps its own order
    counts = Counter(d.n for d in dlv)
    published_n = {p.n for p in pub}
    lost = sorted(published_n - counts.keys())
    unexpected = sorted(counts.keys() - published_n)

    order: dict[str, dict[int, int]] = {}
    by_shard: dict[str, list[Published]] = defaultdict(list)
    for p in pub:
        by_shard[p.shard_id].append(p)
    for shard, items in by_shard.items():
        items.sort(key=lambda p: _seq(p.sequence_number))
        order[shard] = {_seq(p.sequence_number): i for i, p in enumerate(items)}

    gaps: list[dict[str, Any]] = []
    frontier: dict[str, int] = defaultdict(lambda: -1)  # highest index delivered so far, per shard
    for d in dlv:
        index = order.get(d.shard_id, {}).get(_seq(d.sequence_number))
        if index is None:
            continue  # a record published twice after an unclear PutRecords: counted by n above
        top = frontier[d.shard_id]
        if index > top + 1:
            before = by_shard[d.shard_id][top].sequence_number if top >= 0 else None
            gaps.append({"shard_id": d.shard_id, "after": before, "jumped_to": d.sequence_number,
                         "skipped": index - top - 1, "t": d.t, "via": d.via})
        frontier[d.shard_id] = max(top, index)

    recovery: dict[str, float | None] = {}
    events = [(t, list(hit)) for t, hit in faults]
    if fault_at is not None:
        events.insert(0, (fault_at, sorted(set(affected) if affected is not None else set(by_shard))))
    for i, (at, shards) in enumerate(events):
        for shard in shards:
            after = [d.t for d in dlv if d.shard_id == shard and d.t > at + in_flight_s]
            recovery[shard if len(events) == 1 else f"{shard}@{i}"] = round(min(after) - at, 3) if after else None
    first: dict[int, Delivered] = {}
    duplicates_by_shard: Counter[str] = Counter()
    batches_redelivered: dict[str, set[tuple[str, float]]] = defaultdict(set)
    redelivered_at: dict[str, set[float]] = defaultdict(set)
    for d in dlv:
        if d.n in first:
            duplicates_by_shard[d.shard_id] += 1
            original = first[d.n]
            batches_redelivered[original.shard_id].add((original.via, original.t))
            redelivered_at[original.shard_id].add(original.t)
        else:
            first[d.n] = d
    largest: dict[str, int] = {}
    for (_, shard, _), size in Counter((d.via, d.shard_id, d.t) for d in dlv).items():
        largest[shard] = max(largest.get(shard, 0), size)

    known = [v for v in recovery.values() if v is not None]
    return Verdict(
        scenario=scenario, published=len(published_n), deliveries=len(dlv), distinct_delivered=len(counts),
        lost=len(lost), duplicated=sum(c - 1 for c in counts.values()), unexpected=len(unexpected), gaps=gaps,
        recovery_s=max(known) if known and len(known) == len(recovery) else None,
        recovery_by_shard_s=recovery, lost_sample=lost[:50], duplicates_by_shard=dict(sorted(duplicates_by_shard.items())),
        largest_batch_by_shard=dict(sorted(largest.items())),
        batches_redelivered_by_shard={k: len(v) for k, v in sorted(batches_redelivered.items())},
        redelivered_acked_at_by_shard={k: sorted(v) for k, v in sorted(redelivered_at.items())},
    )


def checkpoints_monotonic(samples: Iterable[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every place a shard's stored checkpoint moved backwards across lease-table samples.

    Args:
        samples: ``(epoch seconds, {shard id: checkpoint or None})`` in time order.

    Returns:
        One ``{"shard_id", "t", "from", "to"}`` per backwards move (must be empty: SPEC
        invariant 5; no scenario seeks). A checkpoint going back to None counts too.
    """
    last: dict[str, str | None] = {}
    moves: list[dict[str, Any]] = []
    for t, rows in samples:
        for shard, cp in rows.items():
            prev = last.get(shard)
            if prev is not None and prev != "SHARD_END" and (cp is None or (cp != "SHARD_END" and _seq(cp) < _seq(prev))):
                moves.append({"shard_id": shard, "t": t, "from": prev, "to": cp})
            if cp is not None or prev is None:
                last[shard] = cp
    return moves
