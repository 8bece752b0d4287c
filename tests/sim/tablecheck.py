"""The invariants of a run with a table sink (:mod:`.simtable`), checked on the table's commits
and the history:

- ``table_duplicate``: no record (shard, sequence number) is in the table twice.
- ``table_missing``: every published record is in the table at the end, unless it never had to
  be (filtered, before a ``LATEST`` start) or was dead-lettered.
- ``table_fenced_commit``: no commit lands carrying a shard's position under a lease counter
  lower than one a commit before it recorded (an owner fenced by a newer one commits nothing).
- ``table_behind_checkpoint``: whenever the lease table's checkpoint of a shard is written, every
  record up to it (every record, for ``SHARD_END``) is already in the table: the checkpoint
  never runs ahead of the table, so a next owner resuming after it skips nothing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from kinesis_actors.leases.protocol import SHARD_END

from .checker import Violation, _Replay

__all__ = ["check_table"]


def check_table(world: Any) -> list[Violation]:
    """Every table invariant ``world``'s run broke (empty: none); ``world.table`` is set."""
    r = _Replay(world)  # published records and exemptions (filtered, before LATEST)
    t0, table = world.history.t0, world.table
    found: list[Violation] = []
    in_table: dict[str, set[int]] = defaultdict(set)
    dead: set[int] = set()
    for t, kind, f in world.history.events:
        if kind == "tcommit":
            for shard, seq in table.commits[f["version"] - 1].rows:
                in_table[shard].add(seq)
        elif kind == "dead":
            dead.update(f["seqs"])
        elif kind == "write" and f["checkpoint"] is not None and f["checkpoint"] != f["was_checkpoint"]:
            cp = f["checkpoint"]
            upto = None if cp == SHARD_END else int(cp)
            skipped = [s for s, _ in r.published[f["shard"]] if (upto is None or s <= upto)
                       and s not in in_table[f["shard"]] and s not in r.exempt and s not in dead]
            if skipped and not found:
                found.append(Violation("table_behind_checkpoint", t - t0,
                                       f"{f['who']} checkpointed {f['shard']} at {cp} with {skipped[:5]} "
                                       "not in the table"))
    found += _fences(table, t0)
    count = Counter(pair for c in table.commits for pair in c.rows)
    twice = sorted(p for p, n in count.items() if n > 1)
    if twice:
        found.append(Violation("table_duplicate", world.now() - t0, f"{len(twice)} records twice, first {twice[:5]}"))
    for sid in sorted(r.published):
        left = [s for s, _ in r.published[sid] if (sid, s) not in count and s not in r.exempt and s not in dead]
        if left:
            found.append(Violation("table_missing", world.now() - t0,
                                   f"{sid}: {len(left)} records not in the table, first {left[:5]}"))
    return found


def _fences(table: Any, t0: float) -> list[Violation]:
    """``table_fenced_commit``: a commit under a counter below one already recorded for the shard."""
    from kinesis_actors.sinks.tables.positions import decode_positions

    top: dict[Any, int] = {}
    for c in table.commits:
        for key, p in decode_positions(c.properties).items():
            if p.lease_counter < top.get(key, p.lease_counter):
                return [Violation("table_fenced_commit", c.at - t0,
                                  f"{c.who} committed {key} under counter {p.lease_counter} after counter "
                                  f"{top[key]} fenced it ({sum(1 for s, _ in c.rows if s == key.shard_id)} rows)")]
            top[key] = max(top.get(key, 0), p.lease_counter)
    return []
