"""One instance in a child process (the victim of the process-level failover run).

``python -m bench._instance --address GCS ...`` joins the benchmark's Ray cluster as its
own Ray job (its own driver, Coordinator, readers and sink), subscribes with a
DynamoDB lease table shared with the survivor, prints ``READY <json shard ids>`` once
it holds its leases, then waits to be SIGKILLed (Ray then kills the job's actors).
With ``--iceberg JSON`` (``{"table": ..., "catalog": {...}}``) its sink is an IcebergSink on that
table; with ``--sink-actor NAME`` the named actor (namespace ``bench``) of another job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")):
    os.environ.setdefault(_name, _value)


HERE = os.path.dirname(os.path.abspath(__file__))


def spawn(address: str, endpoint: str, table: str, stream: str, owner: str, max_leases: int,
          timings: Mapping[str, float], extra: Sequence[str] = ()) -> subprocess.Popen[str]:
    """Start ``python -m bench._instance`` in a child process (stdout piped for :func:`await_ready`).

    Args:
        address: the Ray cluster's GCS address. endpoint: the emulator's URL. table: the DynamoDB
        lease table. timings: ``lease_duration_s``, ``renew_interval_s``, ``lease_poll_interval_s``
        (seconds). extra: more of this module's arguments (``--iceberg``, ``--trim-horizon``, ...).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "bench._instance", "--address", address, "--endpoint", endpoint, "--table", table,
           "--stream", stream, "--owner", owner, "--max-leases", str(max_leases),
           "--lease-duration", str(timings["lease_duration_s"]), "--renew-interval", str(timings["renew_interval_s"]),
           "--poll-interval", str(timings["lease_poll_interval_s"]), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            cwd=os.path.dirname(HERE))


def await_ready(child: subprocess.Popen[str]) -> list[str]:
    """The shard ids the child instance holds, from its ``READY`` line (it prints one within ~30 s
    of subscribing).

    Raises:
        RuntimeError: the child exited before its ``READY`` line.
    """
    line = ""
    while not line.startswith("READY"):
        line = child.stdout.readline()  # type: ignore[union-attr]
        if not line and child.poll() is not None:
            raise RuntimeError(f"the child instance exited {child.returncode} before READY")
    held: list[str] = json.loads(line.split(" ", 1)[1])
    return held


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--address", "--endpoint", "--table", "--stream", "--owner"):
        ap.add_argument(name, required=True)
    ap.add_argument("--max-leases", type=int, default=2)
    ap.add_argument("--lease-duration", type=float, default=10.0)
    ap.add_argument("--renew-interval", type=float, default=3.0)
    ap.add_argument("--poll-interval", type=float, default=2.0)
    ap.add_argument("--iceberg", default=None, help='an IcebergSink: {"table": NAME, "catalog": {...}, ...}')
    ap.add_argument("--sink-actor", default=None, help="a named sink actor in namespace bench")
    ap.add_argument("--trim-horizon", action="store_true", help="start_at=TRIM_HORIZON (default LATEST)")
    a = ap.parse_args()

    import ray

    ray.init(address=a.address, namespace="bench", configure_logging=False, log_to_driver=False)
    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt

    from .actors import TimedSink

    if a.iceberg:
        from kinesis_actors.sinks import IcebergSink

        sink = IcebergSink(**json.loads(a.iceberg))
    elif a.sink_actor:
        sink = ray.get_actor(a.sink_actor, namespace="bench")
    else:
        sink = TimedSink.remote()
    conn = KinesisBroker(endpoint=a.endpoint, region="us-east-1", test_credentials=True,
                         lease_store=DynamoLeaseStore(a.table, create_if_missing=True), owner_id=a.owner,
                         lease_duration_s=a.lease_duration, renew_interval_s=a.renew_interval).connect()
    start = {"start_at": StartAt.trim_horizon()} if a.trim_horizon else {}
    sub = conn.subscribe(KinesisStream(a.stream, max_leases=a.max_leases, lease_poll_interval_s=a.poll_interval,
                                       **start), sink=sink)
    deadline = time.monotonic() + 30
    held: list[str] = []
    while time.monotonic() < deadline:
        held = sorted(lease.shard_id for lease in sub.leases())
        if len(held) >= a.max_leases:
            break
        time.sleep(0.1)
    print("READY " + json.dumps(held), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
