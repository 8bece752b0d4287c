"""A CPU trace of one process (the emulator) over a read, to tell what bounds a steady window.

The steady rate of the throughput and peer_kcl_rs sections is (records after the first
delivery) / (last delivery - first delivery). On 2 cores the emulator (one Python process,
so at most one core of useful work) serves the same bytes inside or before that window,
depending on how far the reader had fetched by its first delivery. ``CpuTrace.cores`` says
how busy the emulator was inside the window: near 1.0 means the window was as short as the
emulator could serve what was still unserved at its start.
"""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any


class CpuTrace:
    """Samples a process's user+system CPU seconds every ``period_s`` (s) in a daemon thread.

    ``samples`` holds (``time.time()`` s, CPU s) pairs. psutil reads ``/proc/<pid>/stat``,
    whose clock ticks are 10 ms on Linux: a 0.5 s window is known to about 4 %.
    ``cpu_s`` is the sampling thread's own CPU time (to subtract from the bench driver's).
    """

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        import psutil

        self._proc = psutil.Process(pid)
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-trace", daemon=True)

    def _sample(self) -> None:
        try:
            t = self._proc.cpu_times()
        except Exception:
            return
        self.samples.append((time.time(), t.user + t.system))

    def _run(self) -> None:
        t0 = time.thread_time()
        self._sample()
        while not self._stop.wait(self.period_s):
            self._sample()
        self._sample()
        self.cpu_s = time.thread_time() - t0

    def __enter__(self) -> CpuTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_at(self, t: float) -> float | None:
        """The process's CPU seconds at wall time ``t``, interpolated; None outside the trace."""
        samples = self.samples
        if not samples or not samples[0][0] <= t <= samples[-1][0]:
            return None
        i = bisect.bisect_left(samples, t, key=lambda s: s[0])  # samples are in time order
        if i == 0 or samples[i][0] == t:
            return samples[i][1]
        (ta, ca), (tb, cb) = samples[i - 1], samples[i]
        return ca + (cb - ca) * (t - ta) / max(1e-9, tb - ta)

    def cores(self, t_a: float, t_b: float) -> float | None:
        """Mean cores the process used between wall times ``t_a`` < ``t_b``; None if the
        trace does not cover both."""
        a, b = self.cpu_at(t_a), self.cpu_at(t_b)
        if a is None or b is None or t_b <= t_a:
            return None
        return (b - a) / (t_b - t_a)


def window_cores(trace: CpuTrace, events: list[tuple[float, int]]) -> float | None:
    """Mean cores ``trace``'s process used between the first and the last delivery of ``events``."""
    if len(events) < 2:
        return None
    times = [t for t, _ in events]
    return trace.cores(min(times), max(times))
