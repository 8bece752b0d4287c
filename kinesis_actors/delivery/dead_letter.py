"""Dead letters: one JSON document per record given up, written before it is acknowledged.

The document (SPEC, "Delivery controls")::

    {"stream", "shard_id", "sequence_number", "sub_sequence_number", "partition_key",
     "approximate_arrival_timestamp" (ISO 8601 or null), "data" (base64),
     "error" ("Type: message" or null), "attempts", "reason" ("sink" | "max_record_age")}

published with the record's shard id as partition key, so the dead letters of one shard
stay in order in the dead-letter stream. Lambda's on-failure destination receives only
metadata (shard, sequence range) and the user reads the records back before they expire;
here the payload travels in the document, so a dead letter outlives the stream's retention.

:class:`DeadLetterWriter` retries a failing publisher with :mod:`kinesis_actors.backoff`
for as long as it takes: a record is acknowledged only after its dead letter is written,
so a lost dead-letter stream holds the shard up (its lease is kept: the waits go through
the reader's alive-stamping sleep) and never loses a record silently.
"""

from __future__ import annotations

import base64
import json
import logging
import random
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from ..backoff import Backoff, Retry
from ..errors import InvalidError, SinkError
from ..records import Record

__all__ = ["dead_letter_document", "DeadLetterWriter", "DeadLetter", "REASONS", "DEAD_LETTER_BACKOFF"]

log = logging.getLogger(__name__)

REASONS = ("sink", "max_record_age")
"""Why a record was given up: the sink refused it past its retries, or it was too old."""

DEAD_LETTER_BACKOFF = Backoff(base_s=0.2, cap_s=10.0, floor_s=0.1)
"""Waits between attempts to write dead letters: 0.1 s at least, 10 s at most."""

DeadLetter = tuple[Record, str, "BaseException | None", int]
"""``(record, reason, error or None, attempts)``: one record to give up."""

Publish = Callable[[list[tuple[bytes, str]]], Awaitable[Any]]


def _error_text(error: BaseException | None) -> str | None:
    if error is None:
        return None
    cause = getattr(error, "cause", None)  # Ray's RayTaskError carries the sink's exception
    shown = cause if isinstance(cause, BaseException) else error
    return f"{type(shown).__name__}: {str(shown)[:1000]}"


def dead_letter_document(record: Record, *, reason: str, error: BaseException | None, attempts: int) -> bytes:
    """The dead letter of ``record`` as UTF-8 JSON bytes.

    Args:
        record: the record given up.
        reason: ``"sink"`` or ``"max_record_age"``.
        error: the last error of the sink (``"sink"``), None for an age expiry.
        attempts: deliveries attempted with this record in the batch (0 for an age expiry).

    Raises:
        InvalidError: ``reason`` is not one of :data:`REASONS`.
    """
    if reason not in REASONS:
        raise InvalidError(f"dead-letter reason must be one of {REASONS}, got {reason!r}")
    arrival = record.approximate_arrival_timestamp
    doc = {
        "stream": record.stream,
        "shard_id": record.shard_id,
        "sequence_number": record.sequence_number,
        "sub_sequence_number": record.sub_sequence_number,
        "partition_key": record.partition_key,
        "approximate_arrival_timestamp": arrival.isoformat() if arrival is not None else None,
        "data": base64.b64encode(record.data).decode("ascii"),
        "error": _error_text(error) if reason == "sink" else None,
        "attempts": attempts if reason == "sink" else 0,
        "reason": reason,
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


class DeadLetterWriter:
    """Writes dead letters through a publisher, retrying until they are written.

    Args:
        publish: ``async publish(items)`` with ``items`` a list of ``(data, partition_key)``:
            the consumer passes ``Publisher.put_many`` run in its Kinesis thread pool.
        sleep: ``async sleep(seconds)``; the consumer's alive-stamping sleep (the lease is
            kept while a dead-letter stream is down).
        stats: counters to bump (``dead_letter_records``, ``dead_letter_failures``), or None.
        backoff: waits between attempts (:data:`DEAD_LETTER_BACKOFF`).
        rng: uniform in ``[0, 1)`` for the backoff's jitter (tests).
    """

    def __init__(self, publish: Publish, *, sleep: Callable[[float], Awaitable[None]],
                 stats: MutableMapping[str, Any] | None = None, backoff: Backoff = DEAD_LETTER_BACKOFF,
                 rng: Callable[[], float] | None = None) -> None:
        self._publish = publish
        self._sleep = sleep
        self._stats = stats if stats is not None else {}
        self._backoff = backoff
        self._rng = rng

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Write one document per letter (in order); return once all are written.

        A failing publish is retried with backoff without end (each failure logged at
        WARNING and counted in ``dead_letter_failures``); cancelling the caller (a stop)
        abandons the write, and the records stay unacknowledged.

        Raises:
            SinkError: a document the publisher refuses as invalid (``InvalidError``, e.g. a
                record whose document exceeds the 1 MiB Kinesis record limit): no retry can
                write it, and skipping it would lose the record.
        """
        if not letters:
            return
        items = [(dead_letter_document(r, reason=reason, error=err, attempts=n), r.shard_id)
                 for r, reason, err, n in letters]

        def failed(e: Exception, attempt: int, pause: float) -> None:
            self._stats["dead_letter_failures"] = self._stats.get("dead_letter_failures", 0) + 1
            log.warning("shard %s: writing %d dead letters failed (%r); retry %d in %.2f s",
                        letters[0][0].shard_id, len(items), e, attempt, pause)

        try:  # no bound: the records stay unacknowledged until their dead letters are written
            await Retry(self._backoff, rng=self._rng or random.random).call_async(
                lambda: self._publish(items), retry_on=lambda e: not isinstance(e, InvalidError), on_retry=failed,
                sleep=self._sleep)
        except InvalidError as e:
            first = letters[0][0]
            raise SinkError(f"shard {first.shard_id}: a dead letter for sequence number "
                            f"{first.sequence_number} cannot be written ({e}); not skipping it") from e
        self._stats["dead_letter_records"] = self._stats.get("dead_letter_records", 0) + len(items)
        log.warning("shard %s: %d records sent to the dead letters (%s)", letters[0][0].shard_id, len(items),
                    ", ".join(sorted({reason for _, reason, _, _ in letters})))
