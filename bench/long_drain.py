"""The peer_kcl_rs section's long drain: steady throughput where a steady state exists.

The issue-20 shape (4 shards x 20,000 x 1 KiB) gives each reader 8 responses of 10,000
records. Its steady rate runs from the first delivery to the last, so it counts how much
of the emulator's serving a reader had done before its first delivery (a reader that
fetches further ahead before it delivers starts its window later), not a steady state.

Here the stream holds ``tp_long_records_per_shard`` (default 100,000) x 1 KiB per shard: 10
responses per shard. Ours (default settings, the throughput section's layout) and kcl-rs
(``seeded``: matched settings, its leases pre-created, so it starts in seconds) drain it,
interleaved, ``tp_long_reps`` times each. The rate is taken over the middle half of the
records (from the delivery that passes 25 % of them to the one that passes 75 %), the same
formula for both; beside it, the cores the emulator (moto, one Python process: about 1.0
when it is the bottleneck) used in that span (bench/cputrace.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from .common import Results, create_stream, median, prefill
from .cputrace import CpuTrace

S = "peer_kcl_rs"
MB = 1e6


def middle_half(events: Sequence[tuple[float, int]], lo: float = 0.25, hi: float = 0.75) -> tuple[float, float, float] | None:
    """(records per second, t_a, t_b) between the delivery that brings the running count to
    ``lo`` of all records (t_a) and the one that brings it to ``hi`` (t_b); None if they coincide."""
    ev = sorted(events)
    total = sum(n for _, n in ev)
    acc, a, b = 0, None, None
    for t, n in ev:
        acc += n
        if a is None and acc >= lo * total:
            a = (t, acc)
        if b is None and acc >= hi * total:
            b = (t, acc)
    if a is None or b is None or b[0] <= a[0]:
        return None
    return (b[1] - a[1]) / (b[0] - a[0]), a[0], b[0]


def _measure(trace: CpuTrace, events: Sequence[tuple[float, int]]) -> dict[str, float | None]:
    mid = middle_half(events)
    if mid is None:
        return {"rate": None, "emulator_cores": None}
    rate, t_a, t_b = mid
    return {"rate": rate, "emulator_cores": trace.cores(t_a, t_b)}


def run(ctx: Any, res: Results, cw: str | None, kcl_drain: Any) -> None:
    """Prefill the long stream, drain it with ours and (if ``cw``) kcl-rs, add the figures.

    ``kcl_drain(ctx, cw, stream, expect, mode)`` is peer_kcl_rs's drain; it returns the
    kcl-rs worker's (ts, records) batches under ``events``."""
    from . import throughput

    p = ctx.params
    per_shard, reps = p["tp_long_records_per_shard"], p["tp_long_reps"]
    stream = f"bench-long-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, 4)
    n, nbytes, secs = prefill(ctx.endpoint, stream, shards, per_shard, p["tp_record_bytes"])
    ctx.log(f"  long drain: prefilled {n} records ({nbytes / MB:.0f} MB) in {secs:.1f} s")
    ours: list[dict[str, float | None]] = []
    kcl: list[dict[str, float | None]] = []
    for rep in range(reps):
        with CpuTrace(ctx.emulator_pid) as trace:
            r = throughput.product(ctx, stream, n, sample_uss=False)
        ours.append(_measure(trace, r["events"]))
        ctx.log(f"  long drain ours rep {rep + 1}: {ours[-1]['rate'] or 0:,.0f} rec/s, emulator "
                f"{ours[-1]['emulator_cores'] or 0:.2f} cores")
        if cw is None:
            continue
        try:
            with CpuTrace(ctx.emulator_pid) as trace:
                k = kcl_drain(ctx, cw, stream, n, "seeded")
        except Exception as e:
            res.note(f"{S}: long drain, kcl-rs failed: {e!r:.300}")
            continue
        kcl.append(_measure(trace, k["events"]))
        ctx.log(f"  long drain kcl-rs rep {rep + 1}: {kcl[-1]['rate'] or 0:,.0f} rec/s, emulator "
                f"{kcl[-1]['emulator_cores'] or 0:.2f} cores")
    shape = f"4 shards x {per_shard:,} x {p['tp_record_bytes']} B from TRIM_HORIZON; rate over the middle half of the records"

    def listed(runs: list[dict[str, float | None]]) -> str:
        return ", ".join(f"{x['rate'] or 0:,.0f} rec/s at {x['emulator_cores'] or 0:.2f} emulator cores" for x in runs)

    kr = median(x["rate"] for x in kcl)
    res.add(S, "long_kclrs_seeded_records_per_s", kr, "rec/s",
            note=f"kcl-rs seeded (matched settings, leases pre-created); {shape}; median of {len(kcl)}: {listed(kcl)}")
    res.add(S, "long_ours_records_per_s", median(x["rate"] for x in ours), "rec/s",
            anchor="long_kclrs_seeded_records_per_s", anchor_value=kr, goal=">= 0.95x kcl-rs",
            check=lambda v: kr is not None and v >= 0.95 * kr,
            note=f"ours, default settings; {shape}; median of {len(ours)}: {listed(ours)}")
    res.add(S, "long_emulator_cores_ours", median(x["emulator_cores"] for x in ours), "cores",
            note="the emulator's mean cores over ours' middle half (one Python process: at most about 1.0)")
    res.add(S, "long_emulator_cores_kclrs", median(x["emulator_cores"] for x in kcl), "cores",
            note="the emulator's mean cores over kcl-rs's middle half")
