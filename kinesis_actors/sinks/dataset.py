"""A streaming Ray Dataset sink: readers' batches gathered into windows, each handed to ``fn(Dataset)``.

``DatasetSink(fn, window_s=..., window_records=..., window_bytes=...)`` owns one small
async actor and is passed as ``sink=`` to ``subscribe``. Each reader's
``process_batch(batch)`` call joins the open window and returns only when ``fn`` has
returned for that window. Returning is the reader's acknowledgement, so a checkpoint
never passes a record whose window ``fn`` has not finished (at-least-once). If ``fn``
raises, every call of that window raises; the readers retry their batches (with
backoff, up to ``max_sink_retries``), and the retried batches land in a later window.

A window closes when it is ``window_s`` old (counted from its first batch), or holds
``window_records`` records or ``window_bytes`` bytes (Arrow size of its batches). Windows are
handed to ``fn`` one at a time, in the order they closed.

Throughput: a reader has one batch in flight, so a window holds at most one batch per
shard (up to ``max_records`` records each) and a shard advances one batch per window.
Choose ``window_s`` with that in mind (a few seconds suits files such as Parquet).

``batch_format``: what crosses the object store from each reader to the sink actor.

* ``"records"``: the reader's :class:`~kinesis_actors.batch.RecordBatch` as it is (one
  compact object of contiguous buffers, not one pickled object per record); the sink
  turns it into Arrow with ``batch.to_arrow()``, which wraps the payload buffer without
  copying it.
* ``"pyarrow"``: the reader makes the ``pyarrow.Table`` (schema
  :data:`~kinesis_actors.arrow.RECORD_SCHEMA`, the same builder as ``read_kinesis``'s
  blocks) before the call, moving that small conversion from the one sink actor to
  the readers; Arrow buffers are serialised without per-record pickling.

Example::

    sink = DatasetSink(lambda ds: ds.write_parquet("/data/orders"), window_s=5.0,
                       batch_format="pyarrow")
    with conn.subscribe(KinesisStream("orders"), sink=sink) as sub:
        sub.wait(600)
    sink.close()
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..clock import monotonic_s
from ..errors import InvalidError, KinesisError

__all__ = ["DatasetSink", "DatasetSinkCore", "BATCH_FORMATS"]

log = logging.getLogger(__name__)

BATCH_FORMATS = ("records", "pyarrow")

_ACTOR_OPTION_KEYS = frozenset({"num_cpus", "memory", "resources", "scheduling_strategy", "runtime_env",
                                "label_selector", "name", "namespace", "lifetime"})


def _as_table(batch: Any) -> Any:
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
        window_s / window_records / window_bytes: when a window closes (see the module docstring).
        to_dataset: turns a window's list of Arrow tables into what ``fn`` receives
            (default ``ray.data.from_arrow``).
        clock: monotonic seconds (injectable).
    """

    def __init__(self, fn: Callable[[Any], Any], *, window_s: float, window_records: int, window_bytes: int,
                 to_dataset: Callable[[list[Any]], Any] | None = None,
                 clock: Callable[[], float] = monotonic_s) -> None:
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
        self.counters: dict[str, Any] = {"windows_completed": 0, "windows_failed": 0, "records_written": 0,
                                         "bytes_written": 0, "batches_received": 0, "last_error": None,
                                         "last_window_s": None}

    # ------------------------------------------------------------------ readers' side
    async def process_batch(self, batch: Any) -> None:
        """Add one reader's batch to the open window; return when ``fn`` returned for it.

        Raises:
            The exception ``fn`` raised for the window (the reader retries its batch).
        """
        table = _as_table(batch)
        if table.num_rows == 0:
            return
        self._ensure_writer()
        window = self._open
        if window is None:
            loop = asyncio.get_running_loop()
            self._numbers += 1
            window = self._open = _Window(self._numbers, self._clock(), done=loop.create_future())
            window.timer = loop.call_later(self.window_s, self._close_if_open, window)
        window.tables.append(table)
        window.records += table.num_rows
        window.bytes += table.nbytes
        self.counters["batches_received"] += 1
        done = window.done
        assert done is not None
        if window.records >= self.window_records or window.bytes >= self.window_bytes:
            self._close_if_open(window)
        await asyncio.shield(done)

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
                self.counters["last_window_s"] = round(self._clock() - started, 3)
                self._busy = None
                window.tables = []

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

    def stats(self) -> dict[str, Any]:
        """Counters plus the open window's size and the windows waiting for ``fn``."""
        window = self._open
        waiting = self._closed.qsize() if self._closed is not None else 0
        return {**self.counters, "open_window_records": window.records if window else 0,
                "windows_waiting": waiting + (1 if self._busy is not None else 0)}


def _from_arrow(tables: list[Any]) -> Any:
    import ray.data

    return ray.data.from_arrow(tables)


def _make_actor_class() -> Any:
    import ray

    class DatasetSinkActor:
        """Ray actor shell over :class:`DatasetSinkCore` (async; ``fn`` runs in a worker thread)."""

        def __init__(self, fn: Callable[[Any], Any], window_s: float, window_records: int, window_bytes: int) -> None:
            logging.basicConfig(level=logging.INFO)
            from ray.data import DataContext

            # One Dataset per window: progress bars and per-execution INFO lines would flood the logs.
            DataContext.get_current().enable_progress_bars = False
            logging.getLogger("ray.data").setLevel(logging.WARNING)
            self.core = DatasetSinkCore(fn, window_s=window_s, window_records=window_records,
                                        window_bytes=window_bytes)

        async def process_batch(self, batch: Any) -> None:
            await self.core.process_batch(batch)

        async def flush(self, timeout_s: float | None = None) -> bool:
            return await self.core.flush(timeout_s)

        async def stats(self) -> dict[str, Any]:
            return self.core.stats()

    return ray.remote(num_cpus=0, max_restarts=0,  # type: ignore[call-overload]  # Ray types task options only
                      max_concurrency=1000)(DatasetSinkActor)


