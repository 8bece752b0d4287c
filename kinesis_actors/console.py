"""What the console commands and the demo share: where they talk to (:class:`Target`),
one-line failures (:class:`CliError`), the terminal, SIGTERM and SIGINT, and Ray on loopback.

Nothing here runs at import: Ray's environment defaults are applied by
:func:`configure_ray_env`, which the console entry point calls before Ray is imported.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
import signal
import socket
import sys
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

import click

from .clock import monotonic_s

__all__ = ["PROG", "EXIT_FAILED", "EXIT_USAGE", "EXIT_INTERRUPTED", "CliError", "Target", "configure_ray_env",
           "start_ray", "resolve_target", "check_endpoint_url", "check_reachable", "check_service", "aws_call",
           "console", "install_sigterm", "install_sigint", "progress", "terminal_columns", "fmt_float", "rate",
           "one_line", "die", "describe_exception"]

log = logging.getLogger("kinesis_actors.cli")

PROG = "kinesis-actors"
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
_REACH_TIMEOUT_S = 3.0

RAY_DEFAULTS = (
    ("RAY_AUTH_MODE", "disabled"),  # Ray 2.60 enables token auth otherwise; `ray job submit` then fails
    ("RAY_USAGE_STATS_ENABLED", "0"),  # no usage reports to the internet
    ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0"),  # Ray binds and advertises 127.0.0.1 (read at import)
)
"""Environment defaults of the console commands (a variable already set is kept)."""


def configure_ray_env() -> None:
    """Apply :data:`RAY_DEFAULTS` to this process's environment (before Ray is imported)."""
    for name, value in RAY_DEFAULTS:
        os.environ.setdefault(name, value)


class CliError(Exception):
    """A failure reported as one line on stderr, with an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def start_ray(verbose: bool, address: str | None = None) -> None:
    """Start (or join) Ray with loopback-only settings unless it is initialised already.

    Args:
        verbose: let Ray configure logging and forward workers' output to stderr.
        address: Ray's ``address`` (None: Ray's own resolution, i.e. ``RAY_ADDRESS``, the
            latest ``ray start`` cluster, else a new local one; ``"local"``: always new).
    """
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


def is_loopback_url(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint_url(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"--endpoint must be an http(s) URL such as http://127.0.0.1:4566, got {url!r}", EXIT_USAGE)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise CliError(f"--endpoint has an invalid port: {url!r}", EXIT_USAGE) from None
    return parts.hostname, port


def check_reachable(url: str, timeout_s: float = _REACH_TIMEOUT_S) -> None:
    """Fail fast (one line) when nothing answers TCP at the endpoint's host and port."""
    host, port = check_endpoint_url(url)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, socket.timeout):
            reason = f"no answer within {timeout_s:g} s"
        raise CliError(f"cannot reach endpoint {url}: {reason}") from None


def has_default_credentials(region: str | None) -> bool:
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
        return self.endpoint is None or not is_loopback_url(self.endpoint)

    def settings(self, *, fast: bool = False) -> Any:
        """``AwsSettings`` for admin calls (``fast``: short timeouts, one attempt)."""
        from .aws import AwsSettings

        settings = AwsSettings(endpoint=self.endpoint, region=self.region, test_credentials=self.test_credentials)
        if fast:
            settings = dataclasses.replace(settings, connect_timeout_s=2.0, read_timeout_s=5.0, max_attempts=1)
        return settings

    def describe(self) -> str:
        """Human-readable name of the target (no secrets)."""
        if self.embedded:
            return f"embedded emulator at {self.endpoint}"
        return f"endpoint {self.endpoint}" if self.endpoint else f"AWS ({self.region or 'default region'})"


def resolve_target(endpoint: str | None, region: str | None, test_credentials: bool | None) -> Target:
    """A :class:`Target` for ``--endpoint`` (checked reachable) or AWS (``endpoint=None``)."""
    region = region or default_region()
    if endpoint is not None:
        check_reachable(endpoint)
        loop = is_loopback_url(endpoint)
        if test_credentials is None:  # an emulator on loopback without configured credentials
            test_credentials = loop and not has_default_credentials(region)
        return Target(endpoint, region or "us-east-1", bool(test_credentials))
    if region is None:
        raise CliError("no AWS region configured: pass --region or set AWS_REGION", EXIT_USAGE)
    return Target(None, region, bool(test_credentials))


def default_region() -> str | None:
    """The region of boto3's default chain (environment, config file), or None."""
    import boto3

    try:
        region: str | None = boto3.Session().region_name
    except Exception:
        return None
    return region


