"""Section ``throughput`` (issue 9, item 1) and the ``peer`` side run (item 6).

A stream of 4 shards is pre-filled with 1 KB records. The same records are then read
from TRIM_HORIZON, in the same run, against the same emulator, by:

* ``raw_single``: plain boto3, one process, one thread, the shards one after another;
* ``raw_threads``: plain boto3, one thread per shard;
* ``product``: ``KinesisBroker.subscribe`` with a ``DynamoLeaseStore`` into a Ray actor
  that only counts (push mode), i.e. a Coordinator and its pool of ShardReader processes
  (``pool_size(4, max_shards_per_reader)``: with the default cap one reader holds the 4
  leases and one is spare; the figures name the layout measured);
* ``peer``: async-kinesis 3.0.1, from its own virtualenv (a subprocess).

Rates: ``steady`` = (records - first delivery) / (last delivery - first delivery), the
same formula for every reader; ``e2e`` = records / (last delivery - start), where the
product's start is the ``subscribe()`` call (it includes starting the actors).
CPU: raw = CPU time of the draining threads; product = every process of our Ray
runtime (driver, gcs, raylet, Coordinator, the readers of the pool, sink) over the read, minus the
benchmark's own memory sampler; peer = the subprocess's CPU time while reading.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from .common import (
    CREDENTIALS,
    REGION,
    Results,
    UssSampler,
    client,
    cpu_delta,
    cpu_snapshot,
    create_stream,
    median,
    pool_pids,
    prefill,
    psutil_mod,
    ray_tree,
    steady_rate,
    wait_for,
)
from .cputrace import CpuTrace, window_cores

MB = 1e6
HERE = os.path.dirname(os.path.abspath(__file__))


def _drain_shard(k: Any, stream: str, shard_id: str, expect: int, events: list[tuple[float, int]]) -> tuple[int, int]:
    it = k.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    n = nbytes = 0
    while n < expect:
        resp = k.get_records(ShardIterator=it, Limit=10_000)
        recs = resp["Records"]
        if not recs:
            break
        n += len(recs)
        nbytes += sum(len(r["Data"]) for r in recs)
        events.append((time.time(), len(recs)))
        it = resp["NextShardIterator"]
    return n, nbytes


def raw_single(endpoint: str, stream: str, shard_ids: list[str], per_shard: int) -> dict[str, Any]:
    k = client(endpoint, "kinesis")
    k.list_shards(StreamName=stream)  # warm the connection
    events: list[tuple[float, int]] = []
    t0, c0 = time.time(), time.thread_time()
    n = nbytes = 0
    for sid in shard_ids:
        a, b = _drain_shard(k, stream, sid, per_shard, events)
        n, nbytes = n + a, nbytes + b
    cpu = time.thread_time() - c0
    return {"records": n, "bytes": nbytes, "t0": t0, "events": events, "cpu_s": cpu}


def raw_threads(endpoint: str, stream: str, shard_ids: list[str], per_shard: int) -> dict[str, Any]:
    clients = {sid: client(endpoint, "kinesis") for sid in shard_ids}
    for k in clients.values():
        k.list_shards(StreamName=stream)
    events: list[tuple[float, int]] = []
    totals: dict[str, tuple[int, int, float]] = {}
    go = threading.Barrier(len(shard_ids) + 1)

    def work(sid: str) -> None:
        go.wait()
        c0 = time.thread_time()
        mine: list[tuple[float, int]] = []
        a, b = _drain_shard(clients[sid], stream, sid, per_shard, mine)
        events.extend(mine)
        totals[sid] = (a, b, time.thread_time() - c0)

    threads = [threading.Thread(target=work, args=(sid,)) for sid in shard_ids]
    for t in threads:
        t.start()
    t0 = time.time()
    go.wait()
    for t in threads:
        t.join()
    return {"records": sum(v[0] for v in totals.values()), "bytes": sum(v[1] for v in totals.values()),
            "t0": t0, "events": events, "cpu_s": sum(v[2] for v in totals.values())}


def raw_memory(ctx: Any, stream: str, shard_id: str, expect: int) -> tuple[float, float]:
    """(peak USS while draining, USS at the end) in MiB of a plain boto3 process draining one shard."""
    from .common import uss_mib

    psutil = psutil_mod()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_raw_mem.py"), ctx.endpoint, stream, shard_id, str(expect)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p = psutil.Process(proc.pid)
    peak = 0.0
    done = threading.Event()

    def watch() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("DONE"):
                done.set()
                return
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    while not done.wait(0.1):
        m = uss_mib(p)
        if m:
            peak = max(peak, m[0])
    end = uss_mib(p)
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(timeout=30)
    return max(peak, end[0] if end else 0.0), end[0] if end else 0.0


def product(ctx: Any, stream: str, expect: int, sample_uss: bool, max_records: int = 10_000) -> dict[str, Any]:
    import ray

    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt

    from .actors import CountingSink

    psutil = psutil_mod()
    sink = CountingSink.remote()
    ray.get(sink.pid.remote())
    table = f"bench-tp-{uuid.uuid4().hex[:8]}"
    conn = KinesisBroker(endpoint=ctx.endpoint, region=REGION, test_credentials=True,
                         lease_store=DynamoLeaseStore(table, create_if_missing=True),
                         owner_id=f"bench-{uuid.uuid4().hex[:6]}").connect()
    conn.lease_store.list(stream)  # creates the lease table now, not inside the timed read
    me = psutil.Process()
    exclude = [ctx.emulator_pid]
    emu = psutil.Process(ctx.emulator_pid)
    sampler = UssSampler("ray::ShardReader", exclude, period_s=0.5 if sample_uss else 3600)
    before = cpu_snapshot([me, *ray_tree(exclude)])
    emu0 = sum(emu.cpu_times()[:2])
    t0 = time.time()
    with sampler, CpuTrace(ctx.emulator_pid) as emu_trace:
        sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), max_records=max_records), sink=sink)
        t_sub = time.time()
        mid = cpu_snapshot([me, *ray_tree(exclude)])
        mid_bytes = ray.get(sink.summary.remote())["bytes"]
        got = wait_for(lambda: ray.get(sink.count.remote()) >= expect, timeout_s=ctx.timeout_s, interval_s=0.1)
        after = cpu_snapshot([me, *ray_tree(exclude)])
    emu_cpu = sum(emu.cpu_times()[:2]) - emu0
    summary = ray.get(sink.summary.remote())
    try:
        stats = sub.stats()
    except Exception:
        stats = {}
    sub.close()
    conn.shutdown()
    ray.kill(sink)
    if not got:
        raise RuntimeError(f"product delivered {summary['n']} of {expect} records in {ctx.timeout_s} s")
    per_title = cpu_delta(before, after)
    own = sampler.cpu_s + emu_trace.cpu_s  # the bench's own sampling threads in this process
    total = sum(per_title.values()) - own
    span = max(1e-9, time.time() - t0)
    after_start = sum(cpu_delta(mid, after).values()) - own * (time.time() - t_sub) / span
    events = [tuple(e) for e in summary["log"]]
    calls = [s.get("get_records_calls", 0) for s in stats.get("shards", {}).values()]
    readers, _ = pool_pids(stats)
    peak = {pid: uss for pid, uss in sampler.peak.items() if pid in readers} if readers else dict(sampler.peak)
    return {"readers": readers, "records": summary["n"], "bytes": summary["bytes"], "t0": t0, "t_sub": t_sub,
            "events": events, "cpu_s": total, "emulator_window_cores": window_cores(emu_trace, events), "cpu_by_process": per_title,
            "cpu_after_start_s": after_start, "bytes_after_start": summary["bytes"] - mid_bytes,
            "cpu_after_start_by_process": cpu_delta(mid, after),
            "emulator_cpu_s": emu_cpu, "uss_peak": peak, "get_records_calls": sum(calls)}


def peer(ctx: Any, stream: str, expect: int) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID=CREDENTIALS["aws_access_key_id"], AWS_SECRET_ACCESS_KEY=CREDENTIALS["aws_secret_access_key"],
               AWS_DEFAULT_REGION=REGION, AWS_EC2_METADATA_DISABLED="true")
    env.pop("PYTHONPATH", None)
    psutil = psutil_mod()
    emu = psutil.Process(ctx.emulator_pid)
    emu0 = sum(emu.cpu_times()[:2])
    proc = subprocess.run([ctx.peer_python, os.path.join(HERE, "_peer_drain.py"), "--endpoint", ctx.endpoint,
                           "--stream", stream, "--expect", str(expect), "--timeout", str(ctx.timeout_s)],
                          capture_output=True, text=True, env=env, timeout=ctx.timeout_s + 60)
    emu_cpu = sum(emu.cpu_times()[:2]) - emu0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"peer exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}")
    out = json.loads(lines[-1])
    out["emulator_cpu_s"] = emu_cpu
    return out


def _rates(run: dict[str, Any], start_key: str = "t0") -> dict[str, float | None]:
    events = run["events"]
    last = max(t for t, _ in events) if events else None
    e2e = run["records"] / (last - run[start_key]) if last and last > run[start_key] else None
    steady = steady_rate(events)
    return {"steady": steady, "e2e": e2e,
            "mb_steady": None if steady is None else steady * run["bytes"] / max(1, run["records"]) / MB,
            "cpu_per_mb": run["cpu_s"] / (run["bytes"] / MB) if run["bytes"] else None}


def _where_the_cpu_goes(ctx: Any, res: Results, stream: str, shard_ids: list[str], per_shard: int,
                        products: list[dict[str, Any]], single_cpu: float | None) -> None:
    """Figures ``where_<phase>_cpu_s_per_mb``: a reader's phases measured in this process
    (bench/read_path.py ``breakdown``: the fast path and its RecordBatch, one round) and the
    Coordinator's CPU from ``subscribe()`` returning (the product runs, median)."""
    from .read_path import breakdown

    try:
        phases = breakdown(ctx.endpoint, stream, shard_ids, per_shard, rounds=1, modes=("after",))["cpu_s_per_mb"]["after"]
    except Exception as e:
        res.note(f"where the CPU goes: breakdown failed: {e!r:.200}")
        phases = {}
    note = "bench/read_path.py breakdown in the bench driver: thread CPU of the phase per MB of payload"
    for phase in ("parse", "build", "deliver", "checkpoint"):
        res.add("throughput", f"where_{phase}_cpu_s_per_mb", phases.get(phase), "CPU s/MB",
                anchor="raw_single_cpu_s_per_mb", anchor_value=single_cpu, note=note)
    coordinator = median(r["cpu_after_start_by_process"].get("ray::Coordinator", 0.0) / (r["bytes_after_start"] / MB)
                         for r in products if r["bytes_after_start"])
    res.add("throughput", "where_coordinator_cpu_s_per_mb", coordinator, "CPU s/MB", anchor="raw_single_cpu_s_per_mb",
            anchor_value=single_cpu, note="the Coordinator process, counted from subscribe() returning")


