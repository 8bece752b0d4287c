"""Start and stop kinesalite (npm) on 127.0.0.1 for the tests (see server.js beside this file).

kinesalite is installed into ``tests/kinesalite/node_modules`` by ``npm ci`` (``make
test-kinesalite`` and ``.ci/run`` do it). :meth:`Kinesalite.start` raises
:class:`KinesaliteUnavailable` when node or the package is missing, or the server does
not come up; the fixture turns that into a skip locally and a failure in CI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_LISTENING = re.compile(r"kinesalite listening on 127\.0\.0\.1:(\d+)")


class KinesaliteUnavailable(RuntimeError):
    """node or kinesalite is missing, or the server did not start."""


class Kinesalite:
    """One kinesalite server process (in-memory, 127.0.0.1, any free port)."""

    def __init__(self, process: subprocess.Popen[str], port: int, output: list[str], drain: threading.Thread) -> None:
        self.process = process
        self.port = port
        self.output = output
        self._drain = drain

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, *, timeout_s: float = 20.0, shard_limit: int = 1000, stream_ms: int = 50) -> Kinesalite:
        node = shutil.which("node")
        if node is None:
            raise KinesaliteUnavailable("node is not installed (Node.js >= 18 runs kinesalite)")
        if not (HERE / "node_modules" / "kinesalite" / "package.json").is_file():
            raise KinesaliteUnavailable(f"kinesalite is not installed: run `npm ci --omit=optional` in {HERE}")
        env = {**os.environ, "KINESALITE_SHARD_LIMIT": str(shard_limit), "KINESALITE_CREATE_STREAM_MS": str(stream_ms),
               "KINESALITE_DELETE_STREAM_MS": str(stream_ms), "KINESALITE_UPDATE_STREAM_MS": str(stream_ms)}
        process = subprocess.Popen([node, str(HERE / "server.js"), "0"], cwd=HERE, env=env, text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output: list[str] = []
        port: list[int] = []
        ready = threading.Event()

        def drain() -> None:  # keeps the pipe empty for the server's whole life
            assert process.stdout is not None
            for line in process.stdout:
                output.append(line.rstrip())
                del output[:-200]  # the last lines are enough to explain an exit
                match = _LISTENING.search(line)
                if match and not port:
                    port.append(int(match.group(1)))
                    ready.set()
            ready.set()

        drainer = threading.Thread(target=drain, name="kinesalite-output", daemon=True)
        drainer.start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.05):
            if time.monotonic() > deadline:
                break
        if not port:
            server = cls(process, 0, output, drainer)
            server.process.kill()
            server.stop()
            raise KinesaliteUnavailable(f"kinesalite did not start within {timeout_s} s: {' | '.join(output[-5:])}")
        return cls(process, port[0], output, drainer)

    def exit_report(self) -> str | None:
        """None while the server runs; else its exit code and last output lines."""
        code = self.process.poll()
        if code is None:
            return None
        return f"kinesalite exited with code {code}: " + " | ".join(self.output[-20:])

    def stop(self) -> None:
        """Close the server's stdin (it exits), then kill it if it is still there after 5 s; close its pipes."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            self.process.wait(timeout=5)
        except Exception:
            self.process.kill()
            self.process.wait(timeout=5)
        self._drain.join(timeout=5)  # it reads to EOF, which the exit gives
        if self.process.stdout is not None:
            self.process.stdout.close()
