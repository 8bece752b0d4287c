"""``ray job submit`` entrypoint: read a Kinesis stream with leases in DynamoDB, write windows to a sink.

Run on a Ray cluster (the job's ``working_dir`` is this directory)::

    ray job submit --address http://HEAD:8265 \\
      --runtime-env-json '{"working_dir": "cluster",
                           "env_vars": {"KA_OWNER_ID": "orders-pipeline", "RAY_JOB_STOP_WAIT_TIME_S": "60"}}' \\
      -- python pipeline.py --stream orders --lease-table orders-leases --region us-east-1 \\
                            --sink parquet:s3://example-bucket/orders/ --start-at trim_horizon

(the command of cluster/README.md, its JSON wrapped; the package must be installed on the nodes, or add
``"py_modules"`` or ``"pip": ["kinesis-actors"]`` to the runtime env).

Every flag has an environment variable (``KA_STREAM``, ``KA_LEASE_TABLE``, ``KA_SINK``...,
see ``--help``); a flag wins over its variable. Credentials come from the node (an EC2
instance profile, EKS IRSA or pod identity) through boto3's default chain: never pass
keys on the command line or in files. ``--test-credentials`` is for emulators only.

Instances of this job (on one cluster or several) split the stream's shards through the
lease table; each instance needs its own ``--owner-id`` (default: host name + random). Keep
it the same across submissions (``KA_OWNER_ID``): a resubmitted job then takes its own
leases back at once instead of waiting for them to expire.

``--fanout CONSUMER_NAME`` (``KA_FANOUT``) reads with enhanced fan-out through the stream
consumer of that name (registered on the first run, reused after; never deregistered by
the job): the IAM policy's two ``EnhancedFanOut`` statements are then needed.

Sizing (docs/production.md, "Sizing"; the same rule as ``--help`` and cluster/README.md): a
shard costs ``c = MB/s per shard × m + requests/s per shard × 0.001`` cores (``m``: the steady CPU
seconds per MB docs/production.md gives from the latest bench run; about 1 ms of CPU per ``GetRecords``
or lease-table write); keep ``shards per reader × c <= 0.5`` and
give the readers ``N × c`` cores. Load placement (``reader_target_cpu``) moves hot shards
between readers by itself; ``--max-shards-per-reader`` stays a cap.
Sizing knobs: ``--max-shards-per-reader``,
``--reader-num-cpus`` (readers default to ``num_cpus=0``; set it so Ray places no more
readers on a node than it has cores), ``--min-checkpoint-interval-s``,
``--lease-poll-interval-s``; unset, each is the library's default. ``--kcl-application APP``
(``KA_KCL_APPLICATION``) uses the existing lease table of a KCL application instead of
``--lease-table`` (:class:`~kinesis_actors.KclLeaseStore`): it takes over the table of a
STOPPED KCL fleet (each shard resumes after KCL's checkpoint) and hands it back to a KCL
fleet started after this job stops; a KCL worker still renewing leases in the table fails
the job with :class:`~kinesis_actors.KclFleetLiveError` (stop the KCL fleet first).

``--sink iceberg:<namespace.table>`` (with ``--iceberg-catalog``, the catalog's properties as
JSON: every process loads it as ``pyiceberg.catalog.load_catalog("default", **catalog)``) or
``--sink delta:<path or URI>`` writes every record exactly once into that table
(:class:`~kinesis_actors.sinks.IcebergSink` / :class:`~kinesis_actors.sinks.DeltaSink`, one
commit every ``--commit-interval-s``; the ``tables`` extra). Otherwise
the sink is a :class:`~kinesis_actors.DatasetSink`: every ``--window-s`` seconds (or
``--window-records`` records) the records gathered from the readers become a
``ray.data.Dataset`` written as Parquet under the sink's path (local, ``s3://``...);
checkpoints advance only after the window's files are written. ``--sink null`` only
counts (for smoke tests).

It stops on SIGTERM or SIGINT (``ray job stop``: set ``RAY_JOB_STOP_WAIT_TIME_S`` in
the job's ``env_vars`` above ``--close-timeout-s`` plus about 10 s; Ray's default is 3 s),
after ``--max-records`` records were written, or after ``--duration-s``. The stop, in
order:

1. The subscription closes within ``--close-timeout-s`` (15 s): the sink writes its open
   window at once (not at the end of ``--window-s``), the readers' batches in it are
   acknowledged and checkpointed, and then the readers release their leases, so the next
   instance, or this job submitted again, resumes after those records and writes none of
   them twice. A window the sink could not write in time (its recent writes took longer
   than the time left) is dropped unwritten instead: not checkpointed, it is read again,
   once, by the next owner.
2. The sink's actor stops; it writes nothing more.
3. The connection shuts down and the job exits 0.

So a stop loses nothing and writes nothing twice, unless a window's Parquet write that
started in time runs past the deadline (its records are then written and read again:
at-least-once). It prints one JSON object per line: ``started``, ``progress`` (every
``--progress-s``) and ``stopped`` with the totals (``records_written``,
``records_dropped``: dropped unwritten at the stop, read again by the next owner).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("kinesis_actors.pipeline")

for _name, _value in (("RAY_AUTH_MODE", "disabled"), ("RAY_USAGE_STATS_ENABLED", "0")):
    os.environ.setdefault(_name, _value)


@dataclasses.dataclass(frozen=True)
class Config:
    """The job's settings (flags, else ``KA_*`` environment variables, else defaults)."""

    stream: str
    lease_table: str
    sink: str = "null"
    endpoint: str | None = None
    region: str | None = None
    test_credentials: bool = False
    owner_id: str | None = None
    start_at: str = "latest"
    create_lease_table: bool = False
    window_s: float = 10.0
    window_records: int = 100_000
    batch_format: str = "pyarrow"
    max_records: int = 0
    duration_s: float = 0.0
    progress_s: float = 5.0
    lease_duration_s: float = 10.0
    renew_interval_s: float = 3.0
    fanout: str | None = None
    kcl_application: str | None = None
    max_shards_per_reader: int | None = None
    min_checkpoint_interval_s: float | None = None
    lease_poll_interval_s: float | None = None
    reader_num_cpus: float | None = None
    close_timeout_s: float = 15.0
    iceberg_catalog: str | None = None
    commit_interval_s: float = 10.0


