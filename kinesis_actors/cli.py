"""``kinesis-actors``: the console commands, thin click wrappers over the public API.

``emulator`` serves the embedded emulator, ``leases`` prints a lease table, ``publish``
replays a JSON-lines file, ``demo`` runs the main job (:mod:`kinesis_actors.demo`).
Failures print one line on stderr and exit non-zero (``KINESIS_ACTORS_DEBUG=1`` adds
the traceback).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from .clock import monotonic_s
from .console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PROG,
    CliError,
    check_endpoint_url,
    configure_ray_env,
    console,
    die,
    install_sigint,
    one_line,
    rate,
    resolve_target,
)
from .console import progress as progress_display
from .leases.view import add_lag, print_lease_table, scan_kcl_rows, scan_lease_rows
from .publisher import MAX_REQUEST_RECORDS

__all__ = ["main", "cli"]

log = logging.getLogger(__name__)



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
    help="Endpoint URL of a Kinesis + DynamoDB emulator (default: AWS with the default credential chain, "
         "or AWS_ENDPOINT_URL when set, as boto3 reads it).",
)  # fmt: skip
_region_option = click.option(
    "--region", metavar="REGION", default=None,
    help="AWS region (default: boto3's, e.g. AWS_DEFAULT_REGION; us-east-1 with --endpoint if none is set).",
)
_test_credentials_option = click.option(
    "--test-credentials/--no-test-credentials", default=None,
    help="Use fixed dummy keys (emulators). Default: only for a loopback endpoint without configured credentials.",
)  # fmt: skip


# --------------------------------------------------------------------------- emulator


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback IP address to bind.")
@click.option("--port", type=click.IntRange(0, 65535), default=4567, show_default=True,
              help="TCP port (0: any free port).")
@click.option("--efo", is_flag=True, help="Enhanced fan-out: Kinesis on kinesis-mock (needs Node.js; npm installs "
              "kinesis-local into a cache folder once), DynamoDB on moto at --port. Prints both URLs.")
def emulator(host: str, port: int, efo: bool) -> None:
    """Serve the embedded emulator (Kinesis + DynamoDB, moto) until Ctrl-C."""
    from .emulator import KinesisMock, serve

    mock = KinesisMock().start() if efo else None

    def ready(endpoint: str) -> None:
        if mock is not None:
            click.echo(mock.endpoint)
            click.echo(endpoint)
            click.echo(f"Kinesis (kinesis-mock, SubscribeToShard) on {mock.endpoint}, DynamoDB (moto) on {endpoint}; "
                       "Ctrl-C stops them", err=True)
        else:
            click.echo(endpoint)
            click.echo(f"emulator listening on {endpoint} (Kinesis + DynamoDB); Ctrl-C stops it", err=True)
        sys.stdout.flush()

    undo_sigint = install_sigint()  # "until Ctrl-C", whatever SIGINT disposition and mask were inherited
    try:
        serve(host, port, ready=ready)
    except OSError as exc:
        raise CliError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    finally:
        undo_sigint()
        if mock is not None:
            mock.stop()
    click.echo("emulator stopped", err=True)


# --------------------------------------------------------------------------- leases


@cli.command()
@click.option("--table", "-t", default=None, metavar="T", help="Lease table (DynamoDB) name.")
@click.option("--kcl-table", default=None, metavar="T",
              help="A KCL 2.x/3.x application's lease table (KclLeaseStore), instead of --table.")
@click.option("--stream", "-s", default=None, metavar="S",
              help="Only this stream's shards (a single-stream KCL table: the stream it reads, for the lag).")
@_endpoint_option
@_region_option
@_test_credentials_option
@click.option("--lag/--no-lag", default=True, show_default=True,
              help="Show how far each checkpoint is behind its shard's tip (2 Kinesis calls a shard).")
def leases(table: str | None, kcl_table: str | None, stream: str | None, endpoint: str | None,
           region: str | None, test_credentials: bool | None, lag: bool) -> None:  # fmt: skip
    """Print a lease table: shard, owner, counter, checkpoint, expiry and lag."""
    if (table is None) == (kcl_table is None):
        raise click.UsageError("give exactly one of --table and --kcl-table")
    target = resolve_target(endpoint, region, test_credentials)
    settings = target.settings(fast=True)
    name = table or kcl_table
    assert name is not None
    if kcl_table is not None:
        rows = scan_kcl_rows(settings.client("dynamodb"), kcl_table, stream)
    else:
        rows = scan_lease_rows(settings.client("dynamodb"), name, stream)
    if not rows:
        if stream is None:
            raise CliError(f"lease table {name!r} has no rows")
        scan = scan_kcl_rows if kcl_table is not None else scan_lease_rows
        held = sorted({str(r.get("stream")) for r in scan(settings.client("dynamodb"), name, None)})
        raise CliError(f"lease table {name!r} has no rows of stream {stream!r}; "
                       + (f"it holds the stream(s) {', '.join(held)}" if held else "it has no rows at all"))
    if lag and all(r["stream"] for r in rows):
        add_lag(settings.client("kinesis"), rows)
    title = ("KCL " if kcl_table else "") + f"lease table {name}" + (f", stream {stream}" if stream else "") + \
        f" ({len(rows)} shards)"
    print_lease_table(console(), title, rows, expiry=kcl_table is None, streams=stream is None)


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
            except json.JSONDecodeError as exc:
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
    target = resolve_target(endpoint, region, test_credentials)
    from .publisher import Publisher

    publisher = Publisher.standalone(stream, endpoint=target.endpoint, region=target.region,
                                     test_credentials=target.test_credentials)

    total_bytes = sum(len(d) for d, _ in items)
    started = monotonic_s()
    with progress_display(len(items), "publish", "rec", enabled=progress) as bar:
        for i in range(0, len(items), MAX_REQUEST_RECORDS):
            chunk = items[i : i + MAX_REQUEST_RECORDS]
            publisher.put_many(chunk)
            bar.update(len(chunk))
    took = monotonic_s() - started
    click.echo(f"published {len(items)} records ({total_bytes} bytes) to {stream} in {took:.2f} s "
               f"({rate(len(items), took):.0f} records/s)")  # fmt: skip


@cli.command()
@click.option("--endpoint", metavar="URL", default=None,
              help="Use this Kinesis + DynamoDB endpoint (default credential chain) instead of the embedded emulator.")
@click.option("--aws", is_flag=True, help="Use real AWS (default credential chain and region) instead of the emulator.")
@_region_option
@_test_credentials_option
@click.option("--yes", "-y", is_flag=True, help="Do not ask before creating resources in a real account.")
@click.option("--keep", is_flag=True,
              help="Keep the stream and lease table afterwards; with the embedded emulator, keep it up "
                   "until Ctrl-C and print the command that shows the lease table.")
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
    from .demo import DemoOptions, DemoRun

    opts = DemoOptions(**kwargs)
    if opts.progress is None:
        opts.progress = sys.stderr.isatty()
    if opts.endpoint is not None and opts.aws:
        raise CliError("--endpoint and --aws are exclusive", EXIT_USAGE)
    if opts.endpoint is not None:
        check_endpoint_url(opts.endpoint)
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


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point of ``kinesis-actors``: one line and a non-zero exit on any failure.

    Applies the Ray environment defaults of :data:`~kinesis_actors.console.RAY_DEFAULTS`
    first (loopback only, no token auth, no usage stats), before Ray is imported.
    """
    configure_ray_env()
    debug = os.environ.get("KINESIS_ACTORS_DEBUG", "") not in ("", "0")
    code = 0
    try:
        result = cli.main(args=list(argv) if argv is not None else None, prog_name=PROG, standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx is not None else PROG
        click.echo(f"{cmd}: error: {one_line(exc.format_message())} (see --help)", err=True)
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
        die(exc, exc.code, debug)
        code = exc.code
    except Exception as exc:
        die(exc, EXIT_FAILED, debug)
        code = EXIT_FAILED
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