def aws_call(what: str, fn: Callable[[], Any]) -> Any:
    """Run one admin AWS call; translate botocore failures into one-line :class:`CliError`."""
    from botocore.exceptions import BotoCoreError, ClientError

    from .errors import KinesisError, translate_aws_error

    try:
        return fn()
    except KinesisError:
        raise
    except (ClientError, BotoCoreError) as exc:
        raise CliError(str(translate_aws_error(exc, operation=what))) from exc


def check_service(target: Target) -> None:
    """One cheap call per service, with short timeouts: a clear line instead of a hang."""
    settings = target.settings(fast=True)
    kinesis, dynamodb = settings.client("kinesis"), settings.client("dynamodb")
    aws_call("ListStreams", lambda: kinesis.list_streams(Limit=1))
    aws_call("ListTables", lambda: dynamodb.list_tables(Limit=1))


def fmt_float(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def console() -> Any:
    from rich.console import Console

    # Piped output is read by people and scripts: never squeeze tables into 80 columns.
    width = None if sys.stdout.isatty() else 200
    return Console(file=sys.stdout, highlight=False, soft_wrap=True, width=width)


def terminal_columns() -> int:
    """Columns of the terminal on stderr; 0 when stderr is not a terminal or reports no width
    (some CI terminals do)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns if sys.stderr.isatty() else 0
    except (OSError, ValueError):
        return 0


class _Lines:
    """tqdm's interface as plain lines on stderr: one every ``every_s`` seconds, and the last."""

    def __init__(self, total: int, desc: str, unit: str, every_s: float = 5.0) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.n = 0
        self.postfix = ""
        self._last = monotonic_s()

    def _line(self) -> None:
        extra = f", {self.postfix}" if self.postfix else ""
        click.echo(f"{self.desc}: {self.n}/{self.total} {self.unit}{extra}", err=True)
        self._last = monotonic_s()

    def update(self, n: int) -> None:
        self.n += n
        if monotonic_s() - self._last >= self.every_s:
            self._line()

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._line()


def progress(total: int, desc: str, unit: str, *, enabled: bool, position: int = 0) -> Any:
    """A progress display on stderr: a tqdm bar when ``enabled`` on a terminal with a width;
    plain lines (every 5 s, and the last) when ``enabled`` but the terminal reports no
    columns; nothing (tqdm disabled) otherwise. A context manager with ``update(n)`` and
    ``set_postfix_str(text)``."""
    from tqdm import tqdm

    if enabled and terminal_columns() == 0:
        return _Lines(total, desc, unit)
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not enabled, position=position,
                dynamic_ncols=True, leave=True)


def install_sigterm() -> Callable[[], None]:
    """SIGTERM raises KeyboardInterrupt in the main thread (clean close); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def _on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _on_sigterm)

    def undo() -> None:
        signal.signal(signal.SIGTERM, previous)

    return undo


def install_sigint() -> Callable[[], None]:
    """SIGINT raises KeyboardInterrupt in the main thread whatever the process inherited; returns the undo.

    For the commands that run until Ctrl-C (``emulator``, ``demo --keep``). Both a signal's
    ignored disposition and the signal mask survive ``fork`` and ``exec``: a POSIX shell starts
    a background job of a non-interactive script (``cmd &``) with SIGINT ignored, Python then
    installs no KeyboardInterrupt handler, and ``subprocess.Popen`` resets neither (only SIGPIPE
    and SIGXFSZ). Such a process would ignore Ctrl-C and ``kill -INT`` for ever. So this sets
    Python's handler (:func:`signal.default_int_handler`) and unblocks SIGINT and SIGTERM in the
    calling thread, which the kernel then delivers them to. Off the main thread it does nothing
    (Python sets handlers only there). Raises nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})

    def undo() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)

    return undo


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def die(exc: BaseException, code: int, debug: bool) -> None:
    from .errors import KinesisError

    if debug:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    message = str(exc) if isinstance(exc, (CliError, KinesisError)) else describe_exception(exc)
    click.echo(f"{PROG}: error: {one_line(message)}", err=True)


def describe_exception(exc: BaseException) -> str:
    try:
        from botocore.exceptions import EndpointConnectionError, NoCredentialsError

        if isinstance(exc, EndpointConnectionError):
            return f"cannot reach {exc.kwargs.get('endpoint_url', 'the endpoint')}"
        if isinstance(exc, NoCredentialsError):
            return "no AWS credentials found (configure them, or pass --endpoint for an emulator)"
    except ImportError:  # pragma: no cover
        pass
    return f"{type(exc).__name__}: {exc}"
