"""Chaos scenarios with a table sink (issue 35): a SIGKILLed Coordinator with commits pending
(IcebergSink), and an instance frozen with SIGSTOP while another takes its leases, then thawed
(its committer process first, so that it tries to commit before its readers learn of the lost
leases), once with an IcebergSink and once with a DeltaSink on the local filesystem. The
table, read back, must hold every published event exactly once (by shard and sequence
number), no commit of a fenced owner may land, and no lease-table checkpoint may get ahead of
the table (tables.py). Figures go to the results file as the other scenarios' do
(``published``, ``table_distinct``, ``duplicated``, ``lost``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from ..integration.helpers import wait_until
from .harness import LeaseSampler, NumberedPublisher, processes_titled, sigkill, signal_tree, tree
from .tables import (
    KINDS,
    checkpoints_ahead,
    commits_oldest_first,
    counter_regressions,
    iceberg_sink,
    read_stats,
    table_numbers,
    table_sink,
    table_verdict,
)
from .test_chaos import SHARDS, InClusterRun, coordinator_pids, create_stream, record, thaw_and_stop, two_instances

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(240)]


def assert_exactly_once(verdict: Any, commits: list[Any], samples: list[Any]) -> None:
    """Every event once in the table, no fenced commit landed, no checkpoint ahead of the table."""
    assert verdict.lost == 0 and verdict.unexpected == 0 and not verdict.gaps, verdict.summary()
    assert verdict.duplicated == 0, verdict.summary()
    assert verdict.figures["table_rows"] == verdict.published, verdict.summary()
    regressions, ahead = counter_regressions(commits), checkpoints_ahead(samples, commits)
    assert not regressions, f"a fenced owner's commit landed: {regressions[:3]}"
    assert not ahead, f"a lease-table checkpoint ahead of the table: {ahead[:3]}"
    assert len(samples) >= 20, f"only {len(samples)} lease-table samples"


def fenced(commits: list[Any], counters: dict[str, int]) -> bool:
    """Whether the table's newest position of each shard carries a higher lease counter than ``counters``."""
    newest: dict[str, int] = {}
    for _, positions in commits:
        newest.update({s: counter for s, (counter, _) in positions.items()})
    return all(newest.get(s, -1) > c for s, c in counters.items())


def settle(publisher: NumberedPublisher, backend: Any, timeout_s: float = 90.0) -> list[Any]:
    """Stop publishing; wait until the table holds every accepted event (or ``timeout_s``: the
    verdict then names what is missing). Returns what was published."""
    published = publisher.stop()
    wanted = {p.n for p in published}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not wanted <= table_numbers(backend):
        time.sleep(0.5)
    return published


def test_11_table_sink_coordinator_sigkilled_with_commits_pending(chaos_cluster: Any, emulator: Any, unique: str,
                                                                  tmp_path: Path,
                                                                  chaos_results: dict[str, Any]) -> None:
    sink = iceberg_sink(tmp_path, commit_interval_s=2.0)
    backend = sink.backend()
    run = InClusterRun(emulator.endpoint, f"chaos11-{unique}", lease_s=3.0, renew_s=1.0, poll_s=1.0, sink=sink)
    try:
        run.open()
        wait_until(lambda: len(table_numbers(backend)) >= 200, timeout_s=60, what="rows in the table")
        wait_until(lambda: sink.stats()["staged_bytes"] > 0, timeout_s=10, interval_s=0.05, what="rows staged")
        (pid,) = coordinator_pids()
        t = time.time()
        sigkill(pid, "ray::Coordinator")
        wait_until(lambda: run.sub.coordinator_restarts == 1, timeout_s=60, what="the Coordinator restarted")
        wait_until(lambda: time.time() > t + 5, timeout_s=10)  # records keep coming after the restart
        published = settle(run.publisher, backend)  # type: ignore[arg-type]
        verdict = table_verdict("11_table_sink_sigkill_coordinator", published, backend)
        commits = commits_oldest_first(backend)
        samples = run.sampler.checkpoints()
        stats = sink.stats()
        record(chaos_results, verdict, coordinator_restarts=run.sub.coordinator_restarts, commits=len(commits),
               commit_failures=stats["commit_failures"], shards_refused=stats["shards_refused"],
               lease_samples=len(samples), commit_interval_s=sink.commit_interval_s, renew_interval_s=run.renew_s)
        assert_exactly_once(verdict, commits, samples)
    finally:
        run.close()


