"""Batching: one shard's records gathered until a limit or the window is reached.

:class:`BatchGatherer` holds records fetched and not yet handed to the downstream. A batch
is ready when it holds ``max_records`` records or ``max_bytes`` bytes, or when
``window_s`` has passed since its oldest record was gathered (at once with no window).
This is Lambda's batching (``BatchSize``, ``MaximumBatchingWindowInSeconds``, the 6 MB
payload limit): the window is a maximum wait, not a schedule, so a shard with a backlog
delivers full batches back to back and a shard at its tip delivers what it has when the
window ends (the consumer wakes at :meth:`BatchGatherer.due_in` even while it waits
before its next ``GetRecords``).

Records held here still count in the reader's byte budget (``max_buffered_bytes``): the
consumer gives their bytes back only once the batch they end up in is acknowledged.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence

from ..errors import InvalidError
from ..records import Record

__all__ = ["BatchGatherer", "record_size"]


def record_size(record: Record) -> int:
    """Bytes a record counts for in batch limits: payload plus partition key (as the byte budget counts)."""
    return len(record.data) + len(record.partition_key)


class BatchGatherer:
    """Records of one shard (or one lane of a shard) waiting to form a batch, in order.

    Args:
        max_records: most records per batch (> 0).
        max_bytes: most bytes per batch (:func:`record_size` summed), or None. A record
            larger than this alone makes a batch of one.
        window_s: longest wait from the oldest gathered record to its delivery, seconds
            (0.0: every :meth:`take` returns what is there).
        clock: monotonic seconds.

    Raises:
        InvalidError: a limit that is not positive, or a negative window.
    """

    def __init__(self, *, max_records: int, max_bytes: int | None = None, window_s: float = 0.0,
                 clock: Callable[[], float]) -> None:
        if max_records <= 0 or (max_bytes is not None and max_bytes <= 0) or window_s < 0:
            raise InvalidError(f"BatchGatherer needs max_records > 0, max_bytes > 0 or None and window_s >= 0, got "
                               f"{max_records!r}, {max_bytes!r}, {window_s!r}")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.window_s = window_s
        self._clock = clock
        self._held: collections.deque[tuple[float, Record, int]] = collections.deque()
        self.held_bytes = 0

    def __len__(self) -> int:
        return len(self._held)

    def add(self, records: Iterable[Record]) -> None:
        """Gather ``records`` (in sequence order, after those already held), stamped now."""
        now = self._clock()
        for r in records:
            n = record_size(r)
            self._held.append((now, r, n))
            self.held_bytes += n

    def _full_count(self) -> int:
        """How many records from the front make a full batch (a limit reached), or 0."""
        held = self._held
        if self.max_bytes is None:
            return self.max_records if len(held) >= self.max_records else 0
        size = 0
        for count, (_, _, n) in enumerate(held):  # count: records before this one
            if count == self.max_records:
                return count
            if size + n > self.max_bytes:
                return max(count, 1)  # a single record above the limit goes alone
            size += n
        return len(held) if len(held) == self.max_records or size == self.max_bytes else 0

    def due_in(self) -> float | None:
        """Seconds until a batch is ready (0.0: ready now), or None when nothing is held."""
        if not self._held:
            return None
        if self.window_s == 0 or self._full_count():
            return 0.0
        return max(0.0, self._held[0][0] + self.window_s - self._clock())

    def ready(self) -> bool:
        """True when :meth:`take` would return a batch."""
        return self.due_in() == 0.0

    def take(self, *, force: bool = False) -> list[Record] | None:
        """The next batch if one is ready (or ``force``: whatever is held, within the limits), else None.

        A batch never exceeds ``max_records`` nor (but for a single large record) ``max_bytes``.
        """
        if not self._held:
            return None
        count = self._full_count()
        if not count:
            if not force and self.window_s > 0 and self._clock() - self._held[0][0] < self.window_s:
                return None
            count = self._limited_count()
        batch: list[Record] = []
        for _ in range(count):
            _, record, n = self._held.popleft()
            self.held_bytes -= n
            batch.append(record)
        return batch

    def _limited_count(self) -> int:
        """Records from the front within both limits (at least one)."""
        if self.max_bytes is None:
            return min(len(self._held), self.max_records)
        size, count = 0, 0
        for _, _, n in self._held:
            if count == self.max_records or (count and size + n > self.max_bytes):
                break
            size += n
            count += 1
        return count

    def take_all(self) -> list[list[Record]]:
        """Every held record as batches within the limits (a drain: shard end), in order."""
        batches = []
        while (batch := self.take(force=True)) is not None:
            batches.append(batch)
        return batches

    def drop(self) -> Sequence[Record]:
        """Forget every held record (a seek or a stop: they were never acknowledged); return them."""
        records = [r for _, r, _ in self._held]
        self._held.clear()
        self.held_bytes = 0
        return records
