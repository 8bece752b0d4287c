"""The processes of a Ray cluster (or a pipeline run) that a test started, found and ended by
themselves: never with ``ray stop``, which stops every Ray on the machine.

A cluster's processes are those naming its temp dir (``--temp-dir``, ``RAY_TMPDIR``) in their
command lines, or those in one session (a ``start_new_session=True`` child's pid is its session
id; Ray's workers have process groups of their own but stay in their driver's session), and
the children of either.
"""

from __future__ import annotations

import os
import signal
import socket

import psutil

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    sockets, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


def cluster_processes(*, temp_dir: str | None = None, session: int | None = None) -> list[psutil.Process]:
    """Every process naming ``temp_dir`` in its command line or in session ``session``, and all
    their children; never this process."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            mine = session is not None and os.getsid(proc.pid) == session
            if mine or (temp_dir is not None and any(temp_dir in part for part in proc.info["cmdline"] or ())):
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
        except _GONE:
            continue
    found.pop(os.getpid(), None)
    return list(found.values())


def end_processes(procs: list[psutil.Process], *, grace_s: float = 5.0) -> None:
    """SIGTERM to each of ``procs``, SIGKILL to those still alive after ``grace_s`` seconds,
    then wait up to 5 s for those."""
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except _GONE:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except _GONE:
            pass
    psutil.wait_procs(alive, timeout=5)
