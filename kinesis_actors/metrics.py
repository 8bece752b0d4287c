"""Metrics through ``ray.util.metrics``: per shard and per instance, on Ray's Prometheus endpoint.

Three hooks feed them, each called from one place:

* :func:`reader_tick` from a ShardReader's heartbeat (every step of its read loop and
  every half renew interval while it waits on the downstream). It exports the deltas of
  the reader's ``stats`` counters, so the cost is per batch, never per record, and at
  most one export per :data:`EXPORT_INTERVAL_S` (5 s). It also adds ``checkpoint_age_s`` to
  ``stats``, so ``Subscription.stats()`` returns the figures the metrics show.
* :func:`reader_load_tick` from a ShardReader's load sample (each time the Coordinator
  asks it for news or figures): the process's CPU over ``load_window_s``, in cores.
* :func:`coordinator_tick` from the Coordinator's lease poll (every
  ``lease_poll_interval_s``): leases held, taken, lost, readers replaced.

Metric names (Ray prefixes ``ray_``; Prometheus adds ``_total`` to counters):

==========================================  =======  ===========================  ==========================
name                                        kind     tags                         meaning
==========================================  =======  ===========================  ==========================
``kinesis_actors_records_delivered``        counter  stream, shard_id, owner_id   user records acknowledged
``kinesis_actors_bytes_delivered``          counter  stream, shard_id, owner_id   their payload bytes
``kinesis_actors_get_records_calls``        counter  stream, shard_id, owner_id   ``GetRecords`` calls
``kinesis_actors_throttles``                counter  stream, shard_id, owner_id   throttled calls
``kinesis_actors_sink_failures``            counter  stream, shard_id, owner_id   failed deliveries (retried)
``kinesis_actors_dead_letter_records``      counter  stream, shard_id, owner_id   records sent to the dead letter
``kinesis_actors_checkpoints_written``      counter  stream, shard_id, owner_id   checkpoint writes
``kinesis_actors_millis_behind_latest``     gauge    stream, shard_id, owner_id   lag, ms (see below)
``kinesis_actors_checkpoint_age_s``         gauge    stream, shard_id, owner_id   s since the last checkpoint
``kinesis_actors_dead_letter_failures``     counter  stream, shard_id, owner_id   failed dead-letter writes
``kinesis_actors_records_filtered``         counter  stream, shard_id, owner_id   rejected by record_filter
``kinesis_actors_batches_bisected``         counter  stream, shard_id, owner_id   failing batches split
``kinesis_actors_partial_acks``             counter  stream, shard_id, owner_id   PartialBatchError answers
``kinesis_actors_batches_in_flight``        gauge    stream, shard_id, owner_id   unacknowledged batches
``kinesis_actors_shard_bytes_per_s``        gauge    stream, shard_id, owner_id   bytes/s over load_window_s
``kinesis_actors_reader_cpu``               gauge    stream, owner_id, pid        reader process CPU, cores
``kinesis_actors_leases_held``              gauge    stream, owner_id             readers running
``kinesis_actors_leases_taken``             counter  stream, owner_id             leases taken
``kinesis_actors_leases_lost``              counter  stream, owner_id             leases lost
``kinesis_actors_readers_replaced``         counter  stream, owner_id             dead readers replaced
==========================================  =======  ===========================  ==========================

``millis_behind_latest`` is the reader's figure: ``MillisBehindLatest`` of the last
``GetRecords``, raised to the age of its newest record against the current time (some
emulators report 0 or a gap between records). ``checkpoint_age_s`` counts from the
reader's last checkpoint write (or from its start, for a checkpoint read from the lease
row); it is ``None`` (not exported) for a shard with no checkpoint yet. It grows on an
idle shard too, so alert on it together with the lag (``cluster/prometheus/alerts.yaml``).

:func:`checkpoint_lag_ms` computes a shard's lag from a lease row's checkpoint alone
(for a lease-table view such as ``kinesis-actors leases``).

Without a Ray runtime (unit tests driving the plain cores) nothing is exported; the
``stats`` additions still happen. A failing export never disturbs a reader: it is
logged once and skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from .clock import monotonic_s, wall_s

__all__ = ["reader_tick", "reader_load_tick", "coordinator_tick", "checkpoint_lag_ms", "MetricsSink", "set_sink",
           "EXPORT_INTERVAL_S", "SHARD_COUNTERS", "SHARD_GAUGES", "INSTANCE_COUNTERS", "INSTANCE_GAUGES",
           "READER_GAUGES", "READER_TAGS", "PREFIX"]

log = logging.getLogger(__name__)

PREFIX = "kinesis_actors_"
EXPORT_INTERVAL_S = 5.0
"""Shortest gap between two exports of one reader, seconds. Ray ships a process's metrics every
``metrics_report_interval_ms`` (10 s by default), so exporting more often only costs CPU: each
export is a few ``ray.util.metrics`` calls, which an idle shard would otherwise pay on every poll."""

SHARD_TAGS = ("stream", "shard_id", "owner_id")
INSTANCE_TAGS = ("stream", "owner_id")
READER_TAGS = ("stream", "owner_id", "pid")
# metric name -> key of the reader's / coordinator's figures
SHARD_COUNTERS = {"records_delivered": "records", "bytes_delivered": "bytes",
                  "get_records_calls": "get_records_calls", "throttles": "throttles",
                  "sink_failures": "sink_failures", "dead_letter_records": "dead_letter_records",
                  "checkpoints_written": "checkpoints_written",
                  # delivery controls (kinesis_actors.delivery bumps these keys of the reader's stats)
                  "dead_letter_failures": "dead_letter_failures", "records_filtered": "filtered",
                  "batches_bisected": "bisected", "partial_acks": "partial_acks"}
SHARD_GAUGES = {"millis_behind_latest": "millis_behind_latest", "checkpoint_age_s": "checkpoint_age_s",
                "batches_in_flight": "batches_in_flight", "shard_bytes_per_s": "bytes_per_s"}
INSTANCE_COUNTERS = {"leases_taken": "leases_taken", "leases_lost": "leases_lost",
                     "readers_replaced": "readers_replaced"}
INSTANCE_GAUGES = {"leases_held": "leases_held"}
READER_GAUGES = {"reader_cpu": "cpu", "reader_loop_busy": "loop_busy"}
_DESCRIPTIONS = {
    "records_delivered": "User records acknowledged by the downstream, per shard.",
    "bytes_delivered": "Payload bytes of the records acknowledged, per shard.",
    "get_records_calls": "GetRecords calls, per shard.",
    "throttles": "Throttled Kinesis calls (ProvisionedThroughputExceeded, LimitExceeded), per shard.",
    "sink_failures": "Failed deliveries to the downstream (each retried, up to max_sink_retries), per shard.",
    "dead_letter_records": "Records sent to the dead-letter stream (refused past max_sink_retries, or older than "
                           "max_record_age_s), per shard.",
    "checkpoints_written": "Checkpoint writes (one conditional UpdateItem each on DynamoDB), per shard.",
    "millis_behind_latest": "MillisBehindLatest of the last GetRecords, at least the age of its newest record (ms).",
    "checkpoint_age_s": "Seconds since the reader last wrote a checkpoint (or started); absent without a checkpoint.",
    "dead_letter_failures": "Failed attempts to write dead letters (retried, never skipped), per shard.",
    "records_filtered": "Records rejected by record_filter (acknowledged without delivery), per shard.",
    "batches_bisected": "Failing batches split in halves by bisect_on_error, per shard.",
    "partial_acks": "PartialBatchError answers that acknowledged part of a batch, per shard.",
    "batches_in_flight": "Batches handed to the downstream and not yet acknowledged (<= parallelization_factor).",
    "shard_bytes_per_s": "Bytes/s the shard's reader fetched, averaged over load_window_s (0 before a full window).",
    "reader_cpu": "CPU of one ShardReader process, cores, averaged over load_window_s (0 before a full window).",
    "reader_loop_busy": "Fraction of wall time the ShardReader's event loop was busy (not waiting in select), 0..1, "
                        "averaged over load_window_s (0 before a full window or when not measurable).",
    "leases_held": "Shard leases this instance holds (running readers).",
    "leases_taken": "Shard leases this instance took.",
    "leases_lost": "Shard leases this instance lost to another owner or to expiry.",
    "readers_replaced": "Dead ShardReaders replaced by the Coordinator.",
}


class MetricsSink(Protocol):
    """Where figures go: Ray's metrics by default; a recorder in tests (:func:`set_sink`)."""

    def inc(self, name: str, value: float, tags: Mapping[str, str]) -> None: ...
    def set(self, name: str, value: float, tags: Mapping[str, str]) -> None: ...


