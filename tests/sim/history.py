"""The event history of one simulated run: what happened, in order, at which virtual time.

Every event is ``(time, kind, fields)``; the checker reads the history after (and the sink and
the table while) the run goes. :meth:`History.digest` hashes it (two runs of one seed must give
the same digest); :meth:`History.around` is the shortened history a failing seed prints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

__all__ = ["History", "Event"]

Event = tuple[float, str, dict[str, Any]]


class History:
    """Events in the order they happened.

    Args:
        clock: virtual seconds (each event's time).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.events: list[Event] = []
        self.t0 = clock()

    def add(self, kind: str, **fields: Any) -> None:
        """Append an event of ``kind`` at the current virtual time."""
        self.events.append((self._clock(), kind, fields))

    def digest(self) -> str:
        """SHA-256 of the whole history (times rounded to the microsecond), hex."""
        h = hashlib.sha256()
        for t, kind, fields in self.events:
            h.update(f"{t - self.t0:.6f} {kind} {sorted(fields.items())!r}\n".encode())
        return h.hexdigest()

    def line(self, event: Event) -> str:
        """One event as a line of text (time from the start of the run)."""
        t, kind, fields = event
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        return f"{t - self.t0:9.3f} {kind:<10} {text}"

    def around(self, at: float | None, *, last: int = 40) -> list[str]:
        """The shortened history: every fault, then the ``last`` events up to time ``at`` (None: the end)."""
        faults = [self.line(e) for e in self.events if e[1] == "fault"]
        upto = [e for e in self.events if at is None or e[0] <= at]
        return ["-- faults:", *faults, f"-- the last {last} events before the violation:",
                *(self.line(e) for e in upto[-last:])]
