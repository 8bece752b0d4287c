"""One worker of ours in a child process: its own Ray job in the benchmark's cluster.

``python -m bench._ours_worker --address GCS --sink NAME --namespace NS ...`` joins the
cluster, connects a broker with a ``DynamoLeaseStore`` (the table shared with the other
worker of the application), subscribes from TRIM_HORIZON into the sink actor the benchmark
made (a named actor of the benchmark's job, so its delivery log outlives this process) and
prints JSON lines on stdout, each with ``ts`` (epoch s): ``ray_up`` (``ray.init`` returned),
``start`` (just before ``connect()``), ``subscribed`` (``subscribe()`` returned), ``status``
(every ``--status-every`` s: the shards ``Subscription.leases()`` holds), and on SIGTERM
``close_begin`` / ``close_end`` (``Subscription.close()``: checkpoint, release). A SIGKILL is the
crash: Ray then ends this job's Coordinator and readers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")):
    os.environ.setdefault(_name, _value)


def emit(event: str, **kw: object) -> None:
    sys.stdout.write(json.dumps({"event": event, "ts": time.time(), **kw}) + "\n")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--address", "--endpoint", "--table", "--stream", "--owner", "--sink", "--namespace"):
        ap.add_argument(name, required=True)
    ap.add_argument("--lease-duration", type=float, default=10.0)
    ap.add_argument("--renew-interval", type=float, default=3.0)
    ap.add_argument("--poll-interval", type=float, default=2.0)
    ap.add_argument("--status-every", type=float, default=0.5)
    a = ap.parse_args()

    import ray

    ray.init(address=a.address, namespace=a.namespace, configure_logging=False, log_to_driver=False)
    emit("ray_up", pid=os.getpid())
    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt

    sink = ray.get_actor(a.sink, namespace=a.namespace)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    emit("start")
    conn = KinesisBroker(endpoint=a.endpoint, region="us-east-1", test_credentials=True,
                         lease_store=DynamoLeaseStore(a.table, create_if_missing=True), owner_id=a.owner,
                         lease_duration_s=a.lease_duration, renew_interval_s=a.renew_interval).connect()
    stream = KinesisStream(a.stream, start_at=StartAt.trim_horizon(), lease_poll_interval_s=a.poll_interval)
    sub = conn.subscribe(stream, sink=sink)
    emit("subscribed")
    while not stop.wait(a.status_every):
        try:
            held = sorted(lease.shard_id for lease in sub.leases())
        except Exception as e:
            emit("status_error", error=repr(e)[:200])
            continue
        emit("status", held=held)
    emit("close_begin")
    t = time.time()
    sub.close()
    emit("close_end", took_s=time.time() - t)
    conn.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
