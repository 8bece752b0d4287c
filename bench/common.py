"""Shared pieces of the benchmarks: figures and results, process CPU and memory, streams."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


# ----------------------------------------------------------------------------- figures
@dataclasses.dataclass
class Figure:
    """One measured figure.

    ``anchor`` names what the value is compared to (a raw-boto3 figure measured in the
    same run, or the goal's bound) and ``ratio`` is ``value / anchor_value``.
    """

    section: str
    name: str
    value: float | None
    unit: str
    anchor: str | None = None
    anchor_value: float | None = None
    goal: str | None = None
    goal_met: bool | None = None
    note: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.anchor_value in (None, 0):
            return None
        return self.value / self.anchor_value  # type: ignore[operator]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ratio"] = None if self.ratio is None else round(self.ratio, 3)
        for k in ("value", "anchor_value"):
            if isinstance(d[k], float):
                d[k] = round(d[k], 4)
        return d


class Results:
    """Collects figures, notes and section errors; writes ``results.json``; prints the table."""

    def __init__(self, mode: str, params: dict[str, Any]) -> None:
        self.mode = mode
        self.params = params
        self.figures: list[Figure] = []
        self.notes: list[str] = []
        self.errors: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.load: dict[str, float] = {}
        self.started = _dt.datetime.now(_dt.timezone.utc)

    def add(self, section: str, name: str, value: float | None, unit: str, *, anchor: str | None = None,
            anchor_value: float | None = None, goal: str | None = None,
            check: Callable[[float], bool] | None = None, note: str | None = None) -> Figure:
        met = None if (check is None or value is None) else bool(check(value))
        fig = Figure(section, name, None if value is None else float(value), unit, anchor,
                     None if anchor_value is None else float(anchor_value), goal, met, note)
        self.figures.append(fig)
        return fig

    def note(self, text: str) -> None:
        self.notes.append(text)

    def to_json(self) -> dict[str, Any]:
        return {
            "date": self.started.strftime("%Y-%m-%d"),
            "started_utc": self.started.isoformat(timespec="seconds"),
            "commit": git_commit(),
            "machine": machine(),
            "mode": self.mode,
            "params": self.params,
            "section_seconds": {k: round(v, 1) for k, v in self.timings.items()},
            "load_average_1min_at_section_start": self.load,
            "figures": [f.to_json() for f in self.figures],
            "notes": self.notes,
            "errors": self.errors,
        }

    def write(self, path: str) -> None:
        tmp = f"{path}.tmp"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)

    def table(self) -> str:
        return format_table([f.to_json() for f in self.figures])


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value == 0:
            return "0"
        mag = abs(value)
        if mag >= 1000:
            return f"{value:,.0f}"
        if mag >= 10:
            return f"{value:.1f}"
        if mag >= 0.1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


_GOAL_NUMBER = re.compile(r"(?:<=|>=|<|>)\s*(-?\d[\d,]*(?:\.\d+)?)(x?)")


def fmt_against(value: Any, threshold: float | None) -> str:
    """``fmt(value)`` with as many more decimals as it takes to show how ``value`` compares
    with ``threshold``: 12.02 against a goal of 12 prints "12.02", never "12.0" (which reads
    as met). Without a threshold, or for a non-float, the same as :func:`fmt`."""
    text = fmt(value)
    if threshold is None or not isinstance(value, float) or value == threshold:
        return text
    for decimals in range(1, 7):
        try:
            shown = float(text.replace(",", ""))
        except ValueError:
            return text
        if shown != threshold and (shown < threshold) == (value < threshold):
            return text
        text = f"{value:.{decimals}f}"
    return text


def goal_threshold(figure: dict[str, Any]) -> float | None:
    """The number a figure's goal compares its value with: the goal's number ("<= 250 ms"),
    times the anchor value for a relative goal (">= 1.2x raw single"); None without a goal."""
    if figure.get("goal_met") is None:
        return None
    m = _GOAL_NUMBER.search(str(figure.get("goal") or ""))
    if m is None:
        return None if figure.get("anchor_value") is None else float(figure["anchor_value"])
    number = float(m.group(1).replace(",", ""))
    if m.group(2):  # relative to the anchor
        return None if figure.get("anchor_value") is None else number * float(figure["anchor_value"])
    return number


def section_source(data: dict[str, Any], section: str) -> str:
    """Which run a section's figures come from: "section S, measured DATE" (the merged run
    that last measured it, else the file's own run), so two tables never seem to disagree."""
    when = data.get("date")
    for run in data.get("merged_runs", []):
        if section in run.get("params", {}).get("sections", []):
            when = run.get("started_utc", when)
    return f"section `{section}`, measured {when}"


def fmt_ratio(figure: dict[str, Any]) -> str:
    """The ratio to the anchor ("1.84x"), with a third decimal where two would round a figure
    judged by a goal onto 1.00x."""
    ratio = figure.get("ratio")
    if ratio is None:
        return ""
    text = f"{ratio:.2f}x"
    if figure.get("goal_met") is not None and text == "1.00x" and ratio != 1.0:
        text = f"{ratio:.3f}x"
    return text


def format_table(figures: Sequence[dict[str, Any]]) -> str:
    """A plain-text table: section, figure, value, unit, anchor, ratio, goal, met."""
    head = ("section", "figure", "value", "unit", "anchor", "ratio", "goal", "met")
    rows = [head]
    for f in figures:
        anchor = f.get("anchor") or ""
        if f.get("anchor_value") is not None:
            anchor = f"{anchor} ({fmt(f['anchor_value'])})"
        rows.append((f["section"], f["name"], fmt_against(f["value"], goal_threshold(f)), f["unit"], anchor,
                     fmt_ratio(f) or "-", f.get("goal") or "",
                     "" if f.get("goal_met") is None else fmt(f["goal_met"])))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        info["memory_gib"] = round(kb / 1024 / 1024)
    except OSError:
        pass
    for dist in ("ray", "boto3", "botocore", "moto"):  # installed versions, without importing them
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return info


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return percentile(xs, 50) if xs else None


def git_commit() -> str | None:
    """The short commit of the checkout the bench runs from (``git rev-parse``), None outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def merge_results(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` (a results file) with the sections of ``new`` replaced by ``new``'s figures, errors,
    timings and load; other sections are kept as measured. ``merged_runs`` lists the runs merged in."""
    sections = set(new["params"].get("sections", []))
    out = dict(old)
    order = list(dict.fromkeys([f["section"] for f in old.get("figures", [])] + [f["section"] for f in new["figures"]]))
    figures = [f for f in old.get("figures", []) if f["section"] not in sections] + new["figures"]
    out["figures"] = sorted(figures, key=lambda f: order.index(f["section"]))  # stable: each section in its place
    out["errors"] = {**{k: v for k, v in old.get("errors", {}).items() if k not in sections}, **new["errors"]}
    out["section_seconds"] = {**old.get("section_seconds", {}), **new["section_seconds"]}
    out["load_average_1min_at_section_start"] = {**old.get("load_average_1min_at_section_start", {}),
                                                 **new["load_average_1min_at_section_start"]}
    out["notes"] = list(old.get("notes", [])) + [n for n in new["notes"] if n not in old.get("notes", [])]
    run = {k: new.get(k) for k in ("started_utc", "commit", "mode", "params", "machine")}
    out["merged_runs"] = [*old.get("merged_runs", []), run]
    return out


def ensure_venv(venv: str, package: str, probe_code: str, log: Callable[[str], None]) -> tuple[str | None, str | None]:
    """A peer's own virtualenv at ``venv`` with ``package`` installed (created if ``probe_code`` does not
    run there): (its python, None), or (None, why not)."""
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", probe_code]
    try:
        if os.path.exists(py) and subprocess.run(probe, capture_output=True, text=True, timeout=60).returncode == 0:
            return py, None
        log(f"creating the peer's virtualenv {venv} ({package}) ...")
        subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True, capture_output=True, timeout=300)
        pip = subprocess.run([py, "-m", "pip", "install", "-q", "--timeout", "20", "--retries", "1", package],
                             capture_output=True, text=True, timeout=900)
        if pip.returncode != 0:
            return None, f"pip install {package} failed: {pip.stderr.strip().splitlines()[-1:]}"
        check = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        if check.returncode != 0:
            return None, f"{package} installed but does not import: {check.stderr.strip()[-300:]}"
        return py, None
    except Exception as e:  # recorded in results.json
        return None, f"could not set up {venv}: {e!r:.300}"


