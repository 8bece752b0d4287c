"""The windows of :class:`~kinesis_actors.sinks.dataset.DatasetSink`, as plain asyncio.

:class:`DatasetSinkCore` gathers readers' batches into windows and hands each closed window
to ``fn`` in a worker thread, one at a time, in the order they closed; a batch's call returns
once ``fn`` returned for its window (the acknowledgement). The Ray actor of ``DatasetSink`` is
a thin shell over it, and unit tests drive it without Ray (an injected clock and
``to_dataset``). It also keeps the sink's side of the close
(:class:`~kinesis_actors.sinks.protocol.GatheringSink`): write at once, or drop unwritten.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from ..clock import Clock, monotonic_s
from ..errors import SinkError

__all__ = ["DatasetSinkCore", "as_table"]

log = logging.getLogger("kinesis_actors.sinks.dataset")

_RECENT_WRITES = 3  # fn calls whose longest is the expected time of the next one, at a close


def as_table(batch: Any) -> Any:
    """A batch (a pyarrow Table or RecordBatch, a :class:`~kinesis_actors.batch.RecordBatch`,
    or a sequence of Records) as a pyarrow Table."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    from ..arrow import records_to_table

    return records_to_table(batch)


@dataclasses.dataclass
class _Window:
    number: int
    opened_at: float
    tables: list[Any] = dataclasses.field(default_factory=list)
    records: int = 0
    bytes: int = 0
    done: asyncio.Future[None] | None = None
    timer: asyncio.TimerHandle | None = None


