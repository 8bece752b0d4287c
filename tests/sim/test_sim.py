"""The simulator in the unit stage: a small seed range keeps every invariant, a seed replays
the same history, the checker sees planted damage, and seeds that catch the real bugs the
simulator found stay clean (each fails with its fix taken out: checked when it was chosen, by
re-planting the old code in a scratch run). No Ray; virtual time only."""

from __future__ import annotations

import os

import pytest

from . import simtable
from .checker import check
from .run import run_range, run_seed

SMOKE_SEEDS = range(int(os.environ.get("SIM_SMOKE_FROM", "0")), int(os.environ.get("SIM_SMOKE_FROM", "0")) + 24)


def test_a_small_seed_range_keeps_every_invariant() -> None:
    bad = [(r.seed, r.violations[0]) for r in run_range(SMOKE_SEEDS, workers=1) if r.violations]
    assert bad == []


def test_a_seed_replays_the_same_history() -> None:
    first, second = run_seed(7), run_seed(7)
    assert first.events > 100
    assert (first.digest, first.events) == (second.digest, second.events)
    assert run_seed(8).digest != first.digest


@pytest.mark.parametrize("seed, fault_s, what", [
    (190, 60.0, "a seek whose start_position write met a transient table error failed the read loop, and with it "
                "the whole subscription (the write is now retried like every lease write)"),
    (1376, 30.0, "the first pass's table read, retried through a partition, counted its backoff as read time and "
                 "spaced the polls 16 s apart: an expired lease was taken 10 s past the liveness bound"),
])
def test_the_seeds_that_found_real_bugs_stay_clean(seed: int, fault_s: float, what: str) -> None:
    """Each seed runs as it ran when it found its bug: plain sinks, no aimed faults (the same history)."""
    result = run_seed(seed, fault_s=fault_s, table=False, aimed=False)
    assert result.violations == [], what


def test_the_checker_sees_a_lost_record_and_a_checkpoint_past_it() -> None:
    """Plant the damage in a finished clean history of a plain-sink seed (a table seed's records are
    judged by the table's check): the checker must name it."""
    result_world = _world_of(next(s for s in range(1, 100) if not simtable.chosen(s)))
    t, kind, fields = next(e for e in result_world.history.events if e[1] == "ack" and e[2]["seqs"])
    result_world.history.events.remove((t, kind, fields))  # the sink never acknowledged that batch
    names = {v.name for v in check(result_world)}
    assert "checkpoint_past_unacked" in names or "lost" in names


def _world_of(seed: int):  # type: ignore[no-untyped-def]
    """The finished world of ``seed`` (its history kept for the checker)."""
    from . import run as run_mod

    kept = {}
    real_check = run_mod.check

    def keep(world):  # type: ignore[no-untyped-def]
        kept["w"] = world
        return real_check(world)

    run_mod.check = keep
    try:
        run_seed(seed)
    finally:
        run_mod.check = real_check
    return kept["w"]
