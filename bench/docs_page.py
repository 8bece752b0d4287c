"""``python -m bench.report --docs``: the site's benchmark page (``docs/benchmarks.md``) and its SVG charts
(``docs/assets/bench/*.svg``), generated from ``bench/results.json`` and ``bench/chaos.json``.

Nothing on that page is typed by hand: every figure is read from the JSON, and every chart is drawn
again by matplotlib (Agg backend, SVG, fixed hash salt and no date, so the same JSON gives the same
bytes). A chart whose figures the JSON lacks is left out, and the page says which.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .common import fmt

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
DOCS = os.path.join(ROOT, "docs")
ASSETS = os.path.join(DOCS, "assets", "bench")

OURS, KCLRS, RAW = "#2f6fd0", "#c77d00", "#7a7a7a"


def figures(data: dict[str, Any]) -> dict[str, float]:
    """Every figure of a results file by name (the last one of a name wins, as the merge keeps it)."""
    return {f["name"]: f["value"] for f in data.get("figures", []) if f.get("value") is not None}


def section_runs(data: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each section's provenance, from the run that last measured it (the file's own run, else the last
    ``merged_runs`` entry naming it): ``started`` (UTC), ``date``, ``commit``, ``load`` (the 1-min load
    average, at the section's start or, for a run that recorded only that, at its end) and ``source`` (the
    file ``python -m bench.fold`` folded it from, else ``bench/results.json``). What the run did not record
    reads "not recorded"."""
    runs: dict[str, dict[str, Any]] = {s: {"started_utc": data.get("started_utc"), "date": data.get("date")}
                                       for s in data.get("params", {}).get("sections", [])}
    for run in data.get("merged_runs", []):
        for s in run.get("params", {}).get("sections", []):
            runs[s] = run
    load = data.get("load_average_1min_at_section_start", {})
    out = {}
    for section in dict.fromkeys(f["section"] for f in data.get("figures", [])):
        run = runs.get(section, {"started_utc": data.get("started_utc"), "date": data.get("date")})
        started = run.get("started_utc")
        at = (f"{load[section]:g} at its start" if section in load else
              f"{run['load_at_end']:g} at its end" if run.get("load_at_end") is not None else "not recorded")
        out[section] = {"started": started or "not recorded",
                        "date": run.get("date") or (started or "")[:10] or "not recorded",
                        "commit": run.get("commit") or "not recorded",
                        "load": at, "source": run.get("source") or "bench/results.json"}
    return out


def provenance(data: dict[str, Any]) -> list[str]:
    """One row per section: the run that last measured it, its commit, the load, the file it was folded from."""
    rows = ["| section | measured (UTC) | commit | load average (1 min) | in `bench/results.json` from (`python -m bench.fold` "
            "copies a kept run in) |", "|---|---|---|---|---|"]
    for section, run in section_runs(data).items():
        started = run["started"] if run["started"] != "not recorded" else f"{run['date']} (time not recorded)"
        rows.append(f"| {section} | {started} | {run['commit']} | {run['load']} | `{run['source']}` |")
    return rows