_ENV = {"stream": "KA_STREAM", "lease_table": "KA_LEASE_TABLE", "sink": "KA_SINK", "endpoint": "KA_ENDPOINT",
        "region": "KA_REGION", "test_credentials": "KA_TEST_CREDENTIALS", "owner_id": "KA_OWNER_ID",
        "start_at": "KA_START_AT", "create_lease_table": "KA_CREATE_LEASE_TABLE", "window_s": "KA_WINDOW_S",
        "window_records": "KA_WINDOW_RECORDS", "batch_format": "KA_BATCH_FORMAT", "max_records": "KA_MAX_RECORDS",
        "duration_s": "KA_DURATION_S", "progress_s": "KA_PROGRESS_S", "lease_duration_s": "KA_LEASE_DURATION_S",
        "renew_interval_s": "KA_RENEW_INTERVAL_S", "fanout": "KA_FANOUT",
        "kcl_application": "KA_KCL_APPLICATION", "max_shards_per_reader": "KA_MAX_SHARDS_PER_READER",
        "min_checkpoint_interval_s": "KA_MIN_CHECKPOINT_INTERVAL_S",
        "lease_poll_interval_s": "KA_LEASE_POLL_INTERVAL_S", "reader_num_cpus": "KA_READER_NUM_CPUS",
        "close_timeout_s": "KA_CLOSE_TIMEOUT_S", "iceberg_catalog": "KA_ICEBERG_CATALOG",
        "commit_interval_s": "KA_COMMIT_INTERVAL_S"}

