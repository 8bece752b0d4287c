"""A publisher thread for the sections that read under a steady trickle of records."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .common import client


class Publisher:
    """Puts ``entries(n)`` into ``stream`` every ``period_s`` seconds from a daemon thread while its ``with``
    block runs; ``n`` is the count of records put so far.

    ``entries`` returns ``PutRecords`` entries (``Data``, ``PartitionKey``, ``ExplicitHashKey``); they go out in
    calls of at most 500 (the API's limit). A call the emulator refuses (throttled, busy) is dropped, not retried:
    the load thins and the section's figures, which are the readers', go on; ``n`` counts what was accepted.
    Leaving the block stops the thread and joins it for at most 5 s.
    """

    def __init__(self, endpoint: str, stream: str, entries: Callable[[int], list[dict[str, Any]]],
                 period_s: float = 0.1, name: str = "bench-publisher") -> None:
        self.k = client(endpoint, "kinesis")
        self.stream, self.entries, self.period_s = stream, entries, period_s
        self.n = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)

    def _run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            batch = self.entries(self.n)
            try:
                for i in range(0, len(batch), 500):
                    self.k.put_records(StreamName=self.stream, Records=batch[i:i + 500])
                    self.n += len(batch[i:i + 500])
            except Exception:
                pass
            self.stop.wait(max(0.0, t + self.period_s - time.monotonic()))

    def __enter__(self) -> Publisher:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
