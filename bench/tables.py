"""Table sinks: records/s into an Iceberg table against the DatasetSink writing Parquet (same
stream, same run), commit latency (record publish -> visible in a scan), table commits per minute,
and the duplicates in the table after 5 reader SIGKILLs and 1 instance takeover against a plain
sink's under the same faults (:mod:`bench.tables_faults`). ``python -m bench --only tables`` runs
it as a section of the main bench (into ``bench/results.json``).

One Ray runtime, the embedded emulator (Kinesis and DynamoDB), a ``DynamoLeaseStore``, an
Iceberg table in pyiceberg's SQL catalog on SQLite with a local warehouse.

* throughput: ``--records`` records of ``--record-bytes`` B over ``--shards`` shards are
  published first; each sink then drains the stream from ``TRIM_HORIZON`` (its own lease
  table); the figure is records / seconds from ``subscribe()`` returning to the last row
  visible (a scan of the table; the Parquet files' rows).
* commits per minute: the Iceberg committer's commits over that drain.
* latency: ``--rate`` records/s for ``--seconds`` s; a record is visible from the commit of the
  first snapshot whose position of its shard reaches its sequence number; p50 / p99 of (that
  snapshot's commit time - publish time).

    python -m bench.tables                 # ~3 min on 2 cores
    python -m bench.tables --records 2000 --seconds 5 --json out.json
"""

from __future__ import annotations

import os

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"), ("RAY_raylet_start_wait_time_s", "120"),
                      ("RAY_agent_register_timeout_ms", "120000")):
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from typing import Any  # noqa: E402

from .common import create_stream, percentile, wait_for  # noqa: E402


def _catalog(tmp: pathlib.Path) -> dict[str, str]:
    (tmp / "wh").mkdir(exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db", "warehouse": f"file://{tmp}/wh"}


def _iceberg_rows(sink: Any) -> Any:
    table = sink.backend().load()
    return None if table is None else table.scan(selected_fields=("data",)).to_arrow()


def _count(rows: Any) -> int:
    return 0 if rows is None else int(rows.num_rows)


def _parquet_rows(path: pathlib.Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 0
    for f in path.glob("*.parquet"):
        try:
            n += pq.read_metadata(f).num_rows
        except (pa.ArrowInvalid, OSError):  # a file still being written
            continue
    return n


def _drain(endpoint: str, stream: str, sink: Any, rows: Any, n: int, timeout_s: float) -> float:
    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt

    broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True,
                           lease_store=DynamoLeaseStore(f"bench-{uuid.uuid4().hex[:8]}", create_if_missing=True))
    with broker.connect() as c:
        sub = c.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), max_shards_per_reader=4), sink=sink)
        t0 = time.monotonic()
        if not wait_for(lambda: rows() >= n, timeout_s):
            raise TimeoutError(f"{rows()} of {n} rows after {timeout_s} s")
        elapsed = time.monotonic() - t0
        sub.close()
    return elapsed


def figures(args: argparse.Namespace, endpoint: str, tmp: pathlib.Path) -> dict[str, Any]:
    """Throughput against the DatasetSink, commits per minute and commit latency (module docstring)."""
    from kinesis_actors import DatasetSink, KinesisBroker
    from kinesis_actors.sinks import IcebergSink

    conn = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True).connect()
    stream = f"bench-tables-{uuid.uuid4().hex[:8]}"
    create_stream(endpoint, stream, args.shards)
    payload = b"x" * args.record_bytes
    pub = conn.publisher(stream)
    for i in range(0, args.records, 500):
        pub.put_many([(payload, f"k{j}") for j in range(i, min(i + 500, args.records))])
    out: dict[str, Any] = {"records": args.records, "shards": args.shards, "record_bytes": args.record_bytes}

    parquet = tmp / "parquet"
    dsink = DatasetSink(lambda ds: ds.write_parquet(str(parquet)), window_s=1.0, batch_format="pyarrow")
    out["dataset_s"] = round(_drain(endpoint, stream, dsink, lambda: _parquet_rows(parquet), args.records, 600), 2)
    dsink.close()
    isink = IcebergSink("bench.events", catalog=_catalog(tmp), commit_interval_s=1.0)
    out["iceberg_s"] = round(_drain(endpoint, stream, isink, lambda: _count(_iceberg_rows(isink)), args.records, 600),
                             2)
    stats = isink.close()
    out["dataset_records_per_s"] = round(args.records / out["dataset_s"])
    out["iceberg_records_per_s"] = round(args.records / out["iceberg_s"])
    out["iceberg_vs_dataset"] = round(out["dataset_s"] / out["iceberg_s"], 2)
    out["iceberg_commits_per_min"] = round(stats["commits"] / out["iceberg_s"] * 60, 1)
    out.update(_latency(endpoint, tmp, args))
    conn.shutdown()
    return out


