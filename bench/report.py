"""``python -m bench.report [--key] [results.json]``: the Markdown table of a results file (``--key``: the
key figures, as the site's benchmark page shows them). ``python -m bench.report --docs``: the site's benchmark page and its charts
(``docs/benchmarks.md``, ``docs/assets/bench/``; ``--readme`` prints the README's three figures).
``python -m bench.report --chaos [chaos.json]``: the chaos suite's table
(the repository's reference run; ``make test-chaos`` writes yours to ``build/chaos.json``)."""

from __future__ import annotations

import json
import os
import sys

from .common import fmt, fmt_against, fmt_ratio, goal_threshold

KEY = (
    "raw_single_records_per_s", "raw_threads_records_per_s", "product_records_per_s", "product_records_per_s_vs_threads",
    "product_mb_per_s", "product_e2e_records_per_s", "raw_single_cpu_s_per_mb", "product_cpu_s_per_mb",
    "product_cpu_s_per_mb_after_start", "product_reader_cpu_s_per_mb",
    "product_readers_coordinator_cpu_s_per_mb_after_start", "product_sink_cpu_s_per_mb", "emulator_cpu_s_per_mb_product",
    *(f"where_{k}_cpu_s_per_mb" for k in ("parse", "build", "deliver", "checkpoint", "coordinator")),
    "ours_cpu_s_per_mb_after_start", "ours_cpu_s_per_mb_whole_run", "ours_records_per_s_vs_matched",
    "ours_start_to_first_record_vs_seeded_s", "emulator_cores_in_window_ours", "emulator_cores_in_window_kclrs_matched",
    "long_ours_records_per_s", "long_emulator_cores_ours", "long_emulator_cores_kclrs",
    "peer_records_per_s", "peer_cpu_s_per_mb",
    "raw_poll_p50_ms", "product_p50_ms", "product_p95_ms", "product_p99_ms", "get_records_calls_per_s_per_shard_max",
    "crash_to_survivor_first_record_s", "crash_survivor_take_s", "sigkill_to_survivor_first_record_s",
    "sigkill_survivor_take_s", "close_to_other_reading_s", "close_survivor_take_s",
    "reader_sigkill_to_shards_delivering_s", "reader_sigkill_read_on_by_pool_readers", "ray_actor_start_s",
    "idle_actor_uss_mib", "reader_uss_at_rest_mib", "readers_uss_at_rest_total_mib", "raw_drain_process_uss_peak_mib",
    "reader_uss_under_load_mib",
    "reader_uss_under_load_max_records_1000_mib", "coordinator_pass_s", "coordinator_pass_dynamodb_calls",
    *(f"scale_{n}_{k}" for n in (16, 64, 256, 1000) for k in (
        "subscribe_s", "all_delivered_s", "delivered_distinct", "leases_lost", "processes", "readers_uss_mib",
        "uss_per_shard_mib", "idle_requests_per_s_per_shard", "idle_emulator_cpu_share")),
    "scale_16_cap1_uss_total_mib", "scale_64_cap1_uss_total_mib", "scale_64_cap1_subscribe_s",
    "scale_1000_dynamo_lease10_leases_lost", "scale_1000_dynamo_lease10_idle_update_item_per_s",
    "scale_1000_dynamo_lease30_leases_lost", "scale_1000_dynamo_lease30_idle_update_item_per_s",
    *(f"ckpt_interval_{i}s_{k}" for i in (0, 1, 5) for k in ("update_item_per_shard_per_s",
                                                            "checkpoints_per_shard_per_s")),
    "january_wall_s", "january_emulator_start_s", "january_ray_start_s", "january_subscribe_s", "january_publish_s",
    "january_consume_s", "full_year_wall_s", "full_year_publish_s", "full_year_consume_s",
)


def _merged(run: dict) -> str:
    how = f"folded in from `{run['source']}` (`python -m bench.fold`)" if run.get("source") else \
        "merged in (`python -m bench --merge`)"
    return (f"Sections {', '.join(run['params'].get('sections', []))} measured again "
            f"{run.get('started_utc') or run.get('date')}{' (--quick)' if run.get('mode') == 'quick' else ''} and {how}.")