class _RayMetrics:
    """``ray.util.metrics`` Counters and Gauges, created once per process on first use."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge

        self._metrics: dict[str, Any] = {}
        for names, cls, tags in ((SHARD_COUNTERS, Counter, SHARD_TAGS), (SHARD_GAUGES, Gauge, SHARD_TAGS),
                                 (INSTANCE_COUNTERS, Counter, INSTANCE_TAGS), (INSTANCE_GAUGES, Gauge, INSTANCE_TAGS),
                                 (READER_GAUGES, Gauge, READER_TAGS)):
            for name in names:
                self._metrics[name] = cls(PREFIX + name, description=_DESCRIPTIONS[name], tag_keys=tags)

    def inc(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        self._metrics[name].inc(value, tags=dict(tags))

    def set(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        self._metrics[name].set(value, tags=dict(tags))


_LOCK = threading.Lock()
_SINK: MetricsSink | None = None
_SINK_OVERRIDDEN = False
_WARNED = False


def set_sink(sink: MetricsSink | None) -> None:
    """Send figures to ``sink`` in this process (tests); ``None`` restores Ray's metrics."""
    global _SINK, _SINK_OVERRIDDEN
    with _LOCK:
        _SINK, _SINK_OVERRIDDEN = sink, sink is not None
        _READERS.clear()
        _INSTANCES.clear()
        _PROCESSES.clear()


