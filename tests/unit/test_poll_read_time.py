"""The lease poll's read time (``last_read_s``, which spaces the Coordinator's polls) is the
table's latency: the waits between the first pass's retries of a failing read are not counted.

Found by the simulator (seed 1376): an instance started while partitioned from the table
retried its first read for 8 s, counted it as one 8 s read, and spaced its polls 16 s apart,
so an expired lease waited 10 s past the liveness bound."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator.poll import LeasePoll
from kinesis_actors.errors import LeaseStoreError
from kinesis_actors.testing import FakeClock, InProcessLeaseStore

LATENCY_S = 0.05


def test_the_read_time_is_the_last_attempts_not_the_retries_backoff() -> None:
    clock = FakeClock()
    store = InProcessLeaseStore(clock=clock)
    failures = {"left": 6}

    async def io(fn: Any, *args: Any) -> Any:
        clock.advance(LATENCY_S)  # every attempt takes the table's latency
        if failures["left"]:
            failures["left"] -= 1
            raise LeaseStoreError("unreachable", retriable=True)
        return fn(*args)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    poll = LeasePoll(stream=KinesisStream("s"), store=store, io=io, kinesis=None, owner_id="a",
                     lease_duration_s=10.0, clock=clock, counters={}, sleep=sleep)
    started = clock()
    asyncio.run(poll.read(deadline=clock() + 60.0))
    assert failures["left"] == 0 and clock() - started > 1.0  # the retries waited (backoff) before it succeeded
    assert poll.last_read_s == pytest.approx(LATENCY_S)
