"""``python -m bench.idle``: what idle shards and a start cost our Ray processes (issue 20, parts 3-5).

One fresh embedded emulator (threaded moto), one stream of ``--shards`` empty shards, one
subscription from ``LATEST`` with default settings (MemoryLeaseStore unless ``--dynamo``)
into a counting sink. Printed:

* start: ``subscribe()`` call -> return, and -> the first record of a put made right after
  the call returned (a probe record in every shard); the CPU seconds each of our Ray
  processes (by title: ShardReader, Coordinator, lease store, sink, raylet, gcs) had spent
  when ``subscribe()`` returned, from the process's start for workers created by it;
* idle: over ``--idle-s`` seconds after ``--settle-s`` (idle waits reach their cap), the
  requests the emulator served by operation, our Ray processes' CPU in cores by title, and
  CPU milliseconds per idle request (all our Ray processes' CPU s / requests served:
  GetRecords at the tip plus renewals: with the MemoryLeaseStore a renewal is a Ray actor call,
  counted as leases / ``renew_interval_s``; with ``--dynamo`` the emulator counts its UpdateItems);
* ``--profile DIR``: py-spy ``--format raw --gil`` profiles (50 Hz, the idle window; only the
  thread holding the GIL is sampled, a proxy for Python CPU) of one ShardReader, the
  Coordinator and the lease-store actor, summarised by frame (inclusive share of samples);
* ``--worker-start``: what a bare Ray worker spends before its first call, step by step
  (in a fresh actor: ``import kinesis_actors.reader``, the first boto3 session and client,
  a second client), CPU seconds by ``time.process_time``.

Nothing here is a timed test: figures only (run it alone on the machine for honest ones).
"""

from __future__ import annotations

import os

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")):
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

from .common import REGION, client, cpu_delta, cpu_snapshot, list_shards, pool_pids, ray_tree  # noqa: E402


def _mark(emu: Any, exclude: list[int]) -> dict[str, Any]:
    return {"t": time.time(), "requests": emu.requests(), "ours": cpu_snapshot(ray_tree(exclude))}


def _delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    wall = b["t"] - a["t"]
    ops = set(a["requests"]) | set(b["requests"])
    by_op = {op: (b["requests"].get(op, 0) - a["requests"].get(op, 0)) / wall for op in ops}
    ours = {k: v / wall for k, v in cpu_delta(a["ours"], b["ours"]).items()}
    return {"wall_s": wall, "req_per_s": {k: v for k, v in by_op.items() if v > 0}, "cores": ours}


def _cpu_since_start(exclude: list[int], since: float) -> dict[str, float]:
    """CPU seconds of each Ray process created after ``since`` (epoch s), summed by title."""
    out: dict[str, float] = {}
    for _pid, (created, cpu, title) in cpu_snapshot(ray_tree(exclude)).items():
        if created >= since - 0.5:
            key = title.split(".")[0].split(" ")[0] if title.startswith("ray::") else os.path.basename(title.split(" ")[0])
            out[key] = out.get(key, 0.0) + cpu
            out[f"{key} (processes)"] = out.get(f"{key} (processes)", 0) + 1
    return out


