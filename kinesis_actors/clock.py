"""The one place library code reads the time.

Every class that decides by time takes its clock as an argument (``clock: Clock``, seconds on a
monotonic scale; ``wall_clock: WallClock``, seconds since the epoch) and defaults it to the
readings here, so a unit test or a simulator drives time by passing its own. Nothing else in
``kinesis_actors`` calls :func:`time.monotonic` or :func:`time.time` directly; a shape test counts
those calls.

Facts relied on: :func:`time.monotonic` never goes backwards and is unaffected by wall-clock steps
(NTP), so every duration, deadline and lease-expiry judgement uses it; :func:`time.time` is used only
for values that leave the process (lease rows' ``lease_expiry``, ``AT_TIMESTAMP`` positions, record
ages), never to compare with another host's clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]
"""A monotonic clock: seconds (float) on an arbitrary origin, never decreasing."""

WallClock = Callable[[], float]
"""A wall clock: seconds (float) since the Unix epoch, UTC."""


monotonic_s: Clock = time.monotonic
"""Seconds on this process's monotonic clock: :func:`time.monotonic` itself, bound here
rather than wrapped, so a read costs no Python frame (the read path reads the clock several
times per batch) and a default ``clock=monotonic_s`` is the C function."""

wall_s: WallClock = time.time
"""Seconds since the Unix epoch by this host's wall clock: :func:`time.time` itself."""


cpu_s: Clock = time.process_time
"""CPU seconds this process has used (user + system, every thread): :func:`time.process_time`
itself, bound like :data:`monotonic_s`: the CPU of the load figures (a reader's event loop,
its I/O threads and its record filter alike)."""


def wall_ms() -> int:
    """Milliseconds since the Unix epoch by this host's wall clock, as DynamoDB and Kinesis count."""
    return int(time.time() * 1000)


def deadline_after(timeout_s: float, clock: Clock = monotonic_s) -> float:
    """The monotonic instant ``timeout_s`` seconds from now on ``clock``."""
    return clock() + timeout_s


def left_until(deadline: float, clock: Clock = monotonic_s) -> float:
    """Seconds left until ``deadline`` on ``clock``, never negative."""
    return max(0.0, deadline - clock())