# The KinesisStream knobs the job passes on only when set (unset: the library's own default).
_STREAM_KNOBS = ("max_shards_per_reader", "min_checkpoint_interval_s", "lease_poll_interval_s")


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def parse_args(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> Config:
    """Flags over ``KA_*`` environment variables over defaults."""
    env = os.environ if environ is None else environ
    defaults = Config(stream="", lease_table="")
    parser = argparse.ArgumentParser(prog="pipeline.py", description=__doc__.split("\n\n")[0])

    def option(name: str, kind: Callable[[str], Any], help_: str, **kw: Any) -> None:
        var = _ENV[name]
        default = kind(env[var]) if var in env else getattr(defaults, name)
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                            help=f"{help_} (env {var}; default {default!r})", **kw)

    option("stream", str, "Kinesis stream to read")
    option("lease_table", str, "DynamoDB lease table (this library's layout)")
    option("kcl_application", str, "instead of --lease-table: take over the existing lease table (named after "
           "it) of KCL application APP whose fleet is STOPPED, and hand it back to a KCL fleet started after this "
           "job stops (KclLeaseStore; each shard resumes after the other side's checkpoint). A live mix is refused: "
           "a KCL worker renewing leases in the table fails the job with KclFleetLiveError", metavar="APP")
    option("sink", str, "parquet:<path or s3:// URI>, iceberg:<namespace.table>, delta:<path or URI>, or null")
    option("iceberg_catalog", str, "with --sink iceberg: the catalog's properties as JSON", metavar="JSON")
    option("commit_interval_s", float, "with --sink iceberg or delta: seconds between table commits")
    option("endpoint", str, "endpoint URL (an emulator); unset for AWS")
    option("region", str, "AWS region (else AWS_REGION / the default chain)")
    option("owner_id", str, "lease owner id of this instance")
    option("start_at", str, "where a shard without checkpoint opens: latest, trim_horizon, or an ISO-8601 time")
    option("window_s", float, "seconds per sink window")
    option("window_records", int, "records per sink window at most")
    option("batch_format", str, "records or pyarrow (cheaper through the object store)")
    option("max_records", int, "stop after this many records were written (0: run until stopped)")
    option("duration_s", float, "stop after this many seconds (0: run until stopped)")
    option("progress_s", float, "seconds between progress lines")
    option("close_timeout_s", float, "deadline of the subscription's close at a stop, seconds (keep "
           "RAY_JOB_STOP_WAIT_TIME_S above it)")
    option("lease_duration_s", float, "lease duration, seconds")
    option("renew_interval_s", float, "lease renewal interval, seconds")
    option("fanout", str, "read with enhanced fan-out through this stream consumer name (SubscribeToShard)",
           metavar="CONSUMER_NAME")
    option("max_shards_per_reader", int, "most shard leases per ShardReader process (unset: the library's 128). "
           "Sizing rule (docs/production.md, 'Sizing'): a shard costs c = MB/s per shard × m + requests/s per "
           "shard × 0.001 cores (m: the steady CPU s per MB that docs/production.md gives from the latest "
           "bench run; about 1 ms of CPU per GetRecords or lease-table write: up to 5 GetRecords/s on a busy "
           "shard, 1 renewal per renew interval, plus a checkpoint per batch with --min-checkpoint-interval-s 0); "
           "keep shards per reader × c <= 0.5 and give the readers N × c cores. With load placement "
           "(reader_target_cpu, on by default) a reader above its CPU target hands its hottest shard on by itself, "
           "so this is only a cap")
    option("min_checkpoint_interval_s", float, "shortest time between two checkpoint writes of a shard, seconds "
           "(unset: the library's default; 0: one write per acknowledged batch)")
    option("lease_poll_interval_s", float, "seconds between the Coordinator's lease-table scans (unset: 2)")
    option("reader_num_cpus", float, "num_cpus of each ShardReader actor (unset: 0), so Ray places at most "
           "cores / this many readers per node")
    for name, help_ in (("test_credentials", "fixed dummy keys, for emulators only"),
                        ("create_lease_table", "create the lease table if missing (needs dynamodb:CreateTable)")):
        var = _ENV[name]
        parser.add_argument("--" + name.replace("_", "-"), action="store_true",
                            default=_bool(env.get(var, "0")), help=f"{help_} (env {var}=1)")
    args = parser.parse_args(argv)
    if not args.stream or not (args.lease_table or args.kcl_application):
        parser.error("--stream and --lease-table or --kcl-application (or KA_STREAM and KA_LEASE_TABLE or "
                     "KA_KCL_APPLICATION) are required")
    if args.lease_table and args.kcl_application:
        parser.error("give --lease-table or --kcl-application, not both")
    if args.kcl_application and args.create_lease_table:
        parser.error("--create-lease-table does not apply to --kcl-application (a KCL table must exist)")
    if not args.close_timeout_s > 0:
        parser.error(f"--close-timeout-s must be > 0, got {args.close_timeout_s!r}")
    if args.sink != "null" and args.sink.split(":", 1)[0] not in ("parquet", "iceberg", "delta"):
        parser.error(f"--sink must be parquet:<path>, iceberg:<namespace.table>, delta:<path> or null, "
                     f"got {args.sink!r}")
    if args.sink.startswith("iceberg:") and not args.iceberg_catalog:
        parser.error("--sink iceberg:... needs --iceberg-catalog (the catalog's properties as JSON)")
    return Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})


