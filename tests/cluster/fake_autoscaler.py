"""A Ray head with Ray's own autoscaler on its fake multi-node provider, for the autoscaling tests.

``ray start --head --autoscaling-config=FILE`` with ``RAY_FAKE_CLUSTER=1`` and the provider type
``fake_multinode``: the autoscaler starts and stops worker "nodes" (raylets on this machine) as a
cloud provider would start machines. The config is written here (the pip wheel lacks Ray's
``fake_multi_node/example.yaml``) with ``provider.gcs_address`` set, since the fake provider
otherwise assumes the GCS on port 6379. The head runs in a new session: the autoscaler starts the
fake nodes, so their PIDs are not known here; :meth:`FakeAutoscalingHead.stop` ends every process
of that session (and of its temp dir), never with ``ray stop``, which would stop every Ray on the
machine.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import psutil

from .processes import cluster_processes, end_processes, free_ports

RAY = str(pathlib.Path(sys.executable).with_name("ray"))
WORKER_TYPE = "ray.worker.reader"


def cluster_config(gcs_address: str, *, worker_resources: dict[str, float], max_workers: int = 1,
                   idle_timeout_minutes: float = 0.2) -> dict[str, Any]:
    """The autoscaler config: a head without ``worker_resources``' custom resource, one worker type with it."""
    return {
        "cluster_name": "ka-fake",
        "max_workers": max_workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 2}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {"resources": dict(worker_resources), "node_config": {}, "min_workers": 0,
                          "max_workers": max_workers},
        },
        "head_node_type": "ray.head.default",
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


class FakeAutoscalingHead:
    """A head node whose autoscaler adds nodes with ``worker_resources`` on demand."""

    def __init__(self, *, worker_resources: dict[str, float], max_workers: int = 1) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="ka-as-", dir="/tmp")  # short: socket paths are limited
        gcs, dash, agent, agent_grpc, rt_agent, metrics, client, nm, om = free_ports(9)
        self.address = f"127.0.0.1:{gcs}"
        self.config_path = pathlib.Path(self.temp_dir) / "autoscaler.json"
        self.config_path.write_text(json.dumps(cluster_config(self.address, worker_resources=worker_resources,
                                                              max_workers=max_workers)))
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_TMPDIR": self.temp_dir, "RAY_FAKE_CLUSTER": "1",
                    "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        self.env.pop("RAY_ADDRESS", None)
        self.command = [RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                        f"--autoscaling-config={self.config_path}", "--include-dashboard=false",
                        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
                        f"--runtime-env-agent-port={rt_agent}", f"--metrics-export-port={metrics}",
                        f"--ray-client-server-port={client}", f"--node-manager-port={nm}",
                        f"--object-manager-port={om}", "--num-cpus=2", f"--temp-dir={self.temp_dir}",
                        "--disable-usage-stats"]
        del dash
        self.session: int | None = None

    def start(self) -> FakeAutoscalingHead:
        proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        self.session = proc.pid  # the session leader's pid is the session id
        out, _ = proc.communicate(timeout=180)
        if proc.returncode != 0:
            self.stop()
            raise AssertionError(f"ray start failed ({proc.returncode}):\n{out[-4000:]}")
        return self

    def run_driver(self, source: str, *, timeout_s: float = 150) -> dict[str, Any]:
        """Run ``source`` as a driver script connected to this cluster (``ADDRESS`` is defined);
        returns the JSON object of its last output line."""
        script = f"ADDRESS = {self.address!r}\n" + source
        env = {**self.env, "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).resolve().parents[2]),
                                                          self.env.get("PYTHONPATH", "")])}
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                timeout=timeout_s)
        lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
        assert result.returncode == 0 and lines, f"driver failed ({result.returncode}):\n{result.stdout[-3000:]}\n" \
                                                 f"{result.stderr[-4000:]}"
        return dict(json.loads(lines[-1]))

    def processes(self) -> list[psutil.Process]:
        """Every process of the head's session, or naming its temp dir (and their children)."""
        return cluster_processes(temp_dir=self.temp_dir, session=self.session)

    def stop(self) -> None:
        """End every process of this cluster (SIGTERM, then SIGKILL after 5 s); remove its temp dir."""
        for _ in range(2):  # a node the autoscaler was starting may appear meanwhile
            end_processes(self.processes())
        shutil.rmtree(self.temp_dir, ignore_errors=True)
