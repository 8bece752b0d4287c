"""Section ``checkpoints``: the DynamoDB writes ``min_checkpoint_interval_s`` saves.

For each interval (0, then larger), a fresh 4-shard stream gets ``ckpt_rate`` records/s for
``ckpt_seconds`` s, read by one subscription with a ``DynamoLeaseStore`` on the emulator.
Every HTTP attempt of the readers' and the Coordinator's DynamoDB clients is logged by a
``FaultInjector`` with no rules (``kinesis_actors.testing``), so the figures are counted
calls, not estimates: ``UpdateItem`` (renewals + checkpoints, one write request unit each on
AWS for a row under 1 KB) per shard per second, and the readers' own count of checkpoint
writes (``checkpoints_written`` in ``Subscription.stats()``) against the batches delivered.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from typing import Any

from .common import REGION, Results, client, create_stream, hash_keys, wait_for

S = "checkpoints"
SHARDS = 4


def _publish(endpoint: str, stream: str, keys: list[str], rate: float, seconds: float) -> int:
    """``rate`` records/s spread over the shards (by explicit hash key), for ``seconds``; returns the count."""
    kinesis = client(endpoint, "kinesis")
    tick, n = 0.1, 0
    per_tick = max(1, int(rate * tick))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        entries = [{"Data": b"x" * 100, "PartitionKey": "k", "ExplicitHashKey": keys[(n + i) % len(keys)]}
                   for i in range(per_tick)]
        kinesis.put_records(StreamName=stream, Records=entries)
        n += per_tick
        time.sleep(max(0.0, tick - (time.monotonic() - t0)))
    return n


def _one(ctx: Any, interval_s: float) -> dict[str, float]:
    import ray

    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
    from kinesis_actors.testing import FaultInjector, with_faults

    from .actors import CountingSink

    rate, seconds = ctx.params["ckpt_rate"], ctx.params["ckpt_seconds"]
    stream = f"bench-ckpt-{uuid.uuid4().hex[:8]}"
    keys = list(hash_keys(create_stream(ctx.endpoint, stream, SHARDS)).values())
    calls = FaultInjector.create(tempfile.mkdtemp(prefix="bench-ckpt-"))
    broker = KinesisBroker(endpoint=ctx.endpoint, region=REGION, test_credentials=True,
                           lease_store=DynamoLeaseStore(f"{stream}-leases", create_if_missing=True),
                           lease_duration_s=ctx.timings["lease_duration_s"],
                           renew_interval_s=ctx.timings["renew_interval_s"])
    with_faults(broker, calls, lease_store=True)
    sink = CountingSink.remote()
    conn = broker.connect()
    try:
        sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(),
                                           min_checkpoint_interval_s=interval_s), sink=sink)
        t0 = time.time()
        box: dict[str, int] = {}
        publisher = threading.Thread(target=lambda: box.setdefault("n", _publish(ctx.endpoint, stream, keys, rate,
                                                                                  seconds)), daemon=True)
        publisher.start()
        publisher.join()
        wait_for(lambda: ray.get(sink.count.remote()) >= box["n"], timeout_s=60)
        t1 = time.time()
        shards = sub.stats()["shards"]
        sub.close()
    finally:
        conn.shutdown()
    window = t1 - t0
    update_items = [c for c in calls.calls("UpdateItem") if t0 <= c.time <= t1]
    out = {
        "update_item_per_shard_per_s": len(update_items) / SHARDS / window,
        "checkpoints_per_shard_per_s": sum(s.get("checkpoints_written", 0) for s in shards.values()) / SHARDS / window,
        "batches_per_shard_per_s": sum(s.get("batches", 0) for s in shards.values()) / SHARDS / window,
        "records": float(box["n"]), "window_s": window,
    }
    try:
        os.remove(os.path.join(calls.directory, "calls.jsonl"))
    except OSError:
        pass
    return out


def run(ctx: Any, res: Results) -> None:
    renew_s = ctx.timings["renew_interval_s"]
    base: dict[str, float] | None = None
    for interval in ctx.params["ckpt_intervals"]:
        got = _one(ctx, float(interval))
        tag = f"interval_{interval:g}s".replace(".", "_")
        setting = (f"{SHARDS} shards, {ctx.params['ckpt_rate']} records/s of 100 B for {ctx.params['ckpt_seconds']} s, "
                   f"DynamoLeaseStore on the emulator, renew {renew_s:g} s, min_checkpoint_interval_s={interval:g}; "
                   f"{got['records']:.0f} records in {got['window_s']:.1f} s")
        if base is None:
            base = got
        res.add(S, f"ckpt_{tag}_update_item_per_shard_per_s", got["update_item_per_shard_per_s"], "writes/s",
                anchor=None if got is base else "ckpt_interval_0s_update_item_per_shard_per_s",
                anchor_value=None if got is base else base["update_item_per_shard_per_s"],
                note="UpdateItem calls counted (renewals + checkpoints); " + setting)
        res.add(S, f"ckpt_{tag}_checkpoints_per_shard_per_s", got["checkpoints_per_shard_per_s"], "writes/s",
                anchor="batches delivered per shard per s", anchor_value=got["batches_per_shard_per_s"],
                note="checkpoints_written from stats(); " + setting)
