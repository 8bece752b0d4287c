"""cluster/pipeline.py stopped by SIGTERM (what ``ray job stop`` sends) while records keep
arriving, then run again: every record is in the Parquet output exactly once, by (shard id,
sequence number), and none is lost.

The pipeline runs as a plain subprocess with its own local Ray (no job server: the fast
twin of ``test_ray_job.py``'s ``ray job stop`` test), in its own session, so the test stops
exactly its processes (every process of that session), never another Ray on the machine.
The first run's window (8 s) is longer than a reader's 5 s grace, and the stop comes right
after its first window was written, while the next one gathers: the case where a stop
used to write the open window after the readers had checkpointed without it.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from kinesis_actors import DynamoLeaseStore

from ..integration.helpers import KeyedPublisher, create_stream, exactly_once, newest_by_shard, parquet_keys, wait_until
from .processes import cluster_processes, end_processes

REPO = pathlib.Path(__file__).resolve().parents[2]
PIPELINE = REPO / "cluster" / "pipeline.py"


class PipelineProcess:
    """``python cluster/pipeline.py ARGS`` in a new session; its stdout (JSON lines) in a file."""

    def __init__(self, args: list[str], ray_tmp: str, log: pathlib.Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(PYTHONPATH=str(REPO), RAY_TMPDIR=ray_tmp, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONUNBUFFERED="1")
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen([sys.executable, str(PIPELINE), *args], env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"event"' in line:
                out.append(json.loads(line))
        return out

    def stop(self, timeout_s: float = 90) -> int:
        """SIGTERM to the pipeline (the driver) only; its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill_session(self) -> None:
        """Kill whatever is left of this run: every process of its session (Ray's workers
        have process groups of their own, but stay in the driver's session)."""
        end_processes(cluster_processes(session=self.proc.pid), grace_s=0)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._out.close()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def ray_tmp() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ka-ps-", dir="/tmp")  # short: Ray's socket paths are limited
    yield path
    subprocess.run(["rm", "-rf", path], check=False)


def pipeline_args(endpoint: str, stream: str, table: str, out: pathlib.Path, owner: str, window_s: float) -> list[str]:
    return ["--stream", stream, "--lease-table", table, "--endpoint", endpoint, "--region", "us-east-1",
            "--test-credentials", "--create-lease-table", "--start-at", "trim_horizon", "--owner-id", owner,
            "--window-s", str(window_s), "--sink", f"parquet:{out}", "--lease-duration-s", "6",
            "--renew-interval-s", "2", "--progress-s", "2"]


def checkpoints_and_newest(endpoint: str, table: str, stream: str, out: pathlib.Path) -> tuple[Any, Any, Any]:
    rows = DynamoLeaseStore(table, endpoint=endpoint, region="us-east-1", test_credentials=True).list(stream)
    return rows, {r.shard_id: int(r.checkpoint) for r in rows if r.checkpoint}, newest_by_shard(parquet_keys(out))


@pytest.mark.timeout(300)  # ~45 s on an idle 2-core VM: two runs, each starting its own Ray
def test_sigterm_mid_run_then_a_second_run_writes_every_record_exactly_once(
        endpoint: str, unique: str, tmp_path: pathlib.Path, ray_tmp: str) -> None:
    stream, table, out, owner = f"pstop-{unique}", f"pstop-leases-{unique}", tmp_path / "out", f"pstop-{unique}"
    create_stream(endpoint, stream, 2)
    publisher = KeyedPublisher(endpoint, stream, per_tick=5, interval_s=0.1).backlog(200).start()
    try:
        first = PipelineProcess(pipeline_args(endpoint, stream, table, out, owner, 8.0), ray_tmp, tmp_path / "1.log")
        try:
            wait_until(lambda: parquet_keys(out) or first.proc.poll() is not None, timeout_s=150, interval_s=0.2,
                       what="the first window written")
            assert first.proc.poll() is None, first.tail()
            published_then = len(publisher.keys)
            wait_until(lambda: len(publisher.keys) >= published_then + 20, timeout_s=30,
                       what="records arriving into the next window")
            assert first.stop() == 0, first.tail()
        finally:
            first.kill_session()
        stopped = [e for e in first.events() if e["event"] == "stopped"]
        assert stopped and stopped[-1]["reason"] == "signal" and stopped[-1]["exit_code"] == 0, first.tail()
        print("first run stopped:", stopped[-1])  # written or dropped at the stop: shown with -s
        rows, checkpoints, newest = checkpoints_and_newest(endpoint, table, stream, out)
        # the rule: everything written is checkpointed (the next run reads none of it again) and released
        assert checkpoints == newest, (checkpoints, newest, stopped[-1])
        assert all(r.owner is None for r in rows), rows

        second = PipelineProcess(pipeline_args(endpoint, stream, table, out, owner, 1.0), ray_tmp, tmp_path / "2.log")
        try:
            wait_until(lambda: any(e["event"] == "started" for e in second.events()) or second.proc.poll() is not None,
                       timeout_s=150, interval_s=0.2, what="the second run started")
            assert second.proc.poll() is None, second.tail()
            published = publisher.stop()
            wait_until(lambda: set(parquet_keys(out)) >= published or second.proc.poll() is not None,
                       timeout_s=90, interval_s=0.5, what="every record written")
            assert second.stop() == 0, second.tail()
        finally:
            second.kill_session()
    finally:
        publisher.stop()
    result = exactly_once(published, parquet_keys(out))
    assert result["duplicates"] == 0 and result["lost"] == 0 and result["unknown"] == 0, result
