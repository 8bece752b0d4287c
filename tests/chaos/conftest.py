"""Chaos suite fixtures: a multi-node Ray cluster on this machine and the results file.

Run on its own (``make test-chaos``): ``ray.cluster_utils.Cluster`` cannot share a driver
with another Ray session, so this directory is left out of any other pytest run.

Cluster: a head node (custom resource ``head``: the Coordinators and sinks) and two
worker nodes (``readers``: the ShardReaders), all on 127.0.0.1, with fast node health
checks (a SIGKILLed node is declared dead in ~3-5 s instead of 15 s; shared/ENVIRONMENT.md).
A scenario that removes a worker node adds a fresh one afterwards.

Results: every scenario's verdict goes to ``KA_CHAOS_RESULTS`` (default
``build/chaos.json``, untracked). ``python -m bench.report --chaos build/chaos.json``
prints it; ``KA_CHAOS_RESULTS=bench/chaos.json make test-chaos`` refreshes the figures
the repository keeps and the README shows.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from collections.abc import Iterator
from typing import Any

import pytest

_STARTED = time.time()  # conftest import: the start of the chaos session
HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 5, "health_check_timeout_ms": 1000}
RESULTS = os.environ.get("KA_CHAOS_RESULTS") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build", "chaos.json")


class ChaosCluster:
    """The suite's Ray cluster: ``head`` plus worker nodes offering the ``readers`` resource."""

    def __init__(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "resources": {"head": 100}, "include_dashboard": False,
            "_system_config": HEALTH_CHECKS})
        self.workers: list[Any] = []
        for _ in range(2):
            self.add_reader_node()
        ray.init(address=self.cluster.address, configure_logging=False, log_to_driver=False)
        self.cluster.wait_for_nodes()

    def add_reader_node(self) -> Any:
        node = self.cluster.add_node(num_cpus=1, resources={"readers": 100})
        self.workers.append(node)
        return node

    def remove(self, node: Any, *, graceful: bool) -> None:
        self.workers.remove(node)
        self.cluster.remove_node(node, allow_graceful=graceful)

    def restore(self) -> None:
        """Back to two reader nodes (after a scenario removed one), and wait until the
        scheduler sees both (SPREAD right after a node joins may not place anything on it)."""
        import ray

        from ..integration.helpers import wait_until

        while len(self.workers) < 2:
            self.add_reader_node()
        self.cluster.wait_for_nodes()
        wait_until(lambda: ray.available_resources().get("readers", 0) >= 199, timeout_s=30,
                   what="both reader nodes schedulable")

    def node_ids(self) -> list[str]:
        return [n.node_id for n in self.workers]

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="session")
def chaos_cluster() -> Iterator[ChaosCluster]:
    import ray

    if ray.is_initialized():
        pytest.fail("the chaos suite needs its own pytest run (make test-chaos): Ray is already initialised here")
    cluster = ChaosCluster()
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="session")
def chaos_results() -> Iterator[dict[str, Any]]:
    """Scenario name -> its verdict and figures; written to ``RESULTS`` at the end of the session."""
    import boto3
    import moto
    import ray

    from .harness import write_json

    scenarios: dict[str, Any] = {}
    yield scenarios
    if not scenarios:
        return
    os.makedirs(os.path.dirname(os.path.abspath(RESULTS)), exist_ok=True)
    write_json(RESULTS, {
        "date": dt.date.today().isoformat(),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "ray": ray.__version__,
                    "boto3": boto3.__version__, "moto": moto.__version__},
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "session_s": round(time.time() - _STARTED, 1),
        "command": os.environ.get("KA_CHAOS_COMMAND", "pytest tests/chaos"),
        "cluster": "ray.cluster_utils.Cluster: head (Coordinators, sinks) + 2 worker nodes (ShardReaders), 127.0.0.1",
        "health_checks": HEALTH_CHECKS,
        "scenarios": scenarios,
    })
