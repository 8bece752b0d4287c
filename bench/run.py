"""``python -m bench``: run the benchmarks, print the table, write ``bench/results.json``."""

from __future__ import annotations

import os

# Ray 2.60 trip-wires (shared/ENVIRONMENT.md), before Ray is imported.
for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")):
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

from .common import Results, ensure_venv, merge_results  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SECTIONS = ("throughput", "peer", "latency", "memory", "failover", "scale", "peer_kcl_rs", "efo", "checkpoints",
            "delivery", "lease_cost", "skew", "skew_balance", "tables", "demo")
PEER_PACKAGE = "async-kinesis==3.0.1"

DEFAULT = {
    "tp_records_per_shard": 20_000, "tp_record_bytes": 1024, "tp_reps": 3,
    "tp_long_records_per_shard": 100_000, "tp_long_reps": 2,
    "lat_rate": 50, "lat_seconds": 30.0,
    "rest_seconds": 5.0, "scale_rows": 1000, "scale_passes": 5,
    "reader_kills": 5,
    "scale_sizes": [16, 64, 256, 1000], "scale_per_shard": 50, "scale_per_shard_1000": 20, "scale_record_bytes": 100,
    "scale_idle_s": 10.0, "scale_settle_s": 3.0, "scale_timeout_s": 600.0, "scale_cap1_sizes": [16, 64],
    "scale_sweep_size": 256, "scale_sweep_caps": [32, 64, 128, 256], "scale_dynamo_shards": 1000,
    "scale_dynamo_timings": [[10.0, 3.0], [30.0, 10.0]], "scale_dynamo_window_s": 40.0, "scale_probe_threads": 16,
    "scale_probe_s": 4.0,
    "demo_args": ["--month", "1"], "demo_timeout_s": 900, "efo_seconds": 30.0,
    "kclrs_memory_sizes": [4, 64], "kclrs_default_cold": True, "kclrs_matched_cold": True, "kclrs_two_workers": True,
    "kclrs_balance_shards": 8, "kclrs_memory_side_by_side": False,
    "ckpt_rate": 400, "ckpt_seconds": 20.0, "ckpt_intervals": [0, 1, 5],
    "dc_records_per_shard": 40000, "dc_poison_total": 100_000, "dc_trickle_s": 20.0,
    "lc_idle_shards": 64, "lc_load_shards": 8, "lc_rate_per_shard": 15, "lc_settle_s": 5.0, "lc_window_s": 30.0,
    "lc_kill_s": 10.0, "lc_intervals": ["default", 0, 10],
    "skew_per_shard": 100_000, "skew_filter_us": 150, "skew_timeout_s": 900.0,
    "tables_records": 20_000, "tables_rate": 50, "tables_seconds": 20.0, "tables_kills": 5,
    "skew_order": ["count", "by_hand", "load"],
    "sb_hot_records": 50, "sb_hot_bytes": 1000, "sb_cold_bytes": 200, "sb_settle_quiet_s": 20.0,
    "sb_settle_timeout_s": 180.0, "sb_watch_s": 180.0, "sb_kills": 2, "sb_after_ready_s": 30.0,
}
QUICK = {
    "tp_records_per_shard": 500, "tp_record_bytes": 1024, "tp_reps": 1,
    "tp_long_records_per_shard": 2_000, "tp_long_reps": 1,
    "lat_rate": 50, "lat_seconds": 4.0,
    "rest_seconds": 2.0, "scale_rows": 40, "scale_passes": 2,
    "reader_kills": 2,
    "scale_sizes": [16, 64], "scale_per_shard": 50, "scale_per_shard_1000": 20, "scale_record_bytes": 100,
    "scale_idle_s": 4.0, "scale_settle_s": 1.0, "scale_timeout_s": 180.0, "scale_cap1_sizes": [16],
    "scale_sweep_size": 256, "scale_sweep_caps": [], "scale_dynamo_shards": 1000,
    "scale_dynamo_timings": [], "scale_dynamo_window_s": 40.0, "scale_probe_threads": 16, "scale_probe_s": 4.0,
    "demo_args": ["--day", "2013-01-01"], "demo_timeout_s": 300, "efo_seconds": 6.0,
    "kclrs_memory_sizes": [4], "kclrs_default_cold": False, "kclrs_matched_cold": False, "kclrs_two_workers": False,
    "kclrs_balance_shards": 8, "kclrs_memory_side_by_side": True,
    "ckpt_rate": 200, "ckpt_seconds": 4.0, "ckpt_intervals": [0, 1],
    "dc_records_per_shard": 500, "dc_poison_total": 5_000, "dc_trickle_s": 5.0,
    "lc_idle_shards": 8, "lc_load_shards": 2, "lc_rate_per_shard": 15, "lc_settle_s": 1.0, "lc_window_s": 3.0,
    "lc_kill_s": 2.0, "lc_intervals": ["default"],
    "skew_per_shard": 4_000, "skew_filter_us": 400, "skew_timeout_s": 180.0,
    "tables_records": 2_000, "tables_rate": 50, "tables_seconds": 4.0, "tables_kills": 2,
    "skew_order": ["count", "by_hand", "load"],
    "sb_hot_records": 20, "sb_hot_bytes": 1000, "sb_cold_bytes": 200, "sb_settle_quiet_s": 5.0,
    "sb_settle_timeout_s": 60.0, "sb_watch_s": 10.0, "sb_kills": 1, "sb_after_ready_s": 5.0,
}
DEFAULT_TIMINGS = {"lease_duration_s": 10.0, "renew_interval_s": 3.0, "lease_poll_interval_s": 2.0}
QUICK_TIMINGS = {"lease_duration_s": 2.0, "renew_interval_s": 0.5, "lease_poll_interval_s": 0.5}


