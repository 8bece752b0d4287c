"""subscribe()'s start of Ray is bounded by start_timeout_s and names what Ray was doing.

``ray.init()`` without an address connects to the cluster named by ``RAY_ADDRESS`` or by the
address file a ``ray start`` left in Ray's temp dir; when that cluster is gone it used to wait
on its GCS for many minutes, silently. Each case runs in a fresh subprocess (no Ray in it),
against the session's emulator (the stream check comes before Ray's start)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .helpers import create_stream

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 3.0

SCRIPT = textwrap.dedent("""
    import json, sys, time
    from kinesis_actors import KinesisBroker, KinesisStream
    from kinesis_actors.errors import KinesisError
    endpoint, stream, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    conn = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True).connect()
    t0 = time.monotonic()
    try:
        conn.subscribe(KinesisStream(stream), start_timeout_s=timeout_s)
        out = {"error": None}
    except KinesisError as e:
        out = {"error": type(e).__name__, "message": str(e)}
    out["seconds"] = time.monotonic() - t0
    import ray
    out["ray_initialized"] = ray.is_initialized()
    print(json.dumps(out), flush=True)
""")


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on exit: nothing listens there


def run_subscribe(endpoint: str, stream: str, env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, endpoint, stream, str(START_TIMEOUT_S)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])  # type: ignore[no-any-return]


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path)  # this test's own Ray temp dir: its address file only
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.timeout(120)
def test_a_stale_ray_address_file_fails_subscribe_within_start_timeout(endpoint: str, unique: str,
                                                                       clean_env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    stream = f"raystart-{unique}"
    create_stream(endpoint, stream, 1)
    address_file = tmp_path / "ray" / "ray_current_cluster"
    address_file.parent.mkdir()
    address_file.write_text(f"127.0.0.1:{dead_port()}")  # what a killed `ray start` leaves behind
    out = run_subscribe(endpoint, stream, clean_env)
    assert out["error"] == "StartError", out
    assert f"start_timeout_s={START_TIMEOUT_S:g}" in str(out["message"]) and str(address_file) in str(out["message"])
    assert "Ray did not start" in str(out["message"])
    assert float(out["seconds"]) < START_TIMEOUT_S + 3.0, out  # DescribeStreamSummary (a first boto3 client), then the bound
    assert out["ray_initialized"] is False


@pytest.mark.timeout(120)
def test_ray_address_at_a_dead_port_fails_subscribe_within_start_timeout(endpoint: str, unique: str,
                                                                         clean_env: dict[str, str]) -> None:
    stream = f"raystart-env-{unique}"
    create_stream(endpoint, stream, 1)
    address = f"127.0.0.1:{dead_port()}"
    out = run_subscribe(endpoint, stream, {**clean_env, "RAY_ADDRESS": address})
    assert out["error"] == "StartError", out
    assert f"{address} named by RAY_ADDRESS" in str(out["message"]), out
    assert float(out["seconds"]) < START_TIMEOUT_S + 3.0, out
