"""Batching: one shard's records gathered until a limit or the window is reached.

:class:`BatchGatherer` holds records fetched and not yet handed to the downstream. A batch
is ready when it holds ``max_records`` records or ``max_bytes`` bytes, or when
``window_s`` has passed since its oldest record arrived (at once with no window).
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
import itertools
from collections.abc import Callable, Iterable, Sequence

from ..errors import InvalidError
from ..records import Record

__all__ = ["BatchGatherer", "record_size"]


def record_size(record: Record) -> int:
    """Bytes a record counts for in batch limits: payload plus partition key (as the byte budget counts)."""
    return len(record.data) + len(record.partition_key)


class BatchGatherer:
    """Records of one shard waiting to form a batch (or a round of lane batches), in order.

    With ``lanes > 1`` (``parallelization_factor``) what is taken is a **round**: a
    contiguous run of held records, in shard order, cut into one batch per lane by
    partition key. Within a round every record of one key goes to the same lane, and a
    key seen first in the round goes to the lane holding the fewest records, so the
    lanes fill evenly whatever the keys hash to. (Rounds are delivered one after another,
    so a key may use another lane in the next round and its records still arrive in
    order.) A round is full once its next record's lane has reached a limit, or when a
    new key finds every lane full; ``max_bytes`` applies per lane. Rounds keep every
    lane's batch inside one contiguous span of the shard, so once a round is
    acknowledged the checkpoint lies past all of it. Lanes that gathered independently,
    by a fixed hash of the key, ended their batches at scattered positions, and with the
    checkpoint rule a lane could rarely start before the others' next batches were done;
    a fixed hash also leaves lanes uneven (64 keys hash to lanes of 10 to 21 keys), and
    the fullest lane closes the round.

    Args:
        max_records: most records per batch (> 0).
        max_bytes: most bytes per batch (:func:`record_size` summed), or None. A record
            larger than this alone makes a batch of one.
        window_s: longest wait from the oldest gathered record to its delivery, seconds
            (0.0: every :meth:`take` returns what is there). The window of a record counts
            from its ``ApproximateArrivalTimestamp`` when ``wall_clock`` is given, so the
            wait at the tip before the ``GetRecords`` that fetched it is part of the window
            (Lambda's window bounds the batching latency the same way); never from before
            ``window_s`` ago nor from after it was gathered, so a skewed clock can shorten
            a window but never lengthen it.
        clock: monotonic seconds.
        lanes: batches per round (>= 1).
        wall_clock: epoch seconds (``time.time``), or None to count windows from gathering.

    Raises:
        InvalidError: a limit that is not positive, a negative window, or ``lanes < 1``.
    """

    def __init__(self, *, max_records: int, max_bytes: int | None = None, window_s: float = 0.0,
                 clock: Callable[[], float], lanes: int = 1,
                 wall_clock: Callable[[], float] | None = None) -> None:
        if max_records <= 0 or (max_bytes is not None and max_bytes <= 0) or window_s < 0 or lanes < 1:
            raise InvalidError(f"BatchGatherer needs max_records > 0, max_bytes > 0 or None, window_s >= 0 and "
                               f"lanes >= 1, got {max_records!r}, {max_bytes!r}, {window_s!r}, {lanes!r}")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.window_s = window_s
        self.lanes = lanes
        self._clock = clock
        self._wall_clock = wall_clock if window_s > 0 else None
        # The held records, and beside them when each was gathered and its size: parallel
        # deques, not one tuple per record, so a full garbage collection (which stops the
        # reader process) has one object per held record to scan, not two.
        self._held: collections.deque[Record] = collections.deque()
        self._stamps: collections.deque[float] = collections.deque()
        self._record_sizes: collections.deque[int] = collections.deque()
        self.held_bytes = 0
        # The round at the front of _held: how many records, whether a limit closed it, each
        # record's lane, per-lane shares, and the lane of each key in it.
        self._round = 0
        self._full = False
        self._lane_by_index: list[int] = []
        self._counts = [0] * lanes
        self._sizes = [0] * lanes
        self._key_lane: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._held)

    def add(self, records: Iterable[Record]) -> None:
        """Gather ``records`` (in sequence order, after those already held), stamped with their
        arrival (see ``wall_clock``) or now."""
        now, wall = self._clock(), self._wall_clock
        records = list(records)
        sizes = list(map(record_size, records))
        if wall is None:
            stamps: list[float] = [now] * len(records)
        else:
            wall_now, window_s = wall(), self.window_s
            stamps = [now if (arrival := r.arrival_epoch_s) is None
                      else now - min(window_s, max(0.0, wall_now - arrival)) for r in records]
        # every column computed before any deque grows: the three stay in step
        self._stamps.extend(stamps)
        self._held.extend(records)
        self._record_sizes.extend(sizes)
        self.held_bytes += sum(sizes)
        self._extend_round()

    def _extend_round(self) -> None:
        """Grow the front round over newly held records until the next one cannot join (its lane is full)."""
        held = self._held
        if self._full or self._round == len(held):
            return
        if self.lanes == 1 and self.max_bytes is None:  # O(1): one batch of up to max_records
            self._round = min(len(held), self.max_records)
            self._full = self._round == self.max_records
            return
        counts, sizes, key_lane = self._counts, self._sizes, self._key_lane
        for record, n in zip(itertools.islice(held, self._round, None),
                             itertools.islice(self._record_sizes, self._round, None)):
            lane = key_lane.get(record.partition_key)
            if lane is None:  # a key new to the round: the emptiest lane that can take the record
                lane = min((i for i in range(self.lanes) if not self._at_limit(i, n)), key=counts.__getitem__,
                           default=None)
            if lane is None or self._at_limit(lane, n):
                self._full = True  # the round ends before this record
                return
            key_lane[record.partition_key] = lane
            counts[lane] += 1
            sizes[lane] += n
            self._lane_by_index.append(lane)
            self._round += 1
        if all(self._filled(lane) for lane in range(self.lanes)):
            self._full = True  # ready without waiting to see the record after it

    def _filled(self, lane: int) -> bool:
        """True once ``lane`` holds ``max_records`` records or ``max_bytes`` bytes."""
        return self._counts[lane] >= self.max_records or (
            self.max_bytes is not None and self._sizes[lane] >= self.max_bytes)

    def _at_limit(self, lane: int, n: int) -> bool:
        """True if ``lane`` cannot take one more record of ``n`` bytes (a record larger than
        ``max_bytes`` still goes alone into an empty lane)."""
        count = self._counts[lane]
        if count >= self.max_records:
            return True
        return self.max_bytes is not None and count > 0 and self._sizes[lane] + n > self.max_bytes

    def due_in(self) -> float | None:
        """Seconds until a batch is ready (0.0: ready now), or None when nothing is held."""
        if not self._held:
            return None
        if self.window_s == 0 or self._full:
            return 0.0
        return max(0.0, self._stamps[0] + self.window_s - self._clock())

    def ready(self) -> bool:
        """True when :meth:`take` would return a batch."""
        return self.due_in() == 0.0

    def take_round(self, *, force: bool = False) -> list[list[Record]] | None:
        """The next round, one list per lane (some maybe empty), if ready (or ``force``), else None.

        No lane's batch exceeds ``max_records`` nor (but for a single large record) ``max_bytes``.
        """
        if not self._held or not (force or self.ready()):
            return None
        parts: list[list[Record]] = [[] for _ in range(self.lanes)]
        popleft, pop_size, pop_stamp = self._held.popleft, self._record_sizes.popleft, self._stamps.popleft
        for lane in self._lane_by_index if self._lane_by_index else itertools.repeat(0, self._round):
            self.held_bytes -= pop_size()
            pop_stamp()
            parts[lane].append(popleft())
        self._restart_round()
        return parts

    def take(self, *, force: bool = False) -> list[Record] | None:
        """The next batch if ready (or ``force``), else None (one lane only).

        Raises:
            InvalidError: with ``lanes > 1`` (a round is one batch per lane: :meth:`take_round`).
        """
        if self.lanes > 1:
            raise InvalidError("BatchGatherer.take() hands out one batch; with lanes > 1 use take_round()")
        parts = self.take_round(force=force)
        if parts is None:
            return None
        return parts[0]

    def _restart_round(self) -> None:
        self._round, self._full = 0, False
        self._lane_by_index = []
        self._counts = [0] * self.lanes
        self._sizes = [0] * self.lanes
        self._key_lane = {}
        self._extend_round()

    def drop(self) -> Sequence[Record]:
        """Forget every held record (a seek or a stop: they were never acknowledged); return them."""
        records = list(self._held)
        self._held.clear()
        self._stamps.clear()
        self._record_sizes.clear()
        self.held_bytes = 0
        self._restart_round()
        return records
