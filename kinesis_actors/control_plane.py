"""The Kinesis control plane: ``DescribeStreamSummary``, ``CreateStream``, ``ListShards``.

Control-plane throttling (``LimitExceededException``) and transient errors are retried
here, in one layer, with full jitter (:data:`CONTROL_PLANE_BACKOFF`) until the caller's
deadline (:func:`call_with_retry`); these calls are blocking (``time.sleep``), for the driver, the
Coordinator's threads and read-task planning. Errors leave through
:func:`~kinesis_actors.errors.translate_aws_error`. Everything here is re-exported by
:mod:`kinesis_actors.kinesis`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .backoff import Backoff, Retry
from .clock import Clock, monotonic_s
from .errors import KinesisError, StreamError, aws_error_code, is_throttling, is_unreachable, translate_aws_error

__all__ = ["ShardInfo", "describe_stream", "ensure_stream", "list_shards", "call_with_retry", "CONTROL_PLANE_BACKOFF"]

log = logging.getLogger("kinesis_actors.kinesis")
T = TypeVar("T")

CONTROL_PLANE_BACKOFF = Backoff(base_s=0.4, cap_s=3.0, floor_s=0.1)
"""Waits of :func:`call_with_retry` between throttled control-plane calls (``ListShards``,
``DescribeStreamSummary``, stream consumers: a few calls per second per account), seconds."""


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard as ``ListShards`` describes it.

    Attributes:
        shard_id: e.g. ``"shardId-000000000000"``.
        parent_shard_ids: its parent and adjacent parent (after a split or merge), if any.
        starting_sequence_number / ending_sequence_number: decimal strings; the ending
            one is set only on a closed shard (after resharding).
        hash_key_range: ``(starting, ending)`` hash keys as ints.
    """

    shard_id: str
    parent_shard_ids: tuple[str, ...] = ()
    starting_sequence_number: str | None = None
    ending_sequence_number: str | None = None
    hash_key_range: tuple[int, int] = (0, 2**128 - 1)

    @property
    def closed(self) -> bool:
        """True when the shard has an ``EndingSequenceNumber`` (it takes no new writes)."""
        return self.ending_sequence_number is not None

    @classmethod
    def from_api(cls, shard: dict[str, Any]) -> ShardInfo:
        """Build from one element of ``ListShards``'s ``Shards``."""
        parents = tuple(p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p)
        seq = shard.get("SequenceNumberRange", {})
        hk = shard.get("HashKeyRange", {})
        return cls(
            shard_id=shard["ShardId"],
            parent_shard_ids=parents,
            starting_sequence_number=seq.get("StartingSequenceNumber"),
            ending_sequence_number=seq.get("EndingSequenceNumber"),
            hash_key_range=(int(hk.get("StartingHashKey", 0)), int(hk.get("EndingHashKey", 2**128 - 1))),
        )


def call_with_retry(fn: Callable[[], T], *, operation: str, resource: str, deadline_s: float = 30.0,
                    backoff: Backoff | None = None, clock: Clock | None = None,
                    sleep: Callable[[float], object] | None = None) -> T:
    """Call ``fn`` and retry throttling and transient errors with full-jitter backoff until ``deadline_s``.

    The ``n``-th wait is ``backoff.delay_s(n)`` (default :data:`CONTROL_PLANE_BACKOFF`, read
    at each call), cut short at the deadline (:class:`~kinesis_actors.backoff.Retry`);
    blocking (``sleep``, default ``time.sleep``; ``clock`` default
    :func:`~kinesis_actors.clock.monotonic_s`), for the driver and the control plane. The
    library's control-plane clients are built without botocore's retries
    (``max_attempts=0``), so these are the only ones; a client with botocore's retries on
    has them under each attempt here.

    An endpoint that cannot be reached (connection refused: nothing listens) is not
    retried: the caller hears at once, with the URL.

    Raises:
        KinesisError: the translated error, once it is not transient or the deadline passed.
    """

    def transient(e: Exception) -> bool:  # throttling, 5xx and network errors (as botocore's standard mode)
        return is_throttling(e) and not is_unreachable(e)

    def on_retry(e: Exception, failed: int, pause: float) -> None:
        log.info("%s on %s failed (%s); retry %d in %.2f s", operation, resource, aws_error_code(e) or repr(e),
                 failed, pause)

    retry = Retry(backoff or CONTROL_PLANE_BACKOFF, deadline_s=deadline_s,
                  clock=clock if clock is not None else monotonic_s)
    try:
        return retry.call(fn, retry_on=transient, on_retry=on_retry, sleep=sleep if sleep is not None else time.sleep)
    except Exception as e:
        raise translate_aws_error(e, operation=operation, resource=resource) from e