def show(value: Any) -> str:
    """A figure as the docs print it: :func:`fmt` for a measured float, thousands separated for a count."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else fmt(value)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "kinesis-actors", "svg.fonttype": "none", "font.size": 10,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _save(fig: Any, name: str) -> str:
    os.makedirs(ASSETS, exist_ok=True)
    fig.tight_layout()
    fig.savefig(os.path.join(ASSETS, name), format="svg", metadata={"Date": None})
    _plt().close(fig)
    return f"assets/bench/{name}"


def _bars(ax: Any, labels: list[str], values: list[float], colors: list[str], unit: str) -> None:
    bars = ax.barh(labels, values, color=colors)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    for bar, v in zip(bars, values, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {fmt(v)}", va="center")
    ax.set_xlim(0, max(values) * 1.25)


def _need(fig_: dict[str, float], *names: str) -> list[float] | None:
    return [fig_[n] for n in names] if all(n in fig_ for n in names) else None


Chart = tuple[str, str, Callable[[dict[str, float]], str | None]]  # title, alt text, draw -> path or None


def chart_cpu(f: dict[str, float]) -> str | None:
    v = _need(f, "ours_cpu_s_per_mb_after_start", "ours_cpu_s_per_mb_whole_run", "kclrs_matched_cpu_s_per_mb",
              "kclrs_seeded_cpu_s_per_mb", "raw_cpu_s_per_mb")
    if v is None:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 2.8))
    _bars(ax, ["ours, from subscribe() returning", "ours, whole run (Ray start included)", "kcl-rs matched",
               "kcl-rs seeded", "raw boto3 drain"], v, [OURS, OURS, KCLRS, KCLRS, RAW], "client CPU s per MB (less is better)")
    return _save(fig, "cpu_per_mb.svg")


def chart_throughput(f: dict[str, float]) -> str | None:
    v = _need(f, "ours_records_per_s", "kclrs_matched_records_per_s", "kclrs_seeded_records_per_s", "raw_records_per_s")
    if v is None:
        return None
    labels = ["ours, 8 responses", "kcl-rs matched, 8 responses", "kcl-rs seeded, 8 responses", "raw boto3"]
    colors = [OURS, KCLRS, KCLRS, RAW]
    long = _need(f, "long_ours_records_per_s", "long_kclrs_seeded_records_per_s")
    if long:
        labels += ["ours, long drain", "kcl-rs seeded, long drain"]
        v += long
        colors += [OURS, KCLRS]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.0))
    _bars(ax, labels, v, colors, "records per second (more is better)")
    return _save(fig, "throughput.svg")


FAILOVER = (("start -> first record", "ours_start_to_first_record_s", "kclrs_seeded_start_to_first_record_s"),
            ("SIGKILL a worker -> survivor reads", "ours_sigkill_to_survivor_first_record_s",
             "kclrs_sigkill_to_survivor_first_record_s"),
            ("graceful stop -> other reads", "ours_graceful_to_other_reading_s", "kclrs_graceful_to_other_reading_s"),
            ("second worker joins -> even split", "ours_balance_to_even_s", "kclrs_balance_to_even_s"))


def chart_failover(f: dict[str, float]) -> str | None:
    rows = [(label, f[a], f[b]) for label, a, b in FAILOVER if a in f and b in f]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.0))
    ys = range(len(rows))
    ax.barh([y - 0.2 for y in ys], [r[1] for r in rows], height=0.4, color=OURS, label="kinesis_actors")
    ax.barh([y + 0.2 for y in ys], [r[2] for r in rows], height=0.4, color=KCLRS, label="kcl-rs")
    for y, (_, ours, theirs) in zip(ys, rows, strict=True):
        ax.text(ours, y - 0.2, f" {fmt(ours)}", va="center")
        ax.text(theirs, y + 0.2, f" {fmt(theirs)}", va="center")
    ax.set_yticks(list(ys), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (less is better)")
    ax.set_xlim(0, max(max(r[1], r[2]) for r in rows) * 1.2)
    ax.legend(loc="upper right", frameon=False)
    return _save(fig, "failover.svg")


def chart_scale(f: dict[str, float]) -> str | None:
    sizes = [n for n in (16, 64, 256, 1000) if f"scale_{n}_subscribe_s" in f and f"scale_{n}_uss_total_mib" in f]
    if len(sizes) < 2:
        return None
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.0))
    a1.plot(sizes, [f[f"scale_{n}_subscribe_s"] for n in sizes], "o-", color=OURS, label="subscribe() returns")
    done = [n for n in sizes if f"scale_{n}_all_delivered_s" in f]
    a1.plot(done, [f[f"scale_{n}_all_delivered_s"] for n in done], "s--", color=OURS, alpha=0.6,
            label="every record delivered")
    a1.set(xscale="log", xlabel="shards", ylabel="seconds", title="time to subscribe")
    a1.legend(frameon=False)
    a2.plot(sizes, [f[f"scale_{n}_uss_total_mib"] for n in sizes], "o-", color=OURS)
    a2.set(xscale="log", xlabel="shards", ylabel="MiB USS (readers + Coordinator)", title="memory")
    for ax in (a1, a2):
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_ylim(bottom=0)
    return _save(fig, "scale.svg")


def chart_delivery(f: dict[str, float]) -> str | None:
    factors = [n for n in (1, 4, 10) if f"slow_sink_pf{n}_records_per_s" in f]
    if not factors:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 2.4))
    _bars(ax, [f"parallelization_factor={n}" for n in factors], [f[f"slow_sink_pf{n}_records_per_s"] for n in factors],
          [OURS] * len(factors), "records per second into a sink taking 50 ms per batch (more is better)")
    return _save(fig, "delivery.svg")


CHARTS: list[Chart] = [
    ("Client CPU per MB: ours, kcl-rs and raw boto3", "CPU seconds per MB, ours against kcl-rs and raw boto3", chart_cpu),
    ("Steady throughput: ours, kcl-rs and raw boto3", "records per second, ours against kcl-rs and raw boto3",
     chart_throughput),
    ("Start, failover and handoff times against kcl-rs", "seconds to first record, failover and handoff",
     chart_failover),
    ("Subscribe time and memory against the number of shards", "subscribe time and memory by shard count",
     chart_scale),
    ("The delivery controls' rates", "records per second by parallelization factor", chart_delivery),
]


def readme_figures(data: dict[str, Any]) -> list[str]:
    """The README's three figures against kcl-rs, as the README prints them (a test compares the two)."""
    f = figures(data)
    out = []
    if _need(f, "ours_graceful_to_other_reading_s", "kclrs_graceful_to_other_reading_s"):
        out.append(f"- **Handoff**: a worker stops gracefully and another reads its shards after "
                   f"{fmt(f['ours_graceful_to_other_reading_s'])} s, against {fmt(f['kclrs_graceful_to_other_reading_s'])} s "
                   f"for kcl-rs.")
    if _need(f, "ours_sigkill_to_survivor_first_record_s", "kclrs_sigkill_to_survivor_first_record_s"):
        out.append(f"- **Failover**: a worker is SIGKILLed and the survivor reads its shards after "
                   f"{fmt(f['ours_sigkill_to_survivor_first_record_s'])} s, against "
                   f"{fmt(f['kclrs_sigkill_to_survivor_first_record_s'])} s for kcl-rs (same 10 s lease).")
    if _need(f, "ours_cpu_s_per_mb_after_start", "ours_cpu_s_per_mb_whole_run", "kclrs_matched_cpu_s_per_mb"):
        out.append(f"- **CPU**: {fmt(f['ours_cpu_s_per_mb_after_start'])} CPU s per MB read once subscribed, "
                   f"against {fmt(f['kclrs_matched_cpu_s_per_mb'])} for kcl-rs from its `Scheduler()` on; counting "
                   f"the start of our Ray actors, {fmt(f['ours_cpu_s_per_mb_whole_run'])} (where we lose).")
    return out


