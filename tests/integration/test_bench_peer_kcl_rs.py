"""The bench section ``peer_kcl_rs`` runs on a tiny input (``--quick``) and writes its figures (no timing
assertions). Skipped, with the reason, when kcl-rs (PyPI ``kcl-rs``, its own virtualenv) cannot be installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import ensure_venv
from bench.peer_kcl_rs import KCLRS_PACKAGE

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / "bench" / ".venv-kclrs"


@pytest.fixture(scope="module")
def kclrs_venv() -> Path:
    py, error = ensure_venv(str(VENV), KCLRS_PACKAGE, "import kcl_rs", lambda msg: print(msg, file=sys.stderr))
    if py is None:
        pytest.skip(f"kcl-rs cannot be installed here ({KCLRS_PACKAGE}, no network or no wheel): {error}")
    return VENV


@pytest.mark.slow
@pytest.mark.bench_harness
@pytest.mark.timeout(600)
def test_bench_peer_kcl_rs_quick(kclrs_venv: Path, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "peer_kcl_rs", "--kclrs-venv", str(kclrs_venv),
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.exists(), proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["errors"] == {}, data["errors"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [n for n in data["notes"] if "failed" in n or "not run" in n], data["notes"]
    figs = {f["name"]: f for f in data["figures"] if f["section"] == "peer_kcl_rs"}
    for name in ("kclrs_seeded_start_to_first_record_s", "kclrs_seeded_records_per_s", "kclrs_seeded_cpu_s_per_mb",
                 "kclrs_uss_per_shard_4_mib", "ours_start_to_first_record_s", "ours_uss_per_shard_4_mib",
                 "raw_start_to_first_record_s", "raw_uss_per_shard_4_mib", "long_ours_records_per_s",
                 "long_kclrs_seeded_records_per_s"):
        assert name in figs, sorted(figs)
        assert isinstance(figs[name]["value"], (int, float)) and figs[name]["value"] > 0, figs[name]
    # a tiny window may fall between two of the emulator's 10 ms CPU ticks: present, maybe 0
    assert {"emulator_cores_in_window_ours", "emulator_cores_in_window_kclrs_seeded", "long_emulator_cores_ours"} <= set(figs)
    assert figs["ours_start_to_first_record_s"]["anchor"] == "kclrs_seeded_start_to_first_record_s"
    assert "ours_start_to_first_record_s" in proc.stdout  # the printed table


def test_merge_results_replaces_only_the_sections_run() -> None:
    from bench.common import merge_results

    def fig(section: str, name: str, value: float) -> dict:
        return {"section": section, "name": name, "value": value}

    old = {"figures": [fig("throughput", "a", 1), fig("latency", "b", 2)], "errors": {"throughput": "x"}, "notes": ["n"],
           "section_seconds": {"throughput": 1, "latency": 2}, "load_average_1min_at_section_start": {"latency": 9}}
    new = {"figures": [fig("peer_kcl_rs", "c", 3), fig("throughput", "a", 4)], "errors": {}, "notes": ["n", "m"],
           "section_seconds": {"throughput": 5, "peer_kcl_rs": 6}, "load_average_1min_at_section_start": {"throughput": 1},
           "params": {"sections": ["throughput", "peer_kcl_rs"]}, "started_utc": "t", "mode": "default", "machine": {}}
    out = merge_results(old, new)
    assert [(f["section"], f["value"]) for f in out["figures"]] == [("throughput", 4), ("latency", 2), ("peer_kcl_rs", 3)]
    assert out["errors"] == {} and out["notes"] == ["n", "m"]
    assert out["section_seconds"] == {"throughput": 5, "latency": 2, "peer_kcl_rs": 6}
    assert out["merged_runs"][0]["started_utc"] == "t"
