"""The messages of ``SubscribeToShard``: the ``StartingPosition`` a request carries, the
frames of its answer, and the decoding of each frame into a :class:`SubscriptionEvent`
or an :class:`EventRefused` (an exception event inside an accepted subscription).

Frames are AWS event-stream messages decoded by ``botocore.eventstream.EventStreamBuffer``
(the frame decoder boto3 uses); a message has ``headers`` (``:message-type``,
``:event-type``, ``:exception-type``, ``:error-code``, ``:error-message``) and a
``payload``. The payload of a ``SubscribeToShardEvent`` is AWS's JSON 1.1 (blobs base64,
timestamps epoch seconds), parsed here by the parser of ``GetRecords``'s fast path. Used by
:class:`~kinesis_actors.fanout.FanOutFetcher`; also importable from
:mod:`kinesis_actors.fanout`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from .batch import RecordBatch
from .errors import KinesisError
from .fanout_http import EventSource
from .records import StartAt
from .wire import batch_from_json_records, loads

__all__ = ["SubscriptionEvent", "EventRefused", "parse_event_payload", "decode_message", "complete_frames",
           "starting_position"]


@dataclasses.dataclass(frozen=True)
class SubscriptionEvent:
    """One ``SubscribeToShardEvent``, decoded.

    Attributes:
        records: the event's records as one batch (KPL aggregates de-aggregated).
        continuation_sequence_number: where the next subscription continues (None at shard end).
        millis_behind_latest: ``MillisBehindLatest``, ms (None if absent).
        child_shards: the ``ChildShards`` ids (set at shard end on AWS; kinesis-mock sends null).
    """

    records: RecordBatch
    continuation_sequence_number: str | None
    millis_behind_latest: int | None
    child_shards: tuple[str, ...]


class EventRefused(Exception):
    """An exception event inside an accepted subscription (``:message-type`` exception or error).

    Attributes:
        response: ``{"Error": {"Code": ..., "Message": ...}}``, the shape of botocore's
            ``ClientError.response``, so :func:`~kinesis_actors.errors.aws_error_code` reads it.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.response = {"Error": {"Code": code, "Message": message}}


def parse_event_payload(payload: bytes, *, shard_id: str = "", stream: str = "") -> SubscriptionEvent:
    """Decode the JSON payload of a ``SubscribeToShardEvent`` frame (blobs are base64,
    timestamps epoch seconds, as in AWS's JSON 1.1 protocol) with the parser of
    ``GetRecords``'s fast path (:func:`kinesis_actors.wire.loads`,
    :func:`~kinesis_actors.wire.batch_from_json_records`).

    Args:
        payload: the frame's payload. shard_id / stream: what the records are labelled with.

    Raises:
        KinesisError: the payload is not the JSON of such an event.
    """
    try:
        body = loads(payload)
        records = batch_from_json_records(body.get("Records") or [], shard_id=shard_id, stream=stream)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise KinesisError(f"SubscribeToShard: an event that does not decode ({e!r:.200})") from e
    lag = body.get("MillisBehindLatest")
    children = tuple(str(c.get("ShardId")) for c in body.get("ChildShards") or [] if isinstance(c, dict))
    return SubscriptionEvent(records, body.get("ContinuationSequenceNumber"), None if lag is None else int(lag),
                             children)


def decode_message(message: Any, *, shard_id: str = "", stream: str = "") -> SubscriptionEvent | None:
    """One event-stream message of a subscription, decoded.

    Args:
        message: a decoded frame (``headers`` dict, ``payload`` bytes).
        shard_id / stream: what the records are labelled with.

    Returns:
        The :class:`SubscriptionEvent` of a ``SubscribeToShardEvent``; None for any other
        event (``initial-response``, which AWS sends first and kinesis-mock does not, and
        event types this version does not know).

    Raises:
        EventRefused: an exception or error message (its code from ``:exception-type`` or
            ``:error-code``, ``InternalFailure`` when neither is set).
        KinesisError: a ``SubscribeToShardEvent`` whose payload does not decode.
    """
    headers = message.headers
    kind = headers.get(":message-type")
    if kind != "event":
        code = str(headers.get(":exception-type") or headers.get(":error-code") or "InternalFailure")
        text = message.payload.decode("utf-8", "replace")[:300]
        if kind == "error":
            text = str(headers.get(":error-message") or text)
        raise EventRefused(code, text)
    if headers.get(":event-type") != "SubscribeToShardEvent":
        return None
    return parse_event_payload(message.payload, shard_id=shard_id, stream=stream)


def complete_frames(source: EventSource, buffer: Any) -> Iterator[Any]:
    """The complete frames of ``source`` as they arrive, decoded by ``buffer`` (an
    ``EventStreamBuffer``); ends when ``source`` ends; a dropped connection raises what
    ``source.read()`` raises."""
    while True:
        yield from buffer
        chunk = source.read()
        if not chunk:
            return
        buffer.add_data(chunk)


def starting_position(position: StartAt) -> dict[str, Any]:
    """The ``StartingPosition`` of a ``SubscribeToShard`` request that opens at ``position``
    (``Type`` with ``Timestamp`` or ``SequenceNumber`` where the kind needs one)."""
    starting: dict[str, Any] = {"Type": position.kind}
    if position.kind == "AT_TIMESTAMP":
        starting["Timestamp"] = position.iterator_args()["Timestamp"]
    elif position.sequence_number is not None:
        args = position.iterator_args()
        starting.update(Type=args["ShardIteratorType"], SequenceNumber=position.sequence_number)
    return starting