def _figure_table(data: dict[str, Any], names: list[str]) -> list[str]:
    by_name = {f["name"]: f for f in data.get("figures", [])}
    rows = ["| figure | value | unit | section |", "|---|---:|---|---|"]
    rows += [f"| `{n}` | {fmt(by_name[n]['value'])} | {by_name[n]['unit']} | {by_name[n]['section']} |"
             for n in names if n in by_name and by_name[n].get("value") is not None]
    return rows


CHART_FIGURES = {
    chart_cpu: ["ours_cpu_s_per_mb_after_start", "ours_cpu_s_per_mb_whole_run", "kclrs_matched_cpu_s_per_mb",
                "kclrs_seeded_cpu_s_per_mb", "raw_cpu_s_per_mb"],
    chart_throughput: ["ours_records_per_s", "kclrs_matched_records_per_s", "kclrs_seeded_records_per_s",
                       "raw_records_per_s", "long_ours_records_per_s", "long_kclrs_seeded_records_per_s"],
    chart_failover: [n for _, a, b in FAILOVER for n in (a, b)],
    chart_scale: [f"scale_{n}_{k}" for n in (16, 64, 256, 1000) for k in ("subscribe_s", "all_delivered_s",
                                                                          "uss_total_mib", "uss_per_shard_mib")],
    chart_delivery: [*(f"slow_sink_pf{n}_{k}" for n in (1, 4, 10) for k in ("records_per_s", "steady_records_per_s")),
                     "poison_records_delivered", "poison_records_dead_lettered", "poison_shard_held_up_s",
                     "poison_sink_calls_refused", "trickle_batches_per_s", "trickle_p50_ms", "trickle_p99_ms"],
}

CAPTIONS = {
    chart_cpu: "CPU seconds of every client process per MB read, in one run of the `peer_kcl_rs` section: 4 shards of "
               "1 KiB records from `TRIM_HORIZON`. Ours counts every Ray process (readers, Coordinator, sink, driver, "
               "raylet, GCS), once from the start and once from `subscribe()` returning.",
    chart_throughput: "Records per second once reading, in the same run. \"8 responses\" counts from the first delivery to "
                      "the last of a short drain (a start transient); the long drain counts the middle half of a larger "
                      "one (the steady state).",
    chart_failover: "Two workers of one application in the same run: the time from a start, a SIGKILL, a graceful stop or "
                    "a second worker joining to the records flowing again (or the shards split evenly).",
    chart_scale: "One instance, N shards with a small backlog each, default settings (`scale` section): the time "
                 "`subscribe()` takes and until every record arrived, and the memory of the readers and the Coordinator.",
    chart_delivery: "A sink taking 50 ms per batch, 4 shards with a backlog, `max_batch_records=50`, at "
                    "`parallelization_factor` 1, 4 and 10 (`delivery` section); the table adds a poison record with "
                    "`bisect_on_error` and a 1 s batching window on a trickle.",
}

