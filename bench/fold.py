"""``python -m bench.fold [--as SECTION] FILE...``: fold a run kept outside ``bench/results.json`` into it as a
section, so the documentation can cite its figures from that one file.

Three kinds of file are understood:

- a results file written by ``python -m bench --out FILE`` (``bench/runs/*_lease_cost_*.json``): merged with
  :func:`bench.common.merge_results`, as ``python -m bench --merge`` would have; ``--as`` renames its one
  section (to keep an older run of a section beside the current one);
- the output of ``python -m bench.idle --shards N`` (``bench/runs/*_idle_N_*.txt``): its last JSON object with
  ``idle_cpu_ms_per_request``, as section ``idle_N``; several files make one section, their figures named
  ``idle_N_runK_...`` by the ``_K`` suffix of each file's name;
- the chaos suite's results (``bench/chaos.json``): section ``chaos``, one figure per scenario and number.

Provenance is copied, never made up: the start time, commit, date and load average the file records (the
commit from the file name ``..._<commit>[_suffix].ext`` when the file holds none); what a file does not record is
left out, and the benchmark page then says "not recorded". ``--commits`` gives a merged run that recorded no
commit the one in the name of its ``bench/runs/`` copy (same start time). Each fold is one ``merged_runs`` entry naming its
``source`` file; folding the same file again replaces that entry and its section's figures.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Any

from .common import merge_results

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
_COMMIT = re.compile(r"_([0-9a-f]{7,40})(?:_[a-z0-9]+)?\.\w+$")
_DATE = re.compile(r"^(\d{4}-\d{2}-\d{2})_")


def _figure(section: str, name: str, value: float, unit: str, note: str | None = None) -> dict[str, Any]:
    """A figure as :meth:`bench.common.Figure.to_json` writes one, without an anchor or goal; unlike it, a count
    stays an integer and a value keeps every digit the file recorded (no rounding to 4 places)."""
    value = value if isinstance(value, int) else float(value)
    return {"section": section, "name": name, "value": value, "unit": unit, "anchor": None,
            "anchor_value": None, "goal": None, "goal_met": None, "note": note, "ratio": None}


def _run(section: str, figures: list[dict[str, Any]], **provenance: Any) -> dict[str, Any]:
    """A results-shaped dict of one section, as :func:`merge_results` takes it."""
    load = provenance.pop("load_at_start", None)
    return {"started_utc": provenance.pop("started_utc", None), "commit": provenance.pop("commit", None),
            "mode": "default", "params": {"sections": [section]}, "machine": provenance.pop("machine", None),
            "section_seconds": {}, "load_average_1min_at_section_start": {} if load is None else {section: load},
            "figures": figures, "notes": [], "errors": {}, "extra": provenance}


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object printed in ``text`` (``bench.idle`` prints several between log lines)."""
    found, decoder, i = [], json.JSONDecoder(), 0
    while (i := text.find("{", i)) >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        if isinstance(obj, dict):
            found.append(obj)
        i = end
    return found


IDLE_FIGURES = (("idle_cpu_ms_per_request", "ms", "the Ray processes' CPU per idle request (GetRecords + renewals)"),
                ("idle_requests_per_s", "req/s", "GetRecords at the tip + estimated renewals"),
                ("idle_renewals_per_s_estimated", "req/s", "shards / renew_interval_s"),
                ("idle_ray_cores", "cores", "every Ray process, idle"),
                ("leases_lost", "leases", None))


def idle_run(paths: list[str]) -> dict[str, Any]:
    """``python -m bench.idle`` outputs as section ``idle_N`` (N from the file names, which must agree)."""
    shards = {m.group(1) for p in paths if (m := re.search(r"_idle_(\d+)_", os.path.basename(p)))}
    if len(shards) != 1:
        raise SystemExit(f"bench.fold: idle files of one shard count expected, got {paths}")
    section = f"idle_{shards.pop()}"
    figures = []
    for path in paths:
        with open(path) as fh:
            out = [o for o in _json_objects(fh.read()) if "idle_cpu_ms_per_request" in o]
        if not out:
            raise SystemExit(f"bench.fold: {path} holds no idle_cpu_ms_per_request")
        k = re.search(r"_(\d+)\.txt$", path)
        prefix = f"{section}_run{k.group(1)}" if k and len(paths) > 1 else section
        figures += [_figure(section, f"{prefix}_{key.removeprefix('idle_')}", out[-1][key], unit, note)
                    for key, unit, note in IDLE_FIGURES if out[-1].get(key) is not None]
        get_records = out[-1].get("idle", {}).get("req_per_s", {}).get("GetRecords")
        if get_records is not None:
            figures.append(_figure(section, f"{prefix}_get_records_per_s", get_records, "req/s"))
    return _run(section, figures, **_from_name(paths[0]))


CHAOS_NUMBERS = (("published", "records"), ("deliveries", "records"), ("lost", "records"),
                 ("duplicated", "records"), ("duplicate_rate", "ratio"), ("recovery_s", "s"))


