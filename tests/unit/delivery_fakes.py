"""Fakes for the delivery-control unit tests: records, a scriptable sink, a publisher, a sleep,
and :func:`drain` (the read loop's shard-end wait on a pipeline)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from kinesis_actors import PartialBatchError
from kinesis_actors.delivery import Lanes
from kinesis_actors.records import Record

SHARD = "shardId-000000000007"
T0 = 1_700_000_000.0


def rec(i: int, *, key: str | None = None, data: bytes | None = None, sub: int | None = None,
        arrival: float | None = T0) -> Record:
    """Record number ``i`` (sequence number ``1000 + i``)."""
    when = None if arrival is None else dt.datetime.fromtimestamp(arrival, dt.timezone.utc)
    return Record(data if data is not None else b"r%d" % i, key or f"k{i}", str(1000 + i), sub, when, SHARD, "s")


async def drain(lanes: Lanes, *, wait_s: float = 0.01, within_s: float = 30.0) -> None:
    """What the consumer's read loop does at shard end (``ShardConsumer._drained``): deliver
    everything held, windows aside, and wait until every batch is acknowledged.

    Args:
        wait_s: each wait for an acknowledgement, seconds on the lanes' clock.
        within_s: the deadline, seconds of real time (the lanes' clock may be a fake one that
            nothing drives, on which their waits end only when a batch does).

    Raises:
        The parked error of a lane that failed.
        AssertionError: a batch still unacknowledged after ``within_s`` seconds.
    """

    async def until_idle() -> None:
        while True:
            lanes.dispatch(force=True)
            if lanes.idle:
                return
            await lanes.wait(wait_s)

    try:
        await asyncio.wait_for(until_idle(), within_s)
    except asyncio.TimeoutError:
        raise AssertionError(f"batches still in flight after {within_s} s") from None


def recs(n: int, **kw: Any) -> list[Record]:
    return [rec(i, **kw) for i in range(n)]


class Sink:
    """An async sink: ``poison`` records (by data) always fail; ``fail_calls`` calls fail whole;
    ``partial`` maps a call number to a ``failed_from``. Records every call."""

    def __init__(self, *, poison: Sequence[bytes] = (), fail_calls: Sequence[int] = (),
                 partial: dict[int, int] | None = None, wrap: Callable[[BaseException], BaseException] | None = None):
        self.poison = set(poison)
        self.fail_calls = set(fail_calls)
        self.partial = partial or {}
        self.wrap = wrap
        self.calls: list[list[bytes]] = []
        self.acked: list[bytes] = []

    async def __call__(self, records: Sequence[Record]) -> None:
        self.calls.append([r.data for r in records])
        n = len(self.calls)
        error: BaseException | None = None
        if n in self.fail_calls:
            error = RuntimeError(f"call {n} fails")
        elif n in self.partial:
            k = self.partial[n]
            self.acked.extend(r.data for r in records[:k])
            error = PartialBatchError(failed_from=k)
        else:
            bad = [i for i, r in enumerate(records) if r.data in self.poison]
            if bad:
                self.acked.extend(r.data for r in records[:bad[0]])
                error = ValueError(f"poison at {bad[0]}")
        if error is not None:
            raise self.wrap(error) if self.wrap else error
        self.acked.extend(r.data for r in records)


class Publisher:
    """A dead-letter publisher: records what it published; the first ``fail`` calls raise."""

    def __init__(self, fail: int = 0, error: BaseException | None = None) -> None:
        self.fail = fail
        self.error = error or ConnectionError("dead-letter stream unreachable")
        self.calls = 0
        self.items: list[tuple[bytes, str]] = []

    async def publish(self, items: list[tuple[bytes, str]]) -> None:
        self.calls += 1
        if self.calls <= self.fail:
            raise self.error
        self.items.extend(items)


class Sleeps:
    """An injected sleep that records the waits and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