def _profile(pids: dict[str, int], seconds: float, out_dir: str) -> dict[str, Any]:
    spy = _py_spy()
    os.makedirs(out_dir, exist_ok=True)
    procs = {}
    for name, pid in pids.items():
        path = os.path.join(out_dir, f"{name}.raw")
        procs[name] = (path, subprocess.Popen([spy, "record", "-p", str(pid), "--rate", "50", "-d", str(int(seconds)),
                                               "-f", "raw", "-o", path, "--nonblocking", "--gil"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    summary = {}
    for name, (path, p) in procs.items():
        p.wait()
        summary[name] = _summarise(path) if os.path.exists(path) else "no profile"
    return summary


class _StartProfiler:
    """py-spy on every Coordinator and ShardReader process from the moment its title appears
    (polled every 20 ms) for ``seconds``: where a start's CPU goes."""

    def __init__(self, exclude: list[int], seconds: float, out_dir: str) -> None:
        import threading

        self.exclude, self.seconds, self.out_dir = exclude, seconds, out_dir
        self.procs: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        os.makedirs(out_dir, exist_ok=True)
        self._thread.start()

    def _watch(self) -> None:
        spy = _py_spy()
        while not self._stop.is_set():
            for p in ray_tree(self.exclude):
                if p.pid in self.procs:
                    continue
                try:
                    title = " ".join(p.cmdline())
                except Exception:
                    continue
                for name in ("Coordinator", "ShardReader"):
                    if title.startswith(f"ray::{name}"):
                        path = os.path.join(self.out_dir, f"start-{name}-{p.pid}.raw")
                        self.procs[p.pid] = (path, subprocess.Popen(
                            [spy, "record", "-p", str(p.pid), "--rate", "100", "-d", str(int(self.seconds)), "-f",
                             "raw", "-o", path, "--nonblocking", "--gil"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            self._stop.wait(0.02)

    def finish(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        out = {}
        for path, proc in self.procs.values():
            proc.wait()
            out[os.path.basename(path)] = _summarise(path) if os.path.exists(path) else "no profile"
        return out


def _py_spy() -> str:
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    return spy if os.path.exists(spy) else "/work/main/.venv/bin/py-spy"


def _summarise(path: str, top: int = 40) -> dict[str, Any]:
    """Samples by 'component' (the first frame below the asyncio/thread plumbing that names a
    module of interest) and by leaf function."""
    leaf: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            idle_frame = frames[-1]
            if any(w in idle_frame for w in ("select (selectors", "wait (threading", "_worker (concurrent", "poll (")):
                continue  # a thread waiting: no CPU (py-spy --idle is off, but be safe)
            total += n
            leaf[idle_frame] += n
            seen = set()
            for fr in frames:
                fn = fr.split(" (")[0] + " (" + fr.split(" (")[1].split(":")[0] if " (" in fr else fr
                if fn not in seen:
                    seen.add(fn)
                    inclusive[fn] += n
    return {"samples": total,
            "inclusive": [(k, round(v / max(1, total), 3)) for k, v in inclusive.most_common(top)],
            "leaf": [(k, round(v / max(1, total), 3)) for k, v in leaf.most_common(top)]}


def _worker_start() -> dict[str, float]:
    """CPU seconds a fresh Ray worker spends on each step before it can call Kinesis."""
    import ray

    @ray.remote(num_cpus=0)
    class Probe:
        def __init__(self) -> None:
            self.t0 = time.process_time()

        def steps(self) -> dict[str, float]:
            import psutil

            out = {"worker process before __init__ (import ray, connect)": self.t0}
            t = time.process_time()
            import kinesis_actors.reader  # noqa: F401

            out["import kinesis_actors.reader"] = time.process_time() - t
            from kinesis_actors.aws import AwsSettings

            aws = AwsSettings(endpoint="http://127.0.0.1:1", region=REGION, test_credentials=True)
            t = time.process_time()
            import boto3  # noqa: F401

            out["import boto3"] = time.process_time() - t
            t = time.process_time()
            aws.client("kinesis")
            out["first client (kinesis)"] = time.process_time() - t
            t = time.process_time()
            aws.client("kinesis")
            out["second kinesis client"] = time.process_time() - t
            t = time.process_time()
            aws.client("dynamodb")
            out["first dynamodb client"] = time.process_time() - t
            t = time.process_time()
            from kinesis_actors.leases.memory import MemoryLeaseStore  # noqa: F401

            out["import leases.memory"] = time.process_time() - t
            out["total process CPU (psutil)"] = sum(psutil.Process().cpu_times()[:2])
            return out

    a = Probe.remote()
    try:
        return ray.get(a.steps.remote())
    finally:
        ray.kill(a)


def block_rfc3987_syntax() -> None:
    """Make every process started from here on (Ray's workers inherit the environment) skip
    ``import rfc3987_syntax``, which jsonschema tries when Ray imports it (``ray.runtime_env``) and
    which compiles a lark grammar at import: about 1.75 CPU s per Python process on this machine."""
    import tempfile

    d = tempfile.mkdtemp(prefix="no-rfc3987-")
    with open(os.path.join(d, "sitecustomize.py"), "w") as f:
        f.write("import sys\nsys.modules.setdefault('rfc3987_syntax', None)\n")
    os.environ["PYTHONPATH"] = d + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=256)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--settle-s", type=float, default=4.0)
    ap.add_argument("--dynamo", action="store_true", help="DynamoLeaseStore on the emulator (default: MemoryLeaseStore)")
    ap.add_argument("--profile", metavar="DIR", help="py-spy raw profiles of the idle window into DIR")
    ap.add_argument("--profile-start", metavar="DIR", help="py-spy profiles of each Coordinator and ShardReader "
                                                           "process from its start into DIR")
    ap.add_argument("--start-profile-s", type=float, default=8.0, help="how long each start profile runs [8]")
    ap.add_argument("--worker-start", action="store_true", help="also measure a bare worker's start, step by step")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--without-rfc3987-syntax", action="store_true",
                    help="every Ray process of this run starts as if rfc3987_syntax were not installed (a "
                         "sitecustomize on PYTHONPATH; jsonschema then skips it): how much of a start it costs")
    a = ap.parse_args(argv)
    if a.without_rfc3987_syntax:
        block_rfc3987_syntax()

    import ray

    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
    from kinesis_actors.emulator import Emulator

    from .actors import CountingSink

    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    out: dict[str, Any] = {"shards": a.shards, "store": "dynamo" if a.dynamo else "memory"}
    if a.worker_start:
        out["worker_start_cpu_s"] = _worker_start()
        print(json.dumps({"worker_start_cpu_s": out["worker_start_cpu_s"]}, indent=1), flush=True)
    emu = Emulator().start()
    exclude = [emu.pid]
    try:
        stream = f"idle-{a.shards}-{uuid.uuid4().hex[:6]}"
        k = client(emu.endpoint, "kinesis")
        k.create_stream(StreamName=stream, ShardCount=a.shards)
        k.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 600})
        shards = list_shards(emu.endpoint, stream)
        kwargs: dict[str, Any] = {}
        if a.dynamo:
            kwargs = {"lease_store": DynamoLeaseStore(f"idle-{uuid.uuid4().hex[:8]}", create_if_missing=True)}
        conn = KinesisBroker(endpoint=emu.endpoint, region=REGION, test_credentials=True, **kwargs).connect()
        if a.dynamo:
            conn.lease_store.list(stream)
        sink = CountingSink.remote()
        ray.get(sink.count.remote())
        cfg = KinesisStream(stream, start_at=StartAt.latest())
        starting = _StartProfiler(exclude, a.start_profile_s, a.profile_start) if a.profile_start else None
        before = cpu_snapshot(ray_tree(exclude))
        t0 = time.time()
        sub = conn.subscribe(cfg, sink=sink, start_timeout_s=600)
        t1 = time.time()
        out["subscribe_s"] = t1 - t0
        # the probe: one record per shard, right after subscribe() returned
        entries = [{"Data": b"probe", "PartitionKey": "k", "ExplicitHashKey": s["HashKeyRange"]["StartingHashKey"]}
                   for s in shards]
        for i in range(0, len(entries), 500):
            k.put_records(StreamName=stream, Records=entries[i:i + 500])
        t_put = time.time()
        first = None
        while time.time() - t_put < 60:
            if ray.get(sink.count.remote()) > 0:
                first = time.time()
                break
            time.sleep(0.01)
        out["put_after_return_s"] = t_put - t1
        out["subscribe_to_first_record_s"] = None if first is None else first - t0
        out["put_to_first_record_s"] = None if first is None else first - t_put
        stats = sub.stats()
        readers, coord = pool_pids(stats)
        new_since = _cpu_since_start(exclude, t0)
        after = cpu_snapshot(ray_tree(exclude))
        out["start_cpu_s_by_title"] = {k2: round(v, 3) for k2, v in cpu_delta(before, after).items()}
        out["start_new_processes_cpu_s"] = {k2: round(v, 3) for k2, v in new_since.items()}
        out["readers"] = len(readers)
        print(json.dumps({k2: out[k2] for k2 in ("subscribe_s", "subscribe_to_first_record_s", "put_to_first_record_s",
                                                 "readers", "start_cpu_s_by_title", "start_new_processes_cpu_s")},
                         indent=1), flush=True)
        if starting is not None:
            out["start_profile"] = starting.finish()
            for name, summary in out["start_profile"].items():
                print(f"--- {name}", flush=True)
                print(summary if isinstance(summary, str) else
                      "\n".join(f"{v:6.3f} {k2}" for k2, v in summary["inclusive"]), flush=True)
        time.sleep(a.settle_s)
        m0 = _mark(emu, exclude)
        prof = None
        if a.profile:
            store_pid = next((p.pid for p in ray_tree(exclude) if "MemoryLeaseTable" in " ".join(p.cmdline())), None)
            pids = {"reader": max(readers, key=lambda pid: readers[pid])}
            if coord:
                pids["coordinator"] = coord
            if store_pid:
                pids["lease_store"] = store_pid
            prof = _profile(pids, a.idle_s, a.profile)
        else:
            time.sleep(a.idle_s)
        m1 = _mark(emu, exclude)
        idle = _delta(m0, m1)
        total_req = sum(idle["req_per_s"].values())
        if not a.dynamo:  # MemoryLeaseStore renewals are Ray actor calls, not emulator requests: one per lease per
            out["idle_renewals_per_s_estimated"] = a.shards / conn.renew_interval_s  # renew interval
            total_req += out["idle_renewals_per_s_estimated"]
        ours = sum(idle["cores"].values())
        out["idle"] = idle
        out["idle_requests_per_s"] = total_req
        out["idle_ray_cores"] = ours
        out["idle_cpu_ms_per_request"] = 1000 * ours / max(1e-9, total_req)
        out["idle_cpu_ms_per_request_by_title"] = {k2: round(1000 * v / max(1e-9, total_req), 3)
                                                   for k2, v in idle["cores"].items()}
        s2 = sub.stats()
        out["leases_lost"] = s2.get("leases_lost")
        print(json.dumps({k2: out.get(k2) for k2 in ("idle", "idle_renewals_per_s_estimated", "idle_requests_per_s",
                                                     "idle_ray_cores",
                                                 "idle_cpu_ms_per_request", "idle_cpu_ms_per_request_by_title",
                                                 "leases_lost")}, indent=1), flush=True)
        if prof is not None:
            out["profile"] = prof
            for name, s in prof.items():
                print(f"--- {name}", flush=True)
                print(json.dumps(s, indent=0) if isinstance(s, str) else
                      "\n".join(f"{v:6.3f} {k2}" for k2, v in s["inclusive"]), flush=True)
        sub.close()
        conn.shutdown()
    finally:
        emu.stop()
        ray.shutdown()
    write_json(a.json, out)
    return 0


def write_json(path: str | None, out: dict[str, Any]) -> None:
    """Write the run's figures to ``path`` (if given)."""
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    raise SystemExit(main())