def describe_stream(client: Any, stream: str, *, deadline_s: float = 30.0) -> dict[str, Any]:
    """``DescribeStreamSummary`` of ``stream``: its ``StreamDescriptionSummary`` dict.

    Raises:
        StreamError: the stream does not exist (``ResourceNotFoundException``) or the
            credentials were refused.
        KinesisError: anything else, translated.
    """
    response = call_with_retry(
        lambda: client.describe_stream_summary(StreamName=stream),
        operation="DescribeStreamSummary", resource=stream, deadline_s=deadline_s,
    )
    summary: dict[str, Any] = response["StreamDescriptionSummary"]
    return summary


def ensure_stream(client: Any, stream: str, *, create_shards: int | None, wait_s: float = 60.0) -> dict[str, Any]:
    """Describe ``stream``; create it with ``create_shards`` shards if missing and wait for ``ACTIVE``.

    Args:
        client: a boto3 Kinesis client.
        stream: the stream name.
        create_shards: shard count for ``CreateStream``; None to require the stream.
        wait_s: longest wait for the stream to become ``ACTIVE`` (60 s), polling
            ``DescribeStreamSummary`` every 0.25 s.

    Returns:
        The ``StreamDescriptionSummary`` of the ACTIVE (or UPDATING) stream.

    Raises:
        StreamError: missing (and not to be created), not ACTIVE within ``wait_s``, or the
            credentials were missing or refused (the botocore cause chained).
        KinesisError: the endpoint cannot be reached (the message names its URL), or
            another error, translated.
    """
    try:
        summary = describe_stream(client, stream)
    except StreamError as e:
        if e.aws_code != "ResourceNotFoundException":
            raise  # credentials refused or missing: the error names its real cause
        if create_shards is None:
            raise StreamError(f"stream {stream!r} does not exist (pass create_if_missing=N to create it)",
                              aws_code=e.aws_code) from None
        try:
            client.create_stream(StreamName=stream, ShardCount=create_shards)
            log.info("created stream %s with %d shards", stream, create_shards)
        except Exception as ce:
            if translate_aws_error(ce, operation="CreateStream").aws_code != "ResourceInUseException":
                raise translate_aws_error(ce, operation="CreateStream", resource=stream) from ce
        summary = describe_stream(client, stream)
    end = monotonic_s() + wait_s
    while summary.get("StreamStatus") not in ("ACTIVE", "UPDATING"):
        if summary.get("StreamStatus") == "DELETING" or monotonic_s() > end:
            raise StreamError(f"stream {stream!r} is {summary.get('StreamStatus')}, not ACTIVE after {wait_s:.0f} s")
        time.sleep(0.25)
        summary = describe_stream(client, stream)
    return summary


def list_shards(client: Any, stream: str, *, deadline_s: float = 30.0) -> list[ShardInfo]:
    """Every shard of ``stream`` (open and closed) with ``ListShards``, following ``NextToken``.

    AWS refuses ``StreamName`` together with ``NextToken``; moto needs it. The first page
    is asked by name, later pages by token alone, falling back to both for moto.

    Raises:
        StreamError: the stream is gone. KinesisError: other failures past retries.
    """
    shards: list[ShardInfo] = []
    response = call_with_retry(lambda: client.list_shards(StreamName=stream), operation="ListShards",
                               resource=stream, deadline_s=deadline_s)
    while True:
        shards.extend(ShardInfo.from_api(s) for s in response.get("Shards", []))
        token = response.get("NextToken")
        if not token:
            break
        try:
            response = call_with_retry(functools.partial(client.list_shards, NextToken=token),
                                       operation="ListShards", resource=stream, deadline_s=deadline_s)
        except KinesisError as e:  # moto refuses NextToken without StreamName (AWS refuses both together)
            log.debug("ListShards of %s by NextToken alone refused (%s); asking with the stream name too",
                      stream, e.aws_code)
            response = call_with_retry(functools.partial(client.list_shards, StreamName=stream, NextToken=token),
                                       operation="ListShards", resource=stream, deadline_s=deadline_s)
    return sorted(shards, key=lambda s: s.shard_id)
