"""The embedded emulator: moto in server mode on loopback, Kinesis and DynamoDB at one URL.

:class:`Emulator` runs a moto server (``moto[server]``, 5.2.x) in a **separate child
process** (``python -m kinesis_actors.emulator``) so that the emulator's GIL never
competes with a Ray driver or the tests in the parent process. The child binds
``127.0.0.1`` only (any loopback address is accepted; ``0.0.0.0`` and other
non-loopback addresses are refused), reports its bound port on stdout, and exits when
:meth:`Emulator.stop` is called or when its parent process dies (it polls
``os.getppid()`` every 0.25 s; a ``weakref.finalize`` also kills it when the
:class:`Emulator` is garbage-collected or the interpreter exits).
:func:`serve` runs the same server in the calling process (for the
``kinesis-actors emulator`` CLI).

What is patched in moto, and why
--------------------------------
Before serving, the server process monkeypatches ``moto.kinesis.models.Shard`` in
place (the patch never runs in the parent process; :func:`serve` applies it to the
process that serves):

* **Lost records.** Stock ``Shard.put_record`` computes ``max sequence number + 1``
  and then stores the record without a lock. The werkzeug server is threaded, so two
  concurrent PutRecords into one shard can compute the same number and one record
  silently overwrites the other (about 0.3 % lost under 8 concurrent writers). Each
  shard now has its **own** ``threading.Lock`` held while one record is numbered and
  stored: there is no global lock, so a long PutRecords into one shard never delays
  other shards, other streams or DynamoDB.
* **O(n) PutRecords.** Stock ``get_max_sequence_number`` (and
  ``get_min_sequence_number``) copy every key of the shard (``list(records.keys())``)
  on every put, so PutRecords slows down linearly as a shard fills. Each shard now
  keeps an append-only ascending list of its sequence numbers: min and max are O(1).
* **Quadratic draining.** Stock ``Shard.get_records`` scans the shard from its first
  record on every call. It now bisects the sequence-number list (O(log n + limit)),
  keeping the return contract ``(records, last_sequence_int, millis_behind_latest)``:
  the records after ``last_sequence_id`` in order, at most ``limit`` (all when
  ``limit`` is None or <= 0), the sequence number of the last one returned (or the
  input when none), and the arrival gap in ms between that record and the newest one.
* ``get_sequence_number_at`` (AT_TIMESTAMP iterators) bisects a running maximum of the
  arrival times instead of scanning.
* ``Shard.records`` becomes a property: moto's ``split_shard`` replaces the dict
  wholesale, and the setter rebuilds the index.
* **Non-atomic conditional writes.** moto's DynamoDB evaluates a ``ConditionExpression``
  and then writes, with no lock: two racing conditional ``UpdateItem`` calls can both
  succeed (seen in about 1 run in 10 with 8 racing lease takers), which real DynamoDB
  never allows. Item reads and writes of the DynamoDB backend now run under one
  DynamoDB lock (each call is well under a millisecond, and Kinesis never waits on it).

The patch checks moto's internals before touching them (method signatures, that no
other code in ``moto/kinesis/models.py`` writes into ``Shard.records``) and runs a
behavioural self-test afterwards; if anything has changed shape it raises
:class:`MotoPatchError` at startup instead of serving a silently wrong emulator.

Other moto behaviours (see ENVIRONMENT.md) are left as they are: small per-shard
integer sequence numbers, a NextShardIterator that is never null, no iterator expiry,
writes after resharding going to the closed parent.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import functools
import inspect
import ipaddress
import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from typing import Any

from kinesis_actors.errors import InvalidError, KinesisError

__all__ = ["Emulator", "serve", "EmulatorError", "MotoPatchError", "DEFAULT_HOST"]

log = logging.getLogger("kinesis_actors.emulator")  # same name when run as __main__

DEFAULT_HOST = "127.0.0.1"

_PATCH_MARK = "_kinesis_actors_patched"
_PARENT_POLL_S = 0.25
_LISTEN_BACKLOG = 1024
_STOP_TIMEOUT_S = 5.0
_ENDPOINT_RE = re.compile(r"^http://(\[[0-9a-fA-F:]+\]|[0-9.]+):(\d+)$")
_LEVEL_PREFIX_RE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):")
# Loopback never goes through an HTTP(S)_PROXY from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EmulatorError(KinesisError, RuntimeError):
    """The emulator could not be started, reached or reset.

    Raised by :meth:`Emulator.start` when the child process exits early or does not
    answer HTTP within ``startup_timeout_s``, by :meth:`Emulator.reset` when the
    server does not accept the reset, and by :attr:`Emulator.endpoint` before the
    first :meth:`Emulator.start`.
    """


class MotoPatchError(EmulatorError):
    """moto's internals no longer look like the ones :mod:`kinesis_actors.emulator` patches.

    Raised at emulator startup (in the server process) instead of serving an emulator
    that could lose records; pin ``moto`` to a tested 5.2.x release or update the patch.
    """


# --------------------------------------------------------------------------- patch


def _params(func: Any) -> list[str]:
    return list(inspect.signature(func).parameters)


def _check_moto_shape(models: Any) -> None:
    """Raise MotoPatchError unless moto.kinesis.models looks like the patched 5.2.x code."""
    for name in ("Shard", "Record", "Stream"):
        if not isinstance(getattr(models, name, None), type):
            raise MotoPatchError(f"moto.kinesis.models.{name} is missing or not a class")
    shard_cls, record_cls = models.Shard, models.Record
    expected = {
        "__init__": ["self", "shard_id", "starting_hash", "ending_hash", "parent", "adjacent_parent"],
        "put_record": ["self", "partition_key", "data", "explicit_hash_key"],
        "get_records": ["self", "last_sequence_id", "limit"],
        "get_min_sequence_number": ["self"],
        "get_max_sequence_number": ["self"],
        "get_sequence_number_at": ["self", "at_timestamp"],
    }
    for method, params in expected.items():
        func = getattr(shard_cls, method, None)
        if not callable(func):
            raise MotoPatchError(f"moto.kinesis.models.Shard.{method} is missing")
        if _params(func) != params:
            raise MotoPatchError(
                f"moto.kinesis.models.Shard.{method}{inspect.signature(func)} changed; expected parameters {params}"
            )
    if "records" in shard_cls.__dict__:
        raise MotoPatchError("moto.kinesis.models.Shard.records is a class attribute; expected an instance dict")
    record_params = ["self", "partition_key", "data", "sequence_number", "explicit_hash_key"]
    if _params(record_cls.__init__) != record_params:
        raise MotoPatchError(
            f"moto.kinesis.models.Record.__init__{inspect.signature(record_cls.__init__)} changed; "
            f"expected parameters {record_params}"
        )
    # The index stays right only if Shard.put_record is the one writer into a shard's
    # records dict (reassigning the whole dict goes through the property setter).
    try:
        source = inspect.getsource(models)
        put_source = inspect.getsource(shard_cls.put_record)
    except (OSError, TypeError) as exc:
        raise MotoPatchError(f"cannot read moto.kinesis.models source to verify the patch: {exc}") from exc
    writers = re.compile(
        r"\.records\[[^\]]*\]\s*=(?!=)"  # shard.records[seq] = ...
        r"|del\s+[\w.]*records\["
        r"|\.records\.(pop|popitem|clear|update|setdefault|move_to_end)\("
    )
    outside_put = writers.findall(source.replace(put_source, ""))
    if outside_put or not writers.search(put_source):
        raise MotoPatchError(
            "moto.kinesis.models writes Shard.records outside Shard.put_record "
            f"({len(outside_put)} other writer(s)); the sequence-number index would go stale"
        )


def _install_shard_patch(models: Any) -> None:
    shard_cls = models.Shard
    orig_init = shard_cls.__init__

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # Set before moto's __init__, whose ``self.records = OrderedDict()`` hits the setter.
        self._ka_lock = threading.Lock()
        self._ka_records = collections.OrderedDict()
        self._ka_seqs = []  # ascending sequence numbers (ints) of _ka_records
        self._ka_arrivals = []  # running max of Record.created_at, parallel to _ka_seqs
        orig_init(self, *args, **kwargs)

    def _get_records(self: Any) -> dict[int, Any]:
        return self._ka_records

    def _set_records(self: Any, value: dict[int, Any]) -> None:
        seqs = sorted(value)
        arrivals: list[float] = []
        top = float("-inf")
        for seq in seqs:
            top = max(top, value[seq].created_at)
            arrivals.append(top)
        with self._ka_lock:
            self._ka_records = value
            self._ka_seqs = seqs
            self._ka_arrivals = arrivals

    def put_record(self: Any, partition_key: str, data: str, explicit_hash_key: str) -> str:
        with self._ka_lock:
            seqs = self._ka_seqs
            sequence_number = (seqs[-1] if seqs else 0) + 1
            record = models.Record(partition_key, data, sequence_number, explicit_hash_key)
            self._ka_records[sequence_number] = record
            seqs.append(sequence_number)
            arrivals = self._ka_arrivals
            arrivals.append(max(arrivals[-1], record.created_at) if arrivals else record.created_at)
        return str(sequence_number)

    def get_records(self: Any, last_sequence_id: str, limit: int | None) -> tuple[list[Any], int, int]:
        last_sequence_int = int(last_sequence_id)
        with self._ka_lock:
            seqs = self._ka_seqs
            start = bisect.bisect_right(seqs, last_sequence_int)
            end = len(seqs) if limit is None or limit <= 0 else min(len(seqs), start + limit)
            if start >= end:
                return [], last_sequence_int, 0
            by_seq = self._ka_records
            results = [by_seq[seq] for seq in seqs[start:end]]
            newest = by_seq[seqs[-1]]
        last = results[-1]
        millis_behind_latest = int((newest.created_at - last.created_at) * 1000)
        return results, last.sequence_number, millis_behind_latest

    def get_min_sequence_number(self: Any) -> int:
        seqs = self._ka_seqs
        return seqs[0] if seqs else 0

    def get_max_sequence_number(self: Any) -> int:
        seqs = self._ka_seqs
        return seqs[-1] if seqs else 0

    def get_sequence_number_at(self: Any, at_timestamp: float) -> int:
        # Stock: 0 when empty or at/before the first arrival, else the last record
        # that arrived strictly before at_timestamp.
        with self._ka_lock:
            idx = bisect.bisect_left(self._ka_arrivals, at_timestamp)
            return self._ka_seqs[idx - 1] if idx > 0 else 0

    shard_cls.__init__ = __init__
    shard_cls.records = property(_get_records, _set_records, doc="Records by sequence number (indexed).")
    for func in (put_record, get_records, get_min_sequence_number, get_max_sequence_number, get_sequence_number_at):
        func.__qualname__ = f"Shard.{func.__name__}"
        func.__doc__ = f"kinesis_actors patch of moto's Shard.{func.__name__} (per-shard lock, O(log n) index)."
        setattr(shard_cls, func.__name__, func)
    setattr(shard_cls, _PATCH_MARK, True)


def _self_test(models: Any) -> None:
    """Exercise the patched Shard once; raise MotoPatchError if it misbehaves."""
    shard_cls = models.Shard
    trackers = [getattr(cls, "instances_tracked", None) for cls in (shard_cls, models.Record)]
    sizes = [len(t) if isinstance(t, list) else None for t in trackers]
    shard = shard_cls(0, 0, 2**128 - 1)
    try:
        seqs = [shard.put_record(f"pk{i}", "AA==", None) for i in range(3)]
        records, last, _ = shard.get_records("0", 2)
        ok = (
            seqs == ["1", "2", "3"]
            and [r.sequence_number for r in records] == [1, 2]
            and last == 2
            and [r.sequence_number for r in shard.get_records("2", None)[0]] == [3]
            and shard.get_records("3", 5)[:2] == ([], 3)
            and (shard.get_min_sequence_number(), shard.get_max_sequence_number()) == (1, 3)
            and shard.get_sequence_number_at(0.0) == 0
            and shard.get_sequence_number_at(shard.records[3].created_at + 1.0) == 3
            and list(shard.records) == [1, 2, 3]
        )
        shard.records = collections.OrderedDict()
        ok = ok and shard.get_max_sequence_number() == 0 and shard.put_record("pk", "AA==", None) == "1"
    except Exception as exc:
        raise MotoPatchError(f"self-test of the patched moto Shard failed: {exc!r}") from exc
    finally:
        # Do not leave the throwaway objects in moto's instance tracker (/moto-api/data.json);
        # this runs before the server starts, so nothing else appended meanwhile.
        for tracked, size in zip(trackers, sizes):
            if isinstance(tracked, list) and size is not None:
                del tracked[size:]
    if not ok:
        raise MotoPatchError("self-test of the patched moto Shard returned unexpected results")


def _patch_moto() -> None:
    """Patch moto's Kinesis Shard in this process (idempotent; see the module docstring).

    Raises:
        MotoPatchError: moto is not installed or its internals changed shape.
    """
    try:
        import moto
        from moto.kinesis import models
    except ImportError as exc:
        raise MotoPatchError(f"moto is not installed ({exc}); pip install 'kinesis-actors[emulator]'") from exc
    if getattr(models.Shard, _PATCH_MARK, False):
        return
    version = getattr(moto, "__version__", "?")
    if not str(version).startswith("5."):
        log.warning("moto %s: the emulator patch was written for moto 5.2.x", version)
    _check_moto_shape(models)
    _install_shard_patch(models)
    _self_test(models)
    _install_dynamodb_lock()
    log.info("patched moto %s: Kinesis Shard (per-shard lock, indexed sequence numbers), "
             "DynamoDB (atomic conditional writes)", version)


_DYNAMODB_LOCKED = (
    "get_item", "put_item", "update_item", "delete_item", "scan", "query", "batch_get_item",
    "batch_write_item", "transact_get_items", "transact_write_items", "create_table", "delete_table",
)


def _install_dynamodb_lock() -> None:
    """Make moto's DynamoDB condition-check-then-write atomic: one lock around item operations."""
    from moto.dynamodb.models import DynamoDBBackend

    missing = [name for name in _DYNAMODB_LOCKED if not callable(getattr(DynamoDBBackend, name, None))]
    if missing:
        raise MotoPatchError(f"moto's DynamoDBBackend lacks {missing}: the emulator patch needs updating")
    lock = threading.RLock()

    def locked(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return func(*args, **kwargs)

        return wrapper

    for name in _DYNAMODB_LOCKED:
        setattr(DynamoDBBackend, name, locked(getattr(DynamoDBBackend, name)))


# --------------------------------------------------------------------------- server


def _check_host(host: str) -> None:
    try:
        is_loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        is_loopback = False
    if not is_loopback:
        raise InvalidError(f"emulator host must be a loopback IP address such as 127.0.0.1, not {host!r}")


def _check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidError(f"emulator port must be an int in 0..65535 (0 = any free port), not {port!r}")


def _format_endpoint(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


REQUESTS_PATH = "/_kinesis_actors/requests"
"""``GET`` on the emulator: JSON ``{"total": n, "by_operation": {"GetRecords": n, ...}}``,
the requests served since it started (this path itself not counted)."""


class _RequestCounter:
    """WSGI middleware: counts requests by AWS operation (``X-Amz-Target``), serves the
    counts at :data:`REQUESTS_PATH`. Counting costs a dict increment under a lock."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == REQUESTS_PATH:
            with self.lock:
                counts = dict(self.counts)
            body = json.dumps({"total": sum(counts.values()), "by_operation": counts}).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        target = environ.get("HTTP_X_AMZ_TARGET")  # e.g. "Kinesis_20131202.GetRecords"
        operation = target.rsplit(".", 1)[-1] if target else "(other)"
        with self.lock:
            self.counts[operation] = self.counts.get(operation, 0) + 1
        return self.app(environ, start_response)


def _make_server(host: str, port: int, *, threaded: bool = True) -> Any:
    """A werkzeug server for moto's dispatcher app (threaded unless ``threaded=False``: one
    request at a time, as many test setups run moto), bound (listening) on host:port.

    Raises:
        OSError: host:port cannot be bound (e.g. EADDRINUSE).
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    werkzeug_log = logging.getLogger("werkzeug")
    if werkzeug_log.level == logging.NOTSET:
        werkzeug_log.setLevel(logging.WARNING)  # no line per request unless asked for

    class _QuietHandler(MotoRequestHandler):  # type: ignore[misc,valid-type]
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if werkzeug_log.isEnabledFor(logging.INFO):
                super().log_request(code, size)

    app = _RequestCounter(DomainDispatcherApplication(create_backend_app))
    # Bind the socket ourselves: werkzeug prints to stderr and sys.exit(1)s when the
    # port is taken, where we want an OSError.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_LISTEN_BACKLOG)
        return make_server(host, port, app, threaded=threaded, request_handler=_QuietHandler, fd=sock.fileno())
    finally:
        sock.close()  # the server holds its own duplicate of the descriptor


def serve(host: str = DEFAULT_HOST, port: int = 0, ready: Callable[[str], None] | None = None, *,
          threaded: bool = True) -> None:
    """Run the patched moto server in this process until interrupted (blocking).

    Patches moto (see the module docstring), binds ``host:port``, calls
    ``ready(endpoint)`` once the socket is listening, then serves requests on a
    threaded werkzeug server. Prints nothing itself; it logs through ``logging``.
    When called from the main thread it returns on KeyboardInterrupt or SIGTERM
    (the previous SIGTERM handler is restored); from another thread it only
    returns when the process is interrupted.

    Args:
        host: loopback IP address to bind (``127.0.0.1`` by default).
        port: TCP port; 0 picks a free one (the chosen port is in the endpoint).
        ready: called once with the endpoint URL (``"http://127.0.0.1:<port>"``)
            when the server is listening; exceptions from it propagate.
        threaded: a thread per request (default); False serves one request at a time.

    Raises:
        InvalidError: host is not a loopback IP address, or port is out of range.
        MotoPatchError: moto is missing or its internals changed shape.
        OSError: the address cannot be bound (e.g. the port is in use).
    """
    _check_host(host)
    _check_port(port)
    _patch_moto()
    server = _make_server(host, port, threaded=threaded)
    bound_port = server.server_address[1]
    endpoint = _format_endpoint(host, bound_port)
    os.environ.setdefault("MOTO_PORT", str(bound_port))  # moto builds some URLs from it

    in_main = threading.current_thread() is threading.main_thread()
    previous: Any = None
    if in_main:

        def _on_sigterm(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        log.info("moto emulator (Kinesis + DynamoDB) listening on %s", endpoint)
        if ready is not None:
            ready(endpoint)
        server.serve_forever(poll_interval=0.2)  # werkzeug returns quietly on KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        server.server_close()
        log.info("moto emulator on %s stopped", endpoint)


# --------------------------------------------------------------------------- parent side


def _kill_child(proc: subprocess.Popen[str], owner_pid: int | None = None) -> None:
    """Terminate (then kill) a child process and reap it; safe to call twice.

    With ``owner_pid``, does nothing in any other process (e.g. a fork that inherited
    the finalizer): only the process that started the child stops it.
    """
    if owner_pid is not None and os.getpid() != owner_pid:
        return
    if proc.poll() is None:
        try:
            proc.terminate()
            proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("emulator process %d ignored SIGTERM for %.0f s; killing it", proc.pid, _STOP_TIMEOUT_S)
            proc.kill()
            proc.wait(_STOP_TIMEOUT_S)
        except ProcessLookupError:
            pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


class Emulator:
    """A moto server (Kinesis + DynamoDB) in a child process on loopback; a context manager.

    Example::

        with Emulator() as emu:
            boto3.client("kinesis", endpoint_url=emu.endpoint, region_name="us-east-1",
                         aws_access_key_id="testing", aws_secret_access_key="testing")

    The child runs ``python -m kinesis_actors.emulator`` with a patched moto (see the
    module docstring), its output is forwarded to the ``kinesis_actors.emulator.child``
    logger, and it exits on :meth:`stop`, when this object is garbage-collected, at
    interpreter exit, or within ~0.25 s of this process dying.

    Args:
        host: loopback IP address for the server to bind (default ``127.0.0.1``).
        port: TCP port; 0 (default) lets the child pick a free one.
        startup_timeout_s: seconds :meth:`start` waits for the server to answer HTTP.
        threaded: a thread per request (default); False serves one request at a time,
            as many test setups run moto (``tests/integration/test_scale.py`` holds a
            128-shard subscription to its budget).

    The server counts the requests it answers by operation: :meth:`requests`.

    Raises:
        InvalidError: host is not a loopback IP, port is out of 0..65535, or the
            timeout is not positive.
    """

    def __init__(self, *, host: str = DEFAULT_HOST, port: int = 0, startup_timeout_s: float = 30.0,
                 threaded: bool = True):
        _check_host(host)
        _check_port(port)
        if not startup_timeout_s > 0:
            raise InvalidError(f"startup_timeout_s must be > 0 seconds, not {startup_timeout_s!r}")
        self.host = host
        self.requested_port = port
        self.startup_timeout_s = float(startup_timeout_s)
        self.threaded = bool(threaded)
        self._endpoint: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._finalizer: weakref.finalize | None = None
        self._readers: list[threading.Thread] = []
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._endpoints: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()

    # -- properties

    @property
    def endpoint(self) -> str:
        """Endpoint URL for every service, ``"http://127.0.0.1:<port>"`` (str).

        Valid after :meth:`start`; still returns the last URL after :meth:`stop`.

        Raises:
            EmulatorError: the emulator was never started.
        """
        if self._endpoint is None:
            raise EmulatorError("Emulator.endpoint is only known after start()")
        return self._endpoint

    @property
    def port(self) -> int | None:
        """The bound TCP port (int) once started, else None."""
        if self._endpoint is None:
            return None
        return int(self._endpoint.rsplit(":", 1)[1])

    @property
    def pid(self) -> int | None:
        """Process id (int) of the running server process, or None when not running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self.pid is not None

    # -- lifecycle

    def start(self) -> Emulator:
        """Start the server process and wait until it answers HTTP.

        Does nothing if it is already running. A stopped emulator can be started
        again (with ``port=0`` it may get a different port).

        Returns:
            self, with :attr:`endpoint` set.

        Raises:
            EmulatorError: the process exited early (e.g. moto missing, the patch
                refused this moto version, the port is in use) or did not answer HTTP
                within ``startup_timeout_s``; the message ends with its stderr.
        """
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return self
            self._stop_locked()
            deadline = time.monotonic() + self.startup_timeout_s
            proc = self._spawn()
            try:
                endpoint = self._await_endpoint(proc, deadline)
                self._await_http(proc, endpoint, deadline)
            except BaseException:
                _kill_child(proc)
                self._proc = None
                if self._finalizer is not None:
                    self._finalizer.detach()
                raise
            self._endpoint = endpoint
            log.info("emulator started at %s (pid %d)", endpoint, proc.pid)
            return self

    def stop(self) -> None:
        """Stop the server process (SIGTERM, then SIGKILL after 5 s) and reap it.

        Idempotent: stopping a stopped or never-started emulator does nothing.
        All state held by the server is lost.
        """
        with self._lock:
            self._stop_locked()

    def reset(self) -> None:
        """Wipe every stream, table and other resource (``POST /moto-api/reset``).

        Raises:
            EmulatorError: the emulator is not running or the reset failed.
        """
        if not self.running:
            raise EmulatorError("Emulator.reset(): the emulator is not running")
        request = urllib.request.Request(self.endpoint + "/moto-api/reset", data=b"", method="POST")
        try:
            with _DIRECT.open(request, timeout=30) as response:
                status = response.status
        except (urllib.error.URLError, OSError) as exc:
            raise EmulatorError(f"emulator reset at {self.endpoint} failed: {exc}") from exc
        if status != 200:
            raise EmulatorError(f"emulator reset at {self.endpoint} answered HTTP {status}")
        log.info("emulator at %s reset", self.endpoint)

    def requests(self) -> dict[str, int]:
        """Requests the server answered since it started, by AWS operation name
        (``{"GetRecords": 120, "UpdateItem": 40, ...}``), read from :data:`REQUESTS_PATH`.

        Raises:
            EmulatorError: the server does not answer.
        """
        import urllib.request

        try:
            with urllib.request.urlopen(self.endpoint + REQUESTS_PATH, timeout=10) as response:
                return dict(json.loads(response.read())["by_operation"])
        except OSError as e:
            raise EmulatorError(f"emulator at {self.endpoint} did not report its requests: {e}") from e

    def __enter__(self) -> Emulator:
        """Start the emulator (see :meth:`start`) and return it."""
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        """Stop the emulator (see :meth:`stop`); exceptions are not suppressed."""
        self.stop()

    def __repr__(self) -> str:
        state = f"running pid={self.pid}" if self.running else "stopped"
        return f"Emulator({self._endpoint or self.host!s}, {state})"

    # -- internals

    def _spawn(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [
            sys.executable,
            "-m",
            "kinesis_actors.emulator",
            "--host",
            self.host,
            "--port",
            str(self.requested_port),
            "--parent-pid",
            str(os.getpid()),
        ]
        if not self.threaded:
            cmd.append("--single-threaded")
        log.debug("starting emulator: %s", " ".join(cmd))
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
        )
        self._proc = proc
        self._finalizer = weakref.finalize(self, _kill_child, proc, os.getpid())
        self._stderr_tail.clear()
        self._endpoints = endpoints = queue.Queue()
        self._readers = [
            threading.Thread(target=self._read_stdout, args=(proc, endpoints), daemon=True,
                             name=f"emulator-{proc.pid}-stdout"),
            threading.Thread(target=self._read_stderr, args=(proc, self._stderr_tail), daemon=True,
                             name=f"emulator-{proc.pid}-stderr"),
        ]
        for thread in self._readers:
            thread.start()
        return proc

    @staticmethod
    def _read_stdout(proc: subprocess.Popen[str], endpoints: queue.Queue[str]) -> None:
        child_log = logging.getLogger("kinesis_actors.emulator.child")
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                if _ENDPOINT_RE.match(line):
                    endpoints.put(line)
                elif line:
                    child_log.info("[pid %d stdout] %s", proc.pid, line)
        except (OSError, ValueError):
            pass  # pipe closed by stop()

    @staticmethod
    def _read_stderr(proc: subprocess.Popen[str], tail: collections.deque[str]) -> None:
        # A staticmethod: reader threads must not keep the Emulator alive (its finalizer kills the child).
        child_log = logging.getLogger("kinesis_actors.emulator.child")
        assert proc.stderr is not None
        try:
            for line in proc.stderr:
                line = line.rstrip("\n")
                if not line:
                    continue
                tail.append(line)
                match = _LEVEL_PREFIX_RE.match(line)
                level = logging.getLevelName(match.group(1)) if match else logging.WARNING
                child_log.log(level, "[pid %d] %s", proc.pid, line)
        except (OSError, ValueError):
            pass

    def _failure(self, proc: subprocess.Popen[str], what: str) -> EmulatorError:
        for thread in self._readers:  # collect the last words of a dead child
            if proc.poll() is not None:
                thread.join(1.0)
        tail = "\n".join(self._stderr_tail) or "(no stderr)"
        return EmulatorError(f"emulator (pid {proc.pid}) {what}; its stderr:\n{tail}")

    def _await_endpoint(self, proc: subprocess.Popen[str], deadline: float) -> str:
        while True:
            try:
                return self._endpoints.get(timeout=0.05)
            except queue.Empty:
                pass
            code = proc.poll()
            if code is not None:
                raise self._failure(proc, f"exited with code {code} before reporting its endpoint")
            if time.monotonic() > deadline:
                raise self._failure(proc, f"did not report its endpoint within {self.startup_timeout_s:g} s")

    def _await_http(self, proc: subprocess.Popen[str], endpoint: str, deadline: float) -> None:
        # Any HTTP answer proves the server loop runs; data.json is read-only (and cheap at startup).
        url = endpoint + "/moto-api/data.json"
        last: Exception | None = None
        while True:
            try:
                with _DIRECT.open(url, timeout=5) as response:
                    response.read()
                return
            except urllib.error.HTTPError:
                return  # an HTTP error status is still an HTTP answer
            except (urllib.error.URLError, OSError) as exc:
                last = exc
            code = proc.poll()
            if code is not None:
                raise self._failure(proc, f"exited with code {code} while starting")
            if time.monotonic() > deadline:
                what = f"did not answer HTTP at {endpoint} within {self.startup_timeout_s:g} s ({last})"
                raise self._failure(proc, what)
            threading.Event().wait(0.05)

    def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _kill_child(proc)
        for thread in self._readers:
            thread.join(2.0)
        self._readers = []
        log.info("emulator at %s (pid %d) stopped, exit code %s", self._endpoint, proc.pid, proc.returncode)


# --------------------------------------------------------------------------- child entry point


def _watch_parent(parent_pid: int) -> None:
    """Daemon-thread body: SIGTERM ourselves once the parent process is gone."""
    stop = threading.Event()
    while not stop.wait(_PARENT_POLL_S):
        if os.getppid() != parent_pid:
            log.warning("parent process %d is gone; stopping the emulator", parent_pid)
            os.kill(os.getpid(), signal.SIGTERM)
            if not stop.wait(_STOP_TIMEOUT_S):
                os._exit(1)
            return


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kinesis_actors.emulator",
        description="moto server (Kinesis + DynamoDB, patched) on loopback; prints its endpoint URL on stdout.",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="loopback IP address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default 0: any free port)")
    parser.add_argument("--log-level", default="INFO", help="logging level for stderr (default INFO)")
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--single-threaded", action="store_true",
                        help="serve one request at a time (as many test setups run moto)")
    args = parser.parse_args(argv)

    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format="%(levelname)s:%(name)s:%(message)s")
    if args.parent_pid is not None:
        if os.getppid() != args.parent_pid:
            log.warning("parent process %d already gone; not starting", args.parent_pid)
            return 1
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True, name="parent-watch").start()

    def _ready(endpoint: str) -> None:
        print(endpoint, flush=True)  # the one stdout line: Emulator.start() reads it

    try:
        serve(args.host, args.port, ready=_ready, threaded=not args.single_threaded)
    except (EmulatorError, InvalidError, OSError) as exc:
        log.error("emulator failed: %s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main())
