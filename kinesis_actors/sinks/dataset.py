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

Closing (the :class:`~kinesis_actors.sinks.protocol.GatheringSink` rule): the
subscription's close calls :meth:`DatasetSink.begin_close` before it stops the readers and
:meth:`DatasetSink.end_close` after. In between, the open window is written at once (and
each later batch as soon as ``fn`` is free), so the readers' batches in flight are
acknowledged and checkpointed before their leases are released; a window that would not
be written by the close's deadline is dropped unwritten and read again by the next owner.
Nothing is written after its readers stopped waiting for it, except by a call of ``fn``
already running when the deadline passed (it cannot be taken back).

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
    sink.close()  # after the subscription: its close wrote (and checkpointed) the last window
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import InvalidError, KinesisError
from .windows import DatasetSinkCore, as_table

__all__ = ["DatasetSink", "DatasetSinkCore", "BATCH_FORMATS"]

log = logging.getLogger(__name__)

BATCH_FORMATS = ("records", "pyarrow")

_CALL_TIMEOUT_S = 10.0  # begin_close / end_close: the async actor answers at once unless it is gone

_ACTOR_OPTION_KEYS = frozenset({"num_cpus", "memory", "resources", "scheduling_strategy", "runtime_env",
                                "label_selector", "name", "namespace", "lifetime"})


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

        async def begin_close(self, finish_by_s: float) -> float:
            return self.core.begin_close(finish_by_s)

        async def end_close(self) -> int:
            return self.core.end_close()

        async def stats(self) -> dict[str, Any]:
            return self.core.stats()

    return ray.remote(num_cpus=0, max_restarts=0,  # type: ignore[call-overload]  # Ray types task options only
                      max_concurrency=1000)(DatasetSinkActor)


_ACTOR_CLASS: Any = None


class DatasetSink:
    """A push-mode sink (``subscribe(..., sink=DatasetSink(fn))``) that hands windows of
    records to ``fn`` as a ``ray.data.Dataset`` (columns of :func:`~kinesis_actors.read_kinesis`).

    It is a :class:`~kinesis_actors.sinks.protocol.GatheringSink`: when its subscription
    closes (``sub.close()``, leaving its ``with`` block, ``shutdown()``, SIGTERM in
    ``cluster/pipeline.py``), the open window is written at once, its batches acknowledged
    and checkpointed, and only then are the leases released, so the next owner resumes
    after them and nothing is written twice. A window that would not be written by the
    close's deadline (judged by its last few ``fn`` calls) is dropped unwritten: its
    records are read again, once, by the next owner. A window ``fn`` is still writing when
    the deadline passes cannot be taken back: it is written, not checkpointed, and read
    again (at-least-once, as after a crash).

    The handle owns its actor: :meth:`close` stops it. Close the subscription first, then
    the sink: :meth:`close` writes nothing more (a window still gathering is dropped, its
    batches never acknowledged).

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
        batch = as_table(records) if self.batch_format == "pyarrow" else records
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
        ``batches_received``, ``last_error``, ``last_window_s`` (the last ``fn`` call, seconds),
        ``windows_dropped`` and ``records_dropped`` (dropped unwritten at a close),
        ``open_window_records``, ``windows_waiting``."""
        import ray

        stats: dict[str, Any] = ray.get(self._actor.stats.remote(), timeout=30)
        return stats

    def begin_close(self, finish_by_s: float) -> float:
        """:meth:`GatheringSink.begin_close <kinesis_actors.sinks.protocol.GatheringSink.begin_close>`:
        the open window is handed to ``fn`` now, later batches as soon as ``fn`` is free;
        no window starts unless ``fn`` (judged by the longest of its last few calls) would
        return within ``finish_by_s`` seconds. Returns once the actor has applied it (at
        most 10 s): how long the readers may have to wait for an acknowledgement, seconds
        (0.0 when nothing more will be written).

        Raises:
            KinesisError: the actor did not answer (dead, or not within 10 s).
        """
        return float(self._call("begin_close", float(finish_by_s)))

    def end_close(self) -> int:
        """:meth:`GatheringSink.end_close <kinesis_actors.sinks.protocol.GatheringSink.end_close>`:
        every window not handed to ``fn`` yet is dropped unwritten (its callers get
        ``SinkError``, never an acknowledgement). Returns the records dropped.

        Raises:
            KinesisError: the actor did not answer (dead, or not within 10 s).
        """
        return int(self._call("end_close"))

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return ray.get(getattr(self._actor, method).remote(*args), timeout=_CALL_TIMEOUT_S)
        except Exception as e:  # Ray's errors: the actor died, or did not answer in time
            raise KinesisError(f"dataset sink: {method} failed: {e!r:.300}", retriable=True) from e

    def close(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Stop the actor, writing nothing more: a window not handed to ``fn`` yet is
        dropped unwritten (its batches never acknowledged, so their records are read again
        by whoever reads the shards next); a window ``fn`` is writing is waited for, up to
        ``timeout_s`` seconds. Close the subscription first: its close writes (and
        checkpoints) or drops what the sink holds. Idempotent.

        Returns:
            The final :meth:`stats` (also kept as ``final_stats``).

        Raises:
            KinesisError: the actor failed or did not answer (it is stopped all the same).
        """
        import ray

        if self._closed:
            return self.final_stats
        self._closed = True
        try:
            self.end_close()
            if not ray.get(self._actor.flush.remote(timeout_s), timeout=timeout_s + 30):  # only the running write
                log.warning("dataset sink: fn still running after %.0f s; stopping anyway", timeout_s)
            self.final_stats = ray.get(self._actor.stats.remote(), timeout=30)
        except Exception as e:
            raise KinesisError(f"dataset sink: closing failed: {e!r:.300}") from e
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
