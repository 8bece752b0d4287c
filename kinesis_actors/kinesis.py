"""Kinesis access: the one read path of a shard, :class:`ShardFetcher`.

:class:`ShardFetcher` owns everything about reading one shard (the iterator,
``GetRecords``, expired-iterator recovery, throttling backoff, pacing at the tip); the
subscription's read loops and ``read_kinesis``'s read tasks both read through it. Errors
leave through :func:`~kinesis_actors.errors.translate_aws_error`. When the next call may
go (the call spacing, the idle grid, the throttle backoff) is computed by
:mod:`kinesis_actors.pacing` (re-exported here). The control plane
(``DescribeStreamSummary``, ``CreateStream``, ``ListShards``, :class:`ShardInfo`,
:func:`call_with_retry`) lives in :mod:`kinesis_actors.control_plane` and is re-exported
here.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable
from typing import Any, Literal

from . import mutation
from .batch import RecordBatch
from .clock import monotonic_s
from .control_plane import (
    CONTROL_PLANE_BACKOFF,
    ShardInfo,
    call_with_retry,
    describe_stream,
    ensure_stream,
    list_shards,
)
from .errors import StreamError, aws_error_code, is_throttling, translate_aws_error
from .pacing import IDLE_GRID_S, MIN_CALL_SPACING_S, backoff_s, idle_due
from .records import Record, StartAt, records_from_response, seq_key
from .wire import wire_get_records

__all__ = ["ShardInfo", "describe_stream", "ensure_stream", "list_shards", "call_with_retry", "ShardFetcher",
           "Fetched", "MIN_CALL_SPACING_S", "idle_due", "IDLE_GRID_S", "GET_RECORDS_MAX_BYTES",
           "backoff_s", "CONTROL_PLANE_BACKOFF"]

log = logging.getLogger(__name__)

_SKIP_ONE = mutation.register("resume_skips_one", "a shard resumed after its checkpoint skips its next record")
_EXPIRY_LATEST = mutation.register("iterator_expiry_restarts_latest", "an expired iterator reopens at LATEST")
_FIRST = (-2, -2)  # _skip_through of the planted resume_skips_one: through the first record returned

# ---------------------------------------------------------------------- the read path of one shard
GET_RECORDS_MAX_BYTES = 10 * 2**20
"""Most data one ``GetRecords`` response carries (AWS: 10 MiB per call), bytes."""


def _is_expired_iterator(exc: BaseException) -> bool:
    code = aws_error_code(exc)
    return code == "ExpiredIteratorException" or (code == "InvalidArgumentException" and "expired" in str(exc).lower())


@dataclasses.dataclass(frozen=True)
class Fetched:
    """What one ``GetRecords`` call returned, ready to deliver.

    Attributes:
        records: the user records in shard order (KPL aggregates split), without those at
            or before the position the iterator was opened after, as one compact
            :class:`~kinesis_actors.batch.RecordBatch` (a ``Sequence[Record]``).
        millis_behind_latest: ``MillisBehindLatest`` of the response, ms (None if absent).
        shard_end: the shard is read to its end: ``NextShardIterator`` was null, or a closed
            shard's ``EndingSequenceNumber`` was reached (moto never returns null).
        at_tip: the response was empty with ``MillisBehindLatest`` 0 (or absent): nothing
            more to read now.
        bytes: what ``records`` holds, bytes (:attr:`RecordBatch.nbytes
            <kinesis_actors.batch.RecordBatch.nbytes>`: payloads, keys, sequence numbers,
            offsets, arrival times): what a byte budget counts.
    """

    records: RecordBatch
    millis_behind_latest: int | None
    shard_end: bool
    at_tip: bool
    bytes: int


class ShardPosition:
    """What both shard fetchers (polling :class:`ShardFetcher`, enhanced fan-out
    ``FanOutFetcher``) keep about where a shard is read: the start, the last record
    returned, the KPL user records to drop after resuming inside an aggregate, and the
    end of a closed shard. One implementation, so the two read paths cannot disagree
    on what was returned or where a read resumes.

    Args:
        stream: the stream name. shard_id: the shard.
        start: where to open when no record was returned yet.
        restart_at: where to reopen when the first open fails before any record was
            returned (default ``start``): a ``LATEST`` start reopens at its recorded
            ``AT_TIMESTAMP``.
        ending_sequence_number: a closed shard's ``EndingSequenceNumber``, or None.
    """

    def __init__(self, stream: str, shard_id: str, start: StartAt, restart_at: StartAt | None,
                 ending_sequence_number: str | None) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self._start = start
        self._restart = restart_at or start
        self._end_key = seq_key(ending_sequence_number) if ending_sequence_number else None
        self._last: Record | None = None
        self._skip_through: tuple[int, int] | None = None

    @property
    def resource(self) -> str:
        """``"<stream>/<shard id>"``, for messages."""
        return f"{self.stream}/{self.shard_id}"

    def arm_skip(self, position: StartAt) -> None:
        """Before opening at ``position``: resuming inside a KPL aggregate (``AFTER_SEQUENCE_NUMBER``
        with a sub-sequence) re-reads the aggregate, so the user records through it are dropped once."""
        if position.kind == "AFTER_SEQUENCE_NUMBER" and position.sequence_number is not None \
                and position.sub_sequence_number is not None:
            self._skip_through = (seq_key(position.sequence_number), position.sub_sequence_number)
        elif position.kind == "AFTER_SEQUENCE_NUMBER" and self._last is None and _SKIP_ONE in mutation.ACTIVE:
            self._skip_through = _FIRST
        else:
            self._skip_through = None

    def accept(self, raw: list[dict[str, Any]] | RecordBatch) -> RecordBatch:
        """The user records of one answer (``Records`` of ``GetRecords`` or of an event, as
        botocore's dicts or already a batch), minus those already returned; the last one
        becomes the resume point."""
        if isinstance(raw, RecordBatch):
            records = raw
        else:
            records = RecordBatch.from_records(records_from_response(raw, shard_id=self.shard_id, stream=self.stream),
                                               shard_id=self.shard_id, stream=self.stream)
        if self._skip_through is not None and records:
            skip, self._skip_through = self._skip_through, None
            records = records.after(records[0].position if skip is _FIRST else skip)
        if records:
            self._last = records[-1]
        self._start = self._restart
        return records

    def past_end(self, at_tip: bool) -> bool:
        """A closed shard is read to its end: at the tip, or past ``EndingSequenceNumber``."""
        return self._end_key is not None and (
            at_tip or (self._last is not None and seq_key(self._last.sequence_number) >= self._end_key))

    def not_found(self, e: BaseException, operation: str, what: str) -> Exception:
        """The library's error for a failed call: ``StreamError`` naming ``what`` for
        ``ResourceNotFoundException``, else the translated ``KinesisError``."""
        err = translate_aws_error(e, operation=operation, resource=self.resource)
        if err.aws_code == "ResourceNotFoundException":
            return StreamError(f"{what} does not exist ({operation})", aws_code=err.aws_code)
        return err


class ShardFetcher(ShardPosition):
    """Reads one shard: its iterator, ``GetRecords``, expired iterators, throttling, pacing.

    :meth:`step` makes at most ONE AWS call and never sleeps; :meth:`due_in` says how many
    seconds the caller must wait before the next step. The caller does the waiting
    (``time.sleep`` in a Ray Data read task, ``asyncio.sleep`` in a read loop that
    shares its process with hundreds of others), so blocking and asyncio callers share
    this one implementation.

    Rules (each a fact of the Kinesis API):

    * Iterator: opened lazily at :attr:`position`, i.e. after the last record returned
      by :meth:`step`, else at the start position. ``AFTER_SEQUENCE_NUMBER`` with a KPL
      sub-sequence re-reads the aggregate (``AT_SEQUENCE_NUMBER``) and drops the user
      records already returned.
    * ``ExpiredIteratorException`` (an iterator unused for 5 minutes): the iterator is
      dropped and reopened at :attr:`position` on the next step, so nothing is skipped.
    * Throttling and transient errors (``ProvisionedThroughputExceededException``,
      ``LimitExceededException``, 5xx, network errors; see
      :func:`~kinesis_actors.errors.is_throttling`) on either call: exponential backoff
      with jitter (:func:`backoff_s`), counted in :attr:`throttles`; the caller decides
      how long to keep trying.
    * Pacing: two ``GetRecords`` on one shard are never closer than
      :data:`MIN_CALL_SPACING_S` (5 calls/s, the AWS limit). After a response with
      records the next call may follow at once; at the tip (an empty response with
      ``MillisBehindLatest`` 0) the wait doubles from ``idle_wait_s`` up to
      ``max_idle_wait_s``, and the first records bring it back to zero. A wait at the tip
      ends at the latest point of the process's idle grid before it (:func:`idle_due`,
      one point per :data:`IDLE_GRID_S`), so the shards of a process at the tip poll in
      a few groups a second. An idle shard thus costs
      ``1 / max_idle_wait_s`` calls per second.

    ``GetRecords`` goes through :class:`~kinesis_actors.wire.WireGetRecords` (WirePool and
    msgspec, botocore signing and errors) when the client is a botocore client it applies
    to (:func:`~kinesis_actors.wire.wire_get_records`), else through
    ``client.get_records``; both give the same records and the same errors.

    Args:
        client: a boto3 Kinesis client (or a fake with ``get_records``); called from
            whichever thread calls :meth:`step`.
        stream: the stream name. shard_id: the shard.
        start: where to open when no record was returned yet.
        restart_at: where to reopen when the first iterator expires before any record was
            returned (default ``start``): a ``LATEST`` start reopens at the ``AT_TIMESTAMP``
            recorded when it was resolved, never at a later tip.
        ending_sequence_number: a closed shard's ``EndingSequenceNumber``, or None.
        max_records: ``Limit`` of each ``GetRecords`` (1-10,000).
        idle_wait_s: the first wait at the tip, seconds. max_idle_wait_s: the longest.
        clock: monotonic seconds. rng: uniform [0, 1) for the backoff jitter.

    Raises (from :meth:`step`):
        StreamError: the stream or shard does not exist (``ResourceNotFoundException``),
            or the credentials were refused.
        KinesisError: any other error that is not transient, translated, cause chained.
    """

    def __init__(self, client: Any, stream: str, shard_id: str, start: StartAt, *, restart_at: StartAt | None = None,
                 ending_sequence_number: str | None = None, max_records: int = 10_000, idle_wait_s: float = 0.25,
                 max_idle_wait_s: float = 1.0, clock: Callable[[], float] = monotonic_s,
                 rng: Callable[[], float] = random.random) -> None:
        super().__init__(stream, shard_id, start, restart_at, ending_sequence_number)
        self.client = client
        self._wire = wire_get_records(client)
        self.max_records = max_records
        self.idle_wait_s = idle_wait_s
        self.max_idle_wait_s = max(idle_wait_s, max_idle_wait_s)
        self._clock = clock
        self._rng = rng
        self._iterator: str | None = None
        self._next_call_at = 0.0
        self._idle = 0  # empty answers at the tip in a row
        self.throttled_in_a_row = 0
        self.get_records_calls = 0
        self.throttles = 0
        self.expired_iterators = 0

    @property
    def position(self) -> StartAt:
        """Where the next iterator opens: after the last record :meth:`step` returned, else the start."""
        last = self._last
        if last is None:
            return self._start
        return StartAt.after_sequence_number(last.sequence_number, last.sub_sequence_number)

    @property
    def has_iterator(self) -> bool:
        """True while an iterator is held (the next step is a ``GetRecords``)."""
        return self._iterator is not None

    # -- the reader's Fetcher protocol (kinesis_actors.reader.fetcher)
    reserve_bytes: int | None = None
    """Byte-budget reservation of one step: None, one ``GetRecords`` response (the budget's default)."""

    @property
    def io_kind(self) -> Literal["poll", "open"]:
        """``"poll"`` while an iterator is held (a recurring ``GetRecords``), else ``"open"``."""
        return "poll" if self._iterator is not None else "open"

    def close(self) -> None:
        """Nothing to end: a polling fetcher holds no connection of its own."""

    def pause(self) -> bool:
        """Nothing to drop (``GetRecords`` holds nothing between calls): False."""
        return False

    def counters(self) -> dict[str, int]:
        """``get_records_calls``, ``throttles``, ``expired_iterators``."""
        return {"get_records_calls": self.get_records_calls, "throttles": self.throttles,
                "expired_iterators": self.expired_iterators}

    def seek(self, position: StartAt) -> None:
        """Drop the iterator and everything returned: the next step opens at ``position``."""
        self._start = self._restart = position
        self._last, self._iterator = None, None
        self._idle = 0

    def due_in(self) -> float:
        """Seconds until the next :meth:`step` may call AWS (0 when it may now)."""
        return max(0.0, self._next_call_at - self._clock())

    def _throttled(self, e: BaseException, operation: str) -> None:
        self.throttles += 1
        self.throttled_in_a_row += 1
        pause = backoff_s(self.throttled_in_a_row, rng=self._rng)
        self._next_call_at = max(self._next_call_at, self._clock() + pause)
        log.info("%s on %s throttled or failed (%s); next try in %.2f s", operation, self.resource,
                 aws_error_code(e) or type(e).__name__, pause)

    def _open(self) -> None:
        position = self.position
        args = position.iterator_args()
        self.arm_skip(position)
        try:
            self._iterator = self.client.get_shard_iterator(StreamName=self.stream, ShardId=self.shard_id,
                                                            **args)["ShardIterator"]
        except Exception as e:
            if not is_throttling(e):
                raise self._fatal(e, "GetShardIterator") from e
            self._throttled(e, "GetShardIterator")
            return
        self.throttled_in_a_row = 0
        self._start = self._restart

    def _fatal(self, e: BaseException, operation: str) -> Exception:
        return self.not_found(e, operation, f"stream {self.stream!r} or shard {self.shard_id}")

    def step(self) -> Fetched | None:
        """One AWS call: ``GetShardIterator`` when no iterator is held, else ``GetRecords``.

        Blocking (a socket call); never sleeps: wait :meth:`due_in` seconds before it.

        Returns:
            A :class:`Fetched` for a ``GetRecords`` answer (possibly with no records), or
            None when the step opened an iterator or handled a throttle or an expired
            iterator (nothing to deliver; step again).

        Raises:
            StreamError, KinesisError: see the class docstring.
        """
        if self._iterator is None:
            self._open()
            return None
        self._next_call_at = self._clock() + MIN_CALL_SPACING_S
        self.get_records_calls += 1
        try:
            if self._wire is not None:
                response = self._wire.call(self._iterator, self.max_records, shard_id=self.shard_id,
                                           stream=self.stream)
            else:
                response = self.client.get_records(ShardIterator=self._iterator, Limit=self.max_records)
        except Exception as e:
            if _is_expired_iterator(e):
                self.expired_iterators += 1
                self._iterator = None
                if _EXPIRY_LATEST in mutation.ACTIVE:
                    self.seek(StartAt.latest())
                log.info("%s: iterator expired; reopening at %s", self.resource, self.position)
                return None
            if not is_throttling(e):
                raise self._fatal(e, "GetRecords") from e
            self._throttled(e, "GetRecords")
            return None
        self.throttled_in_a_row = 0
        raw = response.get("Records") or []
        records = self.accept(raw)
        lag = response.get("MillisBehindLatest")
        self._iterator = response.get("NextShardIterator")
        at_tip = not raw and not lag
        shard_end = self._iterator is None or self.past_end(at_tip)
        if at_tip:
            self._idle += 1
            wait = min(self.max_idle_wait_s, self.idle_wait_s * 2 ** min(self._idle - 1, 30))  # 2**1024: OverflowError
            self._next_call_at = max(self._next_call_at, idle_due(self._clock(), wait, IDLE_GRID_S))
        else:
            self._idle = 0
        return Fetched(records, None if lag is None else int(lag), shard_end, at_tip, records.nbytes)