@dataclasses.dataclass
class Ctx:
    quick: bool
    full_year: bool
    sections: tuple[str, ...]
    params: dict[str, Any]
    timings: dict[str, float]
    timeout_s: float
    endpoint: str = ""
    emulator_pid: int = 0
    peer_python: str | None = None
    peer_error: str | None = None
    kclrs_python: str | None = None
    kclrs_error: str | None = None
    tp: dict[str, Any] = dataclasses.field(default_factory=dict)
    children: list[Any] = dataclasses.field(default_factory=list)
    uss_under_load: list[float] = dataclasses.field(default_factory=list)
    uss_under_load_all: dict[int, float] = dataclasses.field(default_factory=dict)
    raw_uss: tuple[float, float] | None = None
    uss_small_batches: float | None = None
    reader_layout: str = ""
    t0: float = dataclasses.field(default_factory=time.monotonic)

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def ensure_peer(ctx: Ctx, venv: str) -> None:
    """The peer's own virtualenv (created if missing): ctx.peer_python, or ctx.peer_error."""
    ctx.peer_python, ctx.peer_error = ensure_venv(
        venv, PEER_PACKAGE, "import kinesis, importlib.metadata as m; print(m.version('async-kinesis'))", ctx.log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny input and short lease timings (a smoke test, ~2 min)")
    ap.add_argument("--full-year", action="store_true", help="also run the demo on the whole year (336776 flights)")
    ap.add_argument("--only", default="", help=f"comma-separated sections to run ({','.join(SECTIONS)})")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"), help="where to write the JSON [bench/results.json]")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override one parameter of the mode, e.g. --set 'scale_sizes=[16]' (recorded in the JSON)")
    ap.add_argument("--peer-venv", default=os.path.join(HERE, ".venv-peer"), help="the peer's virtualenv [bench/.venv-peer]")
    ap.add_argument("--kclrs-venv", default=os.path.join(HERE, ".venv-kclrs"),
                    help="kcl-rs's virtualenv [bench/.venv-kclrs]")
    ap.add_argument("--merge", action="store_true",
                    help="merge into --out: replace the figures of the sections run, keep the others")
    a = ap.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    skip = [s for s in a.skip.split(",") if s]
    for s in only + skip:
        if s not in SECTIONS:
            ap.error(f"unknown section {s!r}; sections: {', '.join(SECTIONS)}")
    sections = tuple(s for s in SECTIONS if (not only or s in only) and s not in skip)
    if "peer" in sections and "throughput" not in sections:
        sections = ("throughput", *sections)  # the peer reads the throughput stream
    params = dict(QUICK if a.quick else DEFAULT)
    for item in a.set:
        key, eq, value = item.partition("=")
        if not eq or key not in params:
            ap.error(f"--set takes KEY=JSON with KEY one of: {', '.join(sorted(params))}")
        try:
            params[key] = json.loads(value)
        except ValueError as e:
            ap.error(f"--set {key}: not JSON ({e})")
    timings = dict(QUICK_TIMINGS if a.quick else DEFAULT_TIMINGS)
    ctx = Ctx(quick=a.quick, full_year=a.full_year, sections=sections, params=params, timings=timings,
              timeout_s=120.0 if a.quick else 300.0)
    res = Results("quick" if a.quick else "default", {**params, **timings, "sections": list(sections)})
    base = None
    if a.merge and os.path.exists(a.out):
        with open(a.out) as f:
            base = json.load(f)

    def write() -> None:
        if base is None:
            res.write(a.out)
            return
        tmp = f"{a.out}.tmp"
        with open(tmp, "w") as f:
            json.dump(merge_results(base, res.to_json()), f, indent=1)
            f.write("\n")
        os.replace(tmp, a.out)

    if "peer_kcl_rs" in sections:
        from .peer_kcl_rs import ensure_kclrs

        ensure_kclrs(ctx, a.kclrs_venv)
        if ctx.kclrs_error:
            res.note(f"kcl-rs not run: {ctx.kclrs_error}")
            ctx.log(ctx.kclrs_error)
    if "peer" in sections:
        ensure_peer(ctx, a.peer_venv)
        if ctx.peer_error:
            res.note(f"peer not run: {ctx.peer_error}")
            ctx.log(ctx.peer_error)

    def section(name: str, fn: Any) -> None:
        load = os.getloadavg()
        ctx.log(f"== {name} (load average {load[0]:.1f})")
        res.load[name] = round(load[0], 2)
        t = time.monotonic()
        try:
            fn(ctx, res)
        except Exception as e:  # one broken section does not hide the others
            res.errors[name] = f"{type(e).__name__}: {e}"[:1000]
            ctx.log(f"{name} FAILED: {e!r}")
            traceback.print_exc()
        res.timings[name] = time.monotonic() - t
        write()  # partial results survive a crash later on

    needs_ray = [s for s in sections if s in ("throughput", "latency", "memory", "failover", "scale", "peer_kcl_rs",
                                              "efo", "checkpoints", "delivery", "lease_cost", "skew",
                                              "skew_balance", "tables")]
    if needs_ray:
        import ray

        from kinesis_actors.emulator import Emulator

        from . import (
            checkpoints,
            delivery,
            efo,
            failover,
            latency,
            lease_cost,
            memory,
            peer_kcl_rs,
            scale,
            skew,
            skew_balance,
            tables,
            throughput,
        )

        t = time.monotonic()
        with Emulator() as emu:
            ctx.endpoint, ctx.emulator_pid = emu.endpoint, emu.pid
            for attempt in (1, 2, 3):  # a loaded 2-core machine sometimes times Ray's start out
                try:
                    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False,
                             log_to_driver=False, _node_ip_address="127.0.0.1")
                    break
                except Exception as e:
                    if attempt == 3:
                        raise
                    ctx.log(f"ray.init failed ({e!r:.120}); retrying")
                    ray.shutdown()
            ctx.log(f"emulator at {emu.endpoint} and Ray up in {time.monotonic() - t:.1f} s")
            try:
                for name, mod in (("throughput", throughput), ("latency", latency), ("memory", memory),
                                  ("failover", failover), ("scale", scale), ("peer_kcl_rs", peer_kcl_rs),
                                  ("efo", efo), ("checkpoints", checkpoints), ("delivery", delivery),
                                  ("lease_cost", lease_cost), ("skew", skew),
                                  ("skew_balance", skew_balance), ("tables", tables)):
                    if name in sections:
                        section(name, mod.run)
            finally:
                for child in ctx.children:
                    if child.poll() is None:
                        child.kill()
                ray.shutdown()
    if "demo" in sections:
        from . import demo

        section("demo", demo.run)
    write()
    print(res.table())
    from .report import CHAOS_LOCAL, CHAOS_PATH, chaos_markdown

    for path, what in ((CHAOS_PATH, "the reference run kept in the repository"), (CHAOS_LOCAL, "your last run")):
        if os.path.exists(path):  # the chaos suite's figures (make test-chaos), reported beside ours
            with open(path) as f:
                print(f"\nChaos suite, {what} ({os.path.relpath(path)}):\n" + chaos_markdown(json.load(f)))
    for n in res.notes:
        print(f"note: {n}")
    for name, err in res.errors.items():
        print(f"error in {name}: {err}")
    print(f"wrote {a.out}")
    return 1 if any(k != "peer" for k in res.errors) else 0
