"""Configuration of a subscription: :class:`KinesisStream`, a frozen, validated dataclass.

The first argument (the stream name) is positional, the rest keyword-only. Durations
are seconds as floats with an ``_s`` suffix (Ray's habit). Everything is checked on
creation, so a bad value raises :class:`~kinesis_actors.errors.InvalidError` before
any AWS call.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from .delivery.options import DeliveryOptions, check_delivery_fields
from .errors import InvalidError
from .records import Record, StartAt

__all__ = ["KinesisStream", "validate_stream_name", "positive_duration", "DEFAULT_MAX_SHARDS_PER_READER",
           "DEFAULT_MAX_BUFFERED_BYTES", "RETRIEVAL_MODES", "BALANCE_MODES"]

DEFAULT_MAX_BUFFERED_BYTES = 64 * 2**20
"""Default byte budget of one reader process (``KinesisStream.max_buffered_bytes``), bytes."""

DEFAULT_MAX_SHARDS_PER_READER = 128
"""Default ``KinesisStream.max_shards_per_reader``. Chosen by ``python -m bench --only scale``
(cap sweep at 256 shards on one 2-core node): each reader process costs about 90 MiB
before it holds any lease, so fewer, fuller readers start faster and use less memory
(cap 32 / 64 / 128 / 256: subscribe 8.7 / 7.6 / 5.4 / 4.2 s, USS 887 / 548 / 377 / 292
MiB); one dead reader then moves more leases, which re-homing does in well under a
second. Hosts with many cores read more in parallel with a smaller cap (one process
holds the GIL)."""

_STREAM_RE = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
_CONSUMER_RE = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
RETRIEVAL_MODES = ("polling", "fanout")
BALANCE_MODES = ("load", "count")
_READER_OPTION_KEYS = frozenset(
    {"num_cpus", "num_gpus", "memory", "resources", "scheduling_strategy", "runtime_env", "label_selector"}
)


def validate_stream_name(name: object) -> str:
    """Return ``name`` if it is a valid Kinesis stream name (1-128 of ``[a-zA-Z0-9_.-]``).

    Raises:
        InvalidError: empty, not a string, or with other characters.
    """
    if not isinstance(name, str) or not _STREAM_RE.match(name):
        raise InvalidError(f"stream name must be 1-128 characters of [a-zA-Z0-9_.-], got {name!r}")
    return name


def positive_duration(what: str, value: object) -> float:
    """Return ``value`` as a float if it is a finite number > 0, else raise InvalidError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidError(f"{what} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _non_negative_duration(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidError(f"{what} must be a finite number of seconds >= 0, got {value!r}")


def _non_negative_int(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidError(f"{what} must be an int >= 0, got {value!r}")


def _positive_int(what: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidError(f"{what} must be a positive int, got {value!r}")


def _check_load_fields(cfg: KinesisStream) -> None:
    """The scaling-with-load keywords of ``cfg``; raises InvalidError naming the bad value."""
    target = cfg.reader_target_cpu
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not math.isfinite(target) or target <= 0):
        raise InvalidError(f"reader_target_cpu must be a number of cores > 0 or None, got {target!r}")
    _positive_int("max_readers", cfg.max_readers, allow_none=True)
    positive_duration("load_window_s", cfg.load_window_s)
    if cfg.balance_by not in BALANCE_MODES:
        raise InvalidError(f"balance_by must be one of {list(BALANCE_MODES)}, got {cfg.balance_by!r}")
    threshold = cfg.balance_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise InvalidError(f"balance_threshold must be a fraction of the fair share, 0 < x < 1, got {threshold!r}")


@dataclasses.dataclass(frozen=True)
class KinesisStream:
    """One subscription's stream and how to read it.

    Args:
        name: the stream name (positional).
        create_if_missing: create the stream with this many shards if it does not exist
            (``CreateStream``, then wait up to 60 s for ``ACTIVE``); None to require it.
            0, a negative number or a bool is refused.
        start_at: where a shard with no checkpoint opens (default ``StartAt.latest()``).
            Resolved once per shard and recorded in its lease row (``start_position``).
            Children of a resharded shard always open at ``TRIM_HORIZON``.
        shard_sync_interval_s: how often the Coordinator calls ``ListShards`` (10.0 s).
        lease_poll_interval_s: how often the Coordinator reads the lease table to take
            free and expired leases (2.0 s); never more often than twice the time the last
            read took (a 1,000-row table on moto takes 2-3 s to scan).
        max_leases: most leases this subscription holds at once (None: no limit).
        max_leases_to_steal: most leases stolen per lease-poll interval when balancing (1).
        max_records: ``Limit`` of each ``GetRecords`` call, 1..10,000 (10,000); also the
            most user records in one delivered batch.
        idle_wait_s: the first wait before the next ``GetRecords`` when a shard is at its tip
            (0.25 s); it doubles while the shard stays empty, up to ``max_idle_wait_s``, and
            drops to zero when records arrive. Calls on one shard are never closer than
            0.2 s (5 per second, the AWS limit).
        max_idle_wait_s: the longest wait at the tip (1.0 s): an idle shard costs at most
            one ``GetRecords`` per this many seconds.
        max_shards_per_reader: most shard leases one ``ShardReader`` process holds
            (``DEFAULT_MAX_SHARDS_PER_READER``); 1 gives one actor per shard. The pool keeps
            ``ceil(leases / max_shards_per_reader) + 1`` readers (at least 2), so a dead
            reader's leases move to live ones at once.
        max_buffered_bytes: byte budget of each ``ShardReader`` process (64 MiB): records
            fetched and not yet acknowledged, counted as payload + partition key. A reader
            never holds more than this plus one ``GetRecords`` response (10 MiB); fetching
            waits for room.
        reader_options: Ray actor options for each ``ShardReader`` (``num_cpus``,
            ``resources``, ``scheduling_strategy``, ``memory``, ``runtime_env``...).
            Defaults: ``num_cpus=0``, ``scheduling_strategy="SPREAD"``.
        coordinator_options: Ray actor options for the ``Coordinator`` (same keys), e.g.
            ``{"resources": {"on_demand": 0.01}}`` to keep it off spot nodes. Default
            ``num_cpus=0`` and Ray's default placement. A Coordinator on a lost node is
            restarted by the subscription's handle, so pinning it only avoids that restart.
        max_sink_retries: attempts after the first failed delivery of a batch before
            the subscription fails with ``SinkError`` (5).
        sink_method: name of the sink actor's method called with each batch ("process_batch").
        dead_letter: a ``Publisher`` that receives ONE JSON document per record given up
            (refused ``max_sink_retries`` times, or older than ``max_record_age_s``), with
            the record's shard id as partition key (see
            :func:`~kinesis_actors.delivery.dead_letter.dead_letter_document`); a record is
            acknowledged only once its dead letter is written, and a failing publisher is
            retried with backoff, never skipped (Lambda's on-failure destination).
        retrieval: how shards are read: ``"polling"`` (default: ``GetRecords``, a read
            limit shared by every polling consumer of the stream) or ``"fanout"``
            (enhanced fan-out: ``SubscribeToShard`` through the stream consumer
            ``consumer_name``, with its own throughput per shard). See the documentation's
            "Enhanced fan-out" page (docs/fanout.md).
        consumer_name: the stream consumer's name (1-128 of ``[a-zA-Z0-9_.-]``), required
            with ``retrieval="fanout"``: registered on the first subscribe if missing
            (``RegisterStreamConsumer``), else reused, and shared by every reader and
            instance of the application. Closing never deregisters it
            (``KinesisBroker.deregister_stream_consumer`` does).
        min_checkpoint_interval_s: when a shard's checkpoint is written, seconds or None
            (None). None writes the last acknowledged position with the lease's next
            renewal, in the same conditional ``UpdateItem`` (a checkpoint write raises the
            lease counter, so it IS the renewal): the lease table costs what the renewals
            cost, one write per shard per ``renew_interval_s``, as KCL's renewals do. 0
            writes one after every acknowledged batch (with ``parallelization_factor``
            above 1, after every acknowledged round of batches). Above 0 a shard writes at
            most one per interval. Every mode also writes at once on close, on a handoff,
            at ``SHARD_END``, at a seek and after a partial acknowledgement. A failure
            redelivers the records acknowledged since the shard's last checkpoint write
            plus the batch in flight: with None, at most one renew interval of
            acknowledged records; with 0, the batch in flight only; above 0, at most the
            interval (plus one idle wait).
        max_batch_records: most records per delivered batch, 1..10,000 (None: one
            ``GetRecords`` response, at most ``max_records``, per batch); Lambda's ``BatchSize``.
        max_batch_bytes: most bytes (payload + partition key) per batch (None: no limit);
            a single larger record goes alone.
        batch_window_s: gather one shard's records for up to this long (0..300 s; 0.0:
            deliver as fetched) or until a limit above is reached; at the window's end a
            shard at its tip delivers what it has. Lambda's ``MaximumBatchingWindowInSeconds``.
        bisect_on_error: a batch still failing after its retries is split in halves (each
            tried once, a single record with all its retries), down to single records; only
            those still failing go to the dead letters, or fail the subscription with
            ``SinkError`` naming the record. Lambda's ``BisectBatchOnFunctionError``. Needs
            a push sink.
        max_record_age_s: a record older than this by its arrival time, when about to be
            delivered, goes to the dead letters (reason ``max_record_age``) instead (None:
            no limit). Needs ``dead_letter``. Lambda's ``MaximumRecordAgeInSeconds``
            (without Lambda's 60 s minimum).
        record_filter: ``Callable[[Record], bool]`` run in the reader (shipped with
            cloudpickle: lambdas and local functions are fine); a record it rejects is
            acknowledged without delivery and counted (metric ``records_filtered``). A filter
            that raises fails the subscription with ``SinkError``. Lambda's ``FilterCriteria``.
        parallelization_factor: 1..10 batches of one shard in flight at once, split by
            partition key (records of one key keep their order), in rounds: a contiguous
            run of the shard cut into one batch per lane, the next round once all of the
            last is acknowledged, so a failure redelivers at most N batches. The checkpoint
            is the highest position below which every record is acknowledged. Needs a push sink.
            Lambda's ``ParallelizationFactor``.
        reader_target_cpu: cores one ``ShardReader`` process should use at most, averaged
            over ``load_window_s`` (0.6; None: count placement only). A reader above it for a
            whole window hands its hottest shard (by CPU share, else bytes/s) to the least
            loaded reader that stays under it, or to a new reader; readers added for load
            are drained and stopped when the load fits in fewer at half the target each,
            never below ``ceil(leases / max_shards_per_reader) + 1`` (at least 2). One
            process runs Python on one core at a time (the GIL), so a node of C cores
            carries about ``C / reader_target_cpu`` busy readers. A reader's load is its CPU, or
            ``reader_target_cpu x loop_busy / 0.9`` when more (its event loop busy 90 % of the
            window counts as the target: saturated on a shared node that gives it fewer cores).
        max_readers: most readers load placement grows the pool to (None: no cap but the
            lease count); the count floor above applies whatever this says.
        load_window_s: the window of every load figure (reader CPU, shard bytes/s and
            records/s), seconds (10.0); also the pace of load moves: one per reader per
            window, one new reader per window, and a shard moved by load stays put for
            three windows.
        balance_by: how instances sharing the stream split it: ``"load"`` (default: each
            steals toward its fair share of the stream's bytes/s, carried in the lease rows
            as KCL 3.x's ``throughputKBps``; counts when every shard is below 1 KB/s) or
            ``"count"`` (equal lease counts).
        balance_threshold: with ``balance_by="load"``, how far below its share an instance
            may sit before it steals, and how far above its share a steal may take it, a
            fraction of the share, 0 < x < 1 (0.1, KCL 3.x's default).

    Raises:
        InvalidError: any value out of range, named in the message.
    """

    name: str
    _: dataclasses.KW_ONLY
    create_if_missing: int | None = None
    start_at: StartAt = dataclasses.field(default_factory=StartAt.latest)
    shard_sync_interval_s: float = 10.0
    lease_poll_interval_s: float = 2.0
    max_leases: int | None = None
    max_leases_to_steal: int = 1
    max_records: int = 10_000
    idle_wait_s: float = 0.25
    max_idle_wait_s: float = 1.0
    max_shards_per_reader: int = DEFAULT_MAX_SHARDS_PER_READER
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    reader_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    coordinator_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_sink_retries: int = 5
    sink_method: str = "process_batch"
    dead_letter: Any = None
    retrieval: str = "polling"
    consumer_name: str | None = None
    min_checkpoint_interval_s: float | None = None
    max_batch_records: int | None = None
    max_batch_bytes: int | None = None
    batch_window_s: float = 0.0
    bisect_on_error: bool = False
    max_record_age_s: float | None = None
    record_filter: Callable[[Record], bool] | None = None
    parallelization_factor: int = 1
    reader_target_cpu: float | None = 0.6
    max_readers: int | None = None
    load_window_s: float = 10.0
    balance_by: str = "load"
    balance_threshold: float = 0.1

    def __post_init__(self) -> None:
        validate_stream_name(self.name)
        if self.create_if_missing is not None:
            n = self.create_if_missing
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise InvalidError(f"create_if_missing must be a positive number of shards or None, got {n!r}")
        if not isinstance(self.start_at, StartAt):
            raise InvalidError(f"start_at must be a StartAt (e.g. StartAt.trim_horizon()), got {self.start_at!r}")
        if self.start_at.needs_shard:
            raise InvalidError(f"start_at {self.start_at} names one shard's sequence number; use seek() for that")
        positive_duration("shard_sync_interval_s", self.shard_sync_interval_s)
        positive_duration("lease_poll_interval_s", self.lease_poll_interval_s)
        positive_duration("idle_wait_s", self.idle_wait_s)
        positive_duration("max_idle_wait_s", self.max_idle_wait_s)
        if self.max_idle_wait_s < self.idle_wait_s:
            raise InvalidError(f"max_idle_wait_s ({self.max_idle_wait_s}) must be at least "
                               f"idle_wait_s ({self.idle_wait_s})")
        if self.min_checkpoint_interval_s is not None:
            _non_negative_duration("min_checkpoint_interval_s", self.min_checkpoint_interval_s)
        _positive_int("max_shards_per_reader", self.max_shards_per_reader)
        _positive_int("max_buffered_bytes", self.max_buffered_bytes)
        _positive_int("max_leases", self.max_leases, allow_none=True)
        _non_negative_int("max_leases_to_steal", self.max_leases_to_steal)
        _positive_int("max_records", self.max_records)
        if self.max_records > 10_000:
            raise InvalidError(f"max_records must be at most 10000 (the GetRecords limit), got {self.max_records}")
        if not isinstance(self.sink_method, str) or not self.sink_method.isidentifier():
            raise InvalidError(f"sink_method must be a method name, got {self.sink_method!r}")
        for what in ("reader_options", "coordinator_options"):
            options = getattr(self, what)
            if not isinstance(options, Mapping):
                raise InvalidError(f"{what} must be a mapping of Ray actor options, got {options!r}")
            unknown = set(options) - _READER_OPTION_KEYS
            if unknown:
                raise InvalidError(f"unknown {what} {sorted(unknown)}; allowed: {sorted(_READER_OPTION_KEYS)}")
        if self.dead_letter is not None and not callable(getattr(self.dead_letter, "put_many", None)):
            raise InvalidError(f"dead_letter must be a Publisher (with put_many), got {self.dead_letter!r}")
        check_delivery_fields(self)
        if self.retrieval not in RETRIEVAL_MODES:
            raise InvalidError(f"retrieval must be one of {list(RETRIEVAL_MODES)}, got {self.retrieval!r}")
        if self.consumer_name is not None and (not isinstance(self.consumer_name, str)
                                               or not _CONSUMER_RE.match(self.consumer_name)):
            raise InvalidError(f"consumer_name must be 1-128 characters of [a-zA-Z0-9_.-], got {self.consumer_name!r}")
        if self.retrieval == "fanout" and self.consumer_name is None:
            raise InvalidError('retrieval="fanout" needs consumer_name= (the stream consumer to register or reuse)')
        if self.retrieval == "polling" and self.consumer_name is not None:
            raise InvalidError(f'consumer_name={self.consumer_name!r} is only used with retrieval="fanout"')
        _check_load_fields(self)

    def delivery_options(self) -> DeliveryOptions:
        """The delivery controls, as the readers receive them (in ``ReaderSpec.delivery``)."""
        return DeliveryOptions(
            max_sink_retries=self.max_sink_retries, dead_letter=self.dead_letter,
            max_batch_records=self.max_batch_records, max_batch_bytes=self.max_batch_bytes,
            batch_window_s=float(self.batch_window_s), bisect_on_error=self.bisect_on_error,
            max_record_age_s=None if self.max_record_age_s is None else float(self.max_record_age_s),
            record_filter=self.record_filter, parallelization_factor=self.parallelization_factor)

    def actor_options(self) -> dict[str, Any]:
        """Ray ``.options()`` for a ShardReader: defaults ``num_cpus=0``, ``SPREAD``, then ``reader_options``."""
        return {"num_cpus": 0, "scheduling_strategy": "SPREAD", **dict(self.reader_options)}

    def coordinator_actor_options(self) -> dict[str, Any]:
        """Ray ``.options()`` for the Coordinator: ``num_cpus=0``, then ``coordinator_options``."""
        return {"num_cpus": 0, **dict(self.coordinator_options)}