def _sink() -> MetricsSink | None:
    global _SINK
    if _SINK is not None or _SINK_OVERRIDDEN:
        return _SINK
    import sys

    ray = sys.modules.get("ray")  # never import Ray from a hook
    if ray is None or not ray.is_initialized():
        return None
    with _LOCK:
        if _SINK is None:
            _SINK = _RayMetrics()
    return _SINK


def _warn_once(e: BaseException) -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        log.warning("exporting metrics failed (%r); continuing without them", e)


@dataclasses.dataclass
class _Exported:
    tags: dict[str, str]
    last: dict[str, float] = dataclasses.field(default_factory=dict)
    checkpoint: Any = None
    checkpoint_since: float = 0.0
    exported_at: float = float("-inf")


_READERS: dict[tuple[str, str, str], _Exported] = {}
_PROCESSES: dict[tuple[str, str, str], _Exported] = {}
_INSTANCES: dict[tuple[str, str], _Exported] = {}


def _export_counters(sink: MetricsSink, state: _Exported, names: Mapping[str, str], figures: Mapping[str, Any]) -> None:
    for name, key in names.items():
        value = figures.get(key) or 0
        delta = value - state.last.get(key, 0)
        if delta < 0:  # the figures restarted (a new reader or coordinator in this process)
            delta = value
        if delta:
            sink.inc(name, delta, state.tags)
        state.last[key] = value


def _export_gauges(sink: MetricsSink, state: _Exported, names: Mapping[str, str], figures: Mapping[str, Any]) -> None:
    for name, key in names.items():
        value = figures.get(key)
        if value is not None:
            sink.set(name, value, state.tags)


def _due(state: _Exported, now: float, force: bool) -> MetricsSink | None:
    """The sink to export ``state``'s figures to now, or None: within :data:`EXPORT_INTERVAL_S`
    of its last export (unless ``force``) or with no sink. A non-None answer counts as the export."""
    if not force and now - state.exported_at < EXPORT_INTERVAL_S:
        return None
    sink = _sink()
    if sink is not None:
        state.exported_at = now
    return sink


