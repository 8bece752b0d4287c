"""Section ``lease_cost``: what the lease table costs, counted on the wire, not computed.

The subscription's ``DynamoLeaseStore`` talks to the emulator through a counting proxy
(:mod:`bench.count_proxy`), so every lease-table request of the Coordinator and the readers
is seen, by ``X-Amz-Target``: ``UpdateItem``/``PutItem``/``DeleteItem`` are writes (one write
request unit each: a lease row is well under 1 KB), ``GetItem``/``Query``/``Scan`` reads (read
units estimated as one per started 4 KB of each response, as a strongly consistent read is
billed). Two cases, each counted over ``lc_window_s`` after the subscription settled:

* ``idle``: ``lc_idle_shards`` shards at the tip (nothing published);
* ``load``: ``lc_load_shards`` shards, each receiving ``lc_rate_per_shard`` records/s (10-20),
  so every poll returns a batch; run once per ``lc_intervals`` entry (``"default"``: the
  ``min_checkpoint_interval_s`` the library defaults to; a number: that value). After the
  window one ShardReader holding shards is SIGKILLed while publishing goes on for
  ``lc_kill_s``; then every record is awaited and the records delivered more than once are
  counted (the sink keeps every (shard, sequence number) it saw).

Printed per case: writes and reads per shard per second, write units per shard per renew
interval, and dollars per month for 500 shards at on-demand prices (the prices are in the
figures' units and in a note). The writes include the instance's presence heartbeat (one
per renew interval per instance, spread over the shards).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import uuid
from typing import Any

import ray
from ray import cloudpickle

from .common import REGION, Results, client, create_stream, hash_keys, wait_for
from .count_proxy import READS, WRITES, CountingProxy

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the sink below, in Ray workers

S = "lease_cost"
WRU_USD_PER_MILLION = 0.625  # on-demand, us-east-1 (docs/production.md, "DynamoDB cost", gives the source)
RRU_USD_PER_MILLION = 0.125
MONTH_S = 2_628_000  # 730 h, AWS's billing month
FLEET_SHARDS = 500
PRICES = (f"on-demand DynamoDB prices: ${WRU_USD_PER_MILLION} per million write request units, "
          f"${RRU_USD_PER_MILLION} per million read request units (us-east-1), month = 730 h")


@ray.remote(num_cpus=0)
class SeqSink:
    """Counts deliveries of each (shard id, sequence number): redeliveries are the surplus."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], int] = {}
        self.deliveries = 0

    def process_batch(self, records: list[Any]) -> None:
        for r in records:
            key = (r.shard_id, r.sequence_number)
            self.seen[key] = self.seen.get(key, 0) + 1
        self.deliveries += len(records)

    def totals(self) -> dict[str, Any]:
        extra: dict[str, int] = {}
        for (shard, _), n in self.seen.items():
            if n > 1:
                extra[shard] = extra.get(shard, 0) + n - 1
        return {"distinct": len(self.seen), "deliveries": self.deliveries, "redelivered_by_shard": extra}


class Publisher(threading.Thread):
    """``rate`` records/s spread evenly over the shards (explicit hash keys) until stopped."""

    def __init__(self, endpoint: str, stream: str, keys: list[str], rate: float) -> None:
        super().__init__(name="lease-cost-publisher", daemon=True)
        self.endpoint, self.stream, self.keys, self.rate = endpoint, stream, keys, rate
        self.n = 0
        self.stop = threading.Event()

    def run(self) -> None:
        kinesis = client(self.endpoint, "kinesis")
        tick = 0.1
        t0 = time.monotonic()
        while not self.stop.is_set():
            due = int(self.rate * (time.monotonic() - t0)) - self.n
            if due > 0:
                entries = [{"Data": b"x" * 100, "PartitionKey": "k", "ExplicitHashKey": self.keys[(self.n + i) % len(self.keys)]}
                           for i in range(due)]
                kinesis.put_records(StreamName=self.stream, Records=entries)
                self.n += due
            self.stop.wait(tick)


def _counts(proxy: CountingProxy, t0: float, t1: float, shards: int) -> dict[str, float]:
    calls = proxy.calls(t0, t1)
    window = t1 - t0
    writes = [c for c in calls if c.op in WRITES]
    reads = [c for c in calls if c.op in READS]
    read_units = sum(max(1, math.ceil(c.response_bytes / 4096)) for c in reads)
    return {"writes_per_shard_per_s": len(writes) / shards / window,
            "reads_per_shard_per_s": len(reads) / shards / window,
            "read_units_per_shard_per_s": read_units / shards / window,
            "update_item_per_shard_per_s": sum(c.op == "UpdateItem" for c in calls) / shards / window,
            "window_s": window}


