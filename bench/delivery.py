"""Section ``delivery`` (issue 23): the delivery controls under load.

1. Throughput with a sink that takes 50 ms per batch, 4 shards with a backlog,
   ``max_batch_records=50``, 256 partition keys (about 64 per shard), at
   ``parallelization_factor`` 1, 4 and 10, side by side in one run on the same stream (each
   run a fresh subscription from ``TRIM_HORIZON`` with its own in-memory lease table).
   Goal: >= 3.5x the factor-1 rate at 4. The rate runs from the first to the last batch
   over all shards, so the moments the shards open count in it (they start delivering up to
   0.5-1.5 s apart): the backlog (``dc_records_per_shard`` x 4 = 160,000 records by default,
   spread over the shards by the keys' MD5 as 38,125 / 43,750 / 39,375 / 38,750; about 14 s
   of delivery at factor 4) is long enough that the opening spread weighs little at 4; at
   12,000 per shard a factor-4 run lasted about 5 s and the spread alone cost a tenth.
2. A poison record in 100,000 (4 shards, ``bisect_on_error``, ``max_sink_retries=2``,
   ``max_batch_records=500``, a dead-letter stream): how long its shard was held up (the
   sink's first refusal of the poison's batch to its first delivery past the poison), the
   records delivered and the records dead-lettered (goal: exactly 1).
3. A window on a trickle: 50 records/s into one shard with ``batch_window_s=1.0``:
   batches per second and the publish -> sink latency per record. Goal: p50 <=
   window + 250 ms, p99 <= window + 600 ms.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from typing import Any

import ray
from ray import cloudpickle

from .common import REGION, Results, client, create_stream, percentile

cloudpickle.register_pickle_by_value(sys.modules[__name__])

WINDOW_S = 1.0


@ray.remote(num_cpus=0, max_concurrency=64)
class SlowSink:
    """Sleeps ``delay_s`` per batch (asyncio: batches overlap); refuses payloads starting with
    ``poison``; logs (time, shard, records, first seq, last seq, ok) per call and the
    publish -> arrival latency of ``T<epoch s>|`` payloads."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.n = 0
        self.seen: set[bytes] = set()
        self.log: list[tuple[float, str, int, str, str, bool]] = []
        self.latencies: list[float] = []

    async def process_batch(self, records: Any) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        now = time.time()
        ok = not any(r.data.startswith(b"poison") for r in records)
        self.log.append((now, records[0].shard_id, len(records), records[0].sequence_number,
                         records[-1].sequence_number, ok))
        if not ok:
            raise ValueError("poison record")
        self.n += len(records)
        for r in records:
            self.seen.add(r.data)
            if r.data[:1] == b"T":
                self.latencies.append(now - float(r.data[1:r.data.index(b"|")]))

    def count(self) -> int:
        return len(self.seen)

    def summary(self) -> dict[str, Any]:
        return {"n": self.n, "distinct": len(self.seen), "log": list(self.log), "latencies": list(self.latencies)}

    def pid(self) -> int:
        return os.getpid()


def _put_all(endpoint: str, stream: str, items: list[tuple[bytes, str]]) -> list[dict[str, Any]]:
    """PutRecords in chunks of 500 (failed entries retried); the results in order."""
    k = client(endpoint, "kinesis")
    out: list[dict[str, Any]] = []
    for start in range(0, len(items), 500):
        chunk = [{"Data": d, "PartitionKey": key} for d, key in items[start:start + 500]]
        results: list[dict[str, Any] | None] = [None] * len(chunk)
        pending = list(range(len(chunk)))
        while pending:
            resp = k.put_records(StreamName=stream, Records=[chunk[i] for i in pending])
            failed = []
            for i, r in zip(pending, resp["Records"]):
                if "ErrorCode" in r:
                    failed.append(i)
                else:
                    results[i] = r
            pending = failed
        out.extend(r for r in results if r is not None)
    return out


def _broker(ctx: Any) -> Any:
    from kinesis_actors import KinesisBroker, MemoryLeaseStore

    return KinesisBroker(endpoint=ctx.endpoint, region=REGION, test_credentials=True, lease_store=MemoryLeaseStore(),
                         **{k: v for k, v in ctx.timings.items() if k != "lease_poll_interval_s"}).connect()


