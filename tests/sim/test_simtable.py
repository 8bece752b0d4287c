"""The table-sink model in the unit stage: a table seed commits and keeps the table invariants,
the checker names planted damage to the table, and the planted bug "commit without the fence"
is caught on a seed that is clean without it. No Ray; virtual time only."""

from __future__ import annotations

import dataclasses
from typing import Any

from kinesis_actors.sinks.tables.positions import decode_positions, encode_positions

from .run import run_seed
from .simtable import chosen
from .tablecheck import check_table

TABLE_SEED = 1
"""A seed that runs a table sink (``simtable.chosen``)."""

FENCE_SEED = 24
"""A table seed whose history has a zombie owner committing after a newer owner's fence."""


def _world_of(seed: int) -> Any:
    """The finished world of table seed ``seed`` (its table and history kept)."""
    from . import run as run_mod

    kept: dict[str, Any] = {}
    real = run_mod.check_table

    def keep(world: Any) -> Any:
        kept["w"] = world
        return real(world)

    run_mod.check_table = keep
    try:
        assert run_seed(seed).violations == []
    finally:
        run_mod.check_table = real
    return kept["w"]


def test_a_table_seed_commits_every_record_once() -> None:
    assert chosen(TABLE_SEED) and chosen(FENCE_SEED)
    world = _world_of(TABLE_SEED)
    rows = [pair for c in world.table.commits for pair in c.rows]
    assert len(world.table.commits) > 5 and len(rows) == len(set(rows)) > 20
    assert check_table(world) == []


def test_the_table_checker_names_planted_damage() -> None:
    world = _world_of(TABLE_SEED)
    commits = world.table.commits
    first = next(i for i, c in enumerate(commits) if c.rows)
    commits.append(commits[first])  # the same rows landing again
    assert "table_duplicate" in {v.name for v in check_table(world)}
    commits.pop()
    kept = commits[first]
    commits[first] = dataclasses.replace(kept, rows=())  # a commit's rows gone
    assert {"table_missing", "table_behind_checkpoint"} <= {v.name for v in check_table(world)}
    commits[first] = kept
    older = {k: p.with_counter(p.lease_counter - 1) for k, p in decode_positions(commits[-1].properties).items()}
    stale = encode_positions(older, "planted")
    commits.append(dataclasses.replace(commits[-1], rows=(), properties=stale))  # an older owner's commit
    assert "table_fenced_commit" in {v.name for v in check_table(world)}


def test_a_commit_without_the_fence_is_caught() -> None:
    assert run_seed(FENCE_SEED).violations == []
    planted = run_seed(FENCE_SEED, mutants=("table_commit_without_fence",))
    assert [v.name for v in planted.violations][:1] == ["table_fenced_commit"]