@pytest.mark.parametrize("kind", KINDS)
def test_12_table_sink_zombie_thawed_after_sigstop_commits_nothing(kind: str, chaos_cluster: Any, emulator: Any,
                                                                   unique: str, tmp_path: Path,
                                                                   chaos_results: dict[str, Any]) -> None:
    endpoint, stream, table = emulator.endpoint, f"chaos12-{unique}", f"chaos12-{unique}-leases"
    lease_s, renew_s, poll_s, commit_s = 4.0, 1.0, 1.0, 2.0
    create_stream(endpoint, stream)
    backend = table_sink(kind, tmp_path, commit_s).backend()
    publisher = NumberedPublisher(endpoint, stream).start()
    zombie = other = None
    try:
        zombie, other, zombie_shards = two_instances(
            endpoint, table, stream, tmp_path, "zombie", "other", lease_s=lease_s, renew_s=renew_s, poll_s=poll_s,
            max_leases_to_steal=0, extra_args=(f"--{kind}", str(tmp_path), "--commit-interval", str(commit_s)))
        with LeaseSampler(endpoint, table, stream, period_s=0.1) as sampler:
            wait_until(lambda: len(table_numbers(backend)) >= 200, timeout_s=60, what="rows in the table")
            t_stop = time.time()  # ~200 records/s and a commit every 2 s: the zombie has rows staged
            signal_tree(zombie.proc.pid, signal.SIGSTOP)
            zombie_counters = {s: row[1] for s, row in sampler.read().items() if s in zombie_shards}
            wait_until(lambda: all(row[0] == "other" for row in sampler.read().values()), timeout_s=60,
                       what="the other instance holding every shard")
            wait_until(lambda: time.time() > t_stop + lease_s + 0.5, timeout_s=10)
            # the other's fences of the zombie's shards are in the table (a commit of the zombie's
            # that lands before them is legitimate: the other then resumes after it)
            wait_until(lambda: fenced(commits_oldest_first(backend), zombie_counters), timeout_s=60,
                       what="the other's fence of the zombie's shards in the table")
            # Thaw the zombie's committer first: its commit round is overdue and runs at once, before
            # its readers (still stopped) can learn that their leases are gone and release the
            # shards. The table must refuse that commit. Then thaw the rest.
            (committer,) = [p.pid for p in processes_titled("ray::TableCommitterActor", tree(zombie.proc.pid))]
            t_cont = time.time()
            os.kill(committer, signal.SIGCONT)
            wait_until(lambda: time.time() > t_cont + 2 * commit_s, timeout_s=20)
            signal_tree(zombie.proc.pid, signal.SIGCONT)
            wait_until(lambda: time.time() > t_cont + 4 * commit_s, timeout_s=20)
            published = settle(publisher, backend)
        zombie.stop()
        zombie_stats = read_stats(f"{zombie.out}.stats.json")
        verdict = table_verdict("12_table_sink_zombie_sigstop" + ("" if kind == "iceberg" else f"_{kind}"),
                                published, backend)
        commits = commits_oldest_first(backend)
        samples = sampler.checkpoints()
        record(chaos_results, verdict, stopped_s=round(t_cont - t_stop, 2), zombie_shards=zombie_shards,
               zombie_commits=zombie_stats.get("commits"), zombie_shards_refused=zombie_stats.get("shards_refused"),
               zombie_conflicts=zombie_stats.get("conflicts"), commits=len(commits), lease_samples=len(samples),
               lease_duration_s=lease_s, renew_interval_s=renew_s, commit_interval_s=commit_s)
        assert_exactly_once(verdict, commits, samples)
        assert t_cont - t_stop > lease_s
        assert zombie_stats, "the zombie wrote no stats at its close"
        assert zombie_stats["shards_refused"] >= 1, f"the zombie's table commit was never refused: {zombie_stats}"
        assert {s for c in commits[-1:] for s in c[1]} >= set(zombie_shards) and len(zombie_shards) == SHARDS // 2
    finally:
        thaw_and_stop(publisher, zombie, other)
