"""Section ``scale``: one instance on one node reading 16, 64, 256 and 1,000 shards.

Each run gets a fresh embedded emulator (``Emulator()``, threaded moto) so its request
counts (``emu.requests()``) and CPU are the run's own. The stream is filled first
(``scale_per_shard`` records of ``scale_record_bytes`` in every shard, PutRecords of 500
with explicit hash keys), then one broker subscribes from ``TRIM_HORIZON`` with default
settings (MemoryLeaseStore, lease 10 s / renew 3 s, default ``max_shards_per_reader``)
into a sink actor that counts distinct (shard, sequence number) per shard. Measured:

* ``subscribe_s``: the ``subscribe()`` call (``start_timeout_s`` raised to
  ``scale_timeout_s`` so a slow first pass is measured, not cut at the 120 s default);
  ``all_delivered_s``: from that call until every shard delivered every record (the
  sink's arrival time of the batch that completed the last shard). Anchor: one plain
  boto3 thread draining every shard (GetShardIterator + GetRecords) on the same emulator
  just before.
* USS (psutil ``memory_full_info().uss``) of the subscription's ShardReader and
  Coordinator processes (pids from ``stats()``), total and per shard, right after
  everything was delivered; the number of those processes. Anchor: a do-nothing actor's
  USS (the floor of one actor per shard).
* Requests the emulator served per second (``emu.requests()`` deltas), GetRecords and
  all, in all and per shard, over an idle window after everything was delivered (after
  a short settle, so idle waits reach their cap) and during the read; the emulator's CPU
  share (its process CPU seconds / wall seconds; 1.0 = one core of the 2) and the
  machine's (cores busy, from ``psutil.cpu_times``; 1-min load average) over both.
* ``leases_lost`` (``stats()`` at the end of the idle window) and distinct records
  delivered vs published.

Variants: ``max_shards_per_reader=1`` (one actor per shard, plus the spare) at
``scale_cap1_sizes``, side by side with the default as ratios; a cap sweep at
``scale_sweep_size`` shards (``scale_sweep_caps``; the default cap's row is the default
run's); at ``scale_dynamo_shards`` a ``DynamoLeaseStore`` on the emulator at each of
``scale_dynamo_timings`` (lease / renew seconds), with the emulator's request rate by
operation (UpdateItem vs GetRecords) and, as the anchor of its UpdateItem rate, the most
conditional UpdateItems per second a plain boto3 client gets from a fresh emulator
(``scale_probe_threads`` threads for a few seconds) next to the renewals the leases need
(leases / renew interval). A run that fails (StartError, a timeout, anything) is
recorded as a failure row with its reason; the others go on.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .common import REGION, Results, client, cpu_delta, cpu_snapshot, list_shards, pool_pids, psutil_mod, ray_tree, uss_of_pids

GIB_MIB = 1024.0


# ----------------------------------------------------------------------------- measuring helpers
class _Meter:
    """Emulator requests, emulator CPU, our Ray runtime's CPU by process title and machine CPU
    between two points in time."""

    def __init__(self, emu: Any, exclude: list[int]) -> None:
        self.emu = emu
        self.psutil = psutil_mod()
        self.proc = self.psutil.Process(emu.pid)
        self.exclude = [pid for pid in exclude if pid]

    def mark(self) -> dict[str, Any]:
        t = self.psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        c = self.proc.cpu_times()
        ours = cpu_snapshot([self.psutil.Process(), *ray_tree(self.exclude)])
        return {"t": time.time(), "requests": self.emu.requests(), "emu_cpu": c.user + c.system, "busy": busy,
                "ours": ours}

    @staticmethod
    def delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        wall = max(1e-9, b["t"] - a["t"])
        ops = set(a["requests"]) | set(b["requests"])
        by_op = {op: (b["requests"].get(op, 0) - a["requests"].get(op, 0)) / wall for op in ops}
        ours = {k: v / wall for k, v in cpu_delta(a.get("ours", {}), b.get("ours", {})).items()}
        emu_share, cores_busy = (b["emu_cpu"] - a["emu_cpu"]) / wall, (b["busy"] - a["busy"]) / wall
        return {"wall_s": wall, "by_op": {k: v for k, v in by_op.items() if v > 0}, "total": sum(by_op.values()),
                "emu_share": emu_share, "cores_busy": cores_busy, "load1": os.getloadavg()[0],
                "ours": ours, "ours_share": sum(ours.values()),
                "rest_share": max(0.0, cores_busy - emu_share - sum(ours.values()))}


def _fill(endpoint: str, stream: str, shards: list[dict[str, Any]], per_shard: int, size: int) -> tuple[int, float]:
    """``per_shard`` records of ``size`` bytes into every shard; PutRecords of 500 spanning shards."""
    entries = []
    for s in shards:
        ehk = s["HashKeyRange"]["StartingHashKey"]
        for i in range(per_shard):
            entries.append({"Data": f"{s['ShardId']}|{i}|".encode().ljust(size, b"."), "PartitionKey": "k",
                            "ExplicitHashKey": ehk})
    chunks = [entries[i:i + 500] for i in range(0, len(entries), 500)]
    clients = [client(endpoint, "kinesis") for _ in range(2)]

    def put(ic: tuple[int, list[dict[str, Any]]]) -> None:
        i, chunk = ic
        while chunk:
            resp = clients[i % 2].put_records(StreamName=stream, Records=chunk)
            if not resp.get("FailedRecordCount"):
                return
            chunk = [e for e, r in zip(chunk, resp["Records"]) if "ErrorCode" in r]
            time.sleep(0.05)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(put, enumerate(chunks)))
    return len(entries), time.perf_counter() - t0


def _raw_drain(endpoint: str, stream: str, shard_ids: list[str], per_shard: int) -> tuple[int, float]:
    """One plain boto3 thread: GetShardIterator TRIM_HORIZON + GetRecords until it has the shard's
    records (or an empty answer), shard after shard."""
    k = client(endpoint, "kinesis")
    k.list_shards(StreamName=stream, MaxResults=1)  # warm the connection
    n = 0
    t0 = time.perf_counter()
    for sid in shard_ids:
        it = k.get_shard_iterator(StreamName=stream, ShardId=sid, ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        got = 0
        while it and got < per_shard:
            resp = k.get_records(ShardIterator=it, Limit=10_000)
            got += len(resp["Records"])
            if not resp["Records"]:
                break
            it = resp.get("NextShardIterator")
        n += got
    return n, time.perf_counter() - t0


def _probe_update_item(endpoint: str, threads: int, seconds: float, rows: int = 1000,
                       emulator_pid: int | None = None) -> tuple[float, float | None]:
    """The most conditional UpdateItems per second plain boto3 gets from this emulator: ``threads``
    threads, each updating its own rows with a condition on an owner and a counter (as a lease
    renewal). Returns (UpdateItems per second, the emulator's CPU share meanwhile)."""
    import boto3
    from botocore.config import Config

    from .common import CREDENTIALS

    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION, **CREDENTIALS,
                       config=Config(retries={"mode": "standard", "max_attempts": 5},
                                     max_pool_connections=max(10, threads), read_timeout=60))
    table = f"probe-{uuid.uuid4().hex[:6]}"
    ddb.create_table(TableName=table, KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST")
    for i in range(rows):
        ddb.put_item(TableName=table, Item={"k": {"S": f"r{i}"}, "o": {"S": "me"}, "c": {"N": "0"}})
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def work(j: int) -> None:
        mine = list(range(j, rows, threads))
        counter = {i: 0 for i in mine}
        x = 0
        while time.monotonic() < stop:
            i = mine[x % len(mine)]
            x += 1
            ddb.update_item(TableName=table, Key={"k": {"S": f"r{i}"}}, UpdateExpression="SET c = :n, t = :t",
                            ConditionExpression="attribute_exists(k) AND c = :c AND o = :o",
                            ExpressionAttributeValues={":n": {"N": str(counter[i] + 1)}, ":c": {"N": str(counter[i])},
                                                       ":o": {"S": "me"}, ":t": {"N": str(time.time())}},
                            ReturnValues="ALL_NEW")
            counter[i] += 1
            counts[j] += 1

    emu = psutil_mod().Process(emulator_pid) if emulator_pid else None
    c0 = sum(emu.cpu_times()[:2]) if emu else 0.0
    t0 = time.monotonic()
    ts = [threading.Thread(target=work, args=(j,)) for j in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.monotonic() - t0
    return sum(counts) / wall, (sum(emu.cpu_times()[:2]) - c0) / wall if emu else None


# ----------------------------------------------------------------------------- one run
def _one(ctx: Any, n: int, *, cap: int | None = None, dynamo: tuple[float, float] | None = None,
         idle_s: float, probe: bool = False) -> dict[str, Any]:
    """One fresh emulator, one stream of ``n`` filled shards, one subscription; the figures of the module docstring.
    ``cap``: max_shards_per_reader (None: the default). ``dynamo``: (lease, renew) seconds with a DynamoLeaseStore."""
    import ray

    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
    from kinesis_actors.emulator import Emulator

    from .actors import DistinctSink

    p = ctx.params
    per_shard = p["scale_per_shard_1000"] if n >= 1000 else p["scale_per_shard"]
    size = p["scale_record_bytes"]
    timeout_s = p["scale_timeout_s"]
    out: dict[str, Any] = {"n": n, "cap": cap, "dynamo": dynamo, "per_shard": per_shard,
                           "probe_threads": p["scale_probe_threads"]}
    emu = Emulator().start()
    sub = conn = sink = None
    try:
        stream = f"scale-{n}-{uuid.uuid4().hex[:6]}"
        t = time.perf_counter()
        k = client(emu.endpoint, "kinesis")
        k.create_stream(StreamName=stream, ShardCount=n)
        k.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 600})
        shards = list_shards(emu.endpoint, stream)
        if len(shards) != n:
            raise RuntimeError(f"the emulator listed {len(shards)} shards, not {n}")
        published, _fill_s = _fill(emu.endpoint, stream, shards, per_shard, size)
        out.update(published=published, create_and_fill_s=time.perf_counter() - t)
        if probe:
            out["probe_update_item_per_s"], out["probe_emulator_cpu_share"] = _probe_update_item(
                emu.endpoint, p["scale_probe_threads"], p["scale_probe_s"], emulator_pid=emu.pid)
        out["raw_records"], out["raw_drain_s"] = _raw_drain(emu.endpoint, stream, [s["ShardId"] for s in shards], per_shard)

        kwargs: dict[str, Any] = {}
        if dynamo is not None:
            kwargs = {"lease_store": DynamoLeaseStore(f"scale-{uuid.uuid4().hex[:8]}", create_if_missing=True),
                      "lease_duration_s": dynamo[0], "renew_interval_s": dynamo[1]}
        conn = KinesisBroker(endpoint=emu.endpoint, region=REGION, test_credentials=True, **kwargs).connect()
        if dynamo is not None:
            conn.lease_store.list(stream)  # the lease table exists before the timed subscribe
        sink = DistinctSink.remote(per_shard, n)
        ray.get(sink.progress.remote())
        cfg = KinesisStream(stream, start_at=StartAt.trim_horizon(),
                            **({} if cap is None else {"max_shards_per_reader": cap}))
        out["max_shards_per_reader"] = cfg.max_shards_per_reader
        meter = _Meter(emu, [ctx.emulator_pid, emu.pid])
        m0 = meter.mark()
        t0 = time.time()
        try:
            sub = conn.subscribe(cfg, sink=sink, start_timeout_s=timeout_s)
        except Exception as e:
            out["error"] = f"subscribe() after {time.time() - t0:.1f} s: {type(e).__name__}: {e}"[:600]
            return out
        out["subscribe_s"] = time.time() - t0
        deadline = time.monotonic() + timeout_s
        prog = ray.get(sink.progress.remote())
        while prog["t_all"] is None and time.monotonic() < deadline:
            time.sleep(0.25)
            prog = ray.get(sink.progress.remote())
        m1 = meter.mark()
        out["read"] = _Meter.delta(m0, m1)
        out["all_delivered_s"] = None if prog["t_all"] is None else prog["t_all"] - t0
        if prog["t_all"] is None:
            out["timeout"] = f"{prog['shards_complete']} of {n} shards complete after {timeout_s:.0f} s"
        stats = sub.stats()
        readers, coordinator = pool_pids(stats)
        uss = uss_of_pids([*readers, *([coordinator] if coordinator else [])])
        out.update(readers=len(readers), layout=sorted(readers.values(), reverse=True),
                   uss_readers_mib=sum(v for pid, v in uss.items() if pid in readers),
                   uss_coordinator_mib=uss.get(coordinator or -1), leases_held=stats["leases_held"])
        out["uss_total_mib"] = out["uss_readers_mib"] + (out["uss_coordinator_mib"] or 0.0)
        time.sleep(p["scale_settle_s"])  # idle waits reach their cap
        m2 = meter.mark()
        time.sleep(idle_s)
        m3 = meter.mark()
        out["idle"] = _Meter.delta(m2, m3)
        stats = sub.stats()
        prog = ray.get(sink.progress.remote())
        readers_after, _ = pool_pids(stats)
        if dynamo is not None:  # the lease-table read the Coordinator does every lease_poll_interval_s
            t = time.perf_counter()
            rows = conn.lease_store.list(stream)
            out["lease_list_s"], out["lease_rows"] = time.perf_counter() - t, len(rows)
        out.update(leases_lost=stats["leases_lost"], readers_replaced=stats["readers_replaced"],
                   distinct=prog["distinct"], deliveries=prog["deliveries"], leases_held_end=stats["leases_held"],
                   uss_readers_after_idle_mib=sum(uss_of_pids(readers_after).values()),
                   call_limit_cuts=sum(r.get("kinesis_call_limit_cuts", 0) for r in stats["readers"]),
                   get_records_calls=sum(s.get("get_records_calls", 0) for s in stats["shards"].values()))
        t = time.time()
        sub.close()
        out["close_s"] = time.time() - t
        sub = None
        return out
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"[:600]
        return out
    finally:
        if sub is not None:
            try:
                sub.close()
            except Exception:
                pass
        if conn is not None:
            try:
                conn.shutdown()
            except Exception:
                pass
        if sink is not None:
            ray.kill(sink)
        emu.stop()


