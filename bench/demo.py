"""Section ``demo`` (issue 9, item 5): ``kinesis-actors demo`` on January (and the full year
with ``--full-year``), its wall time split from the demo's own output.

The demo runs as a subprocess with its own embedded emulator and its own Ray runtime
(``--ray-address local``), after the benchmark has stopped its own, so nothing else
competes for the 2 cores. The split comes from the demo's stderr step lines
(``[  t s] message``, seconds since the run started) and its stdout throughput lines
(``publish  N events, X MB in T s``; ``consume ... in T s (first put to last new event)``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

from .common import Results

_STEP = re.compile(r"^\[\s*([0-9.]+) s\] (.*)$")
_PUBLISH = re.compile(r"publish\s+(\d+) events, ([0-9.]+) MB in ([0-9.]+) s")
_CONSUME = re.compile(r"consume\s+(\d+) records, ([0-9.]+) MB in ([0-9.]+) s")

_MARKS = {
    "emulator": "starting the embedded emulator",
    "stream": "created stream",
    "ray": "Ray is up",
    "owners": "every shard has an owner",
    "delivered": "events delivered",
    "closing": "closing the subscriptions",
    "closed": "closed",
}


def _command() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "kinesis-actors")
    if os.path.exists(exe):
        return [exe]
    found = shutil.which("kinesis-actors")
    return [found] if found else [sys.executable, "-c", "from kinesis_actors.cli import main; main()"]


def parse(stdout: str, stderr: str) -> dict[str, float]:
    """Step times (seconds since the demo's start) and the publish/consume durations."""
    marks: dict[str, float] = {}
    for line in stderr.splitlines():
        m = _STEP.match(line.strip())
        if not m:
            continue
        t, msg = float(m.group(1)), m.group(2)
        for key, text in _MARKS.items():
            if key not in marks and ((msg.strip() == text) if key == "closed" else (text in msg)):
                marks[key] = t
    out: dict[str, float] = {f"at_{k}": v for k, v in marks.items()}
    m = _PUBLISH.search(stdout)
    if m:
        out.update(events=float(m.group(1)), mb=float(m.group(2)), publish_s=float(m.group(3)))
    m = _CONSUME.search(stdout)
    if m:
        out.update(consume_s=float(m.group(3)))
    return out


def _one(ctx: Any, res: Results, label: str, args: list[str]) -> None:
    cmd = _command()
    helptext = subprocess.run([*cmd, "demo", "--help"], capture_output=True, text=True, timeout=120).stdout
    extra = ["--no-progress"]
    if "--ray-address" in helptext:
        extra += ["--ray-address", "local"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, "demo", *extra, *args], capture_output=True, text=True, env=env,
                          timeout=ctx.params["demo_timeout_s"])
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"kinesis-actors demo {' '.join(args)} exited {proc.returncode}: {tail[:300]}")
    p = parse(proc.stdout, proc.stderr)
    ctx.log(f"  demo {label}: wall {wall:.1f} s, {p}")
    sec = "demo"

    def span(a: str, b: str) -> float | None:
        return p[f"at_{b}"] - p[f"at_{a}"] if f"at_{a}" in p and f"at_{b}" in p else None

    n = p.get("events")
    res.add(sec, f"{label}_wall_s", wall, "s", note=f"kinesis-actors demo {' '.join(args)} ({int(n) if n else '?'} events, "
            f"{p.get('mb', 0):.1f} MB, 4 shards, 2 instances): exit 0, every event delivered")
    res.add(sec, f"{label}_emulator_start_s", span("emulator", "stream"), "s", note="emulator child process + CreateStream")
    res.add(sec, f"{label}_ray_start_s", span("stream", "ray"), "s", note="ray.init (flights loaded meanwhile)")
    res.add(sec, f"{label}_subscribe_s", span("ray", "owners"), "s", note="2 instances subscribed, every shard owned")
    res.add(sec, f"{label}_publish_s", p.get("publish_s"), "s")
    if n and p.get("publish_s"):
        res.add(sec, f"{label}_publish_events_per_s", n / p["publish_s"], "events/s")
    res.add(sec, f"{label}_consume_s", p.get("consume_s"), "s", anchor=f"{label}_publish_s", anchor_value=p.get("publish_s"),
            note="first put -> last new event delivered (overlaps publishing)")
    if p.get("consume_s") is not None and p.get("publish_s") is not None:
        res.add(sec, f"{label}_drain_after_publish_s", p["consume_s"] - p["publish_s"], "s")
    res.add(sec, f"{label}_close_s", span("closing", "closed"), "s", note="close subscriptions (checkpoint, release)")
    known = sum(v for v in (span("emulator", "stream"), span("stream", "ray"), span("ray", "owners"), p.get("consume_s"),
                            span("closing", "closed")) if v is not None)
    res.add(sec, f"{label}_other_s", wall - known, "s", note="interpreter start, imports, reading the flights, report, exit")


def run(ctx: Any, res: Results) -> None:
    _one(ctx, res, "january" if not ctx.quick else "day", ctx.params["demo_args"])
    if ctx.full_year:
        _one(ctx, res, "full_year", ["--full", "--timeout", "300"])