def start_position(text: str) -> Any:
    from kinesis_actors import StartAt

    if text.lower() == "latest":
        return StartAt.latest()
    if text.lower() == "trim_horizon":
        return StartAt.trim_horizon()
    when = dt.datetime.fromisoformat(text)
    return StartAt.at_timestamp(when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc))


def make_writer(sink: str) -> Callable[[Any], Any]:
    """``fn(ds)`` of the Dataset sink: write Parquet under the path, or only count."""
    if sink == "null":
        return lambda ds: ds.count()
    path = sink.split(":", 1)[1]

    def write(ds: Any) -> None:
        ds.write_parquet(path)

    return write


def make_sink(cfg: Config) -> Any:
    """The job's sink: an IcebergSink or DeltaSink (exactly once), else a DatasetSink of ``make_writer``.

    Raises:
        InvalidError: a malformed table name or catalog; the ``tables`` extra missing.
    """
    kind, _, target = cfg.sink.partition(":")
    if kind == "iceberg":
        from kinesis_actors.sinks import IcebergSink

        return IcebergSink(target, catalog=json.loads(cfg.iceberg_catalog or "{}"),
                           commit_interval_s=cfg.commit_interval_s)
    if kind == "delta":
        from kinesis_actors.sinks import DeltaSink

        return DeltaSink(target, commit_interval_s=cfg.commit_interval_s)
    from kinesis_actors import DatasetSink

    return DatasetSink(make_writer(cfg.sink), window_s=cfg.window_s, window_records=cfg.window_records,
                       batch_format=cfg.batch_format)


def records_written(stats: dict[str, Any]) -> int:
    """Records written so far, from a DatasetSink's or a table sink's stats."""
    return int(stats.get("records_written", stats.get("rows_committed", 0)))


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                      **fields}), flush=True)