class DatasetSinkCore:
    """The windowing logic (plain asyncio; a unit test drives it without Ray).

    Args:
        fn: called with each window as a Dataset (in a worker thread); its return value is ignored.
        window_s / window_records / window_bytes: when a window closes (see :mod:`~kinesis_actors.sinks.dataset`).
        to_dataset: turns a window's list of Arrow tables into what ``fn`` receives
            (default ``ray.data.from_arrow``).
        clock: monotonic seconds (injectable).

    Closing (:meth:`begin_close`, :meth:`end_close`: the
    :class:`~kinesis_actors.sinks.protocol.GatheringSink` rule): from :meth:`begin_close` a
    window closes as soon as the writer is free, and a window is handed to ``fn`` only if
    ``fn`` is expected (the longest of its last few calls) to end by the close's
    ``finish_by_s``; otherwise it is dropped unwritten and its callers wait, unanswered,
    until :meth:`end_close` fails them.
    """

    def __init__(self, fn: Callable[[Any], Any], *, window_s: float, window_records: int, window_bytes: int,
                 to_dataset: Callable[[list[Any]], Any] | None = None, clock: Clock = monotonic_s) -> None:
        self.fn = fn
        self.window_s = window_s
        self.window_records = window_records
        self.window_bytes = window_bytes
        self._to_dataset = to_dataset or _from_arrow
        self._clock = clock
        self._open: _Window | None = None
        self._closed: asyncio.Queue[_Window] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._numbers = 0
        self._busy: _Window | None = None
        self._finish_by: float | None = None  # closing: writes must end by then (monotonic s)
        self._dropped: list[_Window] = []  # dropped at close; their callers are failed by end_close
        self._recent_writes: collections.deque[float] = collections.deque(maxlen=_RECENT_WRITES)
        self.counters: dict[str, Any] = {"windows_completed": 0, "windows_failed": 0, "records_written": 0,
                                         "bytes_written": 0, "batches_received": 0, "last_error": None,
                                         "last_window_s": None, "windows_dropped": 0, "records_dropped": 0}

    # ------------------------------------------------------------------ readers' side
    async def process_batch(self, batch: Any) -> None:
        """Add one reader's batch to the open window; return when ``fn`` returned for it.

        Raises:
            The exception ``fn`` raised for the window (the reader retries its batch).
        """
        table = as_table(batch)
        if table.num_rows == 0:
            return
        self._ensure_writer()
        window = self._open
        if window is None:
            loop = asyncio.get_running_loop()
            self._numbers += 1
            window = self._open = _Window(self._numbers, self._clock(), done=loop.create_future())
            if self._finish_by is None:  # closing: the window closes when the writer is free instead
                window.timer = loop.call_later(self.window_s, self._close_if_open, window)
        window.tables.append(table)
        window.records += table.num_rows
        window.bytes += table.nbytes
        self.counters["batches_received"] += 1
        done = window.done
        assert done is not None
        if (window.records >= self.window_records or window.bytes >= self.window_bytes
                or (self._finish_by is not None and self._writer_idle())):
            self._close_if_open(window)
        await asyncio.shield(done)

    def _writer_idle(self) -> bool:
        return self._busy is None and (self._closed is None or self._closed.empty())

    def _close_if_open(self, window: _Window) -> None:
        if self._open is window:
            self._open = None
            if window.timer is not None:
                window.timer.cancel()
            assert self._closed is not None
            self._closed.put_nowait(window)

    def _ensure_writer(self) -> None:
        if self._closed is None:
            self._closed = asyncio.Queue()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="dataset-sink-writer")

    async def _write_loop(self) -> None:
        assert self._closed is not None
        while True:
            window = await self._closed.get()
            if self._finish_by is not None and self._clock() + self._expected_write_s() > self._finish_by:
                self._drop(window, "it would not be written before the close's deadline")
                continue
            self._busy = window
            started = self._clock()
            try:
                await asyncio.to_thread(self._run_fn, window.tables)
            except Exception as e:
                self.counters["windows_failed"] += 1
                self.counters["last_error"] = repr(e)[:500]
                log.warning("dataset sink: fn failed on window %d (%d records): %r; its batches will be retried",
                            window.number, window.records, e)
                if window.done is not None and not window.done.done():
                    window.done.set_exception(e)
                    window.done.exception()  # retrieved: no "never retrieved" warning if no reader waits
            else:
                self.counters["windows_completed"] += 1
                self.counters["records_written"] += window.records
                self.counters["bytes_written"] += window.bytes
                if window.done is not None and not window.done.done():
                    window.done.set_result(None)
            finally:
                took = self._clock() - started
                self._recent_writes.append(took)
                self.counters["last_window_s"] = round(took, 3)
                self._busy = None
                window.tables = []
                if self._finish_by is not None and self._open is not None and self._closed.empty():
                    self._close_if_open(self._open)  # closing: what gathered meanwhile goes next

    def _run_fn(self, tables: list[Any]) -> None:
        self.fn(self._to_dataset(tables))

    # ------------------------------------------------------------------ owner's side
    async def flush(self, timeout_s: float | None = None) -> bool:
        """Close the open window now and wait until every closed window was handed to ``fn``.

        Returns:
            True when everything was flushed within ``timeout_s``.
        """
        deadline = None if timeout_s is None else self._clock() + timeout_s
        window = self._open
        if window is not None:
            self._close_if_open(window)
        while (self._closed is not None and not self._closed.empty()) or self._busy is not None:
            if deadline is not None and self._clock() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def begin_close(self, finish_by_s: float) -> float:
        """Closing (the :class:`~kinesis_actors.sinks.protocol.GatheringSink` rule): close the
        open window now; from now on a window closes as soon as the writer is free, and is
        handed to ``fn`` only if ``fn`` is expected to return within ``finish_by_s`` seconds
        from now (expected: the longest of the last few ``fn`` calls); otherwise it is
        dropped unwritten. Safe to call again (the later deadline applies).

        Returns:
            How long the readers may have to wait for an acknowledgement, seconds:
            ``finish_by_s``, or 0.0 when no write runs and none would fit (everything held
            or still coming is dropped, so no reader needs to wait).
        """
        self._finish_by = self._clock() + max(0.0, finish_by_s)
        if self._open is not None:
            self._close_if_open(self._open)  # the writer takes it next; later batches gather behind it
        if self._busy is None and self._expected_write_s() > finish_by_s:
            return 0.0
        return max(0.0, finish_by_s)

    def _expected_write_s(self) -> float:
        """How long the next ``fn`` call is expected to take: the longest of the last few, seconds."""
        return max(self._recent_writes, default=0.0)

    def end_close(self) -> int:
        """The readers have stopped: drop the open window and every window not handed to
        ``fn`` yet, fail their callers with ``SinkError`` (never an acknowledgement), leave
        closing. A window ``fn`` is writing finishes. Returns the records dropped since
        :meth:`begin_close` (by the deadline or now)."""
        window = self._open
        if window is not None:
            self._open = None
            self._drop(window, "its subscription closed")
        while self._closed is not None and not self._closed.empty():
            self._drop(self._closed.get_nowait(), "its subscription closed")
        error = SinkError("dataset sink: the window was dropped unwritten when its subscription closed; "
                          "its records are read again by the shards' next owner", retriable=True)
        for dropped in self._dropped:
            if dropped.done is not None and not dropped.done.done():
                dropped.done.set_exception(error)
                dropped.done.exception()  # retrieved: no "never retrieved" warning when no reader waits
        records = sum(w.records for w in self._dropped)
        self._dropped = []
        self._finish_by = None
        return records

    def _drop(self, window: _Window, why: str) -> None:
        """Forget ``window`` unwritten; its callers stay unanswered until :meth:`end_close`."""
        if window.timer is not None:
            window.timer.cancel()
        self.counters["windows_dropped"] += 1
        self.counters["records_dropped"] += window.records
        log.warning("dataset sink: window %d (%d records) dropped unwritten: %s; its records are read again "
                    "by the shards' next owner", window.number, window.records, why)
        window.tables = []
        self._dropped.append(window)

    def stats(self) -> dict[str, Any]:
        """Counters plus the open window's size and the windows waiting for ``fn``."""
        window = self._open
        waiting = self._closed.qsize() if self._closed is not None else 0
        return {**self.counters, "open_window_records": window.records if window else 0,
                "windows_waiting": waiting + (1 if self._busy is not None else 0)}


def _from_arrow(tables: list[Any]) -> Any:
    import ray.data

    return ray.data.from_arrow(tables)
