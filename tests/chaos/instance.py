"""One instance of the chaos suite in its own driver process with its OWN local Ray.

``python -m tests.chaos.instance --endpoint URL --table T --stream S --owner A --out FILE ...``

Starts a new local Ray (``address="local"``: never the suite's cluster), a FileSink actor
and one subscription sharing the DynamoDB lease table ``T`` with the other instances.
The sink appends ``n shard sequence_number epoch_s`` per record and flushes before it
returns, so every acknowledged record is on disk even if the process tree is SIGKILLed.
With ``--iceberg DIR`` the sink is an IcebergSink on the SQL catalog (SQLite) under ``DIR``
instead (every instance given the same ``DIR`` writes one table); with ``--delta DIR`` a
DeltaSink on the local filesystem under ``DIR`` (likewise one table). A table sink's last
counters go to ``FILE.stats.json`` at the close.
Prints ``READY <json shard ids>`` once it holds ``--expect`` leases; SIGTERM closes it
cleanly (checkpoint, release) and exits 0.
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


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--endpoint", "--table", "--stream", "--owner", "--out"):
        ap.add_argument(name, required=True)
    ap.add_argument("--expect", type=int, default=1, help="leases to hold before printing READY")
    ap.add_argument("--max-leases", type=int, default=None)
    ap.add_argument("--max-leases-to-steal", type=int, default=1)
    ap.add_argument("--lease-duration", type=float, default=10.0)
    ap.add_argument("--renew-interval", type=float, default=3.0)
    ap.add_argument("--poll-interval", type=float, default=2.0)
    ap.add_argument("--iceberg", default=None, help="write to an IcebergSink with its SQLite catalog in this directory")
    ap.add_argument("--delta", default=None, help="write to a DeltaSink with its table in this directory")
    ap.add_argument("--commit-interval", type=float, default=2.0, help="the table sink's commit_interval_s")
    ap.add_argument("--call-log", default=None, help="a FaultInjector directory (no rules): logs every AWS call")
    a = ap.parse_args()

    import ray

    for attempt in (1, 2, 3):  # a loaded 2-core machine sometimes times Ray's start out (its raylet's 30 s)
        try:
            ray.init(address="local", num_cpus=1, include_dashboard=False, configure_logging=False,
                     log_to_driver=False)
            break
        except Exception as e:
            if attempt == 3:
                raise
            print(f"ray.init failed ({e!r:.120}); retrying", file=sys.stderr, flush=True)
            ray.shutdown()
    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
    from kinesis_actors.testing import FaultInjector, with_faults

    @ray.remote(num_cpus=0)
    class FileSink:
        def __init__(self, path: str) -> None:
            self.f = open(path, "a", buffering=1)  # noqa: SIM115 - open for the actor's life, closed with it

        def process_batch(self, records: list) -> None:
            now = time.time()
            self.f.write("".join(f"{int(r.data)} {r.shard_id} {r.sequence_number} {now:.6f}\n" for r in records))
            self.f.flush()

    table_dir, kind = (a.iceberg, "iceberg") if a.iceberg else (a.delta, "delta")
    if table_dir:
        from pathlib import Path

        from .tables import table_sink

        sink = table_sink(kind, Path(table_dir), a.commit_interval)
    else:
        sink = FileSink.remote(a.out)
    broker = KinesisBroker(endpoint=a.endpoint, region="us-east-1", test_credentials=True,
                           lease_store=DynamoLeaseStore(a.table, create_if_missing=True), owner_id=a.owner,
                           lease_duration_s=a.lease_duration, renew_interval_s=a.renew_interval)
    if a.call_log:
        with_faults(broker, FaultInjector(a.call_log), lease_store=True)
    conn = broker.connect()
    sub = conn.subscribe(KinesisStream(a.stream, start_at=StartAt.trim_horizon(), max_leases=a.max_leases,
                                       max_leases_to_steal=a.max_leases_to_steal,
                                       lease_poll_interval_s=a.poll_interval), sink=sink)
    deadline = time.monotonic() + 60
    held: list[str] = []
    while time.monotonic() < deadline:
        held = sorted(lease.shard_id for lease in sub.leases())
        if len(held) >= a.expect:
            break
        time.sleep(0.1)
    print("READY " + json.dumps(held), flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    sub.close()
    if table_dir:
        with open(f"{a.out}.stats.json", "w") as f:
            json.dump(sink.close(), f, default=str)
    conn.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