# ----------------------------------------------------------------------------- processes
def psutil_mod() -> Any:
    """psutil: installed, or the copy Ray ships (importing ray puts it on sys.path)."""
    try:
        import psutil
    except ImportError:
        import psutil
        import ray  # noqa: F401  (adds ray/thirdparty_files to sys.path)
    return psutil


def ray_tree(exclude: Iterable[int] = ()) -> list[Any]:
    """This driver's Ray processes: ray.init() started gcs_server and raylet as our
    children, and the workers (actors) are the raylet's children. ``exclude``: pids whose
    subtrees are not Ray (the emulator, peer or demo subprocesses)."""
    psutil = psutil_mod()
    me = psutil.Process()
    skip = set(exclude)
    out = []
    for p in me.children(recursive=False):
        if p.pid in skip:
            continue
        out.append(p)
        try:
            out.extend(p.children(recursive=True))
        except psutil.Error:
            pass
    return out


def proc_title(p: Any) -> str:
    try:
        cmd = p.cmdline()
        return cmd[0] if cmd else p.name()
    except Exception:
        return ""


def ray_processes(prefix: str, exclude: Iterable[int] = ()) -> list[Any]:
    """Our Ray worker processes whose title starts with ``prefix`` (e.g. ``ray::ShardReader``)."""
    return [p for p in ray_tree(exclude) if proc_title(p).startswith(prefix)]