INTRO = """# Benchmarks

This page is generated by `python -m bench.report --docs` from `bench/results.json` (the
chaos suite's reference run and the runs kept in `bench/runs/` are folded into it by
`python -m bench.fold`); `make docs` runs it before building the site. Do not edit it or its
charts by hand: run `make bench` (or `python -m bench --only S --merge`) and `make docs` again.

Every figure is from one run on a shared 2-core machine, against an emulator (moto in server
mode on the same cores), not AWS: read them as orders of magnitude and compare ratios within
a run. kcl-rs is KCL in Rust (0.1.4), run from its own virtualenv; "matched" is kcl-rs with our
idle wait and a 1 s shard sync, "seeded" adds a lease table whose rows already exist
(`bench/PEER_KCL_RS.md` has the settings behind each number). Raw boto3 is one thread draining
the same shards with `GetRecords`.
"""


def chaos_table(data: dict[str, Any]) -> list[str]:
    """The chaos suite's reference run, one row per scenario, from section ``chaos`` of the results."""
    from .report import CHAOS_KEY

    f = {x["name"]: x["value"] for x in data.get("figures", []) if x["section"] == "chaos"}
    scenarios = sorted(n[len("chaos_"):-len("_published")] for n in f if n.endswith("_published"))
    rows = ["| scenario | published | lost | duplicated | gaps | recovery (s) | key figure |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for sc in scenarios:
        def get(k: str, sc: str = sc) -> str:
            return show(f.get(f"chaos_{sc}_{k}"))

        key, label = CHAOS_KEY.get(sc, ("", ""))
        shown = f"{get(key)} {label}" if f"chaos_{sc}_{key}" in f else ""
        rows.append(f"| {sc} | {get('published')} | {get('lost')} | {get('duplicated')} | {get('gaps')} | "
                    f"{get('recovery_s') if f'chaos_{sc}_recovery_s' in f else ''} | {shown} |")
    return rows


def render(data: dict[str, Any]) -> str:
    """The benchmark page's Markdown; draws the charts into ``docs/assets/bench/`` as it goes."""
    from .report import markdown

    f = figures(data)
    m = data.get("machine", {})
    out = [INTRO, f"Machine: {m.get('cores')} cores, {m.get('memory_gib')} GiB, Python {m.get('python')}, "
                  f"Ray {m.get('ray')} (the first run's; each run's own is in `bench/results.json`).", "",
           "## Against kcl-rs, in three figures", "", "The README quotes these:", "", *readme_figures(data), ""]
    missing = []
    for title, alt, draw in CHARTS:
        path = draw(f)
        if path is None:
            missing.append(title)
            continue
        out += [f"## {title}", "", CAPTIONS[draw], "", f"![{alt}]({path})", "", *_figure_table(data, CHART_FIGURES[draw]), ""]
    if missing:
        out += ["## Charts left out", "", "`bench/results.json` lacks the figures of: "
                + "; ".join(missing) + ".", ""]
    out += ["## Where each section's figures come from", "", *provenance(data), ""]
    table = markdown(data, key_only=True).splitlines()
    out += ["## Every key figure", "", "`python -m bench.report --key` prints the same table.", "",
            *table[next(i for i, line in enumerate(table) if line.startswith("| section")):], ""]
    if any(x["section"] == "chaos" for x in data.get("figures", [])):
        run = section_runs(data)["chaos"]
        out += ["## The chaos suite's reference run", "",
                f"Section `chaos` of `bench/results.json`, folded from `{run['source']}` by `python -m bench.fold`: "
                f"measured {run['date']} at {run['commit']}, load average {run['load']} (see [the chaos suite](chaos.md) "
                "for what each scenario does).", "", *chaos_table(data), ""]
    return "\n".join(out).rstrip() + "\n"


def load(results_path: str) -> dict[str, Any]:
    """The results file at ``results_path``, parsed."""
    import json

    with open(results_path) as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def write(results_path: str) -> str:
    """Write ``docs/benchmarks.md`` and its charts from the results file; returns the page's path."""
    page = os.path.join(DOCS, "benchmarks.md")
    with open(page, "w") as fh:
        fh.write(render(load(results_path)))
    return page