# ----------------------------------------------------------------------------- figures
def _label(r: dict[str, Any]) -> str:
    base = f"scale_{r['n']}"
    if r["dynamo"] is not None:
        return f"{base}_dynamo_lease{r['dynamo'][0]:g}"
    if r["cap"] is not None:
        return f"{base}_cap{r['cap']}"
    return base


def _describe(r: dict[str, Any]) -> str:
    what = f"{r['n']} shards x {r['per_shard']} records"
    what += f", max_shards_per_reader={r.get('max_shards_per_reader') or r['cap'] or 'default'}"
    if r["dynamo"] is not None:
        what += f", DynamoLeaseStore lease {r['dynamo'][0]:g} s / renew {r['dynamo'][1]:g} s"
    else:
        what += ", MemoryLeaseStore, lease 10 s / renew 3 s"
    return what


def _failed(res: Results, r: dict[str, Any]) -> bool:
    if "error" not in r:
        return False
    res.add("scale", f"{_label(r)}_failed", 1, "run", goal="runs to the end", check=lambda v: v == 0,
            note=f"{_describe(r)}: {r['error']}")
    res.note(f"scale: {_label(r)} failed: {r['error']}")
    return True


def _ops(rates: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v >= 0.05)


def _cpu(m: dict[str, Any]) -> str:
    """Where the CPU went over a window, in cores: emulator, our Ray processes by title, the rest of the machine."""
    top = sorted(m["ours"].items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{k} {v:.2f}" for k, v in top if v >= 0.01)
    return (f"cores: emulator {m['emu_share']:.2f}, our Ray processes {m['ours_share']:.2f} ({parts}), rest of the "
            f"machine {m['rest_share']:.2f}; {m['cores_busy']:.2f} of 2 busy, load {m['load1']:.2f}")


def _add_run(res: Results, r: dict[str, Any], idle_uss: float | None, goals: bool) -> None:
    """The figures of one default-settings run (goals at 256 and 1,000 shards)."""
    lab, n = _label(r), r["n"]
    if _failed(res, r):
        if goals and n == 256:
            for name in ("subscribe_s", "readers_uss_mib", "delivered_distinct"):
                res.add("scale", f"{lab}_{name}", None, "-", note=f"not measured: {r['error']}")
        if goals and n >= 1000:
            res.add("scale", f"{lab}_delivered_distinct", None, "records", note=f"not measured: {r['error']}")
        return
    desc = _describe(r)
    sub_goal = dict(goal="<= 60 s", check=lambda v: v <= 60.0) if goals and n == 256 else {}
    res.add("scale", f"{lab}_subscribe_s", r["subscribe_s"], "s", note=f"{desc}; subscribe() call "
            f"(start_timeout_s raised; the default is 120 s)", **sub_goal)
    res.add("scale", f"{lab}_all_delivered_s", r["all_delivered_s"], "s", anchor="raw boto3 drain, one thread",
            anchor_value=r["raw_drain_s"],
            note="subscribe() call -> every shard delivered every record" + (f"; {r['timeout']}" if "timeout" in r else ""))
    everything = dict(goal="= published", check=lambda v: v >= r["published"]) if goals and n >= 256 else {}
    res.add("scale", f"{lab}_delivered_distinct", r["distinct"], "records", anchor="published",
            anchor_value=r["published"], note=f"{r['deliveries']} deliveries in all (duplicates included)", **everything)
    lost_goal = dict(goal="0", check=lambda v: v == 0) if goals and n >= 1000 else {}
    res.add("scale", f"{lab}_leases_lost", r["leases_lost"], "leases",
            note=f"stats() after the idle window; readers replaced {r['readers_replaced']}, leases held "
                 f"{r['leases_held_end']} of {n}; Kinesis call-limit cuts (renewals slow) {r['call_limit_cuts']}",
            **lost_goal)
    res.add("scale", f"{lab}_processes", r["readers"] + 1, "processes", anchor="shards", anchor_value=n,
            note=f"the Coordinator + {r['readers']} ShardReaders holding {'+'.join(map(str, r['layout']))} shards")
    uss_goal = dict(goal="<= 1 GiB", check=lambda v: v <= GIB_MIB) if goals and n == 256 else {}
    res.add("scale", f"{lab}_readers_uss_mib", r["uss_readers_mib"], "MiB",
            note=f"the {r['readers']} ShardReader processes (pids from stats()) right after the last delivery; "
                 f"{r['uss_readers_after_idle_mib']:.0f} MiB after the idle window", **uss_goal)
    res.add("scale", f"{lab}_uss_total_mib", r["uss_total_mib"], "MiB",
            note=f"readers + Coordinator ({r['uss_coordinator_mib'] or 0:.0f} MiB)")
    res.add("scale", f"{lab}_uss_per_shard_mib", r["uss_total_mib"] / n, "MiB", anchor="idle_actor_uss_mib",
            anchor_value=idle_uss, note="(readers + Coordinator) / shards; anchor: one do-nothing actor, the floor "
                                        "of an actor per shard")
    idle, read = r["idle"], r["read"]
    gr = idle["by_op"].get("GetRecords", 0.0)
    res.add("scale", f"{lab}_idle_get_records_per_s", gr, "req/s",
            note=f"emulator's count over {idle['wall_s']:.0f} s idle, after everything was delivered and a settle")
    res.add("scale", f"{lab}_idle_get_records_per_s_per_shard", gr / n, "req/s", anchor="1 / max_idle_wait_s",
            anchor_value=1.0)
    res.add("scale", f"{lab}_idle_requests_per_s", idle["total"], "req/s", note=f"by operation: {_ops(idle['by_op'])}")
    res.add("scale", f"{lab}_idle_requests_per_s_per_shard", idle["total"] / n, "req/s")
    res.add("scale", f"{lab}_idle_emulator_cpu_share", idle["emu_share"], "cores",
            note=f"emulator process CPU s / wall s while idle; {_cpu(idle)}")
    res.add("scale", f"{lab}_idle_ray_cpu_share", idle["ours_share"], "cores", anchor="emulator",
            anchor_value=idle["emu_share"], note="this driver and its Ray processes (readers, Coordinator, lease-store "
                                                 "actor, sink, raylet, gcs) while idle, CPU s / wall s")
    res.add("scale", f"{lab}_read_emulator_cpu_share", read["emu_share"], "cores",
            note=f"the same from the subscribe() call to the last delivery ({read['wall_s']:.1f} s); {_cpu(read)}; "
                 f"requests/s {_ops(read['by_op'])}")
    res.add("scale", f"{lab}_read_ray_cpu_share", read["ours_share"], "cores", anchor="emulator",
            anchor_value=read["emu_share"])


def _probe_threads(r: dict[str, Any]) -> str:
    return str(r.get("probe_threads", "?"))


def _add_dynamo(res: Results, r: dict[str, Any], default: dict[str, Any] | None) -> None:
    lab, n = _label(r), r["n"]
    if _failed(res, r):
        return
    _lease, renew = r["dynamo"]
    desc = _describe(r)
    res.add("scale", f"{lab}_leases_lost", r["leases_lost"], "leases", goal="0", check=lambda v: v == 0,
            note=f"{desc}; stats() after {r['idle']['wall_s']:.0f} s idle; readers replaced {r['readers_replaced']}, "
                 f"held {r['leases_held_end']} of {n}; Kinesis call-limit cuts (renewals slow) {r['call_limit_cuts']}")
    res.add("scale", f"{lab}_subscribe_s", r["subscribe_s"], "s",
            anchor=None if default is None or "error" in default else f"{_label(default)}_subscribe_s",
            anchor_value=None if default is None or "error" in default else default["subscribe_s"])
    res.add("scale", f"{lab}_all_delivered_s", r["all_delivered_s"], "s",
            anchor=None if default is None or "error" in default else f"{_label(default)}_all_delivered_s",
            anchor_value=None if default is None or "error" in default else default["all_delivered_s"],
            note="; ".join(x for x in (r.get("timeout"), f"distinct {r['distinct']} of {r['published']} published") if x))
    res.add("scale", f"{lab}_delivered_distinct", r["distinct"], "records", anchor="published",
            anchor_value=r["published"], goal="= published", check=lambda v: v >= r["published"],
            note=f"{r['deliveries']} deliveries in all (duplicates included)")
    needed = n / renew
    for phase in ("read", "idle"):
        m = r[phase]
        res.add("scale", f"{lab}_{phase}_update_item_per_s", m["by_op"].get("UpdateItem", 0.0), "req/s",
                anchor="raw conditional UpdateItem max", anchor_value=r.get("probe_update_item_per_s"),
                note=f"{phase}: renewals needed {needed:.0f}/s ({n} leases / {renew:g} s); all requests/s "
                     f"{_ops(m['by_op'])}; {_cpu(m)}")
        res.add("scale", f"{lab}_{phase}_get_records_per_s", m["by_op"].get("GetRecords", 0.0), "req/s",
                anchor="shards x 1/max_idle_wait_s" if phase == "idle" else None,
                anchor_value=float(n) if phase == "idle" else None)
    if "lease_list_s" in r:
        res.add("scale", f"{lab}_lease_table_read_s", r["lease_list_s"], "s", anchor="lease_poll_interval_s",
                anchor_value=2.0, note=f"one DynamoLeaseStore.list() of the {r['lease_rows']} rows from the driver after "
                                       "the idle window (consistent Scan pages): what every lease poll of the "
                                       "Coordinator costs the emulator")
    res.add("scale", f"{lab}_renewals_needed_per_s", needed, "req/s", anchor="raw conditional UpdateItem max",
            anchor_value=r.get("probe_update_item_per_s"),
            note=f"leases / renew_interval_s; the anchor: a plain boto3 client's conditional UpdateItems per second "
                 f"on this run's fresh emulator before the subscription ({_probe_threads(r)} threads; the emulator "
                 f"meanwhile at {r.get('probe_emulator_cpu_share') or 0:.2f} cores)")


def run(ctx: Any, res: Results) -> None:
    import ray

    from kinesis_actors.config import DEFAULT_MAX_SHARDS_PER_READER

    from .actors import Idle

    p = ctx.params
    idle = Idle.remote()
    pid = ray.get(idle.pid.remote())
    idle_uss = uss_of_pids([pid]).get(pid)
    ray.kill(idle)
    res.add("scale", "idle_actor_uss_mib", idle_uss, "MiB", note="a Ray actor that does nothing")

    def go(n: int, **kw: Any) -> dict[str, Any]:
        ctx.log(f"  scale: {n} shards {kw or ''} ...")
        t = time.monotonic()
        r = _one(ctx, n, idle_s=kw.pop("idle_s", p["scale_idle_s"]), **kw)
        ctx.log(f"  scale: {_label(r)} in {time.monotonic() - t:.0f} s: " + (
            r["error"] if "error" in r else
            f"subscribe {r['subscribe_s']:.1f} s, all delivered {r['all_delivered_s']} s, {r['readers']} readers, "
            f"USS {r['uss_total_mib']:.0f} MiB, idle {r['idle']['total']:.0f} req/s, lost {r['leases_lost']}"))
        return r

    default: dict[int, dict[str, Any]] = {}
    for n in p["scale_sizes"]:
        default[n] = go(n)
        _add_run(res, default[n], idle_uss, goals=True)

    for n in p["scale_cap1_sizes"]:
        r = go(n, cap=1)
        if _failed(res, r):
            continue
        base = default.get(n)
        ok = base is not None and "error" not in base
        lab, blab = _label(r), f"scale_{n}"
        res.add("scale", f"{lab}_subscribe_s", r["subscribe_s"], "s", anchor=f"{blab}_subscribe_s" if ok else None,
                anchor_value=base["subscribe_s"] if ok else None,
                note=f"{_describe(r)}: one actor per shard (+ the spare) vs the default cap")
        res.add("scale", f"{lab}_all_delivered_s", r["all_delivered_s"], "s", anchor=f"{blab}_all_delivered_s" if ok else None,
                anchor_value=base["all_delivered_s"] if ok else None)
        res.add("scale", f"{lab}_uss_total_mib", r["uss_total_mib"], "MiB", anchor=f"{blab}_uss_total_mib" if ok else None,
                anchor_value=base["uss_total_mib"] if ok else None, note=f"{r['readers']} readers + the Coordinator")
        res.add("scale", f"{lab}_processes", r["readers"] + 1, "processes", anchor=f"{blab}_processes" if ok else None,
                anchor_value=base["readers"] + 1 if ok else None)
        res.add("scale", f"{lab}_idle_requests_per_s", r["idle"]["total"], "req/s",
                anchor=f"{blab}_idle_requests_per_s" if ok else None, anchor_value=base["idle"]["total"] if ok else None)
        res.add("scale", f"{lab}_leases_lost", r["leases_lost"], "leases")

    n = p["scale_sweep_size"]
    for cap in p["scale_sweep_caps"]:
        if cap == DEFAULT_MAX_SHARDS_PER_READER and n in default:
            r = dict(default[n], cap=cap)
            reused = True
        else:
            r = go(n, cap=cap)
            reused = False
        if _failed(res, r):
            continue
        base = default.get(n)
        ok = base is not None and "error" not in base
        lab = f"scale_{n}_sweep_cap{cap}"
        res.add("scale", f"{lab}_subscribe_s", r["subscribe_s"], "s", anchor=f"scale_{n}_subscribe_s" if ok else None,
                anchor_value=base["subscribe_s"] if ok else None,
                note=f"{_describe(r)}" + ("; the default run's figures" if reused else ""))
        res.add("scale", f"{lab}_all_delivered_s", r["all_delivered_s"], "s",
                anchor=f"scale_{n}_all_delivered_s" if ok else None, anchor_value=base["all_delivered_s"] if ok else None)
        res.add("scale", f"{lab}_uss_total_mib", r["uss_total_mib"], "MiB", anchor=f"scale_{n}_uss_total_mib" if ok else None,
                anchor_value=base["uss_total_mib"] if ok else None)
        res.add("scale", f"{lab}_readers", r["readers"], "processes", anchor="readers at the default cap" if ok else None,
                anchor_value=base["readers"] if ok else None,
                note=f"holding {'+'.join(map(str, r['layout']))} shards; leases lost {r['leases_lost']}")

    n = p["scale_dynamo_shards"]
    for lease, renew in p["scale_dynamo_timings"]:
        r = go(n, dynamo=(float(lease), float(renew)), idle_s=p["scale_dynamo_window_s"], probe=True)
        _add_dynamo(res, r, default.get(n))
