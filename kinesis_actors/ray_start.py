"""Ray's start by ``subscribe()``: ``ray.init()`` with Ray's defaults, bounded by a deadline.

``ray.init()`` without an address does not always start a new Ray: it connects to the
cluster named by ``RAY_ADDRESS``, else to the one in Ray's address file
(``$RAY_TMPDIR/ray/ray_current_cluster``, default ``/tmp/ray/ray_current_cluster``), which
``ray start`` writes and a crashed or killed cluster leaves behind. Connecting to a cluster
that is gone then waits on its GCS for many minutes, with no output. So the start runs in a
daemon thread joined with a deadline, and a start that misses it raises a
:class:`~kinesis_actors.errors.StartError` saying what Ray was doing (connecting where, named
by what, or starting a local Ray). The thread cannot be cancelled: a late ``ray.init()`` may
still finish in the background, which leaves Ray initialised as the user's own call would.
The thread stays parked once Ray is up: Ray starts its local processes (GCS, raylet) with
Linux's parent-death signal, which fires when the THREAD that forked them ends.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from .clock import monotonic_s
from .errors import StartError

__all__ = ["start_ray", "ray_init_target", "ray_address_file"]

log = logging.getLogger(__name__)


def ray_address_file() -> str:
    """Where ``ray start`` records the address ``ray.init()`` connects to: Ray's temp dir
    (``RAY_TMPDIR``, else ``TMPDIR`` on Linux, else ``/tmp``) + ``/ray/ray_current_cluster``."""
    base = os.environ.get("RAY_TMPDIR") or (os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None)
    return os.path.join(base or os.path.join(os.sep, "tmp"), "ray", "ray_current_cluster")


def ray_init_target() -> str:
    """What ``ray.init()`` without an address is about to do, in words, for messages: connect
    to ``RAY_ADDRESS``, connect to the address in Ray's address file, or start a local Ray."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        return f"connecting to the Ray cluster at {address} named by RAY_ADDRESS"
    path = ray_address_file()
    try:
        with open(path) as f:
            address = f.read().strip()
    except OSError:
        address = ""
    if address:
        return (f"connecting to the Ray cluster at {address} named by Ray's address file {path} (written by "
                "`ray start`; if that cluster is gone, delete the file or set RAY_ADDRESS=local)")
    return "starting a local Ray (ray.init() with Ray's defaults)"


def start_ray(timeout_s: float) -> float:
    """``ray.init(configure_logging=False)`` unless Ray is initialised, waiting at most ``timeout_s``.

    Ray's own ``ray.init()`` sets a SIGTERM handler that exits the process (so its atexit
    shutdown runs) when called on the main thread; as it runs in a thread here, the same
    handler is set here, on the main thread, unless the process already has one.

    Args:
        timeout_s: longest wait, seconds.

    Returns:
        The seconds it took (0.0 when Ray was already initialised).

    Raises:
        StartError: Ray was not up within ``timeout_s`` (the message says what it was doing),
            or ``ray.init()`` raised (chained; the message says what it was doing).
    """
    t0 = monotonic_s()
    import ray  # its import (seconds on a loaded machine) is part of the start

    if ray.is_initialized():
        return 0.0
    target = ray_init_target()
    log.info("starting Ray: %s", target)
    failed: list[BaseException] = []
    settled = threading.Event()  # ray.init() returned or raised

    def init() -> None:
        try:
            ray.init(configure_logging=False)
        except BaseException as e:  # handed to the caller below
            failed.append(e)
            return
        finally:
            settled.set()
        threading.Event().wait()  # parked for good: Ray's local processes die with the thread that forked them

    thread = threading.Thread(target=init, name="kinesis-actors-ray-init", daemon=True)
    ray_log = logging.getLogger("ray._private.worker")
    ray_log.addFilter(_not_main_thread_warning)  # the handler is set below, on the main thread
    try:
        thread.start()
        settled.wait(max(0.0, t0 + timeout_s - monotonic_s()))
    finally:
        ray_log.removeFilter(_not_main_thread_warning)
    spent = monotonic_s() - t0
    if not settled.is_set():
        raise StartError(f"Ray did not start within start_timeout_s={timeout_s:g} s: ray.init() was still "
                         f"{target}", retriable=False)
    if failed:
        raise StartError(f"Ray's start failed after {spent:.1f} s ({target}): {failed[0]!r:.500}",
                         retriable=False) from failed[0]
    _exit_on_sigterm()
    return spent


def _not_main_thread_warning(record: logging.LogRecord) -> bool:
    """Drops Ray's "SIGTERM handler is not set because current thread is not the main thread"."""
    return not str(record.msg).startswith("SIGTERM handler is not set")


def _exit_on_sigterm() -> None:
    """What ``ray.init()`` does on the main thread: SIGTERM exits through ``sys.exit``, so Ray's
    atexit shutdown runs. Only where Python's default handler is still in place."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
