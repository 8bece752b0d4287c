"""The parent's side of an emulator child process's pipes and end: its stdout and stderr
forwarded to ``logging`` (the endpoint line it reports picked out), and its termination.

Used by :class:`~kinesis_actors.emulator.launcher.Emulator`. The functions take the
``subprocess.Popen`` (text mode) and never the ``Emulator``: the reader threads and the
``weakref.finalize`` that kills the child must not keep the ``Emulator`` alive.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import re
import subprocess

__all__ = ["STOP_TIMEOUT_S", "kill_child", "forward_stdout", "forward_stderr"]

log = logging.getLogger("kinesis_actors.emulator")

STOP_TIMEOUT_S = 5.0
"""How long a child gets after SIGTERM, then after SIGKILL, to exit, seconds."""

_ENDPOINT_RE = re.compile(r"^http://(\[[0-9a-fA-F:]+\]|[0-9.]+):(\d+)$")
_LEVEL_PREFIX_RE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):")
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
           "CRITICAL": logging.CRITICAL}


def kill_child(proc: subprocess.Popen[str], owner_pid: int | None = None) -> None:
    """Terminate (then kill) a child process and reap it, waiting up to :data:`STOP_TIMEOUT_S`
    after each signal; its pipes are closed. Safe to call twice; raises nothing (a child
    that is already gone is fine).

    With ``owner_pid``, does nothing in any other process (e.g. a fork that inherited
    the finalizer): only the process that started the child stops it.
    """
    if owner_pid is not None and os.getpid() != owner_pid:
        return
    if proc.poll() is None:
        try:
            proc.terminate()
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("emulator process %d ignored SIGTERM for %.0f s; killing it", proc.pid, STOP_TIMEOUT_S)
            proc.kill()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # uninterruptible in the kernel: give up rather than raise
                log.warning("emulator process %d still there %.0f s after SIGKILL", proc.pid, STOP_TIMEOUT_S)
        except ProcessLookupError:
            pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


def forward_stdout(proc: subprocess.Popen[str], endpoints: queue.Queue[str]) -> None:
    """Read the child's stdout until it closes (a reader thread's target): a line that is an
    endpoint (``http://127.0.0.1:PORT``) goes to ``endpoints``, any other non-empty line is
    logged at INFO on ``kinesis_actors.emulator.child``. Returns when the pipe closes."""
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


def forward_stderr(proc: subprocess.Popen[str], tail: collections.deque[str]) -> None:
    """Read the child's stderr until it closes (a reader thread's target): each non-empty
    line is kept in ``tail`` (a bounded deque, for the error of a failed start) and logged on
    ``kinesis_actors.emulator.child`` at the level its ``LEVEL:`` prefix names (WARNING
    without one). Returns when the pipe closes."""
    child_log = logging.getLogger("kinesis_actors.emulator.child")
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            line = line.rstrip("\n")
            if not line:
                continue
            tail.append(line)
            match = _LEVEL_PREFIX_RE.match(line)
            level = _LEVELS[match.group(1)] if match else logging.WARNING
            child_log.log(level, "[pid %d] %s", proc.pid, line)
    except (OSError, ValueError):
        pass
