"""Section ``peer_kcl_rs`` (issue 14): ours side by side with kcl-rs, async-kinesis and raw boto3.

kcl-rs (PyPI ``kcl-rs`` 0.1.4, KCL v3 ported to Rust, Python bindings) runs from its own
virtualenv ``bench/.venv-kclrs`` (created here, never one of the project's extras), one
``_kclrs_worker.py`` process per worker, against the same embedded emulator as ours. Its
Kinesis and DynamoDB endpoints come from ``AWS_ENDPOINT_URL_KINESIS`` / ``_DYNAMODB``
(``endpoint_url=None``); ``AWS_ENDPOINT_URL_CLOUDWATCH`` points at a sink in this process that
accepts its metrics (kcl-rs always publishes them; moto answers its CBOR ``PutMetricData`` 404).
It checkpoints after every batch, as ours does. Settings, named in every figure:

* ``default``: kcl-rs's defaults except ``retrieval_mode="POLLING"`` (its default, enhanced
  fan-out, does not work on moto): idle 1,500 ms between reads, shard sync every 60 s;
* ``matched``: ``idle_time_between_reads_millis=200`` (its floor; ours polls every 0.25 s)
  and ``shard_sync_interval_millis=1000`` (the 60 s default stalls its start: the first sync
  sleeps that long before the scheduler goes on);
* ``seeded``: matched, on a lease table whose rows (unowned, checkpoint TRIM_HORIZON) exist
  before it starts, as a previous run leaves them: skips KCL's random 1-30 s wait on an
  empty lease table.

Lease timings are both products' defaults and equal: ours 10 s lease / 3 s renewal / 2 s lease
poll; kcl-rs ``failover_time_millis`` 10 s (renewal ~3.3 s, lease taker every 20 s; not
settable from Python).

Measured (kcl-rs from its worker's ``start`` line, just before ``Scheduler()``; ours from the
``subscribe()`` call in a running Ray session; async-kinesis just before its ``Consumer``; raw
before its first ``GetShardIterator``):

* start -> first record and steady throughput / client CPU s per MB: the ``throughput``
  section's stream (4 shards x ``tp_records_per_shard`` x ``tp_record_bytes``, TRIM_HORIZON).
  Ours, raw and async-kinesis are that section's runs (same run, same stream); without it
  ours and raw are measured here on a stream of the same shape. kcl-rs: steady rate by the
  same formula (records after the first batch / time from the first to the last batch), CPU
  = its process's CPU from ``Scheduler()`` to the last record. async-kinesis start: a
  ``_peer_consume.py`` run to its first record.
* memory per shard: USS of the consumer's processes / shards, once every record of a stream
  of N shards x ``scale_per_shard`` x ``scale_record_bytes`` was read, after
  ``scale_settle_s``: kcl-rs's process (seeded), ours' Coordinator + reader pool (the ``scale``
  section's run, its own emulator), async-kinesis's process, a raw process with one boto3
  thread per shard polling at the tip. One after another, or all at once with
  ``kclrs_memory_side_by_side`` (``--quick``, to stay short).
* two workers of one application on ``kclrs_balance_shards`` shards while a publisher puts one
  record into every shard every 0.1 s (kcl-rs ``matched``, seeded; ours default settings, a
  ``DynamoLeaseStore``, each worker its own Ray job ``_ours_worker.py`` delivering into its own
  ``LogSink`` actor): worker A alone until it holds every shard; B joins -> time to an even
  split (each holds half, disjoint: ours ``Subscription.leases()``, kcl-rs the shards between
  ``initialize`` and ``lease_lost``); SIGKILL of B -> A's first record from B's shards, and
  from every one; C joins, even split again; C stops gracefully (ours ``close()``, kcl-rs
  ``Scheduler.shutdown()``, its only stop) -> A reading C's shards. Duplicates: a (shard,
  sequence number) delivered again (by any worker), counted in the phase of its second
  delivery; lost: records put and never delivered, 3 s after the publisher stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import long_drain
from .common import (
    CREDENTIALS,
    REGION,
    Results,
    client,
    create_stream,
    ensure_venv,
    fmt,
    hash_keys,
    median,
    prefill,
    proc_title,
    psutil_mod,
    ray_tree,
    section_source,
    steady_rate,
    uss_mib,
    wait_for,
)
from .cputrace import CpuTrace, window_cores

HERE = os.path.dirname(os.path.abspath(__file__))
KCLRS_PACKAGE = "kcl-rs==0.1.4"
MB = 1e6
S = "peer_kcl_rs"
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {"retrieval_mode": "POLLING"},
    "matched": {"retrieval_mode": "POLLING", "idle_time_between_reads_millis": 200, "shard_sync_interval_millis": 1000},
}
SETTINGS["seeded"] = SETTINGS["matched"]


def ensure_kclrs(ctx: Any, venv: str) -> None:
    """kcl-rs's own virtualenv (created if missing): ctx.kclrs_python, or ctx.kclrs_error."""
    ctx.kclrs_python, ctx.kclrs_error = ensure_venv(
        venv, KCLRS_PACKAGE, "import kcl_rs, importlib.metadata as m; print(m.version('kcl-rs'))", ctx.log)