_ACTOR_CLASS: Any = None


class DatasetSink:
    """A push-mode sink (``subscribe(..., sink=DatasetSink(fn))``) that hands windows of
    records to ``fn`` as a ``ray.data.Dataset`` (columns of :func:`~kinesis_actors.read_kinesis`).

    The handle owns its actor: :meth:`close` flushes the open window and stops it.
    Close the subscription first (its readers stop sending), then the sink.

    Args:
        fn: ``fn(ds)`` for each window, e.g. ``lambda ds: ds.write_parquet(path)``. It runs
            in the sink actor's process (pickled there), in a worker thread, one window at
            a time. Raising fails the window: its batches are retried by their readers.
        window_s: a window closes this many seconds after its first batch (5.0).
        window_records: ... or once it holds this many records (100,000).
        window_bytes: ... or this many bytes, Arrow size of its batches (64 MiB).
        batch_format: ``"records"`` (default: the reader's compact batch) or ``"pyarrow"``
            (an Arrow table made in the reader); see the module docstring.
        actor_options: Ray options for the sink actor (``num_cpus`` default 0,
            ``resources``, ``scheduling_strategy``, ``runtime_env``, ``name``...).

    Raises:
        InvalidError: a bad value (named in the message).
    """

    def __init__(self, fn: Callable[[Any], Any], *, window_s: float = 5.0, window_records: int = 100_000,
                 window_bytes: int = 64 << 20, batch_format: str = "records",
                 actor_options: Mapping[str, Any] | None = None) -> None:
        if not callable(fn):
            raise InvalidError(f"fn must be callable (fn(ds)), got {fn!r}")
        if (isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not math.isfinite(window_s)
                or window_s <= 0):
            raise InvalidError(f"window_s must be a finite number of seconds > 0, got {window_s!r}")
        for what, value in (("window_records", window_records), ("window_bytes", window_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidError(f"{what} must be a positive int, got {value!r}")
        if batch_format not in BATCH_FORMATS:
            raise InvalidError(f"batch_format must be one of {BATCH_FORMATS}, got {batch_format!r}")
        options = dict(actor_options or {})
        unknown = set(options) - _ACTOR_OPTION_KEYS
        if unknown:
            raise InvalidError(f"unknown actor_options {sorted(unknown)}; allowed: {sorted(_ACTOR_OPTION_KEYS)}")
        import ray

        global _ACTOR_CLASS
        if _ACTOR_CLASS is None:
            _ACTOR_CLASS = _make_actor_class()
        if not ray.is_initialized():
            ray.init(configure_logging=False)
        self.batch_format = batch_format
        self.window_s = float(window_s)
        self._actor = _ACTOR_CLASS.options(**options).remote(fn, float(window_s), window_records, window_bytes)
        self._closed = False
        self.final_stats: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"DatasetSink(window_s={self.window_s}, batch_format={self.batch_format!r})"

    def deliver(self, records: Sequence[Any]) -> Any:
        """The :class:`~kinesis_actors.sinks.protocol.Sink` call readers make: the batch joins
        the open window; the returned ``ObjectRef`` completes once ``fn`` returned for that
        window (the acknowledgement). With ``batch_format="pyarrow"`` the batch becomes one
        ``pyarrow.Table`` here, in the reader's process, before it crosses to the actor."""
        batch = _as_table(records) if self.batch_format == "pyarrow" else records
        return self._actor.process_batch.remote(batch)

    @property
    def actor(self) -> Any:
        """The sink's Ray actor handle."""
        return self._actor

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Close the open window and wait until ``fn`` has run for every closed window."""
        import ray

        return bool(ray.get(self._actor.flush.remote(timeout_s), timeout=timeout_s + 30))

    def stats(self) -> dict[str, Any]:
        """``windows_completed``, ``windows_failed``, ``records_written``, ``bytes_written``,
        ``batches_received``, ``last_error``, ``open_window_records``, ``windows_waiting``."""
        import ray

        stats: dict[str, Any] = ray.get(self._actor.stats.remote(), timeout=30)
        return stats

    def close(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Flush (``fn`` runs for what is open), then stop the actor. Idempotent.

        Returns:
            The final :meth:`stats` (also kept as ``final_stats``).
        """
        import ray

        if self._closed:
            return self.final_stats
        self._closed = True
        try:
            if not ray.get(self._actor.flush.remote(timeout_s), timeout=timeout_s + 30):
                log.warning("dataset sink: windows still pending after %.0f s; stopping anyway", timeout_s)
            self.final_stats = ray.get(self._actor.stats.remote(), timeout=30)
        except Exception as e:
            raise KinesisError(f"dataset sink: flushing at close failed: {e!r:.300}") from e
        finally:
            try:
                ray.kill(self._actor, no_restart=True)
            except Exception:
                pass
        return self.final_stats

    def __enter__(self) -> DatasetSink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