def install_stop_signals(stop: threading.Event) -> None:
    """SIGTERM (``ray job stop``) and SIGINT set ``stop``. Called after Ray is initialised:
    ``ray.init`` installs its own SIGTERM handler in a driver, which would exit at once."""

    def on_signal(signum: int, frame: Any) -> None:
        log.info("received %s: stopping (write the open window, checkpoint, release the leases)",
                 signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def stream_config(cfg: Config) -> Any:
    """The job's ``KinesisStream``: polling, or enhanced fan-out through ``cfg.fanout``.

    Raises:
        InvalidError: a malformed stream or consumer name (before any AWS call).
    """
    from kinesis_actors import KinesisStream

    options: dict[str, Any] = {"retrieval": "fanout", "consumer_name": cfg.fanout} if cfg.fanout else {}
    options.update({name: getattr(cfg, name) for name in _STREAM_KNOBS if getattr(cfg, name) is not None})
    if cfg.reader_num_cpus is not None:
        options["reader_options"] = {"num_cpus": cfg.reader_num_cpus}
    return KinesisStream(cfg.stream, start_at=start_position(cfg.start_at), **options)


def lease_store(cfg: Config) -> Any:
    """The job's lease store: a ``KclLeaseStore`` of ``cfg.kcl_application`` (an existing KCL table,
    checked at ``connect()``), else a ``DynamoLeaseStore`` of ``cfg.lease_table``. No I/O here;
    endpoint, region and credentials are the broker's.

    Raises:
        InvalidError: a malformed application or table name (before any AWS call).
    """
    from kinesis_actors import DynamoLeaseStore, KclLeaseStore

    if cfg.kcl_application:
        return KclLeaseStore(cfg.kcl_application)
    return DynamoLeaseStore(cfg.lease_table, create_if_missing=cfg.create_lease_table)


def run(cfg: Config, stop: threading.Event) -> int:
    """Subscribe and write until ``stop`` is set (SIGTERM, SIGINT), ``max_records`` or
    ``duration_s``; then close cleanly. Returns the exit code."""
    from kinesis_actors import KinesisBroker

    broker = KinesisBroker(endpoint=cfg.endpoint, region=cfg.region, test_credentials=cfg.test_credentials,
                           lease_store=lease_store(cfg),
                           owner_id=cfg.owner_id, lease_duration_s=cfg.lease_duration_s,
                           renew_interval_s=cfg.renew_interval_s)
    conn = broker.connect()
    install_stop_signals(stop)
    sink = make_sink(cfg)
    started = time.monotonic()
    reason, code, written = "stopped", 0, 0
    sub = None
    try:
        sub = conn.subscribe(stream_config(cfg), sink=sink)
        install_stop_signals(stop)  # again: subscribe() started Ray, whose core worker replaces SIGTERM's handler
        emit("started", stream=cfg.stream, lease_table=cfg.kcl_application or cfg.lease_table,
             owner_id=conn.owner_id, sink=cfg.sink,
             retrieval="fanout" if cfg.fanout else "polling",
             shards=sorted(sub.stats()["shards"]))
        next_progress = started + cfg.progress_s
        while True:
            if stop.wait(0.5):
                reason = "signal"
                break
            if sub.wait(0.01):  # ended on its own (raises its error if it failed)
                reason = "subscription ended"
                break
            written = records_written(sink.stats())
            if cfg.max_records and written >= cfg.max_records:
                reason = "max_records"
                break
            if cfg.duration_s and time.monotonic() - started >= cfg.duration_s:
                reason = "duration"
                break
            if time.monotonic() >= next_progress:
                next_progress = time.monotonic() + cfg.progress_s  # one line per interval, no catching up
                stats = sub.stats()
                emit("progress", records_written=written, leases_held=stats["leases_held"],
                     lag_ms={s: v.get("millis_behind_latest") for s, v in stats["shards"].items()})
    except BaseException as e:  # KeyboardInterrupt/SystemExit too: close cleanly all the same
        reason, code = f"error: {e!r:.300}", 1
        log.exception("pipeline failed")
    finally:
        totals: dict[str, Any] = {}
        steps: list[tuple[str, Callable[[], Any]]] = [  # the order of the stop (module docstring)
            ("close the subscription", lambda: sub.close(timeout_s=cfg.close_timeout_s) if sub is not None else None),
            ("stop the sink", lambda: totals.update(sink.close() or {})),
            ("shut down", conn.shutdown)]
        for step, action in steps:
            try:
                action()
            except Exception as e:
                log.error("could not %s: %r", step, e)
                code = 1
        emit("stopped", reason=reason, records_written=records_written(totals) if totals else written,
             records_dropped=totals.get("records_dropped"), windows=totals.get("windows_completed"),
             seconds=round(time.monotonic() - started, 1), exit_code=code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = parse_args(argv)
    stop = threading.Event()
    install_stop_signals(stop)  # until Ray starts; installed again after ray.init
    return run(cfg, stop)


if __name__ == "__main__":
    sys.exit(main())