# ----------------------------------------------------------------------------- helpers
class _CloudWatchSink:
    """Answers every CloudWatch request with an empty success (CBOR for the Smithy RPC v2 protocol)."""

    def __enter__(self) -> _CloudWatchSink:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                cbor = "smithy-protocol" in self.headers or "/operation/" in self.path
                body = b"\xbf\xff" if cbor else b"<PutMetricDataResponse/>"
                self.send_response(200)
                if cbor:
                    self.send_header("smithy-protocol", "rpc-v2-cbor")
                self.send_header("Content-Type", "application/cbor" if cbor else "text/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True, name="cloudwatch-sink").start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Child:
    """A worker subprocess printing JSON lines (``event``, ``ts``, ...) on stdout."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], cwd: str | None = None) -> None:
        self.name = name
        self.err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (read back on failure)
        self._tail = ""
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True, env=env, cwd=cwd)
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._eof = threading.Event()
        threading.Thread(target=self._read, daemon=True, name=f"child-{name}").start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(ev)
        self._eof.set()

    def last(self, event: str) -> dict[str, Any] | None:
        with self._lock:
            return next((e for e in reversed(self.events) if e.get("event") == event), None)

    def wait(self, *events: str, timeout_s: float) -> dict[str, Any] | None:
        """The last line of one of ``events`` once there is one (None after ``timeout_s`` or at exit)."""
        deadline = time.monotonic() + timeout_s
        while True:
            eof = self._eof.is_set()
            for event in events:
                ev = self.last(event)
                if ev:
                    return ev
            if eof or time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    def held(self) -> list[str]:
        st = self.last("status")
        return st["held"] if st else []

    def stderr_tail(self) -> str:
        if self.err.closed:
            return self._tail
        self.err.seek(0)
        return self.err.read()[-600:]

    def kill(self) -> None:
        """SIGKILL (if still running), then close its pipe and stderr file (the tail stays readable)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._eof.wait(5)  # the reader thread ends at the pipe's end
        if not self.err.closed:
            self._tail = self.stderr_tail()
            self.err.close()
        if self.proc.stdout is not None and self._eof.is_set():
            self.proc.stdout.close()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (the worker's graceful stop), SIGKILL if it has not exited after ``timeout_s``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()


def _kcl_env(ctx: Any, cloudwatch: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "PYTHONPATH"}
    env.update(AWS_ENDPOINT_URL_KINESIS=ctx.endpoint, AWS_ENDPOINT_URL_DYNAMODB=ctx.endpoint,
               AWS_ENDPOINT_URL_CLOUDWATCH=cloudwatch, AWS_REGION=REGION, AWS_EC2_METADATA_DISABLED="true",
               AWS_ACCESS_KEY_ID=CREDENTIALS["aws_access_key_id"], AWS_SECRET_ACCESS_KEY=CREDENTIALS["aws_secret_access_key"])
    return env


def _kcl_worker(ctx: Any, cw: str, name: str, stream: str, app: str, settings: dict[str, Any], *, expect: int = 0,
                exit_after_reached: float | None = None, record_log: str | None = None, events: bool = False,
                timeout_s: float = 600.0) -> _Child:
    cmd = [ctx.kclrs_python, os.path.join(HERE, "_kclrs_worker.py"), "--stream", stream, "--app", app,
           "--worker-id", f"{app}-{name}", "--settings", json.dumps(settings), "--expect", str(expect),
           "--timeout", str(timeout_s)]
    if exit_after_reached is not None:
        cmd += ["--exit-after-reached", str(exit_after_reached)]
    if record_log:
        cmd += ["--record-log", record_log]
    if events:
        cmd.append("--events")
    return _Child(name, cmd, _kcl_env(ctx, cw))


def seed_kcl_leases(endpoint: str, stream: str, app: str) -> int:
    """A KCL lease table ``app`` with one unowned lease per open shard at TRIM_HORIZON: the rows
    kcl-rs's own first shard sync writes (so a worker finds leases and skips the empty-table wait)."""
    ddb = client(endpoint, "dynamodb")
    ddb.create_table(TableName=app, AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
                     KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
    wait_for(lambda: ddb.describe_table(TableName=app)["Table"]["TableStatus"] == "ACTIVE", 30, 0.1)
    n = 0
    for s in client(endpoint, "kinesis").list_shards(StreamName=stream)["Shards"]:
        if "EndingSequenceNumber" in s["SequenceNumberRange"]:
            continue
        ddb.put_item(TableName=app, Item={
            "leaseKey": {"S": s["ShardId"]}, "checkpoint": {"S": "TRIM_HORIZON"}, "checkpointSubSequenceNumber": {"N": "0"},
            "leaseCounter": {"N": "0"}, "ownerSwitchesSinceCheckpoint": {"N": "0"}, "entityType": {"S": "LEASE"},
            "startingHashKey": {"S": s["HashKeyRange"]["StartingHashKey"]},
            "endingHashKey": {"S": s["HashKeyRange"]["EndingHashKey"]}})
        n += 1
    return n


def _fig(res: Results, name: str) -> float | None:
    return next((f.value for f in reversed(res.figures) if f.name == name), None)


# ----------------------------------------------------------------------------- start and drain
def _kcl_drain(ctx: Any, cw: str, stream: str, expect: int, mode: str) -> dict[str, Any]:
    """One kcl-rs worker of a new application reads every record of ``stream``."""
    app = f"kclrs-{mode}-{uuid.uuid4().hex[:6]}"
    if mode == "seeded":
        seed_kcl_leases(ctx.endpoint, stream, app)
    limit = 300.0
    with CpuTrace(ctx.emulator_pid) as emu_trace:
        w = _kcl_worker(ctx, cw, "drain", stream, app, SETTINGS[mode], expect=expect, exit_after_reached=0.2,
                        events=True, timeout_s=limit)
        try:
            done = w.wait("done", timeout_s=limit + 30)
        finally:
            w.kill()
    start, first = w.last("start"), w.last("first_record")
    if not done or not start or not first or done["count"] < expect:
        raise RuntimeError(f"kcl-rs ({mode}) read {done and done['count']} of {expect} records: {w.stderr_tail()}")
    events = [tuple(e) for e in done["events"]]
    steady = steady_rate(events)
    cpu = done["cpu_last"] - done["cpu_start"]
    return {"mode": mode, "first_s": first["ts"] - start["ts"], "all_s": done["t_last"] - start["ts"], "steady": steady,
            "cpu_s": cpu, "cpu_per_mb": cpu / (done["bytes"] / MB), "records": done["count"], "batches": done["batches"],
            "deliveries": done["deliveries"], "emulator_window_cores": window_cores(emu_trace, events), "events": events}


def _window_figures(res: Results, products: list[dict[str, Any]], kcl: dict[str, dict[str, Any]]) -> None:
    """``emulator_cores_in_window_*``: how busy the emulator was between a reader's first and
    last delivery (bench/cputrace.py). Near 1.0 the emulator, not the reader, set the window's length."""
    note = ("mean cores the emulator process used between the first and the last delivery (the steady-rate window); "
            "one Python process, so about 1.0 when it was the bottleneck")
    res.add(S, "emulator_cores_in_window_ours", median(r.get("emulator_window_cores") for r in products), "cores",
            note=f"{note}; median of {len(products)}: "
                 + ", ".join(f"{r['emulator_window_cores']:.2f}" for r in products if r.get("emulator_window_cores")))
    for mode, r in kcl.items():
        res.add(S, f"emulator_cores_in_window_kclrs_{mode}", r.get("emulator_window_cores"), "cores", note=note)


def _async_kinesis_first(ctx: Any, stream: str) -> float:
    """async-kinesis from Consumer creation to its first record (``_peer_consume.py --expect 1``)."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"], "AWS_DEFAULT_REGION": REGION}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([ctx.peer_python, os.path.join(HERE, "_peer_consume.py"), "--endpoint", ctx.endpoint,
                           "--stream", stream, "--expect", "1", "--timeout", "120"],
                          capture_output=True, text=True, env=env, timeout=180)
    ev = {e["event"]: e for e in (json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{"))}
    if "first" not in ev:
        raise RuntimeError(f"async-kinesis gave no record: {proc.stderr[-400:]}")
    return ev["first"]["ts"] - ev["start"]["ts"]


def _start_and_throughput(ctx: Any, res: Results, cw: str | None) -> None:
    from . import throughput

    p = ctx.params
    tp = ctx.tp
    own = not tp
    if own:  # no throughput section in this run: ours and raw on a stream of the same shape, here
        stream = f"pk-tp-{uuid.uuid4().hex[:8]}"
        shards = create_stream(ctx.endpoint, stream, 4)
        n, nbytes, _ = prefill(ctx.endpoint, stream, shards, p["tp_records_per_shard"], p["tp_record_bytes"])
        tp = {"stream": stream, "shard_ids": [s["ShardId"] for s in shards], "expect": n, "bytes": nbytes,
              "size": p["tp_record_bytes"], "runs": {}}
        raw = throughput.raw_single(ctx.endpoint, stream, tp["shard_ids"], p["tp_records_per_shard"])
        raw.update(throughput._rates(raw))
        prod = throughput.product(ctx, stream, n, sample_uss=False)
        prod.update(throughput._rates(prod))
        tp["runs"] = {"raw_single": [raw], "product": [prod]}
        if ctx.peer_python:
            pr = throughput.peer(ctx, stream, n)
            pr["events"] = [tuple(e) for e in pr["events"]]
            pr.update(throughput._rates(pr))
            tp["peer"] = pr
    stream, expect, runs = tp["stream"], tp["expect"], tp["runs"]
    shape = f"4 shards x {expect // 4:,} x {tp['size']} B from TRIM_HORIZON"
    src = "measured here" if own else "the throughput section's runs, same stream, same run"

    def first_s(r: dict[str, Any]) -> float | None:
        return min(t for t, _ in r["events"]) - r["t0"] if r["events"] else None

    ours_first = median(first_s(r) for r in runs["product"])
    ours_rate = median(r["steady"] for r in runs["product"])
    ours_cpu = median(r["cpu_per_mb"] for r in runs["product"])
    reps = len(runs["product"])
    kcl: dict[str, dict[str, Any]] = {}
    if cw is not None:
        modes = [m for m, on in (("default", p["kclrs_default_cold"]), ("matched", p["kclrs_matched_cold"]),
                                 ("seeded", True)) if on]
        for mode in modes:
            try:
                kcl[mode] = r = _kcl_drain(ctx, cw, stream, expect, mode)
                ctx.log(f"  kcl-rs {mode}: first record {r['first_s']:.1f} s, all {r['all_s']:.1f} s, steady "
                        f"{r['steady'] or 0:,.0f} rec/s, CPU {r['cpu_s']:.2f} s ({r['cpu_per_mb']:.4f} s/MB), "
                        f"{r['batches']} batches")
            except Exception as e:
                res.note(f"{S}: kcl-rs {mode} drain failed: {e!r:.400}")
                ctx.log(f"  kcl-rs {mode} drain failed: {e!r:.300}")
    fair = kcl.get("matched") or kcl.get("seeded")
    fair_name = "matched" if "matched" in kcl else "seeded"
    how = {"default": "defaults (POLLING; idle 1,500 ms, shard sync 60 s), new application (empty lease table)",
           "matched": "matched (POLLING, idle 200 ms, shard sync 1 s), new application (empty lease table)",
           "seeded": "matched, leases pre-created unowned (an application that ran before)"}
    for mode, r in kcl.items():
        res.add(S, f"kclrs_{mode}_start_to_first_record_s", r["first_s"], "s",
                note=f"kcl-rs {how[mode]}; Scheduler() -> first process_records; {shape}; one run")
    for mode, r in kcl.items():
        res.add(S, f"kclrs_{mode}_records_per_s", r["steady"], "rec/s",
                note=f"kcl-rs {how[mode]}; steady rate, {r['batches']} batches; all records {r['all_s']:.1f} s after start")
        res.add(S, f"kclrs_{mode}_cpu_s_per_mb", r["cpu_per_mb"], "CPU s/MB",
                note=f"kcl-rs process CPU from Scheduler() to the last record ({r['cpu_s']:.2f} s)")
    fv = fair["first_s"] if fair else None
    res.add(S, "ours_start_to_first_record_s", ours_first, "s", anchor=f"kclrs_{fair_name}_start_to_first_record_s",
            anchor_value=fv, goal="faster than kcl-rs", check=lambda v: fv is not None and v < fv,
            note=f"subscribe() call -> first batch in the sink (Coordinator and reader pool start; Ray already up, its "
                 f"2-4 s start not counted), DynamoDB lease table created before; {shape}; median of {reps}, {src}")
    fr = fair["steady"] if fair else None
    res.add(S, "ours_records_per_s", ours_rate, "rec/s", anchor=f"kclrs_{fair_name}_records_per_s", anchor_value=fr,
            goal=">= 0.8x kcl-rs", check=lambda v: fr is not None and v >= 0.8 * fr,
            note=f"= throughput product_records_per_s (reader pool -> counting sink actor); median of {reps}, {src}")
    fc = fair["cpu_per_mb"] if fair else None
    res.add(S, "ours_cpu_s_per_mb", ours_cpu, "CPU s/MB", anchor=f"kclrs_{fair_name}_cpu_s_per_mb", anchor_value=fc,
            goal="<= 2x kcl-rs", check=lambda v: fc is not None and v <= 2 * fc,
            note="= throughput product_cpu_s_per_mb: every process of our Ray runtime from subscribe() to the last record")
    ours_after = median(r["cpu_after_start_s"] / (r["bytes_after_start"] / MB) for r in runs["product"]
                        if r.get("bytes_after_start"))
    res.add(S, "ours_cpu_s_per_mb_after_start", ours_after, "CPU s/MB", anchor=f"kclrs_{fair_name}_cpu_s_per_mb",
            anchor_value=fc, goal="<= 2x kcl-rs", check=lambda v: fc is not None and v <= 2 * fc,
            note="= throughput product_cpu_s_per_mb_after_start: every process of our Ray runtime from subscribe() "
                 "returning to the last record (actor start-up left out)")
    res.add(S, "ours_cpu_s_per_mb_whole_run", ours_cpu, "CPU s/MB", anchor=f"kclrs_{fair_name}_cpu_s_per_mb",
            anchor_value=fc, goal="<= 8x kcl-rs", check=lambda v: fc is not None and v <= 8 * fc,
            note="= ours_cpu_s_per_mb (start included), against the issue-20 goal")
    res.add(S, "ours_records_per_s_vs_matched", ours_rate, "rec/s", anchor=f"kclrs_{fair_name}_records_per_s",
            anchor_value=fr, goal=">= 0.95x kcl-rs", check=lambda v: fr is not None and v >= 0.95 * fr,
            note="emulator CPU s/MB while ours read: "
                 + ", ".join(f"{r['emulator_cpu_s'] / (r['bytes'] / MB):.4f}" for r in runs["product"] if r.get("bytes")))
    _window_figures(res, runs["product"], kcl)
    seeded = kcl.get("seeded")
    sv = seeded["first_s"] if seeded else None
    res.add(S, "ours_start_to_first_record_vs_seeded_s", ours_first, "s", anchor="kclrs_seeded_start_to_first_record_s",
            anchor_value=sv, goal="<= 0.8x kcl-rs seeded", check=lambda v: sv is not None and v <= 0.8 * sv,
            note="= ours_start_to_first_record_s against kcl-rs with its leases already in the table")
    raw = runs.get("raw_single", [])
    res.add(S, "raw_start_to_first_record_s", median(first_s(r) for r in raw), "s",
            note="plain boto3, one thread: GetShardIterator + first GetRecords of the first shard")
    res.add(S, "raw_records_per_s", median(r["steady"] for r in raw), "rec/s", note="= throughput raw_single_records_per_s")
    res.add(S, "raw_cpu_s_per_mb", median(r["cpu_per_mb"] for r in raw), "CPU s/MB", note="= throughput raw_single_cpu_s_per_mb")
    pr = tp.get("peer")
    if pr:
        res.add(S, "async_kinesis_records_per_s", pr["steady"], "rec/s", note="= peer peer_records_per_s (async-kinesis 3.0.1)")
        res.add(S, "async_kinesis_cpu_s_per_mb", pr["cpu_per_mb"], "CPU s/MB", note="= peer peer_cpu_s_per_mb")
    if ctx.peer_python:
        try:
            res.add(S, "async_kinesis_start_to_first_record_s", _async_kinesis_first(ctx, stream), "s",
                    note="async-kinesis 3.0.1 Consumer (settings of the peer section) -> its first record; one run")
        except Exception as e:
            res.note(f"{S}: async-kinesis start run failed: {e!r:.300}")


# ----------------------------------------------------------------------------- memory per shard
def _sample_uss(pid: int, settle_s: float) -> float | None:
    """The USS (MiB) of ``pid`` after ``settle_s``, the largest of 3 samples 0.5 s apart."""
    psutil = psutil_mod()
    time.sleep(settle_s)
    out = []
    for _ in range(3):
        m = uss_mib(psutil.Process(pid))
        if m:
            out.append(m[0])
        time.sleep(0.5)
    return max(out) if out else None


def _child_memory(cmd: list[str], env: dict[str, str], ready: Callable[[str], bool], settle_s: float,
                  timeout_s: float = 300.0) -> float:
    """Start ``cmd``; once a line of its stdout satisfies ``ready``, sample its USS; close its stdin."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    hit = threading.Event()

    def watch() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if ready(line):
                hit.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        if not hit.wait(timeout_s):
            raise RuntimeError(f"not ready in {timeout_s:.0f} s: {proc.stderr.read()[-300:] if proc.poll() is not None else ''}")
        uss = _sample_uss(proc.pid, settle_s)
        if uss is None:
            raise RuntimeError("the process was gone")
        return uss
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _memory(ctx: Any, res: Results, cw: str | None) -> None:
    from .scale import _one

    p = ctx.params
    settle = p["scale_settle_s"]
    per_shard, size = p["scale_per_shard"], p["scale_record_bytes"]
    shape = f"{per_shard} x {size} B per shard, all read, then {settle:g} s at the tip"
    peer_env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}
    peer_env.pop("PYTHONPATH", None)
    for n in p["kclrs_memory_sizes"]:
        stream = f"pk-mem-{n}-{uuid.uuid4().hex[:6]}"
        shards = create_stream(ctx.endpoint, stream, n)
        expect, _, _ = prefill(ctx.endpoint, stream, shards, per_shard, size)
        jobs: dict[str, tuple[list[str], dict[str, str], Callable[[str], bool], str]] = {}
        if cw is not None:
            app = f"kclrs-mem-{uuid.uuid4().hex[:6]}"
            seed_kcl_leases(ctx.endpoint, stream, app)
            jobs["kclrs"] = ([ctx.kclrs_python, os.path.join(HERE, "_kclrs_worker.py"), "--stream", stream, "--app", app,
                              "--worker-id", f"{app}-w", "--settings", json.dumps(SETTINGS["seeded"]), "--expect", str(expect)],
                             _kcl_env(ctx, cw), lambda ln: '"event": "reached"' in ln,
                             "kcl-rs process, seeded, matched settings")
        if ctx.peer_python:
            jobs["async_kinesis"] = ([ctx.peer_python, os.path.join(HERE, "_peer_consume.py"), "--endpoint", ctx.endpoint,
                                      "--stream", stream, "--expect", str(expect), "--hold"],
                                     peer_env, lambda ln: '"event": "reached"' in ln, "async-kinesis process")
        jobs["raw"] = ([sys.executable, os.path.join(HERE, "_raw_hold.py"), ctx.endpoint, stream, str(expect)],
                       dict(os.environ), lambda ln: ln.startswith("REACHED"),
                       "plain boto3 process, one thread per shard polling every 0.25 s")
        got: dict[str, Any] = {}

        def measure(who: str, got: dict[str, Any] = got, jobs: dict[str, Any] = jobs) -> None:
            cmd, env, ready, _ = jobs[who]
            try:
                got[who] = _child_memory(cmd, env, ready, settle)
            except Exception as e:
                got[who] = e

        threads = [threading.Thread(target=measure, args=(who,), daemon=True) for who in jobs]
        together = p["kclrs_memory_side_by_side"]  # --quick: the peers' processes and ours at the same time
        for t in threads:
            t.start()
            if not together:
                t.join()
        r = _one(ctx, n, idle_s=settle)
        for t in threads:
            t.join()
        for who, (_, _, _, what) in jobs.items():
            v = got.get(who)
            if isinstance(v, float):
                res.add(S, f"{who}_uss_per_shard_{n}_mib", v / n, "MiB", note=f"{what}: USS {v:.1f} MiB / {n} shards; {shape}")
            else:
                res.note(f"{S}: {who} memory at {n} shards failed: {v!r:.300}")
        if r.get("error") or r.get("timeout") or not r.get("uss_total_mib"):
            res.note(f"{S}: ours memory at {n} shards failed: {r.get('error') or r.get('timeout')}")
        else:
            kv = _fig(res, f"kclrs_uss_per_shard_{n}_mib")
            res.add(S, f"ours_uss_per_shard_{n}_mib", r["uss_total_mib"] / n, "MiB", anchor=f"kclrs_uss_per_shard_{n}_mib",
                    anchor_value=kv,
                    note=f"Coordinator + reader pool USS {r['uss_total_mib']:.0f} MiB ({r['readers']} readers, shards "
                         f"{r['layout']}) / {n}; the scale section's run (own emulator, MemoryLeaseStore); "
                         f"{r['per_shard']} x {size} B per shard; Ray's own processes not counted (see ours_ray_runtime_uss_mib)")
    # Ray's own processes (gcs_server, raylet, agents): a fixed cost per node of every Ray application
    procs = [q for q in ray_tree([ctx.emulator_pid]) if not proc_title(q).startswith("ray::")]
    total = sum(m[0] for m in (uss_mib(q) for q in procs) if m)
    res.add(S, "ours_ray_runtime_uss_mib", total, "MiB",
            note=f"USS of Ray's own {len(procs)} processes of this node (gcs_server, raylet, agents, ...), "
                 "not per shard: what any Ray application starts")


# ----------------------------------------------------------------------------- two workers
class _Log:
    """Deliveries (ts, shard, sequence) of one worker, fetched incrementally."""

    def __init__(self, fetch: Callable[[int], list[tuple[float, str, str]]]) -> None:
        self.fetch = fetch
        self.rows: list[tuple[float, str, str]] = []

    def update(self) -> list[tuple[float, str, str]]:
        try:
            self.rows.extend(self.fetch(len(self.rows)))
        except Exception:
            pass
        return self.rows


def _file_log(path: str) -> _Log:
    def fetch(i: int) -> list[tuple[float, str, str]]:
        if not os.path.exists(path):
            return []
        with open(path) as f:
            lines = f.read().splitlines()
        out = []
        for ln in lines[i:]:
            parts = ln.split()
            if len(parts) != 3:
                break  # a line being written
            out.append((float(parts[0]), parts[1], parts[2]))
        return out

    return _Log(fetch)


def _even(a: _Child, b: _Child, shards: list[str]) -> bool:
    ha, hb = set(a.held()), set(b.held())
    half = len(shards) // 2
    return len(ha) == half and len(hb) == len(shards) - half and not (ha & hb)


def _await_from(log: _Log, t0: float, shards: list[str], limit_s: float) -> tuple[float | None, float | None]:
    """Seconds from ``t0`` to ``log``'s first delivery from one of ``shards``, and from every one."""
    firsts: dict[str, float] = {}

    def every() -> bool:
        for ts, sid, _ in log.update():
            if ts > t0 and sid in shards and sid not in firsts:
                firsts[sid] = ts
        return len(firsts) == len(shards)

    wait_for(every, limit_s, 0.25)
    return (min(firsts.values()) - t0 if firsts else None), (max(firsts.values()) - t0 if len(firsts) == len(shards) else None)


def _two_workers(ctx: Any, who: str, start: Callable[[str, str], tuple[_Child, _Log]], stream: str,
                 shards: list[str]) -> dict[str, Any]:
    """The scenario of the module docstring for one product; ``start(name, stream)`` starts a worker."""
    from .failover import _Publisher

    n = len(shards)
    out: dict[str, Any] = {}
    phases: list[tuple[str, float]] = [("start", 0.0)]
    workers: dict[str, tuple[_Child, _Log]] = {}
    keys = list(hash_keys(client(ctx.endpoint, "kinesis").list_shards(StreamName=stream)["Shards"]).values())
    pub = _Publisher(ctx.endpoint, stream, keys).__enter__()
    try:
        workers["a"] = a, alog = start("a", stream)
        if not wait_for(lambda: len(a.held()) == n, 180, 0.2):
            raise RuntimeError(f"{who}: worker A held {a.held()} of {n} shards after 180 s: {a.stderr_tail()}")
        for step, name in (("balance", "b"), ("balance2", "c")):
            workers[name] = w, _ = start(name, stream)
            st = w.wait("start", timeout_s=120)
            if not st:
                raise RuntimeError(f"{who}: worker {name} did not start: {w.stderr_tail()}")
            phases.append((step, st["ts"]))
            ok = wait_for(lambda w=w: _even(a, w, shards), 300, 0.2)
            out[f"{step}_s"] = time.time() - st["ts"] if ok else None
            ctx.log(f"  {who}: worker {name} joined -> even split in {out[f'{step}_s']} s (A {a.held()}, {name} {w.held()})")
            if not ok:
                raise RuntimeError(f"{who}: no even split within 300 s of {name} joining: A {a.held()}, {name} {w.held()}")
            moved = w.held()
            time.sleep(2.0)  # records flowing on the split
            t_event = time.time()
            event = "sigkill" if name == "b" else "graceful"
            phases.append((event, t_event))
            if event == "sigkill":
                w.kill()
            else:
                w.proc.send_signal(signal.SIGTERM)
            first, every = _await_from(alog, t_event, moved, 150)
            out[f"{event}_first_s"], out[f"{event}_every_s"] = first, every
            ctx.log(f"  {who}: {event} of {name} ({moved}) -> A's first record from them {first} s, every one {every} s")
            if event == "graceful":
                end = w.wait("close_end", "shutdown_end", timeout_s=60)
                out["graceful_stop_s"] = end["took_s"] if end else None
                w.stop()
            if first is None:
                raise RuntimeError(f"{who}: A read nothing from {moved} within 150 s of the {event}")
    finally:
        pub.__exit__()
    time.sleep(3.0)
    rows = sorted((ts, name, sid, seq) for name, (_, log) in workers.items() for ts, sid, seq in log.update())
    seen: set[tuple[str, str]] = set()
    dups = {p: 0 for p, _ in phases}
    for ts, _, sid, seq in rows:
        if (sid, seq) in seen:
            phase = max((p for p in phases if p[1] <= ts), key=lambda p: p[1])[0]
            dups[phase] += 1
        seen.add((sid, seq))
    out["duplicates"] = dups
    out["published"], out["distinct"] = pub.n, len(seen)
    out["lost"] = max(0, pub.n - len(seen))
    for w, _ in workers.values():
        w.stop(10)
    return out


def _ours_pair(ctx: Any, stream: str) -> tuple[Callable[[str, str], tuple[_Child, _Log]], Callable[[], None]]:
    import ray

    from .actors import LogSink

    t = ctx.timings
    ns, table = f"pk-{uuid.uuid4().hex[:6]}", f"pk-ours-{uuid.uuid4().hex[:8]}"
    address = ray.get_runtime_context().gcs_address
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)
    sinks: list[Any] = []

    def start(name: str, stream: str) -> tuple[_Child, _Log]:
        sink = LogSink.options(name=f"sink-{name}", namespace=ns).remote()
        ray.get(sink.since.remote(0))
        sinks.append(sink)
        child = _Child(name, [sys.executable, "-m", "bench._ours_worker", "--address", address, "--endpoint", ctx.endpoint,
                              "--table", table, "--stream", stream, "--owner", f"ours-{name}", "--sink", f"sink-{name}",
                              "--namespace", ns, "--lease-duration", str(t["lease_duration_s"]),
                              "--renew-interval", str(t["renew_interval_s"]), "--poll-interval", str(t["lease_poll_interval_s"])],
                       env, cwd=os.path.dirname(HERE))
        ctx.children.append(child.proc)
        return child, _Log(lambda i, sink=sink: ray.get(sink.since.remote(i)))

    def cleanup() -> None:
        for s in sinks:
            ray.kill(s)

    return start, cleanup


def _two_worker_figures(ctx: Any, res: Results, cw: str | None) -> None:
    n = ctx.params["kclrs_balance_shards"]
    runs: dict[str, dict[str, Any]] = {}
    t = ctx.timings
    for who in ("kclrs", "ours"):
        if who == "kclrs" and cw is None:
            continue
        stream = f"pk-2w-{who}-{uuid.uuid4().hex[:6]}"
        shards = [s["ShardId"] for s in create_stream(ctx.endpoint, stream, n)]
        tmp = tempfile.mkdtemp(prefix="pk-2w-")
        cleanup: Callable[[], None] = lambda: None  # noqa: E731
        if who == "kclrs":
            app = f"kclrs-2w-{uuid.uuid4().hex[:6]}"
            seed_kcl_leases(ctx.endpoint, stream, app)

            def start(name: str, stream: str, app: str = app, tmp: str = tmp) -> tuple[_Child, _Log]:
                path = os.path.join(tmp, f"{name}.log")
                return _kcl_worker(ctx, cw, name, stream, app, SETTINGS["matched"], record_log=path,
                                   timeout_s=1800), _file_log(path)
        else:
            start, cleanup = _ours_pair(ctx, stream)
        try:
            runs[who] = _two_workers(ctx, who, start, stream, shards)
        except Exception as e:
            res.note(f"{S}: two-worker run of {who} failed: {e!r:.400}")
            ctx.log(f"  two-worker run of {who} failed: {e!r:.300}")
        finally:
            cleanup()
            shutil.rmtree(tmp, ignore_errors=True)
    setting = {"kclrs": "kcl-rs matched settings (idle 200 ms, shard sync 1 s), leases pre-created; failover_time 10 s "
                        "(default, not settable), lease taker every 20 s, 1 steal per taker run",
               "ours": f"ours default settings: lease {t['lease_duration_s']:g} s, renew {t['renew_interval_s']:g} s, lease "
                       f"poll {t['lease_poll_interval_s']:g} s, 1 steal per poll, DynamoLeaseStore"}
    common = f"{n} shards, publisher 1 record per shard per 0.1 s"
    specs = (  # key in the run, figure suffix, unit, goal (ours vs kcl-rs), what
        ("balance_s", "balance_to_even_s", "s", "<=", "second worker's start -> even split"),
        ("balance2_s", "balance_again_to_even_s", "s", None, "third worker's start (after the crash) -> even split"),
        ("sigkill_first_s", "sigkill_to_survivor_first_record_s", "s", "<=",
         "SIGKILL of one of two workers -> the survivor's first record from its shards"),
        ("sigkill_every_s", "sigkill_to_survivor_every_shard_s", "s", None, "... from every one of its shards"),
        ("graceful_first_s", "graceful_to_other_reading_s", "s", "<=",
         "graceful stop of one of two workers -> the other's first record from its shards"),
        ("graceful_every_s", "graceful_to_other_every_shard_s", "s", None, "... from every one of its shards"),
        ("graceful_stop_s", "graceful_stop_call_s", "s", None, "the stop call itself (ours close(), kcl-rs shutdown())"),
    )
    for who in ("kclrs", "ours"):
        r = runs.get(who)
        if r is None:
            continue
        for key, suffix, unit, goal, what in specs:
            kv = runs.get("kclrs", {}).get(key) if who == "ours" else None
            res.add(S, f"{who}_{suffix}", r.get(key), unit, anchor=f"kclrs_{suffix}" if who == "ours" else None,
                    anchor_value=kv, goal=(f"{goal} kcl-rs" if goal and who == "ours" else None),
                    check=(lambda v, kv=kv: kv is not None and v <= kv) if goal and who == "ours" else None,
                    note=f"{what}; {common}; {setting[who]}; one run")
        d = r["duplicates"]
        for phase, suffix in (("balance", "balance_duplicates"), ("sigkill", "sigkill_duplicates"),
                              ("graceful", "graceful_duplicates")):
            goal = "0" if (who == "ours" and phase == "graceful") else None
            res.add(S, f"{who}_{suffix}", d.get(phase, 0), "records", goal=goal,
                    check=(lambda v: v == 0) if goal else None,
                    note=f"records delivered a second time during the {phase} phase; all phases {d}")
        res.add(S, f"{who}_two_worker_lost", r["lost"], "records",
                note=f"{r['published']} put, {r['distinct']} distinct delivered, 3 s after the publisher stopped")


# ----------------------------------------------------------------------------- the section
def run(ctx: Any, res: Results) -> None:
    if ctx.kclrs_python is None:
        res.add(S, "kclrs_matched_start_to_first_record_s", None, "s", note=f"kcl-rs not run: {ctx.kclrs_error}")
    with _CloudWatchSink() as cw_sink:
        cw = cw_sink.endpoint if ctx.kclrs_python else None
        _start_and_throughput(ctx, res, cw)
        if ctx.params.get("tp_long_records_per_shard"):
            long_drain.run(ctx, res, cw, _kcl_drain)
        _memory(ctx, res, cw)
        if ctx.params["kclrs_two_workers"]:
            _two_worker_figures(ctx, res, cw)
        else:
            res.note(f"{S}: the two-worker runs (failover, graceful stop, balancing) are not part of --quick: "
                     "kcl-rs's lease taker runs every 20 s, so they take minutes")


# ----------------------------------------------------------------------------- the table
ROWS = (  # label, lower is better, ours, kcl-rs default, kcl-rs matched, async-kinesis, raw
    ("start -> first record, new application (s)", True, "ours_start_to_first_record_s",
     "kclrs_default_start_to_first_record_s", "kclrs_matched_start_to_first_record_s",
     "async_kinesis_start_to_first_record_s", "raw_start_to_first_record_s"),
    ("start -> first record, leases already in the table (s)", True, "ours_start_to_first_record_s", None,
     "kclrs_seeded_start_to_first_record_s", None, None),
    ("steady throughput (rec/s)", False, "ours_records_per_s", "kclrs_default_records_per_s", "kclrs_matched_records_per_s",
     "async_kinesis_records_per_s", "raw_records_per_s"),
    ("client CPU (s/MB)", True, "ours_cpu_s_per_mb", "kclrs_default_cpu_s_per_mb", "kclrs_matched_cpu_s_per_mb",
     "async_kinesis_cpu_s_per_mb", "raw_cpu_s_per_mb"),
    ("memory per shard, 4 shards (MiB USS)", True, "ours_uss_per_shard_4_mib", None, "kclrs_uss_per_shard_4_mib",
     "async_kinesis_uss_per_shard_4_mib", "raw_uss_per_shard_4_mib"),
    ("memory per shard, 64 shards (MiB USS)", True, "ours_uss_per_shard_64_mib", None, "kclrs_uss_per_shard_64_mib",
     "async_kinesis_uss_per_shard_64_mib", "raw_uss_per_shard_64_mib"),
    ("crash failover: SIGKILL -> survivor reads its shards (s)", True, "ours_sigkill_to_survivor_first_record_s", None,
     "kclrs_sigkill_to_survivor_first_record_s", None, None),
    ("crash failover: ... every shard (s)", True, "ours_sigkill_to_survivor_every_shard_s", None,
     "kclrs_sigkill_to_survivor_every_shard_s", None, None),
    ("crash failover: duplicates", True, "ours_sigkill_duplicates", None, "kclrs_sigkill_duplicates", None, None),
    ("graceful stop -> other worker reading (s)", True, "ours_graceful_to_other_reading_s", None,
     "kclrs_graceful_to_other_reading_s", None, None),
    ("graceful stop: duplicates", True, "ours_graceful_duplicates", None, "kclrs_graceful_duplicates", None, None),
    ("balancing: second worker joins 8 shards -> 4/4 (s)", True, "ours_balance_to_even_s", None,
     "kclrs_balance_to_even_s", None, None),
    ("balancing: duplicates during the moves", True, "ours_balance_duplicates", None, "kclrs_balance_duplicates", None, None),
)


def markdown(data: dict[str, Any]) -> str:
    """The side-by-side table of a results file: us / kcl-rs / async-kinesis / raw, ours / the best peer."""
    figs = {f["name"]: f["value"] for f in data.get("figures", []) if f["section"] == S}
    lines = [f"From {section_source(data, S)} (its own runs of ours; the `failover` section measures our "
             "failover separately, so its figures differ from run to run).", "",
             "| figure | ours | kcl-rs default | kcl-rs matched | async-kinesis | raw boto3 | ours / best peer |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, lower, *names in ROWS:
        vals = [figs.get(n) if n else None for n in names]
        peers = [v for v in vals[1:4] if v is not None]
        best = (min(peers) if lower else max(peers)) if peers else None
        ours = vals[0]
        ratio = f"{ours / best:.2f}x" if ours is not None and best else ("-" if best is None or ours is None else "")
        cells = ["-" if n is None else ("n/m" if v is None else fmt(float(v))) for n, v in zip(names, vals)]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m bench.peer_kcl_rs [results.json]
    with open(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results.json")) as _f:
        print(markdown(json.load(_f)))