def reader_tick(spec: Any, stats: dict[str, Any], *, now: float | None = None, force: bool = False) -> None:
    """A reader's heartbeat: note ``checkpoint_age_s`` in ``stats``, export deltas (rate-limited).

    Args:
        spec: the reader's ``ReaderSpec`` (``stream``, ``shard_id``, ``owner_id``).
        stats: the reader's ``stats`` dict (cumulative ``records``, ``bytes``,
            ``get_records_calls``, ``throttles``; ``millis_behind_latest``; ``checkpoint``).
        now: monotonic seconds (tests). force: export even within ``EXPORT_INTERVAL_S``.
    """
    try:
        now = monotonic_s() if now is None else now
        key = (spec.stream, spec.shard_id, spec.owner_id)
        state = _READERS.get(key)
        if state is None:
            state = _READERS[key] = _Exported(dict(zip(SHARD_TAGS, key)), checkpoint=stats.get("checkpoint"),
                                              checkpoint_since=now)
        if stats.get("checkpoint") != state.checkpoint:
            state.checkpoint, state.checkpoint_since = stats.get("checkpoint"), now
        # No checkpoint yet (a fresh shard, after a seek): no age, so an age alert never fires on it.
        stats["checkpoint_age_s"] = None if state.checkpoint is None else round(now - state.checkpoint_since, 3)
        sink = _due(state, now, force)
        if sink is None:
            return
        _export_counters(sink, state, SHARD_COUNTERS, stats)
        _export_gauges(sink, state, SHARD_GAUGES, stats)
    except Exception as e:  # never disturb the read path
        _warn_once(e)


def reader_load_tick(stream: str, owner_id: str, pid: str, figures: Mapping[str, Any], *, now: float,
                     force: bool = False) -> None:
    """A reader's load sample: export its ``cpu`` (cores) and ``loop_busy`` (fraction of wall time its
    event loop was busy, 0..1), at most every ``EXPORT_INTERVAL_S``.

    Args:
        stream / owner_id / pid: the tags (the stream and owner of its shards, its process id).
        figures: the reader's load figures (``cpu``, ``loop_busy``).
        now: monotonic seconds. force: export even within ``EXPORT_INTERVAL_S``.
    """
    try:
        key = (stream, owner_id, pid)
        state = _PROCESSES.get(key)
        if state is None:
            state = _PROCESSES[key] = _Exported(dict(zip(READER_TAGS, key)))
        sink = _due(state, now, force)
        if sink is not None:
            _export_gauges(sink, state, READER_GAUGES, figures)
    except Exception as e:  # never disturb the read path
        _warn_once(e)


def coordinator_tick(core: Any) -> None:
    """The Coordinator's lease poll: export leases held and the lease counters.

    Args:
        core: the ``CoordinatorCore`` (``stream.name``, ``owner_id``, ``counters``, held readers).
    """
    try:
        sink = _sink()
        if sink is None:
            return
        key = (core.stream.name, core.owner_id)
        state = _INSTANCES.get(key)
        if state is None:
            state = _INSTANCES[key] = _Exported(dict(zip(INSTANCE_TAGS, key)))
        figures = {**core.counters, "leases_held": len(core.held())}
        _export_counters(sink, state, INSTANCE_COUNTERS, figures)
        _export_gauges(sink, state, INSTANCE_GAUGES, figures)
    except Exception as e:
        _warn_once(e)


def checkpoint_lag_ms(kinesis: Any, stream: str, shard_id: str, checkpoint: str | None, *,
                      now_s: float | None = None) -> int | None:
    """How far a shard's checkpoint is behind its tip, in ms, from the lease row alone.

    Opens an iterator after the checkpoint (``TRIM_HORIZON`` without one) and reads one
    record: the lag is ``max(MillisBehindLatest, now - arrival of that record)`` (the
    age of the oldest unacknowledged record), or 0 when nothing follows the checkpoint.
    Two Kinesis calls per shard: meant for a lease-table view, not a hot path.

    Returns:
        The lag in ms; ``None`` for ``SHARD_END`` (a finished shard has no lag).
    """
    if checkpoint == "SHARD_END":
        return None
    args: dict[str, Any] = {"ShardIteratorType": "TRIM_HORIZON"}
    if checkpoint:
        args = {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": checkpoint}
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id, **args)["ShardIterator"]
    response = kinesis.get_records(ShardIterator=iterator, Limit=1)
    lag = int(response.get("MillisBehindLatest") or 0)
    records = response.get("Records") or []
    if records and records[0].get("ApproximateArrivalTimestamp") is not None:
        now_s = wall_s() if now_s is None else now_s
        age = int((now_s - records[0]["ApproximateArrivalTimestamp"].timestamp()) * 1000)
        lag = max(lag, age)
    return lag
