"""Balancing bench, in one process (issue 21 part 3): two of our instances, no Ray.

Two ``CoordinatorCore`` instances over one in-process lease table, their readers
``ShardReaderCore`` in this event loop (``testing.LocalReader``) over a fake Kinesis of
``--shards`` shards, while a publisher puts one record into every shard every 0.1 s.
Default timings (lease 10 s, renew 3 s, lease poll 2 s) unless given. Worker A starts
alone and takes every shard; B starts; measured from B's ``start()`` call:

* ``even_s``: until each holds half, disjoint, and the table's owners agree;
* ``goal_s``: ceil(moves / max_leases_to_steal) lease-poll intervals + 1 renew interval;
* ``duplicates``: (shard, sequence number) pairs delivered more than once, any worker;
* ``moves_after_even``: lease owner changes in the table during ``--watch`` seconds after
  the even split (ping-pong: should be 0).

It measures the Coordinator's balancing logic and the reader's handoff path over an
in-process table and Kinesis: no network, no Ray actor calls. Run:
``python -m bench.balancing --steal 1,2,4``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from typing import Any

from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator import CoordinatorCore
from kinesis_actors.reader import ReaderIo, ShardReaderCore
from kinesis_actors.records import StartAt
from kinesis_actors.testing import FakeKinesis, InProcessLeaseStore, LocalReader

STREAM = "bench-balance"


def _instance(owner: str, rows: InProcessLeaseStore, kinesis: FakeKinesis, seen: list[tuple[str, int]],
              args: argparse.Namespace, steal: int) -> CoordinatorCore:
    stream = KinesisStream(STREAM, start_at=StartAt.trim_horizon(), lease_poll_interval_s=args.poll,
                           max_leases_to_steal=steal)

    async def deliver(records: list[Any]) -> None:
        seen.extend((r.shard_id, int(r.sequence_number)) for r in records)

    def launch(_: int) -> LocalReader:
        return LocalReader(ShardReaderCore(store=rows.peer(), deliver=deliver, kinesis=kinesis,
                                           io=ReaderIo(kinesis_threads=4, store_threads=4)))

    return CoordinatorCore(stream, aws=None, store=rows.peer(), owner_id=owner,  # type: ignore[arg-type]
                           lease_duration_s=args.lease, renew_interval_s=args.renew, launcher=launch, kinesis=kinesis)


async def _until(cond: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def one_run(args: argparse.Namespace, steal: int) -> dict[str, Any]:
    """One A-then-B run with ``max_leases_to_steal=steal``; returns the figures."""
    kinesis, rows, seen = FakeKinesis(args.shards), InProcessLeaseStore(), []
    stop = asyncio.Event()

    async def publish() -> None:
        while not stop.is_set():
            kinesis.publish(1)
            await asyncio.sleep(0.1)

    pub = asyncio.create_task(publish())
    a = _instance("a", rows, kinesis, seen, args, steal)
    await a.start()
    b = _instance("b", rows, kinesis, seen, args, steal)
    half = args.shards // 2

    def even() -> bool:
        owners = [lease.owner for lease in rows.list(STREAM)]
        return (len(a.held()) == len(b.held()) == half and not set(a.held()) & set(b.held())
                and owners.count("a") == owners.count("b") == half)

    t0 = time.monotonic()
    await b.start()
    ok = await _until(even, 120)
    even_s = time.monotonic() - t0 if ok else None
    before = {lease.shard_id: lease.owner for lease in rows.list(STREAM)}
    moves = 0
    watch_end = time.monotonic() + args.watch
    while time.monotonic() < watch_end:
        now = {lease.shard_id: lease.owner for lease in rows.list(STREAM)}
        moves += sum(1 for sid, owner in now.items() if before.get(sid) != owner)
        before = now
        await asyncio.sleep(0.1)
    stop.set()
    await pub
    await b.close()
    await a.close()
    goal = math.ceil(half / steal) * args.poll + args.renew
    return {"max_leases_to_steal": steal, "even_s": None if even_s is None else round(even_s, 2), "goal_s": goal,
            "duplicates": len(seen) - len(set(seen)), "moves_after_even": moves,
            "handoffs_requested": b.counters["handoffs_requested"], "handoffs_forced": b.counters["handoffs_forced"],
            "handoffs_passed_on": a.counters.get("handoffs_passed_on", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--steal", default="1,2,4", help="comma-separated max_leases_to_steal values, one run each")
    ap.add_argument("--lease", type=float, default=10.0)
    ap.add_argument("--renew", type=float, default=3.0)
    ap.add_argument("--poll", type=float, default=2.0)
    ap.add_argument("--watch", type=float, default=30.0, help="seconds watched for moves after the even split")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    for steal in [int(s) for s in args.steal.split(",")]:
        for _ in range(args.runs):
            print(json.dumps(asyncio.run(one_run(args, steal))), flush=True)


if __name__ == "__main__":
    main()
