"""cluster/pipeline.py as a real Ray job: ``ray start --head`` on loopback (own ports and temp dir),
``ray job submit`` with working_dir + py_modules, against the embedded emulator; ``ray job stop``
mid-run then a resubmit writes every record exactly once. Only the processes of the cluster
started here are stopped (by the temp dir in their command lines), never with ``ray stop``."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest

from kinesis_actors import DynamoLeaseStore

from ..integration.helpers import (
    KeyedPublisher,
    create_stream,
    exactly_once,
    kinesis_client,
    newest_by_shard,
    parquet_keys,
    wait_until,
)
from .processes import cluster_processes, end_processes, free_ports

REPO = pathlib.Path(__file__).resolve().parents[2]
RAY = str(pathlib.Path(sys.executable).with_name("ray"))
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


class Head:
    """A one-node Ray cluster started with ``ray start --head``; :meth:`stop` ends only its processes."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="ka-cl-", dir="/tmp")  # short: socket paths are limited
        gcs, dash, agent, agent_grpc, rt_agent, metrics, client, nm, om = free_ports(9)
        self.dashboard = f"http://127.0.0.1:{dash}"
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_TMPDIR": self.temp_dir}
        for name in [n for n in self.env if n.startswith("AWS_") or n == "RAY_ADDRESS"]:
            del self.env[name]  # module scope runs before the hermetic fixture: strip here too
        self.env["AWS_EC2_METADATA_DISABLED"] = "true"
        # `python` in the job's entrypoint is this virtualenv's, as after `source .venv/bin/activate`
        self.env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), self.env.get("PATH", "")])
        self.command = [RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
                        f"--runtime-env-agent-port={rt_agent}", f"--metrics-export-port={metrics}",
                        f"--ray-client-server-port={client}", f"--node-manager-port={nm}",
                        f"--object-manager-port={om}", "--num-cpus=2", f"--temp-dir={self.temp_dir}",
                        "--disable-usage-stats"]

    def start(self) -> Head:
        result = subprocess.run(self.command, env=self.env, timeout=180, capture_output=True, text=True)
        if result.returncode != 0:
            self.stop()
            raise AssertionError(f"ray start failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        wait_until(self._dashboard_up, timeout_s=60, interval_s=0.5, what="the Ray dashboard's job API")
        return self

    def _dashboard_up(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(self.dashboard + "/api/version", timeout=2) as r:
                return r.status == 200
        except Exception:
            return False

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes: those naming its temp dir, and all their children."""
        return cluster_processes(temp_dir=self.temp_dir)

    def stop(self) -> None:
        end_processes(self.processes())
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def ray(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([RAY, *args], env=self.env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    cluster = Head()
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def submit(head: Head, job_id: str, *args: str) -> None:
    runtime_env = {"working_dir": str(REPO / "cluster"), "py_modules": [str(REPO / "kinesis_actors")],
                   "excludes": ["__pycache__", "*.pyc"],
                   "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "60", "AWS_EC2_METADATA_DISABLED": "true"}}
    result = head.ray("job", "submit", "--address", head.dashboard, "--submission-id", job_id, "--no-wait",
                      "--runtime-env-json", json.dumps(runtime_env), "--", "python", "pipeline.py", *args)
    assert result.returncode == 0, result.stderr[-3000:]


def client(head: Head) -> Any:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(head.dashboard)


def wait_terminal(head: Head, job_id: str, timeout_s: float) -> str:
    jobs = client(head)
    status = wait_until(lambda: (s := str(jobs.get_job_status(job_id).value)) in TERMINAL and s,
                        timeout_s=timeout_s, interval_s=0.5, what=f"job {job_id} to end")
    return status


def events(head: Head, job_id: str) -> list[dict[str, Any]]:
    logs = client(head).get_job_logs(job_id)
    out = []
    for line in logs.splitlines():
        if line.startswith("{") and '"event"' in line:
            out.append(json.loads(line))
    return out


def written(path: pathlib.Path) -> dict[str, Any]:
    payloads: list[bytes] = []
    newest: dict[str, int] = {}
    for f in sorted(path.glob("*.parquet")) if path.exists() else []:
        t = pq.read_table(f)
        payloads += t.column("data").to_pylist()
        for sid, seq in zip(t.column("shard_id").to_pylist(), t.column("sequence_number").to_pylist()):
            newest[sid] = max(newest.get(sid, 0), int(seq))
    return {"payloads": payloads, "newest": newest}


def publish(endpoint: str, stream: str, n: int) -> set[bytes]:
    payloads = [f"job-{i}".encode() for i in range(n)]
    kinesis_client(endpoint).put_records(StreamName=stream, Records=[
        {"Data": p, "PartitionKey": f"k{i}"} for i, p in enumerate(payloads)])
    return set(payloads)


def job_args(endpoint: str, stream: str, table: str, out: pathlib.Path, *extra: str) -> list[str]:
    return ["--stream", stream, "--lease-table", table, "--endpoint", endpoint, "--region", "us-east-1",
            "--test-credentials", "--create-lease-table", "--start-at", "trim_horizon", "--window-s", "0.5",
            "--sink", f"parquet:{out}", "--lease-duration-s", "6", "--renew-interval-s", "2", *extra]


def lease_rows(endpoint: str, table: str, stream: str) -> list[Any]:
    return DynamoLeaseStore(table, endpoint=endpoint, region="us-east-1", test_credentials=True).list(stream)


@pytest.mark.timeout(300)  # ~25 s on an idle 2-core VM; the first test also pays for `ray start`
def test_job_reads_the_stream_into_parquet_and_exits(head: Head, endpoint: str, unique: str,
                                                     tmp_path: pathlib.Path) -> None:
    stream, table, out = f"job-{unique}", f"job-leases-{unique}", tmp_path / "out"
    create_stream(endpoint, stream, 2)
    payloads = publish(endpoint, stream, 60)
    job_id = f"ka-bounded-{unique}"
    submit(head, job_id, *job_args(endpoint, stream, table, out, "--max-records", "60"))
    status = wait_terminal(head, job_id, timeout_s=180)
    log_events = events(head, job_id)
    assert status == "SUCCEEDED", client(head).get_job_logs(job_id)[-4000:]
    assert next(e["event"] for e in log_events) == "started"
    stopped = log_events[-1]
    assert stopped["event"] == "stopped" and stopped["reason"] == "max_records" and stopped["exit_code"] == 0
    files = written(out)
    assert set(files["payloads"]) == payloads
    rows = lease_rows(endpoint, table, stream)
    assert {r.shard_id: int(r.checkpoint) for r in rows} == files["newest"]
    assert all(r.owner is None for r in rows)  # released at the end: another instance may take them at once


def stop_job(head: Head, job_id: str) -> list[dict[str, Any]]:
    """``ray job stop`` (SIGTERM to the pipeline), then check it stopped cleanly; its events."""
    assert str(client(head).get_job_status(job_id).value) == "RUNNING", client(head).get_job_logs(job_id)[-4000:]
    stop = head.ray("job", "stop", "--address", head.dashboard, job_id)
    assert stop.returncode == 0, stop.stderr[-2000:]
    assert wait_terminal(head, job_id, timeout_s=120) == "STOPPED"
    logs = client(head).get_job_logs(job_id)
    assert "received SIGTERM" in logs
    stopped = [e for e in events(head, job_id) if e["event"] == "stopped"]
    assert stopped and stopped[-1]["reason"] == "signal" and stopped[-1]["exit_code"] == 0, logs[-4000:]
    return events(head, job_id)


@pytest.mark.timeout(300)  # ~60 s on an idle 2-core VM: two submissions
def test_ray_job_stop_mid_run_then_a_resubmit_writes_every_record_exactly_once(
        head: Head, endpoint: str, unique: str, tmp_path: pathlib.Path) -> None:
    """``ray job stop`` while records keep arriving, right after the first 8 s window was
    written (the next one gathering: longer than a reader's 5 s grace), then the same job
    submitted again: every record in the Parquet output exactly once by (shard id,
    sequence number), none lost; after the stop, the leases are released and checkpointed
    at exactly what was written."""
    stream, table, out = f"jobstop-{unique}", f"jobstop-leases-{unique}", tmp_path / "out"
    create_stream(endpoint, stream, 2)
    publisher = KeyedPublisher(endpoint, stream, per_tick=5, interval_s=0.1).backlog(200).start()
    args = job_args(endpoint, stream, table, out, "--owner-id", f"jobstop-{unique}")
    try:
        first = f"ka-stop-{unique}"
        submit(head, first, *args, "--window-s", "8")
        wait_until(lambda: parquet_keys(out) or str(client(head).get_job_status(first).value) in TERMINAL,
                   timeout_s=150, interval_s=0.5, what="the first window written by the running job")
        published_then = len(publisher.keys)
        wait_until(lambda: len(publisher.keys) >= published_then + 20, timeout_s=30,
                   what="records arriving into the next window")
        stopped = [e for e in stop_job(head, first) if e["event"] == "stopped"]
        print("first job stopped:", stopped[-1])  # written or dropped at the stop: shown with -s
        rows = lease_rows(endpoint, table, stream)
        assert all(r.owner is None for r in rows), rows  # released, not left to expire
        checkpoints = {r.shard_id: int(r.checkpoint) for r in rows if r.checkpoint}
        assert checkpoints == newest_by_shard(parquet_keys(out))  # none to read again

        second = f"ka-resubmit-{unique}"
        submit(head, second, *args)
        wait_until(lambda: any(e["event"] == "started" for e in events(head, second))
                   or str(client(head).get_job_status(second).value) in TERMINAL,
                   timeout_s=150, interval_s=0.5, what="the resubmitted job started")
        published = publisher.stop()
        wait_until(lambda: set(parquet_keys(out)) >= published, timeout_s=90, interval_s=0.5,
                   what="every record written")
        stop_job(head, second)
    finally:
        publisher.stop()
    result = exactly_once(published, parquet_keys(out))
    assert result["duplicates"] == 0 and result["lost"] == 0 and result["unknown"] == 0, result
