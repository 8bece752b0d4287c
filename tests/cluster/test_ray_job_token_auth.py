"""cluster/README.md's `ray job submit` on a cluster with Ray 2.60's token authentication on.

A ``ray start --head`` on loopback with ``RAY_AUTH_MODE=token`` and its token in a temporary
file (``RAY_AUTH_TOKEN_PATH``: no ``~/.ray/auth_token`` is written); the client runs the
documented command with the documented environment, submits cluster/pipeline.py against
the embedded emulator, sees it start, and stops it with ``ray job stop``. The same
``ray job submit`` without ``RAY_AUTH_MODE=token`` on the client is refused, as the README
says. Only this cluster's processes are stopped (by PID, never ``ray stop``)."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from ..integration.helpers import create_stream, wait_until
from .test_ray_job import RAY, REPO, TERMINAL, Head, job_args, publish, written

HOME_TOKEN = pathlib.Path.home() / ".ray" / "auth_token"


class TokenHead(Head):
    """A head node with token authentication on; its token lives in the cluster's temp dir."""

    def __init__(self) -> None:
        super().__init__()
        self.token_path = pathlib.Path(self.temp_dir) / "auth_token"
        self.token_path.write_text(secrets.token_hex(32))  # what `ray get-auth-token --generate` makes
        self.token_path.chmod(0o600)
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_path))

    def client_env(self, *, token_mode: bool) -> dict[str, str]:
        """The client's environment: the token file, and RAY_AUTH_MODE=token or not set at all."""
        env = {k: v for k, v in self.env.items() if k != "RAY_AUTH_MODE"}
        if token_mode:
            env["RAY_AUTH_MODE"] = "token"
        return env

    def _dashboard_up(self) -> bool:  # any answer: the job API needs the token, /api/version too
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.dashboard + "/api/version", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except Exception:
            return False

    def run(self, args: list[str], *, token_mode: bool = True, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, env=self.client_env(token_mode=token_mode), capture_output=True, text=True,
                              timeout=timeout_s, cwd=REPO)


@pytest.fixture(scope="module")
def token_head() -> Iterator[TokenHead]:
    had_home_token = HOME_TOKEN.exists()
    cluster = TokenHead()
    try:
        yield cluster.start()
    finally:
        cluster.stop()
    assert had_home_token or not HOME_TOKEN.exists(), "a ~/.ray/auth_token was written"


def documented_submit(head: TokenHead, job_id: str, *args: str, token_mode: bool = True) -> subprocess.CompletedProcess[str]:
    """cluster/README.md's command: working_dir cluster/, the package shipped as a py_module."""
    runtime_env = {"working_dir": "cluster", "py_modules": ["kinesis_actors"], "excludes": ["__pycache__", "*.pyc"],
                   "env_vars": {"KA_OWNER_ID": f"owner-{job_id}", "RAY_JOB_STOP_WAIT_TIME_S": "60",
                                "AWS_EC2_METADATA_DISABLED": "true"}}
    return head.run([RAY, "job", "submit", "--address", head.dashboard, "--submission-id", job_id, "--no-wait",
                     "--runtime-env-json", json.dumps(runtime_env), "--", "python", "pipeline.py", *args],
                    token_mode=token_mode)


def jobs(head: TokenHead) -> Any:
    """The job SDK from this process, which keeps RAY_AUTH_MODE=disabled: the token goes as a header."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(head.dashboard, headers={"Authorization": f"Bearer {head.token_path.read_text()}"})


def status(head: TokenHead, job_id: str) -> str:
    return str(jobs(head).get_job_status(job_id).value)


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and '"event"' in line]


@pytest.mark.timeout(300)
def test_the_documented_submit_runs_and_stops_the_pipeline_with_token_auth(
        token_head: TokenHead, endpoint: str, unique: str, tmp_path: pathlib.Path) -> None:
    stream, table, out = f"jobtok-{unique}", f"jobtok-leases-{unique}", tmp_path / "out"
    create_stream(endpoint, stream, 1)
    payloads = publish(endpoint, stream, 20)
    args = job_args(endpoint, stream, table, out)
    refused = documented_submit(token_head, f"ka-tok-refused-{unique}", *args, token_mode=False)
    assert refused.returncode != 0, refused.stdout[-2000:]
    assert "Missing authentication token" in refused.stdout + refused.stderr, (refused.stdout + refused.stderr)[-3000:]

    job_id = f"ka-tok-{unique}"
    submitted = documented_submit(token_head, job_id, *args)
    assert submitted.returncode == 0, (submitted.stdout + submitted.stderr)[-3000:]
    wait_until(lambda: set(written(out)["payloads"]) == payloads, timeout_s=150, interval_s=0.5,
               what="every record written by the job submitted with token auth")
    assert status(token_head, job_id) == "RUNNING"
    stop = token_head.run([RAY, "job", "stop", "--address", token_head.dashboard, job_id])
    assert stop.returncode == 0, (stop.stdout + stop.stderr)[-2000:]
    wait_until(lambda: status(token_head, job_id) in TERMINAL, timeout_s=120, interval_s=0.5, what="the job to stop")
    assert status(token_head, job_id) == "STOPPED"
    log_text = jobs(token_head).get_job_logs(job_id)
    stopped = [e for e in events(log_text) if e["event"] == "stopped"]
    assert stopped and stopped[-1]["reason"] == "signal" and stopped[-1]["exit_code"] == 0, log_text[-3000:]
    assert os.environ.get("RAY_AUTH_MODE") != "token"  # this process (and its Ray) never switched mode
