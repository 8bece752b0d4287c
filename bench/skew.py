"""``skew`` section: two hot shards with a CPU-costly ``record_filter``, drained under three placements.

A 4-shard stream on the embedded emulator gets a backlog in shards 0 and 2 only (``skew_per_shard``
records of 100 B each). Count placement hands the sorted leases to the reader with the fewest, so
shards 0 and 2 share one reader. The filter burns ``skew_filter_us`` of CPU per record in the reader.
Each placement drains a copy of the backlog (its own stream), ``load_window_s=2``, in the order
``skew_order`` (default count, by_hand, load; a second run in another order shows how much the
machine's load at the time, not the placement, moved the figures):

* ``load``: the defaults (``reader_target_cpu=0.6``): the hot reader hands a shard to another reader;
* ``count``: ``reader_target_cpu=None`` (count placement only);
* ``by_hand``: ``reader_target_cpu=None, max_shards_per_reader=1`` (one reader per shard).

Figures: each drain time (subscribe to the last record acknowledged), load against count and
against by-hand in the same run; the time from the hot reader's figures first passing the target (CPU above it, or its event loop
busy at least 0.9 of the window)
to the two hot shards being on two readers; the moves made. The pull sink counts each (shard, sequence
number), so duplicates are counted too.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any

from .common import Results, create_stream, prefill

S = "skew"
PAIR = ("shardId-000000000000", "shardId-000000000002")


def _burn(us: float) -> Any:
    def burn(record: Any) -> bool:
        import time as _time

        end = _time.perf_counter() + us / 1e6
        while _time.perf_counter() < end:
            pass
        return True

    return burn


def _over(reader: dict[str, Any], target: float) -> bool:
    """The reader's figures in ``stats()`` pass the target as load placement reads them: its CPU above
    it, or its event loop busy at least ``BUSY_SATURATED`` of the window."""
    from kinesis_actors.load import BUSY_SATURATED

    return (reader.get("cpu") or 0) > target or (reader.get("loop_busy_known") and
                                                 (reader.get("loop_busy") or 0) >= BUSY_SATURATED)


def _drain(ctx: Any, placement: str) -> dict[str, Any]:
    from kinesis_actors import KinesisBroker, KinesisStream, StartAt

    per_shard, us = ctx.params["skew_per_shard"], ctx.params["skew_filter_us"]
    stream = f"skew-{placement}-{int(time.time() * 1000) % 10**8}"
    shards = create_stream(ctx.endpoint, stream, 4)
    prefill(ctx.endpoint, stream, [s for s in shards if s["ShardId"] in PAIR], per_shard, 100)
    extra: dict[str, Any] = {"load": {}, "count": {"reader_target_cpu": None},
                             "by_hand": {"reader_target_cpu": None, "max_shards_per_reader": 1}}[placement]
    cfg = KinesisStream(stream, start_at=StartAt.trim_horizon(), record_filter=_burn(us), load_window_s=2.0,
                        max_records=500, lease_poll_interval_s=ctx.timings["lease_poll_interval_s"], **extra)
    conn = KinesisBroker(endpoint=ctx.endpoint, region="us-east-1", test_credentials=True).connect()
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    target = extra.get("reader_target_cpu", 0.6)
    passed_at = apart_at = None
    t0 = time.monotonic()
    sub = conn.subscribe(cfg)
    try:
        next_look = 0.0
        while len(seen) < 2 * per_shard and time.monotonic() - t0 < ctx.params["skew_timeout_s"]:
            for r in sub.next_batch(timeout_s=0.5):
                seen[(r.shard_id, r.sequence_number)] += 1
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + 0.5
                stats = sub.stats()
                if passed_at is None and target is not None and any(_over(r, target) for r in stats["readers"]):
                    passed_at = time.monotonic()
                homes = {stats["shards"].get(sid, {}).get("reader") for sid in PAIR}
                if apart_at is None and len(homes - {None}) == 2:
                    apart_at = time.monotonic()
        drain_s = time.monotonic() - t0
        stats = sub.stats()
    finally:
        sub.close()
        conn.shutdown()
    return {"drain_s": drain_s if len(seen) >= 2 * per_shard else None, "records": len(seen),
            "load_average_1min": round(os.getloadavg()[0], 1),
            "apart_after_s": None if apart_at is None else round(apart_at - t0, 1),
            "duplicates": sum(n - 1 for n in seen.values()), "moves": stats.get("shards_moved", 0),
            "passed_to_apart_s": None if passed_at is None or apart_at is None else max(0.0, apart_at - passed_at),
            "readers": len(stats["readers"])}


def run(ctx: Any, res: Results) -> None:
    got = {p: _drain(ctx, p) for p in ctx.params.get("skew_order", ("count", "by_hand", "load"))}
    ctx.log(f"skew: {got}")
    setting = (f"2 hot shards of 4, {ctx.params['skew_per_shard']} records of 100 B each, record_filter "
               f"{ctx.params['skew_filter_us']} us per record, load_window_s=2")
    load, count, hand = got["load"], got["count"], got["by_hand"]
    res.add(S, "skew_drain_load_vs_count", load["drain_s"], "s", anchor="drain under count placement",
            anchor_value=count["drain_s"], goal="<= 0.85x",
            check=lambda v: count["drain_s"] is not None and v <= 0.85 * count["drain_s"],
            note=f"{setting}; moves {load['moves']} (hot shards apart {load['apart_after_s']} s after subscribe), "
                 f"readers {load['readers']}, duplicates {load['duplicates']}; order {list(got)}, 1-min load average "
                 f"at each drain's end {[g['load_average_1min'] for g in got.values()]} (2 cores, shared)")
    res.add(S, "skew_drain_load_vs_by_hand", load["drain_s"], "s", anchor="drain with max_shards_per_reader=1",
            anchor_value=hand["drain_s"], goal="<= 1.1x",
            check=lambda v: hand["drain_s"] is not None and v <= 1.1 * hand["drain_s"],
            note=f"{setting}; by hand: {hand['readers']} readers, duplicates {hand['duplicates']}")
    res.add(S, "skew_target_passed_to_move_done_s", load["passed_to_apart_s"], "s", goal="<= 2 x load_window_s + 2 s",
            check=lambda v: v <= 6.0,
            note="from a reader's figures in stats() passing the target (cpu above 0.6 or loop_busy >= 0.9) to the hot "
                 "shards on two readers, both seen by the driver's look at stats() every 0.5-1 s (0.0: in the same look)")
    res.add(S, "skew_duplicates", float(sum(g["duplicates"] for g in got.values())), "records", goal="0",
            check=lambda v: v == 0, note="all three drains")
