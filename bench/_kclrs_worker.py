"""One kcl-rs (KCL v3 in Rust) worker: a ``kcl_rs.Scheduler`` in this process.

Run by the kcl-rs virtualenv only (``bench/.venv-kclrs/bin/python bench/_kclrs_worker.py ...``),
never imported by the benchmark; the standard library and ``kcl_rs`` are all it uses.
Kinesis, DynamoDB and CloudWatch endpoints come from ``AWS_ENDPOINT_URL_KINESIS`` /
``_DYNAMODB`` / ``_CLOUDWATCH`` (``endpoint_url=None``, so the per-service variables apply).

The processor counts records and bytes, checkpoints after every batch (as ours does) and
prints JSON lines on stdout, each with ``ts`` (epoch s): ``start`` (just before
``Scheduler()``), ``started``, ``initialize`` / ``lease_lost`` / ``shard_ended`` /
``shutdown_requested`` (per shard), ``first_record``, ``reached`` (``--expect`` unique
records delivered), ``status`` (every ``--status-every`` s: held shards, counts),
``shutdown_begin`` / ``shutdown_end`` (``Scheduler.shutdown()``, on SIGTERM or when
``--exit-after-reached`` is given) and ``done`` (counts, process CPU seconds at the start, at
the first and at the last record, and with ``--events`` the (ts, records) of every batch).
``--record-log`` appends one line per delivered record: ``ts shard sequence``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import sys
import threading
import time

_lock = threading.Lock()


def emit(event: str, **kw: object) -> None:
    line = json.dumps({"event": event, "ts": time.time(), **kw})
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stream", required=True)
    ap.add_argument("--app", required=True, help="application_name (the lease table), >= 3 characters")
    ap.add_argument("--worker-id", required=True)
    ap.add_argument("--settings", default="{}", help="JSON: extra Scheduler keyword arguments")
    ap.add_argument("--expect", type=int, default=0, help="emit 'reached' after this many unique records")
    ap.add_argument("--exit-after-reached", type=float, default=None,
                    help="SIGKILL-free exit this many s after 'reached' (no shutdown(): os._exit)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--status-every", type=float, default=0.5)
    ap.add_argument("--record-log", default=None)
    ap.add_argument("--events", action="store_true", help="keep (ts, records) of every batch for the done line")
    a = ap.parse_args()

    from kcl_rs import CheckpointError, RecordProcessorBase, Scheduler

    state: dict = {"count": 0, "bytes": 0, "deliveries": 0, "batches": 0, "ckpt_err": 0, "held": set(),
                   "cpu_first": None, "cpu_last": None, "t_first": None, "t_last": None}
    seen: set[tuple[str, str, int]] = set()
    events: list[tuple[float, int]] = []
    reached = threading.Event()
    stop = threading.Event()
    rlog = open(a.record_log, "a", buffering=1) if a.record_log else None  # noqa: SIM115 - closed at exit

    class Processor(RecordProcessorBase):
        def __init__(self) -> None:
            self.shard = ""

        def initialize(self, i) -> None:
            self.shard = i.shard_id or ""
            with _lock:
                state["held"].add(self.shard)
            emit("initialize", shard=self.shard, checkpoint=i.sequence_number)

        def process_records(self, p) -> None:
            recs = p.records
            if not recs:
                return
            now = time.time()
            new = nbytes = 0
            lines = []
            for r in recs:
                data = r.data
                nbytes += len(data)
                key = (self.shard, r.sequence_number or "", r.sub_sequence_number)
                if rlog is not None:
                    lines.append(f"{now:.6f} {self.shard} {key[1]}\n")
                if key not in seen:
                    seen.add(key)
                    new += 1
            with _lock:
                first = state["t_first"] is None
                state["count"] += new
                state["bytes"] += nbytes
                state["deliveries"] += len(recs)
                state["batches"] += 1
                state["t_last"] = now
                state["cpu_last"] = time.process_time()
                if first:
                    state["t_first"], state["cpu_first"] = now, state["cpu_last"]
                if a.events:
                    events.append((now, len(recs)))
                count = state["count"]
            if first:
                emit("first_record", shard=self.shard)
            if rlog is not None:
                rlog.write("".join(lines))
            try:
                p.checkpointer.checkpoint()
            except CheckpointError as e:
                with _lock:
                    state["ckpt_err"] += 1
                emit("checkpoint_error", shard=self.shard, error=str(getattr(e, "value", e)))
            if a.expect and count >= a.expect and not reached.is_set():
                reached.set()
                emit("reached", count=count)

        def lease_lost(self, _l) -> None:
            with _lock:
                state["held"].discard(self.shard)
            emit("lease_lost", shard=self.shard)

        def shard_ended(self, s) -> None:
            with _lock:
                state["held"].discard(self.shard)
            emit("shard_ended", shard=self.shard)
            try:
                s.checkpointer.checkpoint()
            except CheckpointError:
                pass

        def shutdown_requested(self, s) -> None:
            with _lock:
                state["held"].discard(self.shard)
            emit("shutdown_requested", shard=self.shard)
            try:
                s.checkpointer.checkpoint()
            except CheckpointError:
                pass

    kw = {"stream_name": a.stream, "application_name": a.app, "record_processor_factory": Processor,
          "worker_identifier": a.worker_id, "region": os.environ.get("AWS_REGION", "us-east-1"), "endpoint_url": None,
          "initial_position": "TRIM_HORIZON", "access_key_id": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
          "secret_access_key": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"), **json.loads(a.settings)}
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cpu_start = time.process_time()
    emit("start", pid=os.getpid(), kcl_rs=importlib.metadata.version("kcl-rs"),
         settings={k: v for k, v in kw.items() if k not in ("record_processor_factory", "secret_access_key")})
    sched = Scheduler(**kw)
    sched.start()
    emit("started")
    deadline = time.monotonic() + a.timeout
    next_status = 0.0
    reached_at = None
    while not stop.is_set() and time.monotonic() < deadline:
        if reached.is_set() and a.exit_after_reached is not None:
            reached_at = reached_at or time.monotonic()
            if time.monotonic() - reached_at >= a.exit_after_reached:
                break
        if time.monotonic() >= next_status:
            with _lock:
                held, count = sorted(state["held"]), state["count"]
            emit("status", held=held, count=count)
            next_status = time.monotonic() + a.status_every
        stop.wait(0.05)

    if stop.is_set():  # SIGTERM: the stop a kcl-rs user has (Scheduler.shutdown(), also what run() does on Ctrl-C)
        emit("shutdown_begin")
        t = time.time()
        th = threading.Thread(target=sched.shutdown, daemon=True)
        th.start()
        th.join(60)
        emit("shutdown_end", took_s=time.time() - t, finished=not th.is_alive())
    with _lock:
        final = dict(count=state["count"], bytes=state["bytes"], deliveries=state["deliveries"],
                     batches=state["batches"], checkpoint_errors=state["ckpt_err"], t_first=state["t_first"],
                     t_last=state["t_last"], cpu_start=cpu_start, cpu_first=state["cpu_first"], cpu_last=state["cpu_last"],
                     cpu_end=time.process_time(), events=list(events) if a.events else None)
    emit("done", **final)
    if rlog is not None:
        rlog.close()
    sys.stdout.flush()
    os._exit(0)  # the Rust runtime's threads are not joined


if __name__ == "__main__":
    sys.exit(main())
