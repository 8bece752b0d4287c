"""``python -m bench.start``: start -> first record, ours beside kcl-rs seeded, in one run (issue 20, part 4).

One embedded emulator, one Ray session (already running when ours is timed, as in the
``peer_kcl_rs`` section), one stream of 4 shards x ``--records`` x 1 KiB from TRIM_HORIZON.
Rounds alternate: ours (``throughput.product``: a DynamoLeaseStore on the emulator, the
``subscribe()`` call -> the sink's first batch; a new Coordinator and new readers each round)
then kcl-rs seeded (``peer_kcl_rs._kcl_drain``: matched settings on a lease table seeded with
unowned rows; its worker's ``start`` line -> its first record). Printed per round and as
medians: start -> first record and the ratio ours / kcl-rs; ours' CPU seconds by process title
(readers, Coordinator, ...) up to ``subscribe()`` returning, and the whole drain.

``--without-rfc3987-syntax``: ours' Ray processes start as if rfc3987_syntax were not
installed (see ``bench/idle.py``); kcl-rs is unaffected (no Python imports of note).
Needs kcl-rs's virtualenv (``--kclrs-venv``, created by ``python -m bench`` when missing).
"""

from __future__ import annotations

import os

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")):
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import json  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

from .common import create_stream, median, prefill  # noqa: E402
from .idle import block_rfc3987_syntax, write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class _Ctx:
    """The few fields of ``bench.run.Ctx`` that ``throughput.product`` and ``_kcl_drain`` read."""

    def __init__(self, endpoint: str, emulator_pid: int, kclrs_python: str | None, timeout_s: float) -> None:
        self.endpoint, self.emulator_pid, self.kclrs_python, self.timeout_s = endpoint, emulator_pid, kclrs_python, timeout_s
        self.params: dict[str, Any] = {}

    def log(self, msg: str) -> None:
        print(msg, flush=True)


def _ours(ctx: _Ctx, stream: str, expect: int) -> dict[str, Any]:
    from . import throughput

    r = throughput.product(ctx, stream, expect, sample_uss=False)
    first = min(t for t, _ in r["events"]) - r["t0"] if r["events"] else None
    return {"first_s": first, "subscribe_s": r["t_sub"] - r["t0"], "cpu_by_process": r["cpu_by_process"],
            "cpu_s": r["cpu_s"], "cpu_after_start_s": r["cpu_after_start_s"], "readers": len(r["readers"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--records", type=int, default=2000, help="records per shard [2000]")
    ap.add_argument("--kclrs-venv", default=os.path.join(HERE, ".venv-kclrs"))
    ap.add_argument("--no-kclrs", action="store_true", help="ours only")
    ap.add_argument("--without-rfc3987-syntax", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args(argv)
    if a.without_rfc3987_syntax:
        block_rfc3987_syntax()
    import ray

    from kinesis_actors.emulator import Emulator

    from .peer_kcl_rs import _CloudWatchSink, _kcl_drain

    kclrs_python = None if a.no_kclrs else os.path.join(a.kclrs_venv, "bin", "python")
    if kclrs_python and not os.path.exists(kclrs_python):
        raise SystemExit(f"no kcl-rs virtualenv at {a.kclrs_venv} (python -m bench creates it; or --no-kclrs)")
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    emu = Emulator().start()
    out: dict[str, Any] = {"ours": [], "kclrs_seeded": []}
    try:
        ctx = _Ctx(emu.endpoint, emu.pid, kclrs_python, 300.0)
        stream = f"start-{uuid.uuid4().hex[:6]}"
        shards = create_stream(emu.endpoint, stream, 4)
        expect, _nbytes, _ = prefill(emu.endpoint, stream, shards, a.records, 1024)
        with _CloudWatchSink() as cw:
            for i in range(a.rounds):
                r = _ours(ctx, stream, expect)
                out["ours"].append(r)
                ctx.log(f"round {i}: ours first record {r['first_s']:.2f} s (subscribe() {r['subscribe_s']:.2f} s, "
                        f"{r['readers']} readers); CPU s by process: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["cpu_by_process"].items(), key=lambda kv: -kv[1])
                                    if v >= 0.01))
                if kclrs_python:
                    k = _kcl_drain(ctx, cw.endpoint, stream, expect, "seeded")
                    out["kclrs_seeded"].append(k)
                    ctx.log(f"round {i}: kcl-rs seeded first record {k['first_s']:.2f} s, CPU {k['cpu_s']:.2f} s")
    finally:
        emu.stop()
        ray.shutdown()
    ours = median(r["first_s"] for r in out["ours"])
    kcl = median(r["first_s"] for r in out["kclrs_seeded"]) if out["kclrs_seeded"] else None
    out["ours_first_s_median"], out["kclrs_seeded_first_s_median"] = ours, kcl
    out["ratio"] = ours / kcl if ours and kcl else None
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, list)}, indent=1), flush=True)
    write_json(a.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
