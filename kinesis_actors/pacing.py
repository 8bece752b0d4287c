"""When a shard's next Kinesis call may go: the spacing of ``GetRecords`` calls, the idle
grid of the shards at the tip, and the wait after a throttle.

:class:`~kinesis_actors.kinesis.ShardFetcher` sets its next call time from these and
nothing else; they are pure functions of their arguments (and of this process's random
phase on the idle grid), so they are tested without a fetcher. Re-exported by
:mod:`kinesis_actors.kinesis`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from .backoff import THROTTLE_BACKOFF

__all__ = ["MIN_CALL_SPACING_S", "IDLE_GRID_S", "idle_due", "backoff_s"]

MIN_CALL_SPACING_S = 0.2
"""Shortest gap between two ``GetRecords`` calls on one shard, seconds: 5 calls per second,
the AWS limit per shard."""

IDLE_GRID_S = 0.1
"""Spacing of the idle-poll grid, seconds (:func:`idle_due`): the idle shards of a process
poll at one of ``max_idle_wait_s / IDLE_GRID_S`` points a period (10 at the defaults)."""

_IDLE_PHASE = random.random()
"""This process's phase on the idle-poll grid, a fraction of a slot (see :func:`idle_due`)."""



def idle_due(now: float, wait: float, slot: float, phase: float | None = None) -> float:
    """When an idle poll due ``wait`` seconds after ``now`` (monotonic s) runs: the latest
    point of this process's grid (``slot`` seconds apart, offset by ``phase`` of a slot,
    default a random phase per process) that is after ``now`` and not after ``now + wait``;
    ``now + wait`` itself when there is none (a wait shorter than the gap to the grid).

    :class:`~kinesis_actors.kinesis.ShardFetcher` passes :data:`IDLE_GRID_S` (0.1 s) as ``slot``: the shards of a
    process that sit at the tip then poll in a few groups a second (10 at the defaults,
    each about a tenth of them), each group woken by one timer, rather than each alone with
    its code cold, as operating systems batch timers (Linux's timer slack); renewals use a
    grid too, rounded up (:func:`~kinesis_actors.reader.lease.renewal_slot`); what it saves
    per idle request is in ``bench/DESIGN_FIGURES.md`` (``python -m bench.idle``). A group
    is kept to a tenth of the idle shards because its polls go out together:
    on a service that answers one request at a time, a process's lease renewals wait
    behind the group (one point per ``max_idle_wait_s``, all of a reader's 128 idle shards
    at once, stretched a renewal gap in ``tests/integration/test_scale.py`` past its
    bound). Rounding down, a shard never notices new records later than without it; once
    on the grid it polls once per ``max_idle_wait_s`` (a whole number of slots). Each
    process has its own phase, so the processes of a machine (whose ``time.monotonic`` is
    one clock) take turns rather than contend for the cores at once.

    Args:
        now: monotonic seconds. wait: the idle wait, seconds. slot: the grid's spacing,
            seconds (``<= 0``: no grid, ``now + wait``). phase: the grid's offset as a
            fraction of ``slot`` (default this process's).

    Returns the due time, monotonic seconds, in ``(now, now + wait]`` for a positive wait.
    Raises nothing.
    """
    due = now + wait
    if slot <= 0:
        return due
    offset = (_IDLE_PHASE if phase is None else phase) * slot
    aligned = offset + math.floor((due - offset) / slot + 1e-9) * slot  # 1e-9: a due on the grid stays there
    return aligned if now < aligned <= due else due


def backoff_s(attempt: int, *, rng: Callable[[], float] = random.random) -> float:
    """The wait after the ``attempt``-th throttle in a row (1-based) of a shard's Kinesis
    calls, seconds: :data:`~kinesis_actors.backoff.THROTTLE_BACKOFF` (full jitter, at least
    0.2 s, at most 5 s). ``rng``: uniform in ``[0, 1)``."""
    return THROTTLE_BACKOFF.delay_s(attempt, rng=rng)