def run(ctx: Any, res: Results) -> None:
    p = ctx.params
    n_shards, per_shard, size, reps = 4, p["tp_records_per_shard"], p["tp_record_bytes"], p["tp_reps"]
    stream = f"bench-tp-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, n_shards)
    shard_ids = [s["ShardId"] for s in shards]
    n, nbytes, secs = prefill(ctx.endpoint, stream, shards, per_shard, size)
    expect = n
    res.add("throughput", "prefill_put_records_per_s", n / secs, "rec/s",
            note=f"{n} records of {size} B into {n_shards} shards, PutRecords of 500, 2 threads")
    ctx.log(f"prefilled {n} records ({nbytes / MB:.0f} MB) in {secs:.1f} s")

    runs: dict[str, list[dict[str, Any]]] = {"raw_single": [], "raw_threads": [], "product": []}
    order = ["raw_single", "raw_threads", "product"]
    for rep in range(reps):
        for kind in order[rep % 3:] + order[:rep % 3]:
            if kind == "raw_single":
                r = raw_single(ctx.endpoint, stream, shard_ids, per_shard)
            elif kind == "raw_threads":
                r = raw_threads(ctx.endpoint, stream, shard_ids, per_shard)
            else:
                r = product(ctx, stream, expect, sample_uss=(rep == reps - 1))
            if r["records"] < expect:
                raise RuntimeError(f"{kind} read {r['records']} of {expect} records")
            r.update(_rates(r, "t0"))
            runs[kind].append(r)
            ctx.log(f"  {kind:11s} rep {rep + 1}: steady {r['steady'] or 0:,.0f} rec/s, e2e {r['e2e'] or 0:,.0f} rec/s, "
                    f"CPU {r['cpu_s']:.2f} s ({r['cpu_per_mb'] or 0:.4f} s/MB)")

    ctx.tp = {"stream": stream, "shard_ids": shard_ids, "expect": expect, "bytes": nbytes, "size": size, "runs": runs}
    # (the peer_kcl_rs section reads kcl-rs from this stream and reuses these runs)

    def med(kind: str, key: str) -> float | None:
        return median(r[key] for r in runs[kind])

    single, threads, prod = med("raw_single", "steady"), med("raw_threads", "steady"), med("product", "steady")
    last_readers = runs["product"][-1]["readers"]
    layout = (f"{len(last_readers)} processes holding "
              + "+".join(str(n) for n in sorted(last_readers.values(), reverse=True)) + " shards") if last_readers else "?"
    ctx.reader_layout = layout
    note = f"median of {reps}; {n} records x {size} B, 4 shards, GetRecords Limit 10000"
    res.add("throughput", "raw_single_records_per_s", single, "rec/s", note=note + "; boto3, one thread")
    res.add("throughput", "raw_single_mb_per_s", med("raw_single", "mb_steady"), "MB/s")
    res.add("throughput", "raw_threads_records_per_s", threads, "rec/s", anchor="raw_single_records_per_s",
            anchor_value=single, note="boto3, one thread per shard")
    res.add("throughput", "raw_threads_mb_per_s", med("raw_threads", "mb_steady"), "MB/s")
    res.add("throughput", "product_records_per_s", prod, "rec/s", anchor="raw_single_records_per_s",
            anchor_value=single, goal=">= 1.2x raw single", check=lambda v: single is not None and v >= 1.2 * single,
            note=f"the reader pool ({layout}) -> one counting sink actor, DynamoDB lease table, checkpoint per batch")
    res.add("throughput", "product_records_per_s_vs_threads", prod, "rec/s", anchor="raw_threads_records_per_s",
            anchor_value=threads, goal=">= 0.9x raw threads", check=lambda v: threads is not None and v >= 0.9 * threads)
    res.add("throughput", "product_mb_per_s", med("product", "mb_steady"), "MB/s", anchor="raw_single_mb_per_s",
            anchor_value=med("raw_single", "mb_steady"))
    single_e2e = med("raw_single", "e2e")
    res.add("throughput", "product_e2e_records_per_s", med("product", "e2e"), "rec/s", anchor="raw_single_e2e_records_per_s",
            anchor_value=single_e2e, note="from the subscribe() call (actors start) to the last record delivered")
    subscribe_s = median(r["t_sub"] - r["t0"] for r in runs["product"])
    res.add("throughput", "product_subscribe_s", subscribe_s, "s",
            note=f"subscribe() call: Coordinator + the pool's {len(last_readers)} readers started, 4 iterators held")
    res.add("throughput", "product_reader_processes", len(last_readers), "processes",
            note=f"ShardReader processes of the 4-shard subscription (stats()['readers']): {layout}")
    single_cpu, threads_cpu = med("raw_single", "cpu_per_mb"), med("raw_threads", "cpu_per_mb")
    res.add("throughput", "raw_single_cpu_s_per_mb", single_cpu, "CPU s/MB", note="CPU time of the draining thread")
    res.add("throughput", "raw_threads_cpu_s_per_mb", threads_cpu, "CPU s/MB", anchor="raw_single_cpu_s_per_mb",
            anchor_value=single_cpu)
    prod_cpu = med("product", "cpu_per_mb")
    by_proc: dict[str, float] = {}
    last = runs["product"][-1]
    for title, cpu in sorted(last["cpu_by_process"].items(), key=lambda kv: -kv[1]):
        if cpu >= 0.01:
            by_proc[title] = round(cpu, 2)
    res.add("throughput", "product_cpu_s_per_mb", prod_cpu, "CPU s/MB", anchor="raw_single_cpu_s_per_mb",
            anchor_value=single_cpu, goal="<= 1.2x raw", check=lambda v: single_cpu is not None and v <= 1.2 * single_cpu,
            note="all Ray processes (driver, gcs, raylet, Coordinator, readers, sink); last run, CPU s by process: "
                 + json.dumps(by_proc))
    res.add("throughput", "product_cpu_s_per_mb_after_start",
            median(r["cpu_after_start_s"] / (r["bytes_after_start"] / MB) for r in runs["product"] if r["bytes_after_start"]),
            "CPU s/MB", anchor="raw_single_cpu_s_per_mb", anchor_value=single_cpu,
            note="the same, counted from subscribe() returning (actor start-up and imports left out)")
    reader_cpu = median(r["cpu_by_process"].get("ray::ShardReader", 0.0) / (r["bytes"] / MB) for r in runs["product"])
    res.add("throughput", "product_reader_cpu_s_per_mb", reader_cpu, "CPU s/MB", anchor="raw_single_cpu_s_per_mb",
            anchor_value=single_cpu, note=f"the ShardReader processes only ({layout})")
    pool_cpu = median(sum(r["cpu_after_start_by_process"].get(t, 0.0) for t in ("ray::ShardReader", "ray::Coordinator"))
                      / (r["bytes_after_start"] / MB) for r in runs["product"] if r["bytes_after_start"])
    res.add("throughput", "product_readers_coordinator_cpu_s_per_mb_after_start", pool_cpu, "CPU s/MB",
            anchor="raw_single_cpu_s_per_mb", anchor_value=single_cpu, goal="<= 1.0x raw",
            check=lambda v: single_cpu is not None and v <= single_cpu,
            note=f"the ShardReader processes ({layout}) + the Coordinator, counted from subscribe() returning")
    sink_cpu = median(r["cpu_by_process"].get("ray::CountingSink", 0.0) / (r["bytes"] / MB) for r in runs["product"])
    res.add("throughput", "product_sink_cpu_s_per_mb", sink_cpu, "CPU s/MB", anchor="raw_single_cpu_s_per_mb",
            anchor_value=single_cpu, goal="<= 0.2x raw", check=lambda v: single_cpu is not None and v <= 0.2 * single_cpu,
            note="the counting sink actor (unpickling the Records it is sent)")
    res.add("throughput", "emulator_cpu_s_per_mb_product", median(r["emulator_cpu_s"] / (r["bytes"] / MB) for r in runs["product"]),
            "CPU s/MB", note="moto server process while the product read (server side, shares the 2 cores)")
    _where_the_cpu_goes(ctx, res, stream, shard_ids, per_shard, runs["product"], single_cpu)
    ctx.uss_under_load = [max(r["uss_peak"].values()) for r in runs["product"] if r["uss_peak"]]
    ctx.uss_under_load_all = runs["product"][-1]["uss_peak"]
    try:
        ctx.raw_uss = raw_memory(ctx, stream, shard_ids[0], per_shard)
    except Exception as e:
        res.note(f"raw memory anchor failed: {e!r:.200}")
    # The knob that bounds a reader's memory: GetRecords Limit (max_records) 1,000 instead of 10,000.
    small = product(ctx, stream, expect, sample_uss=True, max_records=1000)
    small.update(_rates(small, "t0"))
    ctx.uss_small_batches = max(small["uss_peak"].values()) if small["uss_peak"] else None
    ctx.log(f"  product max_records=1000: steady {small['steady'] or 0:,.0f} rec/s, peak USS {ctx.uss_small_batches} MiB")
    res.add("throughput", "product_records_per_s_max_records_1000", small["steady"], "rec/s", anchor="raw_single_records_per_s",
            anchor_value=single, note="one run with KinesisStream(max_records=1000): smaller GetRecords and batches")

    # ---- peer (item 6), same stream, same emulator
    if "peer" in ctx.sections:
        if ctx.peer_python is None:
            res.add("peer", "peer_records_per_s", None, "rec/s", note=f"async-kinesis 3.0.1 not run: {ctx.peer_error}")
            return
        try:
            pr = peer(ctx, stream, expect)
        except Exception as e:
            res.errors["peer"] = repr(e)[:500]
            res.add("peer", "peer_records_per_s", None, "rec/s", note=f"async-kinesis 3.0.1 failed: {e!r:.300}")
            return
        pr["events"] = [tuple(e) for e in pr["events"]]
        pr.update(_rates(pr, "t0"))
        ctx.tp["peer"] = pr
        ctx.log(f"  peer: steady {pr['steady'] or 0:,.0f} rec/s, CPU {pr['cpu_s']:.2f} s")
        res.add("peer", "peer_records_per_s", pr["steady"], "rec/s", anchor="raw_single_records_per_s", anchor_value=single,
                note="async-kinesis 3.0.1 (own venv, aiobotocore), Consumer TRIM_HORIZON, StringProcessor, "
                     "shard_fetch_rate=5, record_limit=10000, MemoryCheckPointer; one run")
        res.add("peer", "product_vs_peer_records_per_s", prod, "rec/s", anchor="peer_records_per_s", anchor_value=pr["steady"])
        res.add("peer", "peer_e2e_records_per_s", pr["e2e"], "rec/s", anchor="raw_single_e2e_records_per_s",
                anchor_value=single_e2e, note="from Consumer creation to the last record")
        res.add("peer", "peer_cpu_s_per_mb", pr["cpu_per_mb"], "CPU s/MB", anchor="raw_single_cpu_s_per_mb", anchor_value=single_cpu,
                note="process CPU time of the peer while reading")
        res.add("peer", "product_vs_peer_cpu_s_per_mb", prod_cpu, "CPU s/MB",
                anchor="peer_cpu_s_per_mb", anchor_value=pr["cpu_per_mb"])

