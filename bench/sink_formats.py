"""Dataset sink ``batch_format``: Record objects vs a pyarrow Table through the object store.

Measures one reader -> sink hop as the Dataset sink does it: with ``"records"`` the
reader passes its ``list[Record]`` and the sink actor converts it to Arrow; with
``"pyarrow"`` the reader converts first and passes the Table. The figure is the wall
time per batch (caller's conversion + actor call + sink's conversion), median of
``--reps`` runs, for batches of 1,000 and 10,000 records of 100 B and 1 KB.

    python -m bench.sink_formats            # ~30 s on 2 cores
    python -m bench.sink_formats --reps 3 --json out.json
"""

from __future__ import annotations

import os

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0"),
                      ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")):
    os.environ.setdefault(_name, _value)

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402

from kinesis_actors.arrow import records_to_table  # noqa: E402
from kinesis_actors.records import Record  # noqa: E402


@ray.remote(num_cpus=0)
class _Sink:
    def take(self, batch: Any) -> int:
        import pyarrow as pa

        table = batch if isinstance(batch, pa.Table) else records_to_table(batch)
        return table.num_rows


def _batch(n: int, size: int) -> list[Record]:
    when = dt.datetime.now(dt.timezone.utc)
    payload = os.urandom(size)
    return [Record(payload, f"key-{i}", str(10**20 + i), None, when, "shardId-000000000000", "bench")
            for i in range(n)]


def run(reps: int) -> list[dict[str, Any]]:
    sink = _Sink.remote()
    ray.get(sink.take.remote(records_to_table(_batch(10, 10))))  # warm up
    out = []
    for n, size in ((1_000, 100), (1_000, 1024), (10_000, 100), (10_000, 1024)):
        records = _batch(n, size)
        row: dict[str, Any] = {"records": n, "record_bytes": size}
        for fmt in ("records", "pyarrow"):
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                arg = records if fmt == "records" else records_to_table(records)
                assert ray.get(sink.take.remote(arg)) == n
                times.append(time.perf_counter() - t0)
            row[f"{fmt}_ms"] = round(statistics.median(times) * 1000, 2)
        row["ratio"] = round(row["records_ms"] / row["pyarrow_ms"], 2)
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        rows = run(args.reps)
    finally:
        ray.shutdown()
    print(f"{'records':>8} {'bytes':>6} {'records ms':>11} {'pyarrow ms':>11} {'ratio':>6}")
    for r in rows:
        print(f"{r['records']:>8} {r['record_bytes']:>6} {r['records_ms']:>11} {r['pyarrow_ms']:>11} {r['ratio']:>6}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
