"""The rate of a cumulative counter over a moving window (every load figure is one)."""

from __future__ import annotations

import collections

__all__ = ["WindowRate"]


class WindowRate:
    """The rate of a cumulative counter over the last ``window_s`` seconds.

    Args:
        window_s: the window, seconds (> 0).

    Invariant: the samples kept are the newest one at or before ``newest - window_s`` and
    every later one, so memory is bounded by the sampling rate times the window.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: collections.deque[tuple[float, float]] = collections.deque()

    def add(self, now: float, total: float) -> None:
        """Record the counter's ``total`` at ``now`` (seconds on the caller's monotonic clock).
        A sample older than the newest one is ignored; a counter that went down (a restart)
        starts the window again."""
        if self._samples and now < self._samples[-1][0]:
            return
        if self._samples and total < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((now, total))
        while len(self._samples) >= 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def rate(self) -> float | None:
        """Growth per second over at least one window, or None before a full window was sampled."""
        if len(self._samples) < 2:
            return None
        (t0, v0), (t1, v1) = self._samples[0], self._samples[-1]
        if t1 - t0 < self.window_s * 0.999:  # also t1 <= t0, as window_s > 0
            return None
        return (v1 - v0) / (t1 - t0)