def cpu_snapshot(procs: Iterable[Any]) -> dict[int, tuple[float, float, str]]:
    """pid -> (create_time, user+system CPU seconds, title)."""
    snap = {}
    for p in procs:
        try:
            t = p.cpu_times()
            snap[p.pid] = (p.create_time(), t.user + t.system, proc_title(p))
        except Exception:
            pass
    return snap


def cpu_delta(before: dict[int, tuple[float, float, str]], after: dict[int, tuple[float, float, str]]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, summed per process title (``ray::ShardReader``...)."""
    out: dict[str, float] = {}
    for pid, (created, cpu, title) in after.items():
        b = before.get(pid)
        base = b[1] if b is not None and abs(b[0] - created) < 1e-3 else 0.0
        if title.startswith("ray::"):  # noqa: SIM108 (two cases, each with its example)
            key = title.split(".")[0].split(" ")[0]  # ray::ShardReader.events -> ray::ShardReader
        else:
            key = os.path.basename(title.split(" ")[0]) or "?"  # /x/.venv/bin/python -> python
        out[key] = out.get(key, 0.0) + max(0.0, cpu - base)
    return out


def uss_mib(p: Any) -> tuple[float, float] | None:
    """(USS, RSS) of a process in MiB, or None if it is gone."""
    try:
        m = p.memory_full_info()
        return m.uss / 2**20, m.rss / 2**20
    except Exception:
        return None


def pool_pids(stats: dict[str, Any]) -> tuple[dict[int, int], int | None]:
    """From ``Subscription.stats()``: {ShardReader pid: shards it holds} and the Coordinator's pid."""
    readers = {int(r["pid"]): int(r.get("shards", 0)) for r in stats.get("readers", []) if r.get("pid")}
    coordinator = (stats.get("coordinator") or {}).get("pid")
    return readers, None if coordinator is None else int(coordinator)


def uss_of_pids(pids: Iterable[int]) -> dict[int, float]:
    """pid -> USS in MiB of each process still alive."""
    psutil = psutil_mod()
    out = {}
    for pid in pids:
        try:
            m = uss_mib(psutil.Process(pid))
        except Exception:
            m = None
        if m is not None:
            out[pid] = m[0]
    return out


class UssSampler:
    """Samples the USS of processes matching a title prefix every ``period_s`` in a thread;
    keeps the peak per pid. Its own CPU time is kept (to subtract from the driver's)."""

    def __init__(self, prefix: str, exclude: Iterable[int] = (), period_s: float = 0.5) -> None:
        self.prefix, self.exclude, self.period_s = prefix, tuple(exclude), period_s
        self.peak: dict[int, float] = {}
        self.samples = 0
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="uss-sampler", daemon=True)

    def _run(self) -> None:
        t0 = time.thread_time()
        while not self._stop.wait(self.period_s):
            for p in ray_processes(self.prefix, self.exclude):
                m = uss_mib(p)
                if m is not None:
                    self.peak[p.pid] = max(self.peak.get(p.pid, 0.0), m[0])
            self.samples += 1
        self.cpu_s = time.thread_time() - t0

    def __enter__(self) -> UssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------- streams