def markdown(data: dict, key_only: bool = False) -> str:
    m = data.get("machine", {})
    lines = [
        f"Measured {data.get('date')} on {m.get('cores')} cores, {m.get('memory_gib')} GiB "
        f"(Python {m.get('python')}, Ray {m.get('ray')}, boto3 {m.get('boto3')}, moto {m.get('moto')}; "
        f"`python -m bench`{' --quick' if data.get('mode') == 'quick' else ''}, emulator: moto server).",
        *(_merged(r) for r in data.get("merged_runs", [])),
        "",
        "Load average (1 min) of the shared machine when each section started: "
        + (", ".join(f"{k} {v:g}" for k, v in data.get("load_average_1min_at_section_start", {}).items()) or "not recorded")
        + " (2 cores: anything above 2 means other work shared the CPUs; figures are from one noisy run).",
        "",
        "| section | figure | value | unit | anchor | ratio | goal | met |",
        "|---|---|---:|---|---|---:|---|---|",
    ]
    for f in data.get("figures", []):
        if key_only and f["name"] not in KEY:
            continue
        anchor = f.get("anchor") or ""
        if f.get("anchor_value") is not None:
            anchor = f"{anchor} = {fmt(f['anchor_value'])}"
        ratio = fmt_ratio(f)
        met = "" if f.get("goal_met") is None else ("yes" if f["goal_met"] else "**no**")
        value = fmt_against(f["value"], goal_threshold(f))  # the digits the goal's comparison uses
        lines.append(f"| {f['section']} | {f['name']} | {value} | {f['unit']} | {anchor} | {ratio} | "
                     f"{f.get('goal') or ''} | {met} |")
    return "\n".join(lines)


# The figure of each chaos scenario the table shows besides lost/duplicated/gaps/recovery.
CHAOS_KEY = {
    "1_sigkill_readers": ("kills", "SIGKILLs"),
    "2_remove_node_graceful": ("old_readers_exited_after_s", "s until the removed node's readers exited"),
    "2_remove_node_sigkill": ("old_readers_exited_after_s", "s until the removed node's readers exited"),
    "3a_sigkill_coordinator": ("old_readers_exited_after_s", "s until the old readers exited (fate sharing)"),
    "3b_sigkill_coordinator_first_pass": ("readers_alive_at_kill", "readers alive at the kill"),
    "4_sigkill_driver_process": ("take_after_kill_s", "s until the survivor took the leases"),
    "5_zombie_sigstop": ("zombie_reader_last_call_after_resume_s", "s until the zombie's readers stopped calling AWS"),
    "6_downstream_stall": ("longest_renewal_gap_s", "s longest gap between renewals"),
    "7_lease_table_unreachable": ("retaken_after_return_s", "s until every shard re-taken"),
    "8_sigkill_reader_with_several_shards": ("shards_on_victim", "shards on the killed reader, re-homed onto the live one"),
}

CHAOS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaos.json")  # the reference run
CHAOS_LOCAL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "chaos.json")


def chaos_markdown(data: dict) -> str:
    """The chaos suite's table from its results file (``bench/chaos.json``, parsed): the run's line, then one row
    per scenario as the benchmark page shows section ``chaos`` (:func:`bench.docs_page.chaos_table`)."""
    from .docs_page import chaos_table
    from .fold import chaos_run

    m = data.get("machine", {})
    head = (f"Measured {data.get('date')} on {m.get('cores')} cores (Python {m.get('python')}, Ray {m.get('ray')}, "
            f"moto {m.get('moto')}; `{data.get('command', 'pytest tests/chaos')}`, {data.get('session_s')} s in all; "
            f"load average at the end {data.get('load_average_1min_at_end')}).")
    return "\n".join([head, "", *chaos_table(chaos_run(data))])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    key_only = "--key" in args
    chaos = "--chaos" in args
    docs, readme = "--docs" in args, "--readme" in args
    args = [a for a in args if a not in ("--key", "--chaos", "--docs", "--readme")]
    if chaos:
        with open(args[0] if args else CHAOS_PATH) as f:
            print(chaos_markdown(json.load(f)))
        return 0
    path = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json")
    if docs:
        from .docs_page import write

        print(write(path))
        return 0
    with open(path) as f:
        if readme:
            from .docs_page import readme_figures

            print("\n".join(readme_figures(json.load(f))))
            return 0
        print(markdown(json.load(f), key_only=key_only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
