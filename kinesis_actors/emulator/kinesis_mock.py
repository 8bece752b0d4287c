"""kinesis-mock on loopback: the Kinesis side of the enhanced fan-out emulator.

moto does not serve ``SubscribeToShard``; kinesis-mock does (``RegisterStreamConsumer``,
``DescribeStreamConsumer``, ``SubscribeToShard`` over HTTP/1.1 as AWS event-stream
frames). Its npm build, ``kinesis-local`` 0.6.2, is Scala.js: it needs Node.js (>= 18),
not a JVM.

How an installed wheel finds it: the package ships ``package.json``, a pinned
``package-lock.json`` (version and sha512 integrity of ``kinesis-local``) and
``preload.js`` in ``kinesis_actors/emulator/kinesis_local/``. The first
:meth:`KinesisMock.start` (or :func:`install_kinesis_local`) copies them into a cache
folder and runs ``npm ci`` there, once: ``$KINESIS_ACTORS_CACHE/kinesis-local-0.6.2``,
default ``~/.cache/kinesis-actors/kinesis-local-0.6.2`` (``$XDG_CACHE_HOME`` is honoured).
Later starts use the cached copy and need no network. ``npm ci`` fetches from npm's
configured registry; a machine without one can fill the cache folder by hand.

Loopback only: kinesis-mock listens on every interface and has no host option, so
``preload.js`` (``node -r preload.js main.js``) rewrites the host of every
``net.Server.listen`` to ``127.0.0.1``. Its TLS port (default 4567, our moto emulator's
default port) is set to 0 (any free port); its plain port is a free port picked here.
The child exits when :meth:`KinesisMock.stop` is called, when this object is garbage
collected, at interpreter exit, or within ~0.25 s of this process dying (``preload.js``
polls the parent).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

from ..clock import monotonic_s
from .errors import EmulatorError

__all__ = ["KinesisMock", "install_kinesis_local", "KINESIS_LOCAL_VERSION", "kinesis_local_dir"]

log = logging.getLogger("kinesis_actors.emulator.kinesis_mock")

KINESIS_LOCAL_VERSION = "0.6.2"
"""The pinned npm ``kinesis-local`` (kinesis-mock) version, as in the shipped package-lock.json."""

_FILES = ("package.json", "package-lock.json", "preload.js")
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_INSTALL_LOCK = threading.Lock()


def kinesis_local_dir() -> Path:
    """The cache folder kinesis-local is installed into (see the module docstring); not created here."""
    base = os.environ.get("KINESIS_ACTORS_CACHE")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(base) if base else cache / "kinesis-actors"
    return root / f"kinesis-local-{KINESIS_LOCAL_VERSION}"


def install_kinesis_local(directory: Path | None = None, *, timeout_s: float = 300.0) -> Path:
    """Install kinesis-local from the shipped lock file with ``npm ci``, unless already there.

    Args:
        directory: where (default :func:`kinesis_local_dir`).
        timeout_s: longest ``npm ci``, seconds.

    Returns:
        The package folder holding ``main.js`` and ``server.json``
        (``<directory>/node_modules/kinesis-local``).

    Raises:
        EmulatorError: node or npm is missing, or ``npm ci`` failed (its output in the message).
    """
    directory = directory or kinesis_local_dir()
    package = directory / "node_modules" / "kinesis-local"
    marker = directory / "node_modules" / ".kinesis-actors-installed"
    with _INSTALL_LOCK:
        shipped = resources.files("kinesis_actors.emulator") / "kinesis_local"
        lock = shipped.joinpath("package-lock.json").read_bytes()
        if marker.is_file() and marker.read_bytes() == lock and (package / "main.js").is_file():
            _refresh_preload(directory, shipped)
            return package
        npm = shutil.which("npm")
        if shutil.which("node") is None or npm is None:
            raise EmulatorError("the enhanced fan-out emulator needs Node.js >= 18 and npm (kinesis-mock runs on "
                                "node); install them, or fill " + str(directory) + " by hand (npm ci there)")
        directory.mkdir(parents=True, exist_ok=True)
        for name in _FILES:
            (directory / name).write_bytes(shipped.joinpath(name).read_bytes())
        log.info("installing kinesis-local %s into %s (npm ci, once)", KINESIS_LOCAL_VERSION, directory)
        try:
            done = subprocess.run([npm, "ci", "--omit=optional", "--no-audit", "--no-fund"], cwd=directory,
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as e:
            raise EmulatorError(f"npm ci of kinesis-local in {directory} took more than {timeout_s:.0f} s") from e
        if done.returncode != 0 or not (package / "main.js").is_file():
            tail = (done.stdout + done.stderr).strip()[-2000:]
            raise EmulatorError(f"npm ci of kinesis-local in {directory} failed (exit {done.returncode}):\n{tail}")
        marker.write_bytes(lock)
        return package


def _refresh_preload(directory: Path, shipped: Any) -> None:
    data = shipped.joinpath("preload.js").read_bytes()
    target = directory / "preload.js"
    if not target.is_file() or target.read_bytes() != data:
        target.write_bytes(data)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _kill(proc: subprocess.Popen[bytes], owner_pid: int) -> None:
    if os.getpid() != owner_pid or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5.0)


class KinesisMock:
    """kinesis-mock in a child ``node`` process on ``127.0.0.1``; a context manager.

    Example::

        with KinesisMock() as km:
            boto3.client("kinesis", endpoint_url=km.endpoint, region_name="us-east-1",
                         aws_access_key_id="testing", aws_secret_access_key="testing")

    What it is like (measured on kinesis-local 0.6.2): streams become ``ACTIVE`` after
    0.5 s; it sends one ``SubscribeToShardEvent`` per second per subscription; after a
    client drops a subscription it refuses a new one with ``ResourceInUseException`` for
    about 2 s, and it refuses a second subscription of one consumer and shard the same
    way, both as HTTP 200 followed by an exception frame (AWS answers the refusal with
    an HTTP error status); in-memory only.

    Args:
        shard_limit: ``SHARD_LIMIT``, most shards per account (kinesis-mock's default is 50).
        startup_timeout_s: how long :meth:`start` waits for it to answer HTTP, seconds.
        directory: where kinesis-local is installed (default :func:`kinesis_local_dir`).

    Raises:
        EmulatorError (from :meth:`start`): node is missing, the install failed, or the
            server did not answer within ``startup_timeout_s`` (its output in the message).
    """

    def __init__(self, *, shard_limit: int = 200, startup_timeout_s: float = 60.0,
                 directory: Path | None = None) -> None:
        self.shard_limit = shard_limit
        self.startup_timeout_s = startup_timeout_s
        self.directory = directory
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._output: collections.deque[str] = collections.deque(maxlen=40)
        self._drain: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``, its plain HTTP endpoint (valid after :meth:`start`).

        Raises:
            EmulatorError: never started.
        """
        if self._port is None:
            raise EmulatorError("KinesisMock.endpoint is only known after start()")
        return f"http://127.0.0.1:{self._port}"

    @property
    def pid(self) -> int | None:
        """Process id of the running node process, or None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> KinesisMock:
        """Install kinesis-local if needed, start it, and wait until it answers HTTP. Returns self."""
        if self.pid is not None:
            return self
        package = install_kinesis_local(self.directory)
        node = shutil.which("node")
        if node is None:
            raise EmulatorError("node is not installed (kinesis-mock runs on Node.js >= 18)")
        port = _free_port("127.0.0.1")
        env = {**os.environ, "KINESIS_MOCK_PLAIN_PORT": str(port), "KINESIS_MOCK_TLS_PORT": "0",
               "LOG_LEVEL": "WARN", "SHARD_LIMIT": str(self.shard_limit), "KA_PARENT_PID": str(os.getpid())}
        preload = package.parent.parent / "preload.js"
        # main.js must run from its package folder, which holds server.json.
        proc = subprocess.Popen([node, "-r", str(preload), "main.js"], cwd=package, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._proc, self._port = proc, port
        self._finalizer = weakref.finalize(self, _kill, proc, os.getpid())
        self._output.clear()
        self._drain = threading.Thread(target=self._read_output, args=(proc, self._output), daemon=True,
                                       name=f"kinesis-mock-{proc.pid}")
        self._drain.start()
        try:
            self._await_http(proc)
        except BaseException:
            self.stop()
            raise
        log.info("kinesis-mock started at %s (pid %d)", self.endpoint, proc.pid)
        return self

    @staticmethod
    def _read_output(proc: subprocess.Popen[bytes], tail: collections.deque[str]) -> None:
        child = logging.getLogger("kinesis_actors.emulator.kinesis_mock.child")
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    tail.append(line)
                    child.info("[pid %d] %s", proc.pid, line)
        except (OSError, ValueError):
            pass

    def _await_http(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = monotonic_s() + self.startup_timeout_s
        body = json.dumps({}).encode()
        while True:
            request = urllib.request.Request(self.endpoint, data=body, method="POST", headers={
                "X-Amz-Target": "Kinesis_20131202.ListStreams", "Content-Type": "application/x-amz-json-1.1"})
            try:
                with _DIRECT.open(request, timeout=5) as response:
                    response.read()
                return
            except urllib.error.HTTPError:
                return  # an HTTP answer, even an error, means it serves
            except (urllib.error.URLError, OSError):
                pass
            if proc.poll() is not None or monotonic_s() > deadline:
                if self._drain is not None:
                    self._drain.join(1.0)
                what = f"exited with code {proc.returncode}" if proc.poll() is not None else \
                    f"did not answer HTTP within {self.startup_timeout_s:g} s"
                raise EmulatorError(f"kinesis-mock (pid {proc.pid}) {what}; its output:\n"
                                    + ("\n".join(self._output) or "(none)"))
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the node process (SIGTERM, then SIGKILL after 5 s); idempotent. Its data is lost."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _kill(proc, os.getpid())
        if self._drain is not None:
            self._drain.join(2.0)
            self._drain = None
        if proc.stdout is not None:
            proc.stdout.close()
        log.info("kinesis-mock at %s (pid %d) stopped", self.endpoint, proc.pid)

    def __enter__(self) -> KinesisMock:
        """Start it (see :meth:`start`) and return it."""
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        """Stop it (see :meth:`stop`)."""
        self.stop()

    def __repr__(self) -> str:
        return f"KinesisMock({self._port and self.endpoint}, {'running' if self.pid else 'stopped'})"