def client(endpoint: str, service: str, **config: Any) -> Any:
    import boto3
    from botocore.config import Config

    cfg = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=32, read_timeout=60, **config)
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION, config=cfg, **CREDENTIALS)


def create_stream(endpoint: str, name: str, shards: int) -> list[dict[str, Any]]:
    """Create a stream, wait until ACTIVE; returns ListShards' shards (sorted by id)."""
    kinesis = client(endpoint, "kinesis")
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300})
    return list_shards(endpoint, name)


def list_shards(endpoint: str, name: str) -> list[dict[str, Any]]:
    kinesis = client(endpoint, "kinesis")
    shards: list[dict[str, Any]] = []
    resp = kinesis.list_shards(StreamName=name)
    while True:
        shards.extend(resp["Shards"])
        token = resp.get("NextToken")
        if not token:
            break
        resp = kinesis.list_shards(StreamName=name, NextToken=token)  # moto needs the name too
    return sorted(shards, key=lambda s: s["ShardId"])


def hash_keys(shards: Sequence[dict[str, Any]]) -> dict[str, str]:
    """shard id -> an explicit hash key that lands in that shard."""
    return {s["ShardId"]: s["HashKeyRange"]["StartingHashKey"] for s in shards}


def payload(i: int, size: int) -> bytes:
    """An ASCII payload of ``size`` bytes starting with the record's number."""
    head = f"{i:010d}|".encode()
    body = (b"abcdefghijklmnopqrstuvwxyz0123456789" * (size // 36 + 1))[: max(0, size - len(head))]
    return head + body


def prefill(endpoint: str, stream: str, shards: Sequence[dict[str, Any]], per_shard: int, size: int,
            threads: int = 2) -> tuple[int, int, float]:
    """Put ``per_shard`` records of ``size`` bytes into every shard (PutRecords of 500, explicit
    hash keys); returns (records, bytes, seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    keys = hash_keys(shards)
    jobs: list[list[dict[str, Any]]] = []
    n = 0
    for ehk in keys.values():
        for start in range(0, per_shard, 500):
            chunk = []
            for _ in range(min(500, per_shard - start)):
                chunk.append({"Data": payload(n, size), "PartitionKey": f"k{n % 97}", "ExplicitHashKey": ehk})
                n += 1
            jobs.append(chunk)
    clients = [client(endpoint, "kinesis") for _ in range(threads)]

    def put(idx_chunk: tuple[int, list[dict[str, Any]]]) -> None:
        idx, chunk = idx_chunk
        k = clients[idx % threads]
        while chunk:
            resp = k.put_records(StreamName=stream, Records=chunk)
            if not resp.get("FailedRecordCount"):
                return
            chunk = [e for e, r in zip(chunk, resp["Records"]) if "ErrorCode" in r]
            time.sleep(0.05)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, enumerate(jobs)))
    return n, n * size, time.perf_counter() - t0


def steady_rate(events: Sequence[tuple[float, int]]) -> float | None:
    """Records per second between the first and the last delivery, from (time, n) events:
    (total - first delivery's n) / (t_last - t_first). The same formula for every reader."""
    if len(events) < 2:
        return None
    ev = sorted(events)
    span = ev[-1][0] - ev[0][0]
    if span <= 0:
        return None
    return (sum(n for _, n in ev) - ev[0][1]) / span


def wait_for(pred: Callable[[], Any], timeout_s: float, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            return v
        time.sleep(interval_s)
