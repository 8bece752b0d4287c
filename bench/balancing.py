"""Balancing bench, in one process (issue 21 part 3): two of our instances, no Ray.

Two ``CoordinatorCore`` instances over one in-process lease table, their readers
``ShardReaderCore`` in this event loop (``testing.LocalReader``) over a fake Kinesis of
``--shards`` shards, while a publisher puts one record into every shard every 0.1 s.
Default timings (lease 10 s, renew 3 s, lease poll 2 s) unless given. Worker A starts
alone and takes every shard; ``--joiners`` instances (1: worker B) start at once; measured
from their ``start()`` calls:

* ``even_s``: until each holds its share (counts differ by at most one), disjoint, and the
  table's owners agree;
* ``goal_s``: ceil(moves / (max_leases_to_steal x joiners)) lease-poll intervals + 1 renew
  interval, moves being the leases A gives away;
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
    """One run with ``max_leases_to_steal=steal``: A alone, then ``args.joiners`` instances
    start at once; returns the figures."""
    kinesis, rows, seen = FakeKinesis(args.shards), InProcessLeaseStore(), []
    stop = asyncio.Event()

    async def publish() -> None:
        while not stop.is_set():
            kinesis.publish(1)
            await asyncio.sleep(0.1)

    pub = asyncio.create_task(publish())
    a = _instance("a", rows, kinesis, seen, args, steal)
    await a.start()
    joiners = [_instance(f"j{i}", rows, kinesis, seen, args, steal) for i in range(args.joiners)]
    workers = [a, *joiners]
    share = args.shards // len(workers)

    def even() -> bool:
        owners = [lease.owner for lease in rows.list(STREAM)]
        held = [set(w.held()) for w in workers]
        return (all(len(h) in (share, share + 1) for h in held) and sum(map(len, held)) == args.shards
                and len(set().union(*held)) == args.shards
                and all(owners.count(w.owner_id) == len(h) for w, h in zip(workers, held)))

    t0 = time.monotonic()
    await asyncio.gather(*(j.start() for j in joiners))
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
    for w in reversed(workers):
        await w.close()
    planned = args.shards - math.ceil(args.shards / len(workers))  # leases A gives away
    goal = math.ceil(planned / (steal * args.joiners)) * args.poll + args.renew
    return {"max_leases_to_steal": steal, "instances": len(workers), "even_s": None if even_s is None else round(even_s, 2),
            "goal_s": goal, "duplicates": len(seen) - len(set(seen)), "moves_after_even": moves,
            "handoffs_requested": sum(j.counters["handoffs_requested"] for j in joiners),
            "handoffs_forced": sum(j.counters["handoffs_forced"] for j in joiners),
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
    ap.add_argument("--joiners", type=int, default=1, help="instances that start at once after A holds every shard")
    args = ap.parse_args()
    for steal in [int(s) for s in args.steal.split(",")]:
        for _ in range(args.runs):
            print(json.dumps(asyncio.run(one_run(args, steal))), flush=True)


if __name__ == "__main__":
    main()
