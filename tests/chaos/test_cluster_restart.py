"""Chaos 9: the whole Ray cluster dies, driver included, mid-stream, and the job is started again.

What a KubeRay RayJob retry (``backoffLimit``) or a ``ray job submit`` entrypoint retry does
after the head node (and its GCS) is lost: nothing of the old cluster survives but the
DynamoDB lease table. The instance runs in its own driver process with its own local Ray
(head node, GCS, raylet, the Coordinator, the readers, the sink: ``tests/chaos/instance.py``);
SIGKILL of that whole process tree is the cluster's death. A new driver with a new local Ray
and the same ``owner_id`` (a RayJob with ``KA_OWNER_ID`` set) resumes from the lease table:
nothing lost, no gaps, at most the one unacknowledged batch per shard delivered again, and each
shard's first record after the restart is the one right after its stored checkpoint.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from ..integration.helpers import wait_until
from .checker import check, checkpoints_monotonic
from .harness import LeaseSampler, NumberedPublisher, gone, signal_tree
from .test_chaos import SHARDS, Instance, assert_ok, create_stream, first_after, record

# Two driver processes each start a Ray of their own, one after the other: on a loaded 2-core machine
# each start can take minutes, so the start waits are long (they are deadlines, not speed goals).
START_S = 300.0
pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(4 * START_S + 240)]


def restart(endpoint: str, table: str, stream: str, tmp_path: Any, timing: dict[str, float],
            attempts: int = 3) -> tuple[Instance, int]:
    """Start the job again as a RayJob's ``backoffLimit`` does: a new driver and a new Ray, the same
    owner id and output file; an attempt whose Ray fails to start (it happens on a loaded 2-core
    machine) is killed and retried. Returns the running instance and the attempts it took."""
    for attempt in range(1, attempts + 1):
        inst = Instance(endpoint, table, stream, "job", str(tmp_path / "second.txt"), expect=SHARDS, **timing)
        try:
            inst.ready(START_S)
            return inst, attempt
        except AssertionError:
            signal_tree(inst.proc.pid, signal.SIGKILL)
            inst.stop()
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def test_9_the_whole_ray_cluster_killed_mid_stream_then_started_again(emulator: Any, unique: str, tmp_path: Any,
                                                                      chaos_results: dict[str, Any]) -> None:
    endpoint, stream, table = emulator.endpoint, f"chaos9-{unique}", f"chaos9-{unique}-leases"
    lease_s, renew_s, poll_s = 4.0, 1.0, 1.0
    timing = {"lease_s": lease_s, "renew_s": renew_s, "poll_s": poll_s}
    create_stream(endpoint, stream)
    publisher = NumberedPublisher(endpoint, stream).start()
    first = second = None
    try:
        first = Instance(endpoint, table, stream, "job", str(tmp_path / "first.txt"), expect=SHARDS, **timing)
        shards = first.ready(START_S)
        assert len(shards) == SHARDS, f"the first run holds {shards}"
        with LeaseSampler(endpoint, table, stream) as sampler:
            wait_until(lambda: len({d.shard_id for d in first.rows() if d.t > time.time() - 1}) == SHARDS,  # type: ignore[union-attr]
                       timeout_s=60, what="records from every shard")
            t_kill = time.time()
            killed = signal_tree(first.proc.pid, signal.SIGKILL)  # driver, GCS, raylet, every actor
            wait_until(lambda: gone(killed), timeout_s=30, what="every process of the first cluster gone")
            stored = sampler.read()  # what survives: the lease table
            assert {s: row[0] for s, row in stored.items()} == dict.fromkeys(shards, "job"), stored
            t_restart = time.time()
            second, attempts = restart(endpoint, table, stream, tmp_path, timing)
            assert sorted(second.held) == sorted(shards), f"the restarted run holds {second.held}"
            t_ready = time.time()
            wait_until(lambda: set(shards) <= {d.shard_id for d in second.rows()}, timeout_s=60,  # type: ignore[union-attr]
                       what="the restarted run delivering every shard")
            published = publisher.stop()

            def rows() -> list[Any]:
                return first.rows() + second.rows()  # type: ignore[union-attr]
            wait_all = [p.n for p in published]
            wait_until(lambda: set(wait_all) <= {d.n for d in rows()}, timeout_s=60, what="every event delivered")
            verdict = check("9_whole_cluster_killed_and_restarted", published, rows(), fault_at=t_kill,
                            affected=shards)
        resumed = {}
        for shard in shards:
            checkpoint = stored[shard][2]
            after = sorted((p for p in published if p.shard_id == shard and int(p.sequence_number) > int(checkpoint or 0)),
                           key=lambda p: int(p.sequence_number))
            got = first_after(second.rows(), shard, t_restart)
            resumed[shard] = {"checkpoint": checkpoint, "first_delivered": got and got.sequence_number,
                              "expected": after[0].sequence_number if after else None}
        backwards = checkpoints_monotonic(sampler.checkpoints())
        record(chaos_results, verdict, processes_killed=len(killed), restart_to_ready_s=round(t_ready - t_restart, 2),
               restart_attempts=attempts,
               resumed_after_checkpoint=resumed, backwards_checkpoints=backwards, lease_duration_s=lease_s,
               renew_interval_s=renew_s, lease_poll_interval_s=poll_s)
        assert len(killed) >= 3, f"the driver and its Ray (GCS, raylet...) were killed: {killed}"
        assert_ok(verdict, dict.fromkeys(shards, 1))
        assert all(v["first_delivered"] == v["expected"] for v in resumed.values()), resumed
        assert not backwards, backwards
    finally:
        publisher.stop()
        for inst in (first, second):
            if inst is not None:
                inst.stop()