def _broker(ctx: Any, proxy: CountingProxy, table: str) -> Any:
    from kinesis_actors import DynamoLeaseStore, KinesisBroker

    return KinesisBroker(endpoint=ctx.endpoint, region=REGION, test_credentials=True,
                         lease_store=DynamoLeaseStore(table, create_if_missing=True, endpoint=proxy.url),
                         lease_duration_s=ctx.timings["lease_duration_s"],
                         renew_interval_s=ctx.timings["renew_interval_s"])


def _stream_options(interval: Any) -> dict[str, Any]:
    return {} if interval == "default" else {"min_checkpoint_interval_s": float(interval)}


def _idle(ctx: Any, proxy: CountingProxy) -> dict[str, float]:
    from kinesis_actors import KinesisStream

    shards = ctx.params["lc_idle_shards"]
    stream = f"bench-lc-idle-{uuid.uuid4().hex[:8]}"
    create_stream(ctx.endpoint, stream, shards)
    conn = _broker(ctx, proxy, f"{stream}-leases").connect()
    try:
        sub = conn.subscribe(KinesisStream(stream), sink=SeqSink.remote())
        time.sleep(ctx.params["lc_settle_s"])  # let the first pass's takes and opens finish
        t0 = time.time()
        time.sleep(ctx.params["lc_window_s"])
        out = _counts(proxy, t0, time.time(), shards)
        sub.close()
    finally:
        conn.shutdown()
    return out


def _load(ctx: Any, proxy: CountingProxy, interval: Any) -> dict[str, float]:
    from kinesis_actors import KinesisStream

    shards, rate = ctx.params["lc_load_shards"], ctx.params["lc_rate_per_shard"]
    stream = f"bench-lc-load-{uuid.uuid4().hex[:8]}"
    keys = list(hash_keys(create_stream(ctx.endpoint, stream, shards)).values())
    conn = _broker(ctx, proxy, f"{stream}-leases").connect()
    sink = SeqSink.remote()
    pub = Publisher(ctx.endpoint, stream, keys, rate * shards)
    try:
        sub = conn.subscribe(KinesisStream(stream, **_stream_options(interval)), sink=sink)
        pub.start()
        time.sleep(ctx.params["lc_settle_s"])
        before = sub.stats()["shards"]
        t0 = time.time()
        time.sleep(ctx.params["lc_window_s"])
        t1 = time.time()
        after = sub.stats()["shards"]
        out = _counts(proxy, t0, t1, shards)
        out["batches_per_shard_per_s"] = sum(after[s].get("batches", 0) - before.get(s, {}).get("batches", 0)
                                             for s in after) / shards / (t1 - t0)
        out.update(_kill_one_reader(ctx, sub, sink, pub))
        sub.close()
    finally:
        pub.stop.set()
        conn.shutdown()
    return out


def _kill_one_reader(ctx: Any, sub: Any, sink: Any, pub: Publisher) -> dict[str, float]:
    """SIGKILL a reader holding shards while publishing goes on; then the redelivered records."""
    readers = [r for r in sub.stats()["readers"] if r.get("pid") and r.get("shards")]
    if not readers:
        return {}
    victim = max(readers, key=lambda r: r["shards"])
    os.kill(int(victim["pid"]), signal.SIGKILL)
    time.sleep(ctx.params["lc_kill_s"])
    pub.stop.set()
    pub.join(timeout=30)
    delivered = wait_for(lambda: ray.get(sink.totals.remote())["distinct"] >= pub.n, timeout_s=120, interval_s=0.5)
    totals = ray.get(sink.totals.remote())
    if not delivered:
        ctx.log(f"lease_cost: only {totals['distinct']} of {pub.n} records delivered after the kill")
    return {"killed_reader_shards": float(victim["shards"]),
            "redelivered_records": float(sum(totals["redelivered_by_shard"].values())),
            "published": float(pub.n), "distinct_delivered": float(totals["distinct"])}


def _usd_per_month(figures: dict[str, float]) -> tuple[float, float]:
    """Dollars per month for FLEET_SHARDS shards: (the writes' cost, the read units' cost)."""
    writes = figures["writes_per_shard_per_s"] * FLEET_SHARDS * MONTH_S / 1e6 * WRU_USD_PER_MILLION
    reads = figures["read_units_per_shard_per_s"] * FLEET_SHARDS * MONTH_S / 1e6 * RRU_USD_PER_MILLION
    return writes, reads


