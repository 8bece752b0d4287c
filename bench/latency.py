"""Section ``latency`` (issue 9, item 2): publish at 50 records/s for 30 s; publish -> sink.

The product (default timings, 4 shards, ``LATEST``, DynamoDB lease table) pushes into a
sink actor that computes ``arrival - publish time`` from each payload (``T<epoch s>|``,
stamped just before ``PutRecord``; one machine, one clock). Side by side, on the same
records: raw boto3 pollers, one thread per shard calling ``GetRecords`` every 0.2 s
(5 calls/s per shard, the AWS limit): the best a poller can do here.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

from .common import REGION, Results, client, create_stream, hash_keys, percentile

STREAM_SHARDS = 4


def _raw_poller(endpoint: str, stream: str, shard_id: str, lat: list[float], stop: threading.Event,
                ready: threading.Barrier) -> None:
    k = client(endpoint, "kinesis")
    it = k.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="LATEST")["ShardIterator"]
    ready.wait()
    while not stop.is_set():
        t = time.monotonic()
        resp = k.get_records(ShardIterator=it, Limit=10_000)
        now = time.time()
        for r in resp["Records"]:
            d = r["Data"]
            if d[:1] == b"T":
                lat.append(now - float(d[1:d.index(b"|")]))
        it = resp["NextShardIterator"]
        wait = t + 0.2 - time.monotonic()
        if wait > 0:
            time.sleep(wait)


def run(ctx: Any, res: Results) -> None:
    import ray

    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream

    from .actors import TimedSink

    rate, duration = ctx.params["lat_rate"], ctx.params["lat_seconds"]
    stream = f"bench-lat-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, STREAM_SHARDS)
    keys = list(hash_keys(shards).values())
    sink = TimedSink.remote()
    ray.get(sink.count.remote())
    conn = KinesisBroker(endpoint=ctx.endpoint, region=REGION, test_credentials=True,
                         lease_store=DynamoLeaseStore(f"bench-lat-{uuid.uuid4().hex[:8]}", create_if_missing=True)).connect()
    sub = conn.subscribe(KinesisStream(stream), sink=sink)
    raw_lat: list[float] = []
    stop = threading.Event()
    ready = threading.Barrier(len(shards) + 1)
    pollers = [threading.Thread(target=_raw_poller, args=(ctx.endpoint, stream, s["ShardId"], raw_lat, stop, ready), daemon=True)
               for s in shards]
    for t in pollers:
        t.start()
    ready.wait()
    time.sleep(1.0)  # readers and pollers at the tip
    k = client(ctx.endpoint, "kinesis")
    calls0 = {sid: s.get("get_records_calls", 0) for sid, s in sub.stats()["shards"].items()}
    t_start = time.monotonic()
    n = 0
    rnd = random.Random(7)
    pad = b"x" * 80
    while True:
        due = t_start + n / rate
        now = time.monotonic()
        if due - t_start >= duration:
            break
        if due > now:
            time.sleep(due - now)
        data = f"T{time.time():.6f}|{n}|".encode() + pad
        k.put_record(StreamName=stream, Data=data, PartitionKey=f"k{n}", ExplicitHashKey=rnd.choice(keys))
        n += 1
    window = time.monotonic() - t_start
    time.sleep(2.0)  # stragglers
    stats = sub.stats()["shards"]
    stop.set()
    for t in pollers:
        t.join(timeout=5)
    lat = ray.get(sink.latencies_since.remote(0.0))
    delivered = ray.get(sink.count.remote())
    sub.close()
    conn.shutdown()
    ray.kill(sink)
    calls = {sid: (s.get("get_records_calls", 0) - calls0.get(sid, 0)) / (window + 2.0) for sid, s in stats.items()}
    ms = [v * 1000 for v in lat]
    raw_ms = [v * 1000 for v in raw_lat]
    note = f"{n} records at {rate}/s for {window:.0f} s over {STREAM_SHARDS} shards; default timings (idle wait 0.25 s)"
    res.add("latency", "published", n, "records", note=note)
    res.add("latency", "delivered", delivered, "records", anchor="published", anchor_value=n, goal=">= published",
            check=lambda v: v >= n)
    for q, bound in ((50, 250.0), (95, None), (99, 600.0)):
        raw_q = percentile(raw_ms, q)
        res.add("latency", f"raw_poll_p{q}_ms", raw_q, "ms",
                note="boto3 poller per shard, GetRecords every 0.2 s" if q == 50 else None)
        res.add("latency", f"product_p{q}_ms", percentile(ms, q), "ms", anchor=f"raw_poll_p{q}_ms", anchor_value=raw_q,
                goal=None if bound is None else f"<= {bound:.0f} ms",
                check=None if bound is None else (lambda v, b=bound: v <= b))
    res.add("latency", "product_max_ms", max(ms) if ms else None, "ms")
    top = max(calls.values()) if calls else None
    res.add("latency", "get_records_calls_per_s_per_shard_max", top, "calls/s", anchor="AWS limit", anchor_value=5.0,
            goal="<= 5", check=lambda v: v <= 5.0, note="from ShardReader stats over the publishing window")