def _drain(ctx: Any, stream: str, total: int, timeout_s: float, **controls: Any) -> dict[str, Any]:
    """Subscribe from TRIM_HORIZON with ``controls``; wait until ``total`` distinct records arrived."""
    from kinesis_actors import KinesisStream, StartAt

    sink = SlowSink.remote(controls.pop("delay_s", 0.0))
    ray.get(sink.count.remote())
    conn = _broker(ctx)
    t0 = time.time()
    sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(),
                                       lease_poll_interval_s=ctx.timings["lease_poll_interval_s"], **controls),
                         sink=sink)
    deadline = time.monotonic() + timeout_s
    while ray.get(sink.count.remote()) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    summary = ray.get(sink.summary.remote())
    summary["stats"] = sub.stats()
    summary["subscribed_at"] = t0
    sub.close()
    conn.shutdown()
    ray.kill(sink)
    return summary


def _rate(log: list[tuple[float, str, int, str, str, bool]]) -> float | None:
    ok = sorted((t, n) for t, _, n, _, _, good in log if good)
    if len(ok) < 2 or ok[-1][0] <= ok[0][0]:
        return None
    return (sum(n for _, n in ok) - ok[0][1]) / (ok[-1][0] - ok[0][0])


def _steady_rate(log: list[tuple[float, str, int, str, str, bool]]) -> float | None:
    """The sum over shards of each shard's own rate (first to last batch of that shard): the
    steady rate, without the moments the shards opened (up to 1.5 s apart on 2 cores)."""
    by_shard: dict[str, list[tuple[float, str, int, str, str, bool]]] = {}
    for entry in log:
        by_shard.setdefault(entry[1], []).append(entry)
    rates = [_rate(entries) for entries in by_shard.values()]
    return sum(r for r in rates if r is not None) if rates and all(r is not None for r in rates) else None


def _throughput(ctx: Any, res: Results) -> None:
    per_shard = ctx.params["dc_records_per_shard"]
    stream = f"bench-dc-tp-{uuid.uuid4().hex[:8]}"
    create_stream(ctx.endpoint, stream, 4)
    total = 4 * per_shard
    _put_all(ctx.endpoint, stream, [(b"%010d" % i + b"x" * 90, f"key-{i % 256}") for i in range(total)])
    rates: dict[int, float | None] = {}
    steady: dict[int, float | None] = {}
    for factor in (1, 4, 10):
        s = _drain(ctx, stream, total, ctx.timeout_s, delay_s=0.05, max_batch_records=50,
                   parallelization_factor=factor)
        rates[factor] = _rate(s["log"])
        steady[factor] = _steady_rate(s["log"])
        inflight = max((sh.get("max_batches_in_flight") or 0) for sh in s["stats"]["shards"].values())
        res.add("delivery", f"slow_sink_pf{factor}_records_per_s", rates[factor], "records/s",
                anchor=None if factor == 1 else "slow_sink_pf1_records_per_s",
                anchor_value=None if factor == 1 else rates[1],
                goal=">= 3.5x pf1" if factor == 4 else None,
                check=(lambda v: rates[1] is not None and v >= 3.5 * rates[1]) if factor == 4 else None,
                note=(f"{total} records on 4 shards, 256 keys, 50 ms per batch, max_batch_records=50; "
                      f"delivered {s['distinct']}; most batches in flight on a shard {inflight}"))
        res.add("delivery", f"slow_sink_pf{factor}_steady_records_per_s", steady[factor], "records/s",
                anchor=None if factor == 1 else "slow_sink_pf1_steady_records_per_s",
                anchor_value=None if factor == 1 else steady[1],
                note="the sum of each shard's own rate (its first to its last batch): no goal, the "
                     "figure above carries it")


