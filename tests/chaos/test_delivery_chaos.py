"""Chaos with the delivery controls (issue 23): ``parallelization_factor=4`` and a reader SIGKILL.

With N batches of one shard in flight at once, a reader's death may leave up to N of them
unacknowledged; the checkpoint is the highest position below which everything was
acknowledged, so what lies above it is read again. SPEC then promises: nothing lost, and at
most N batches delivered twice per shard per failure. Order is kept per partition key, not
per shard, so the checker's per-shard gap report does not apply here; every published
event delivered (``lost == 0``) is what shows nothing was skipped.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray

from kinesis_actors import KinesisStream, StartAt

from ..integration.helpers import wait_until
from .harness import sigkill
from .test_chaos import InClusterRun, record, ride_window_s

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(240)]

FACTOR = 4


class ParallelRun(InClusterRun):
    """An :class:`InClusterRun` whose subscription delivers up to ``FACTOR`` batches per
    shard at once (lanes by partition-key hash; the publisher gives every event its own key)."""

    def stream_config(self) -> KinesisStream:
        return KinesisStream(self.name, start_at=StartAt.trim_horizon(), lease_poll_interval_s=self.poll_s,
                             shard_sync_interval_s=30.0, max_records=1000, parallelization_factor=FACTOR,
                             max_batch_records=20,
                             reader_options={"resources": {"readers": 0.01}},
                             coordinator_options={"resources": {"head": 0.01}})


def test_10_sigkill_a_reader_with_four_batches_in_flight_per_shard(chaos_cluster: Any, emulator: Any, unique: str,
                                                                   chaos_results: dict[str, Any]) -> None:
    run = ParallelRun(emulator.endpoint, f"chaos10-{unique}", lease_s=3.0, renew_s=1.0, poll_s=1.0)
    try:
        run.open().flowing()
        ray.get(run.sink.stall.remote(time.time(), 0.05, 3600.0))  # 50 ms per batch: a shard's lanes overlap
        time.sleep(2.0)  # a few seconds of overlapping batches before the fault
        readers = wait_until(lambda: run.reader_map_if(lambda m: len(m) == run.shards), timeout_s=30,
                             what="a reader for every shard")
        victim = readers[sorted(readers)[0]]["pid"]
        affected = sorted(sid for sid, r in readers.items() if r["pid"] == victim)
        t = time.time()
        sigkill(victim, "ray::ShardReader")
        replaced, old_gone_s = run.replacements({s: victim for s in affected}, t)
        _in_flight_now, most_in_flight = ray.get(run.sink.in_flight_figures.remote())
        verdict = run.finish("10_parallelization_factor_4_sigkill_reader", fault_at=t, affected=affected)
        record(chaos_results, verdict, parallelization_factor=FACTOR, shards_on_victim=len(affected),
               replacement_delivering_s=replaced, old_reader_exited_after_s=old_gone_s,
               sink_batches_in_flight_most=most_in_flight, lease_duration_s=run.lease_s)
        assert verdict.lost == 0 and verdict.unexpected == 0, verdict.summary()
        assert all(v is not None for v in verdict.recovery_by_shard_s.values()), verdict.summary()
        window_s = ride_window_s(run.renew_s)  # checkpoints ride the renewals: one window per shard hit
        over = {s: verdict.redelivery_windows(s, window_s) for s in verdict.redelivered_acked_at_by_shard}
        over = {s: n for s, n in over.items() if n > 1 or s not in affected}
        assert not over, f"records delivered again beyond one {window_s} s window per shard hit: {over} (hit: {affected})"
        assert most_in_flight > 1, "the lanes never overlapped: the scenario did not test N batches in flight"
    finally:
        run.close()
