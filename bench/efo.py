"""Section ``efo`` (issue 15): enhanced fan-out against polling, both on kinesis-mock.

4 shards, 50 records/s (100 B payloads, stamped ``T<epoch s>|`` just before ``PutRecord``)
for ``efo_seconds``; the product with default timings, ``LATEST``, its lease table on
moto's DynamoDB, pushing into a sink actor that computes ``arrival - publish time``.
Run twice on fresh streams, one after the other: ``retrieval="fanout"`` then
``"polling"``. CPU = user+system seconds of this subscription's Ray processes
(``ray::ShardReader``, ``ray::Coordinator``) over the publishing window, per MB delivered.

These are the EMULATOR's latencies, not AWS's: kinesis-mock sends one
``SubscribeToShardEvent`` per second per subscription, so its fan-out latency is that
second's wait, where AWS documents about 70 ms for EFO.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

from .common import (
    REGION,
    Results,
    client,
    cpu_delta,
    cpu_snapshot,
    create_stream,
    hash_keys,
    percentile,
    proc_title,
    ray_tree,
)

STREAM_SHARDS = 4
RATE = 50
NOTE = "kinesis-mock: one event per second per subscription; the emulator's latency, not AWS's (~70 ms)"


def _one(ctx: Any, kinesis_endpoint: str, retrieval: str, seconds: float) -> dict[str, Any]:
    import ray

    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream

    from .actors import TimedSink

    stream = f"bench-efo-{retrieval}-{uuid.uuid4().hex[:8]}"
    shards = create_stream(kinesis_endpoint, stream, STREAM_SHARDS)
    keys = list(hash_keys(shards).values())
    sink = TimedSink.remote()
    ray.get(sink.count.remote())
    store = DynamoLeaseStore(f"bench-efo-{uuid.uuid4().hex[:8]}", create_if_missing=True, endpoint=ctx.endpoint,
                             region=REGION, test_credentials=True)
    conn = KinesisBroker(endpoint=kinesis_endpoint, region=REGION, test_credentials=True, lease_store=store).connect()
    options: dict[str, Any] = {"retrieval": "fanout", "consumer_name": "bench"} if retrieval == "fanout" else {}
    sub = conn.subscribe(KinesisStream(stream, **options), sink=sink)
    time.sleep(1.0)  # readers at the tip
    exclude = [ctx.emulator_pid, *(c.pid for c in ctx.children)]
    procs = [p for p in ray_tree(exclude) if proc_title(p).startswith(("ray::ShardReader", "ray::Coordinator"))]
    before = cpu_snapshot(procs)
    k = client(kinesis_endpoint, "kinesis")
    rnd, pad = random.Random(7), b"x" * 80
    t_start, n, nbytes = time.monotonic(), 0, 0
    while True:
        due = t_start + n / RATE
        if due - t_start >= seconds:
            break
        if due > time.monotonic():
            time.sleep(due - time.monotonic())
        data = f"T{time.time():.6f}|{n}|".encode() + pad
        k.put_record(StreamName=stream, Data=data, PartitionKey=f"k{n}", ExplicitHashKey=rnd.choice(keys))
        n, nbytes = n + 1, nbytes + len(data)
    deadline = time.monotonic() + 10.0
    while ray.get(sink.count.remote()) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    after = cpu_snapshot(procs)
    lat = [v * 1000 for v in ray.get(sink.latencies_since.remote(0.0))]
    delivered = ray.get(sink.count.remote())
    shard_stats = sub.stats()["shards"]
    sub.close()
    conn.shutdown()
    ray.kill(sink)
    cpu = sum(cpu_delta(before, after).values())
    mb = nbytes / 1e6 * min(1.0, delivered / max(1, n))
    return {"published": n, "delivered": delivered, "lat_ms": lat, "cpu_s": cpu, "mb": mb, "processes": len(procs),
            "subscriptions": sum(s.get("subscriptions", 0) for s in shard_stats.values())}


def run(ctx: Any, res: Results) -> None:
    from kinesis_actors.emulator import KinesisMock

    seconds = ctx.params["efo_seconds"]
    with KinesisMock() as km:
        ctx.log(f"kinesis-mock at {km.endpoint}")
        got = {mode: _one(ctx, km.endpoint, mode, seconds) for mode in ("fanout", "polling")}
    for mode, r in got.items():
        res.add("efo", f"{mode}_delivered", r["delivered"], "records", anchor="published", anchor_value=r["published"],
                goal=">= published", check=lambda v, n=r["published"]: v >= n,
                note=f"{r['published']} records at {RATE}/s for {seconds:.0f} s over {STREAM_SHARDS} shards"
                if mode == "fanout" else None)
    for q in (50, 99):
        poll_q = percentile(got["polling"]["lat_ms"], q)
        res.add("efo", f"polling_p{q}_ms", poll_q, "ms", note="GetRecords, default timings" if q == 50 else None)
        res.add("efo", f"fanout_p{q}_ms", percentile(got["fanout"]["lat_ms"], q), "ms", anchor=f"polling_p{q}_ms",
                anchor_value=poll_q, note=NOTE if q == 50 else None)
    cpu_poll = got["polling"]["cpu_s"] / got["polling"]["mb"] if got["polling"]["mb"] else None
    res.add("efo", "polling_cpu_s_per_mb", cpu_poll, "CPU s/MB",
            note="ShardReader + Coordinator processes over the window; MB = payload bytes delivered")
    res.add("efo", "fanout_cpu_s_per_mb", got["fanout"]["cpu_s"] / got["fanout"]["mb"] if got["fanout"]["mb"] else None,
            "CPU s/MB", anchor="polling_cpu_s_per_mb", anchor_value=cpu_poll)
    res.add("efo", "fanout_subscriptions", got["fanout"]["subscriptions"], "SubscribeToShard accepted",
            note=f"{STREAM_SHARDS} shards: one each unless renewed or dropped")