def _poison(ctx: Any, res: Results) -> None:
    total = ctx.params["dc_poison_total"]
    stream, dlq = f"bench-dc-poison-{uuid.uuid4().hex[:8]}", f"bench-dc-dlq-{uuid.uuid4().hex[:8]}"
    create_stream(ctx.endpoint, stream, 4)
    create_stream(ctx.endpoint, dlq, 1)
    poison_at = total // 2
    items = [(b"poison" if i == poison_at else b"%010d" % i + b"y" * 90, f"key-{i % 256}") for i in range(total)]
    t = time.monotonic()
    results = _put_all(ctx.endpoint, stream, items)
    ctx.log(f"published {total} records in {time.monotonic() - t:.1f} s")
    shard, seq = results[poison_at]["ShardId"], int(results[poison_at]["SequenceNumber"])
    conn = _broker(ctx)
    s = _drain(ctx, stream, total - 1, ctx.timeout_s * 3, bisect_on_error=True, max_sink_retries=2,
               max_batch_records=500, dead_letter=conn.publisher(dlq))
    conn.shutdown()
    log = s["log"]
    refused = [t for t, sh, _, first, last, ok in log if sh == shard and not ok]
    past = [t for t, sh, _, first, last, ok in log if sh == shard and ok and int(first) > seq]
    held = (min(past) - min(refused)) if refused and past else None
    dead = sum(sh.get("dead_letter_records") or 0 for sh in s["stats"]["shards"].values())
    res.add("delivery", "poison_shard_held_up_s", held, "s",
            note=f"{total} records on 4 shards; bisect_on_error, max_sink_retries=2, max_batch_records=500")
    res.add("delivery", "poison_records_delivered", s["distinct"], "records", anchor="published - 1",
            anchor_value=total - 1, goal="== published - 1", check=lambda v: v == total - 1)
    res.add("delivery", "poison_records_dead_lettered", dead, "records", goal="== 1", check=lambda v: v == 1)
    res.add("delivery", "poison_sink_calls_refused", len(refused), "calls")


def _trickle(ctx: Any, res: Results) -> None:
    from kinesis_actors import KinesisStream

    rate, seconds = ctx.params["lat_rate"], ctx.params["dc_trickle_s"]
    stream = f"bench-dc-trickle-{uuid.uuid4().hex[:8]}"
    create_stream(ctx.endpoint, stream, 1)
    sink = SlowSink.remote()
    ray.get(sink.count.remote())
    conn = _broker(ctx)
    sub = conn.subscribe(KinesisStream(stream, batch_window_s=WINDOW_S,
                                       lease_poll_interval_s=ctx.timings["lease_poll_interval_s"]), sink=sink)
    k = client(ctx.endpoint, "kinesis")
    time.sleep(1.0)
    t0, n = time.monotonic(), 0
    while (due := t0 + n / rate) - t0 < seconds:
        if due > time.monotonic():
            time.sleep(due - time.monotonic())
        k.put_record(StreamName=stream, Data=f"T{time.time():.6f}|{n}|".encode() + b"z" * 80, PartitionKey=f"k{n}")
        n += 1
    span = time.monotonic() - t0
    deadline = time.monotonic() + 10
    while ray.get(sink.count.remote()) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    s = ray.get(sink.summary.remote())
    sub.close()
    conn.shutdown()
    ray.kill(sink)
    ms = [v * 1000 for v in s["latencies"]]
    window_ms = WINDOW_S * 1000
    note = f"{n} records at {rate}/s for {span:.0f} s into 1 shard, batch_window_s={WINDOW_S}"
    res.add("delivery", "trickle_delivered", s["distinct"], "records", anchor="published", anchor_value=n,
            goal="== published", check=lambda v: v == n, note=note)
    res.add("delivery", "trickle_batches_per_s", len(s["log"]) / span, "batches/s", anchor="1 / window",
            anchor_value=1 / WINDOW_S)
    for q, extra in ((50, 250.0), (99, 600.0)):
        res.add("delivery", f"trickle_p{q}_ms", percentile(ms, q), "ms", anchor="window", anchor_value=window_ms,
                goal=f"<= window + {extra:.0f} ms", check=lambda v, e=extra: v <= window_ms + e)


def run(ctx: Any, res: Results) -> None:
    for name, part in (("throughput", _throughput), ("poison", _poison), ("trickle", _trickle)):
        ctx.log(f"delivery: {name}")
        t = time.monotonic()
        part(ctx, res)
        ctx.log(f"delivery: {name} took {time.monotonic() - t:.1f} s")


__all__ = ["run", "SlowSink"]