def _report(ctx: Any, res: Results, tag: str, got: dict[str, float], setting: str, default: bool,
            idle: bool) -> None:
    renew_s = ctx.timings["renew_interval_s"]
    bound = (1.0 if idle else 1.1) / renew_s
    res.add(S, f"lc_{tag}_writes_per_shard_per_s", got["writes_per_shard_per_s"], "writes/s",
            anchor="1 / renew_interval_s (the renewals alone)", anchor_value=1.0 / renew_s,
            goal=f"<= {bound:.3g}" if default else None, check=(lambda v: v <= bound) if default else None,
            note="lease-table UpdateItem/PutItem/DeleteItem counted on the wire; " + setting)
    res.add(S, f"lc_{tag}_reads_per_shard_per_s", got["reads_per_shard_per_s"], "reads/s",
            note=f"GetItem/Query/Scan requests; read units {got['read_units_per_shard_per_s']:.3g}/s per shard "
                 "(one per started 4 KB of each response); " + setting)
    res.add(S, f"lc_{tag}_wru_per_shard_per_renew_interval", got["writes_per_shard_per_s"] * renew_s, "WRU",
            goal=("<= 1" if idle else "<= 1.1") if default else None,
            check=(lambda v: v <= (1.0 if idle else 1.1)) if default else None, note=setting)
    usd, read_usd = _usd_per_month(got)
    res.add(S, f"lc_{tag}_usd_per_month_500_shards", usd, "$/month",
            goal="<= 300" if default else None, check=(lambda v: v <= 300) if default else None,
            note=f"{FLEET_SHARDS} x the measured per-shard writes; {PRICES}; " + setting)
    res.add(S, f"lc_{tag}_read_usd_per_month_500_shards", read_usd, "$/month",
            note=(f"{FLEET_SHARDS} x the measured per-shard read units (the Coordinators' lease-table Scans, "
                  "extrapolated per shard); " + setting))
    if "batches_per_shard_per_s" in got:
        res.add(S, f"lc_{tag}_batches_per_shard_per_s", got["batches_per_shard_per_s"], "batches/s", note=setting)
    if got.get("killed_reader_shards"):
        per_interval = ctx.params["lc_rate_per_shard"] * renew_s
        per_shard = got["redelivered_records"] / got["killed_reader_shards"]
        res.add(S, f"lc_{tag}_redelivered_per_killed_shard", per_shard, "records",
                anchor="records acknowledged per shard in one renew interval", anchor_value=per_interval,
                goal=f"<= {per_interval:g}" if default else None,
                check=(lambda v: v <= per_interval) if default else None,
                note=(f"SIGKILL of one ShardReader holding {got['killed_reader_shards']:.0f} shards under load; "
                      f"{got['redelivered_records']:.0f} records delivered twice, {got['distinct_delivered']:.0f} "
                      f"of {got['published']:.0f} published delivered; " + setting))
    ctx.log(f"lease_cost {tag}: {got['writes_per_shard_per_s']:.3f} writes and {got['reads_per_shard_per_s']:.3f} "
            f"reads per shard per s, {got['writes_per_shard_per_s'] * renew_s:.2f} WRU per shard per renew "
            f"interval, ${usd:,.0f}/month of writes (+${read_usd:,.0f} of reads) for {FLEET_SHARDS} shards; "
            f"redelivered after a reader SIGKILL: "
            f"{got.get('redelivered_records', 'not measured')}")


def run(ctx: Any, res: Results) -> None:
    from kinesis_actors import KinesisStream

    renew_s, lease_s = ctx.timings["renew_interval_s"], ctx.timings["lease_duration_s"]
    default_interval = KinesisStream("x").min_checkpoint_interval_s
    res.note(f"lease_cost: {PRICES}")
    with CountingProxy(ctx.endpoint) as proxy:
        got = _idle(ctx, proxy)
        setting = (f"{ctx.params['lc_idle_shards']} idle shards at the tip, lease {lease_s:g} s / renew {renew_s:g} s, "
                   f"defaults (min_checkpoint_interval_s={default_interval!r}), {got['window_s']:.0f} s counted")
        _report(ctx, res, "idle", got, setting, default=True, idle=True)
        for interval in ctx.params["lc_intervals"]:
            got = _load(ctx, proxy, interval)
            value = default_interval if interval == "default" else float(interval)
            tag = "load_default" if interval == "default" else f"load_ckpt_{float(interval):g}s".replace(".", "_")
            setting = (f"{ctx.params['lc_load_shards']} shards x {ctx.params['lc_rate_per_shard']} records/s of "
                       f"100 B, lease {lease_s:g} s / renew {renew_s:g} s, min_checkpoint_interval_s={value!r}"
                       f"{' (the default)' if interval == 'default' else ''}, {got['window_s']:.0f} s counted")
            _report(ctx, res, tag, got, setting, default=interval == "default", idle=False)
