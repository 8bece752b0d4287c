"""``python -m kinesis_actors.emulator``: the server process :class:`~kinesis_actors.emulator.Emulator` starts
(it prints its endpoint URL on stdout, then serves until interrupted or its parent dies)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from ..errors import InvalidError
from .errors import EmulatorError
from .server import DEFAULT_HOST, serve

log = logging.getLogger("kinesis_actors.emulator")

_PARENT_POLL_S = 0.25
_STOP_TIMEOUT_S = 5.0


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
