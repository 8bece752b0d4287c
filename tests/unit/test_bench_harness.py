"""Pure helpers of the benchmark harness: figures, rates, percentiles, the demo-output parser."""

from __future__ import annotations

import json
import os

from bench.common import Results, percentile, pool_pids, steady_rate
from bench.cputrace import CpuTrace, window_cores
from bench.demo import parse
from bench.long_drain import middle_half
from bench.report import markdown


def test_percentile_and_steady_rate() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 99) == 9.9
    # 100 records in 4 deliveries over 2 s: the first delivery's records are not counted
    assert steady_rate([(10.0, 25), (11.0, 25), (11.5, 25), (12.0, 25)]) == 37.5
    assert steady_rate([(1.0, 5)]) is None


def test_middle_half_rate_and_the_emulator_cores_inside_it() -> None:
    # 8 deliveries of 10: the count passes 20 (25 %) at t=1 and 60 (75 %) at t=5 -> 40 records in 4 s
    events = [(float(t), 10) for t in range(8)][::-1]
    assert middle_half(events) == (10.0, 1.0, 5.0)
    assert middle_half([(1.0, 10)]) is None  # one delivery: no span
    trace = CpuTrace(os.getpid())  # not started: samples set by hand
    trace.samples = [(0.0, 0.0), (1.0, 0.5), (3.0, 2.5)]  # half a core, then a whole one
    assert trace.cpu_at(2.0) == 1.5 and trace.cpu_at(3.5) is None
    assert trace.cores(0.0, 1.0) == 0.5 and trace.cores(1.0, 3.0) == 1.0 and trace.cores(2.0, 1.0) is None
    assert window_cores(trace, [(1.0, 5), (3.0, 5)]) == 1.0 and window_cores(trace, [(1.0, 5)]) is None


def test_results_json_has_value_anchor_ratio(tmp_path) -> None:
    res = Results("quick", {"x": 1})
    res.add("s", "fast", 12.0, "rec/s", anchor="raw", anchor_value=10.0, goal=">= 1.2x", check=lambda v: v >= 12.0)
    res.add("s", "missing", None, "s", note="not run")
    path = tmp_path / "r.json"
    res.write(str(path))
    data = json.loads(path.read_text())
    first, second = data["figures"]
    assert first["ratio"] == 1.2 and first["goal_met"] is True and first["anchor"] == "raw"
    assert second["value"] is None and second["ratio"] is None and second["goal_met"] is None
    assert "fast" in res.table() and "| s | fast | 12.0 |" in markdown(data)


def test_demo_output_parser() -> None:
    stderr = "\n".join([
        "[   0.1 s] starting the embedded emulator ...",
        "[   2.0 s] created stream flights (4 shards) in the embedded emulator",
        "[   5.5 s] Ray is up",
        "[   9.0 s] every shard has an owner; publishing",
        "[  20.0 s] all 27004 events delivered",
        "[  21.0 s] closing the subscriptions (checkpoint, release)",
        "[  22.5 s] closed",
    ])
    stdout = ("  publish  27004 events, 10.26 MB in 8.10 s: 3334 events/s, 1.27 MB/s\n"
              "  consume  27004 records, 10.26 MB in 11.00 s (first put to last new event): 2455 events/s\n")
    p = parse(stdout, stderr)
    assert p["at_emulator"] == 0.1 and p["at_stream"] == 2.0 and p["at_ray"] == 5.5 and p["at_owners"] == 9.0
    assert p["at_delivered"] == 20.0 and p["at_closing"] == 21.0 and p["at_closed"] == 22.5
    assert p["events"] == 27004 and p["publish_s"] == 8.1 and p["consume_s"] == 11.0


def test_pool_pids_from_stats() -> None:
    stats = {"readers": [{"reader": 1, "pid": 11, "shards": 3}, {"reader": 2, "pid": 12, "shards": 0}],
             "coordinator": {"pid": 10, "node_id": "n"}}
    assert pool_pids(stats) == ({11: 3, 12: 0}, 10)
    assert pool_pids({"readers": []}) == ({}, None)


def test_scale_meter_delta_rates() -> None:
    from bench.scale import _Meter

    a = {"t": 100.0, "requests": {"GetRecords": 10, "UpdateItem": 5}, "emu_cpu": 1.0, "busy": 50.0}
    b = {"t": 110.0, "requests": {"GetRecords": 110, "UpdateItem": 5, "Scan": 4}, "emu_cpu": 6.0, "busy": 60.0}
    d = _Meter.delta(a, b)
    assert d["wall_s"] == 10.0 and d["by_op"] == {"GetRecords": 10.0, "Scan": 0.4}  # ops that did not move are left out
    assert abs(d["total"] - 10.4) < 1e-9 and d["emu_share"] == 0.5 and d["cores_busy"] == 1.0
    assert d["ours_share"] == 0 and d["rest_share"] == 0.5
    # our processes by title: a reader that existed before, one that started in the window
    a["ours"] = {7: (1.0, 2.0, "ray::ShardReader")}
    b["ours"] = {7: (1.0, 3.0, "ray::ShardReader"), 8: (105.0, 1.0, "ray::ShardReader"), 9: (1.0, 0.0, "raylet")}
    d = _Meter.delta(a, b)
    assert d["ours"] == {"ray::ShardReader": 0.2, "raylet": 0.0} and abs(d["rest_share"] - 0.3) < 1e-9
