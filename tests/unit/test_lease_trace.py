"""How many library files a renewal and a checkpoint pass through, as a runtime trace.

A renewal (``LeaseKeeper.renew``), a checkpoint written at once (``CheckpointPacer.flush``) and
a checkpoint that rides a renewal are each driven once under :func:`sys.setprofile` through an
in-process lease store, and every ``kinesis_actors`` source file whose code runs is counted.
The store's clocks and the reader's IO seam are the test's own (a function and an inline
``store`` call), so what is counted is the lease code itself: the keeper, the rules and the
rows. In a reader process the IO seam adds ``reader/io.py`` (a thread-pool hop).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import kinesis_actors
from kinesis_actors.reader import CheckpointPacer, LeaseKeeper, ReaderSpec
from kinesis_actors.records import StartAt
from kinesis_actors.testing import InProcessLeaseStore

PACKAGE = os.path.dirname(kinesis_actors.__file__)
MAX_FILES = 3


class DirectIo:
    """The reader's IO seam, inline: a store call runs in the calling coroutine."""

    async def store(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        """No call limit here."""


def _traced(step: Callable[[], Awaitable[Any]]) -> set[str]:
    """The library files (relative to the package) whose code ran during ``await step()``."""
    files: set[str] = set()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            files.add(os.path.relpath(frame.f_code.co_filename, PACKAGE))

    async def run() -> None:
        sys.setprofile(profile)
        try:
            await step()
        finally:
            sys.setprofile(None)

    asyncio.run(run())
    return files


def _keeper() -> tuple[LeaseKeeper, CheckpointPacer]:
    now = [1000.0]
    store = InProcessLeaseStore(clock=lambda: now[0], wall_clock=lambda: 1.7e9 + now[0])
    lease = store.take("orders", "shardId-000000000000", owner="me", duration_s=10.0)
    assert lease is not None
    spec = ReaderSpec(stream="orders", shard_id="shardId-000000000000", owner_id="me", start_at=StartAt.latest(),
                      lease_duration_s=10.0,
                      renew_interval_s=3.0)
    keeper = LeaseKeeper(spec, lease, store, DirectIo(), clock=lambda: now[0])  # type: ignore[arg-type]

    async def sleep_alive(seconds: float) -> None:
        now[0] += seconds

    stats: dict[str, Any] = {"checkpoints_written": 0}
    pacer = CheckpointPacer(keeper, None, clock=lambda: now[0], sleep_alive=sleep_alive, stats=stats)
    return keeper, pacer


def trace_counts() -> dict[str, set[str]]:
    """The files entered by a renewal, a checkpoint and a checkpoint riding a renewal."""
    keeper, pacer = _keeper()
    renewal = _traced(keeper.renew)
    pacer.acknowledged("17", None, partial=True)
    checkpoint = _traced(pacer.flush)
    assert keeper.lease.checkpoint == "17" and pacer.pending is None
    pacer.acknowledged("18", 2)
    riding = _traced(keeper.renew)
    assert keeper.lease.checkpoint == "18" and keeper.lease.checkpoint_sub_sequence == 2
    return {"renewal": renewal, "checkpoint": checkpoint, "checkpoint riding a renewal": riding}


def test_a_renewal_and_a_checkpoint_each_pass_through_at_most_three_library_files() -> None:
    for what, files in trace_counts().items():
        assert files, f"the trace saw nothing of the {what}"
        assert len(files) <= MAX_FILES, f"a {what} passes through {len(files)} files: {sorted(files)}"


if __name__ == "__main__":  # print the counts: python -m tests.unit.test_lease_trace
    for what, files in trace_counts().items():
        print(f"{what}: {len(files)} files: {', '.join(sorted(files))}")