def chaos_run(data: dict[str, Any]) -> dict[str, Any]:
    """The chaos suite's results (``bench/chaos.json``, parsed) as section ``chaos``: ``chaos_<scenario>_<number>``
    for each scenario's published, lost, duplicated, gaps, recovery and every number of its ``figures``; raises
    ``KeyError`` without ``session_s`` (the suite's wall time)."""
    figures = []
    for scenario, v in sorted(data.get("scenarios", {}).items()):
        pre = f"chaos_{scenario}"
        figures += [_figure("chaos", f"{pre}_{k}", v[k], unit) for k, unit in CHAOS_NUMBERS if v.get(k) is not None]
        figures.append(_figure("chaos", f"{pre}_gaps", len(v.get("gaps", [])), "gaps"))
        for k, x in sorted(v.get("figures", {}).items()):
            if isinstance(x, int | float) and not isinstance(x, bool):
                figures.append(_figure("chaos", f"{pre}_{k}", x, "s" if k.endswith("_s") else "count"))
    figures.append(_figure("chaos", "chaos_session_s", data["session_s"], "s", data.get("command")))
    commit = re.search(r"\bat ([0-9a-f]{7,40})\b", data.get("command", ""))
    return _run("chaos", figures, commit=commit.group(1) if commit else None, date=data.get("date"),
                machine=data.get("machine"), load_at_end=data.get("load_average_1min_at_end"))


def _from_name(path: str) -> dict[str, Any]:
    name = os.path.basename(path)
    commit, date = _COMMIT.search(name), _DATE.search(name)
    return {"commit": commit.group(1) if commit else None, "date": date.group(1) if date else None}


def results_run(path: str, rename: str | None) -> dict[str, Any]:
    """A ``python -m bench --out`` file; ``rename`` moves its one section to another name."""
    with open(path) as fh:
        run = json.load(fh)
    sections = run["params"].get("sections", [])
    run["commit"] = run.get("commit") or _from_name(path)["commit"]
    run["extra"] = {"date": run.get("date")}
    if rename:
        if len(sections) != 1:
            raise SystemExit(f"bench.fold: --as renames one section; {path} has {sections}")
        old = sections[0]
        run["params"] = {**run["params"], "sections": [rename]}
        run["figures"] = [{**f, "section": rename} for f in run["figures"] if f["section"] == old]
        for key in ("section_seconds", "load_average_1min_at_section_start", "errors"):
            run[key] = {rename if k == old else k: v for k, v in run.get(key, {}).items()}
    return run


def load_run(paths: list[str], rename: str | None = None) -> dict[str, Any]:
    """The run in ``paths``: ``bench.idle`` outputs (``.txt``, one shard count), else one chaos or results JSON file
    (``rename``: the section name to give a results file's one section). Raises ``SystemExit`` for a file this
    module does not understand."""
    if paths[0].endswith(".txt"):
        return idle_run(paths)
    with open(paths[0]) as fh:
        data = json.load(fh)
    if "scenarios" in data:
        return chaos_run(data)
    if "figures" not in data or "params" not in data:
        raise SystemExit(f"bench.fold: {paths[0]} is neither a results file nor the chaos suite's")
    return results_run(paths[0], rename)


def fill_commits(data: dict[str, Any]) -> list[str]:
    """Give each ``merged_runs`` entry without a ``commit`` the one in the name of the ``bench/runs/*.json`` copy of
    the same run (same ``started_utc``; ``..._<commit>[_suffix].json``), noting that file as ``commit_from``.
    Returns the start times filled."""
    copies = {}
    for path in sorted(glob.glob(os.path.join(HERE, "runs", "*.json"))):
        with open(path) as fh:
            run = json.load(fh)
        commit = run.get("commit") or _from_name(path)["commit"]
        if run.get("started_utc") and commit:
            copies[run["started_utc"]] = (commit, os.path.relpath(path, ROOT))
    filled = []
    for run in data.get("merged_runs", []):
        if not run.get("commit") and run.get("started_utc") in copies:
            run["commit"], run["commit_from"] = copies[run["started_utc"]]
            filled.append(run["started_utc"])
    return filled


def fold(base: dict[str, Any], run: dict[str, Any], source: str) -> dict[str, Any]:
    """``base`` with ``run`` merged in (its sections replaced) and the merged entry naming ``source``."""
    kept = [r for r in base.get("merged_runs", []) if r.get("source") != source]
    out = merge_results({**base, "merged_runs": kept}, run)
    out["merged_runs"][-1].update({k: v for k, v in run.get("extra", {}).items() if v is not None}, source=source)
    return out


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fold", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="one results/chaos JSON, or bench.idle outputs of one shard count")
    ap.add_argument("--commits", action="store_true",
                    help="only fill the commit of merged runs that lack one from their bench/runs/ copy")
    ap.add_argument("--as", dest="rename", help="the section name to give a results file's one section")
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"), help="the results file [bench/results.json]")
    a = ap.parse_args(argv)
    if a.commits:
        with open(a.out) as fh:
            data = json.load(fh)
        print(f"{a.out}: commits filled for the runs started {', '.join(fill_commits(data)) or '(none)'}")
        _write(a.out, data)
        return 0
    if not a.files:
        ap.error("name the files to fold (or --commits)")
    if not a.files[0].endswith(".txt") and len(a.files) != 1:
        ap.error("one JSON file per fold")
    run = load_run(a.files, a.rename)
    with open(a.out) as fh:
        base = json.load(fh)
    source = ",".join(os.path.relpath(os.path.abspath(p), ROOT) for p in a.files)
    _write(a.out, fold(base, run, source))
    print(f"{a.out}: section {', '.join(run['params']['sections'])} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
