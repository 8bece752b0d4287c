"""The parent side of the embedded emulator: :class:`Emulator` starts, watches and stops its child process.

:class:`Emulator` runs a moto server (``moto[server]``, 5.2.x) in a **separate child
process** (``python -m kinesis_actors.emulator``) so that the emulator's GIL never
competes with a Ray driver or the tests in the parent process. The child binds
``127.0.0.1`` only (any loopback address is accepted; ``0.0.0.0`` and other
non-loopback addresses are refused), reports its bound port on stdout, and exits when
:meth:`Emulator.stop` is called or when its parent process dies (it polls
``os.getppid()`` every 0.25 s; a ``weakref.finalize`` also kills it when the
:class:`Emulator` is garbage-collected or the interpreter exits).
:func:`serve` runs the same server in the calling process (for the
``kinesis-actors emulator`` CLI). The child's pipes (forwarded to ``logging``) and its
termination are :mod:`~kinesis_actors.emulator.child`'s.

With ``efo=True`` (enhanced fan-out), Kinesis is served by kinesis-mock instead
(:class:`~kinesis_actors.emulator.kinesis_mock.KinesisMock`, a second child process,
``node``), because moto does not serve ``SubscribeToShard``; moto keeps DynamoDB. The two
live at two endpoints: :attr:`Emulator.endpoint` (Kinesis) and
:attr:`Emulator.dynamodb_endpoint` (the lease table: give it to
``DynamoLeaseStore(table, endpoint=...)``, which keeps its own endpoint).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import weakref
from typing import Any

from ..clock import monotonic_s
from ..errors import InvalidError
from .child import forward_stderr, forward_stdout, kill_child
from .errors import EmulatorError
from .kinesis_mock import KinesisMock
from .server import DEFAULT_HOST, REQUESTS_PATH, check_host, check_port

__all__ = ["Emulator"]

log = logging.getLogger("kinesis_actors.emulator")

# Loopback never goes through an HTTP(S)_PROXY from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
        efo: serve Kinesis with kinesis-mock (enhanced fan-out: ``SubscribeToShard``) and
            keep DynamoDB on moto; see the module docstring. Needs Node.js; kinesis-local
            is installed into a cache folder on first use
            (:func:`~kinesis_actors.emulator.kinesis_mock.install_kinesis_local`).

    The server counts the requests it answers by operation: :meth:`requests`.

    Raises:
        InvalidError: host is not a loopback IP, port is out of 0..65535, or the
            timeout is not positive.
    """

    def __init__(self, *, host: str = DEFAULT_HOST, port: int = 0, startup_timeout_s: float = 30.0,
                 threaded: bool = True, efo: bool = False):
        check_host(host)
        check_port(port)
        if not startup_timeout_s > 0:
            raise InvalidError(f"startup_timeout_s must be > 0 seconds, not {startup_timeout_s!r}")
        self.host = host
        self.requested_port = port
        self.startup_timeout_s = float(startup_timeout_s)
        self.threaded = bool(threaded)
        self.efo = bool(efo)
        self.kinesis_mock: KinesisMock | None = KinesisMock(startup_timeout_s=max(60.0, startup_timeout_s)) \
            if self.efo else None
        self._endpoint: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._readers: list[threading.Thread] = []
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self._endpoints: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()

    # -- properties

    @property
    def endpoint(self) -> str:
        """Endpoint URL for every service, ``"http://127.0.0.1:<port>"`` (str); with
        ``efo=True``, of Kinesis only (kinesis-mock; DynamoDB is at :attr:`dynamodb_endpoint`).

        Valid after :meth:`start`; still returns the last URL after :meth:`stop`.

        Raises:
            EmulatorError: the emulator was never started.
        """
        if self._endpoint is None:
            raise EmulatorError("Emulator.endpoint is only known after start()")
        if self.kinesis_mock is not None:
            return self.kinesis_mock.endpoint
        return self._endpoint

    @property
    def dynamodb_endpoint(self) -> str:
        """Endpoint URL of DynamoDB (moto), ``"http://127.0.0.1:<port>"``: the same as
        :attr:`endpoint` unless ``efo=True``.

        Raises:
            EmulatorError: the emulator was never started.
        """
        if self._endpoint is None:
            raise EmulatorError("Emulator.dynamodb_endpoint is only known after start()")
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
            deadline = monotonic_s() + self.startup_timeout_s
            proc = self._spawn()
            try:
                endpoint = self._await_endpoint(proc, deadline)
                self._await_http(proc, endpoint, deadline)
            except BaseException:
                kill_child(proc)
                self._proc = None
                if self._finalizer is not None:
                    self._finalizer.detach()
                raise
            self._endpoint = endpoint
            log.info("emulator started at %s (pid %d)", endpoint, proc.pid)
            if self.kinesis_mock is not None:
                try:
                    self.kinesis_mock.start()
                except BaseException:
                    self._stop_locked()
                    raise
            return self

    def stop(self) -> None:
        """Stop the server process (SIGTERM, then SIGKILL after 5 s) and reap it.

        Idempotent: stopping a stopped or never-started emulator does nothing.
        All state held by the server is lost.
        """
        with self._lock:
            self._stop_locked()

    def reset(self) -> None:
        """Wipe every stream, table and other resource of moto (``POST /moto-api/reset``;
        with ``efo=True`` kinesis-mock's streams stay).

        Raises:
            EmulatorError: the emulator is not running or the reset failed.
        """
        if not self.running:
            raise EmulatorError("Emulator.reset(): the emulator is not running")
        request = urllib.request.Request(self.dynamodb_endpoint + "/moto-api/reset", data=b"", method="POST")
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
        try:
            with _DIRECT.open(self.dynamodb_endpoint + REQUESTS_PATH, timeout=10) as response:
                return dict(json.loads(response.read())["by_operation"])
        except OSError as e:
            raise EmulatorError(f"emulator at {self.dynamodb_endpoint} did not report its requests: {e}") from e

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
        self._finalizer = weakref.finalize(self, kill_child, proc, os.getpid())
        self._stderr_tail.clear()
        self._endpoints = endpoints = queue.Queue[str]()
        self._readers = [
            threading.Thread(target=forward_stdout, args=(proc, endpoints), daemon=True,
                             name=f"emulator-{proc.pid}-stdout"),
            threading.Thread(target=forward_stderr, args=(proc, self._stderr_tail), daemon=True,
                             name=f"emulator-{proc.pid}-stderr"),
        ]
        for thread in self._readers:
            thread.start()
        return proc

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
            if monotonic_s() > deadline:
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
            if monotonic_s() > deadline:
                what = f"did not answer HTTP at {endpoint} within {self.startup_timeout_s:g} s ({last})"
                raise self._failure(proc, what)
            threading.Event().wait(0.05)

    def _stop_locked(self) -> None:
        if self.kinesis_mock is not None:
            self.kinesis_mock.stop()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        kill_child(proc)
        for thread in self._readers:
            thread.join(2.0)
        self._readers = []
        log.info("emulator at %s (pid %d) stopped, exit code %s", self._endpoint, proc.pid, proc.returncode)