def _latency(endpoint: str, tmp: pathlib.Path, args: argparse.Namespace) -> dict[str, Any]:
    """Publish at ``args.rate`` for ``args.seconds``; each record's latency is the commit time
    (the snapshot's ``timestamp-ms``) of the first snapshot whose position of its shard reaches
    its sequence number, minus its publish time (both this host's wall clock)."""
    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt
    from kinesis_actors.sinks import IcebergSink
    from kinesis_actors.sinks.tables.positions import decode_positions

    stream = f"bench-lat-{uuid.uuid4().hex[:8]}"
    create_stream(endpoint, stream, args.shards)
    sink = IcebergSink("bench.latency", catalog=_catalog(tmp), commit_interval_s=1.0)
    broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True,
                           lease_store=DynamoLeaseStore(f"bench-{uuid.uuid4().hex[:8]}", create_if_missing=True))
    sent: list[tuple[str, int, float]] = []  # shard, sequence number, publish time
    with broker.connect() as c:
        sub = c.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon()), sink=sink)
        pub = c.publisher(stream)
        for i in range(int(args.rate * args.seconds)):
            t = time.time()
            res = pub.put(f"r{i}".encode(), partition_key=f"r{i}")
            sent.append((res.shard_id, int(res.sequence_number), t))
            time.sleep(max(0.0, 1.0 / args.rate - (time.time() - t)))
        wait_for(lambda: _count(_iceberg_rows(sink)) >= len(sent), 60, interval_s=0.5)  # or score those seen
        sub.close()
    table = sink.backend().load()
    sink.close()
    commits = []  # (commit time, {shard: sequence number}), oldest first
    for snap in sorted(table.snapshots(), key=lambda s: s.timestamp_ms):
        positions = decode_positions(snap.summary.additional_properties if snap.summary else {})
        commits.append((snap.timestamp_ms / 1000, {k.shard_id: int(p.sequence_number)
                                                   for k, p in positions.items() if p.sequence_number}))
    lat = []
    for shard, seq, t in sent:
        done = next((ct for ct, pos in commits if pos.get(shard, -1) >= seq), None)
        if done is not None:
            lat.append(done - t)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    if p50 is None or p99 is None:
        return {"latency_records": 0}
    return {"latency_records": len(lat), "latency_p50_s": round(p50, 2), "latency_p99_s": round(p99, 2)}


S = "tables"


def run(ctx: Any, res: Any) -> None:
    """The ``tables`` section of ``python -m bench`` (its emulator and Ray; params ``tables_*``)."""
    from .tables_faults import TIMINGS, duplicates

    p = ctx.params
    args = argparse.Namespace(records=p["tables_records"], record_bytes=1024, shards=4, rate=p["tables_rate"],
                              seconds=p["tables_seconds"])
    with tempfile.TemporaryDirectory() as tmp:
        got = figures(args, ctx.endpoint, pathlib.Path(tmp))
        faults = duplicates(ctx, pathlib.Path(tmp) / "faults", kills=p["tables_kills"])
    drain = f"{args.records} records of 1 KiB over 4 shards drained from TRIM_HORIZON, commit_interval_s=1"
    res.add(S, "iceberg_records_per_s", got["iceberg_records_per_s"], "records/s", anchor="dataset_sink_records_per_s",
            anchor_value=got["dataset_records_per_s"], goal=">= 0.8x", check=lambda v: v >= 0.8 * got["dataset_records_per_s"],
            note=f"IcebergSink (SQL catalog on SQLite) vs DatasetSink writing Parquet, same stream; {drain}")
    res.add(S, "iceberg_commits_per_min_4_shards", got["iceberg_commits_per_min"], "commits/min", goal="<= 60",
            check=lambda v: v <= 60, note=drain)
    for q, extra in (("p50", 1.0), ("p99", 3.0)):
        res.add(S, f"iceberg_commit_latency_{q}_s", got.get(f"latency_{q}_s"), "s", goal=f"<= {1.0 + extra:g} s",
                check=lambda v, b=1.0 + extra: v <= b,
                note=f"publish -> the snapshot whose position reaches the record; {args.rate:g} records/s for "
                     f"{args.seconds:g} s, {got.get('latency_records')} records")
    plain = faults["plain"]
    setting = (f"{p['tables_kills']} reader SIGKILLs, then the victim instance's driver SIGKILLed and the survivor "
               f"taking every shard; 4 shards, ~200 records/s, lease {TIMINGS['lease_duration_s']:g} s, "
               f"renew {TIMINGS['renew_interval_s']:g} s")
    for kind, fig in faults.items():
        res.add(S, f"{kind}_duplicates_after_faults", fig["duplicates"], "records",
                anchor=None if kind == "plain" else "plain_duplicates_after_faults",
                anchor_value=None if kind == "plain" else plain["duplicates"],
                goal="0" if kind == "iceberg" else None, check=(lambda v: v == 0) if kind == "iceberg" else None,
                note=f"{fig['published']} published, {fig['distinct']} distinct held, {fig['lost']} lost, takeover "
                     f"{fig['takeover_s']} s; {setting}")
        res.add(S, f"{kind}_lost_after_faults", fig["lost"], "records", goal="0", check=lambda v: v == 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--kills", type=int, default=5, help="reader SIGKILLs before the takeover (0: no fault run)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    import ray

    from kinesis_actors.emulator import Emulator

    with Emulator() as emu, tempfile.TemporaryDirectory() as tmp:
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1")
        try:
            got = figures(args, emu.endpoint, pathlib.Path(tmp))
            if args.kills:
                from .tables_faults import duplicates

                ctx = argparse.Namespace(endpoint=emu.endpoint, children=[], log=lambda msg: print(msg, flush=True))
                for kind, fig in duplicates(ctx, pathlib.Path(tmp) / "faults", kills=args.kills).items():
                    got.update({f"{kind}_{k}": v for k, v in fig.items()})
        finally:
            ray.shutdown()
    got["load_average"] = round(os.getloadavg()[0], 1)
    for key, value in got.items():
        print(f"{key:>26}: {value}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(got, fh, indent=2)


if __name__ == "__main__":
    main()
