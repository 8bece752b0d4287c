"""Expiry as KCL judges it: on the judge's own monotonic clock, never another host's wall clock.

:class:`ExpiryObserver` remembers, per lease key, the counter it last saw and when it
first saw that counter. A lease is expired *for this observer* once its counter has not
changed for the row's ``lease_duration_ms``. An observer that sees a row for the first
time therefore waits one full duration before it calls it expired, and clock skew
between hosts cannot make a live lease look expired. Presence rows are judged the same
way (stale = expired). Each store has its own observer; a new process starts empty.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .rows import COUNTER, KEY

__all__ = ["ExpiryObserver"]


class ExpiryObserver:
    """What one store has seen of each row's counter, and since when (thread-safe).

    Args:
        clock: monotonic clock, seconds.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def note(self, row: Mapping[str, Any]) -> None:
        """Record that ``row``'s counter was seen now, unless this counter was seen before."""
        key, counter = row[KEY], int(row[COUNTER])
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen[0] != counter:
                self._seen[key] = (counter, now)

    def expired(self, key: str, counter: int, duration_ms: int) -> bool:
        """True when the newest counter seen for ``key`` has not changed for ``duration_ms``.

        A counter newer than any seen is noted (not expired); an older one (a stale Lease of
        the caller) is judged by the newest counter seen."""
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen[0] < counter:
                self._seen[key] = (counter, now)
                return False
            return (now - seen[1]) * 1000.0 >= duration_ms

    def last_counter(self, key: str) -> int | None:
        """The newest counter seen for ``key``, or None."""
        with self._lock:
            seen = self._seen.get(key)
        return None if seen is None else seen[0]

    def forget(self, key: str) -> None:
        """Drop what was seen of ``key`` (its row was deleted)."""
        with self._lock:
            self._seen.pop(key, None)
