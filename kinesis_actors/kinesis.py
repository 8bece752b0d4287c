"""Kinesis control-plane calls: ``DescribeStreamSummary``, ``CreateStream``, ``ListShards``.

Throttling (``LimitExceededException``) is retried by botocore's standard retry mode
and then here with jitter until the caller's deadline; errors leave through
:func:`~kinesis_actors.errors.translate_aws_error`.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import StreamError, is_throttling, translate_aws_error

__all__ = ["ShardInfo", "describe_stream", "ensure_stream", "list_shards", "call_with_retry"]

log = logging.getLogger(__name__)
T = TypeVar("T")


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
    def from_api(cls, shard: dict[str, Any]) -> "ShardInfo":
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


def call_with_retry(fn: Callable[[], T], *, operation: str, resource: str, deadline_s: float = 30.0) -> T:
    """Call ``fn`` and retry throttling/transient errors with full-jitter backoff until ``deadline_s``.

    Raises:
        KinesisError: the translated error, once it is not transient or the deadline passed.
    """
    end = time.monotonic() + deadline_s
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as e:
            attempt += 1
            err = translate_aws_error(e, operation=operation, resource=resource)
            if not is_throttling(e) or time.monotonic() >= end:
                raise err from e
            pause = random.uniform(0.1, min(3.0, 0.2 * 2**attempt))
            log.info("%s on %s throttled (%s); retrying in %.2f s", operation, resource, err.aws_code, pause)
            time.sleep(min(pause, max(0.0, end - time.monotonic())))


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
    return response["StreamDescriptionSummary"]


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
        StreamError: missing (and not to be created), or not ACTIVE within ``wait_s``.
    """
    try:
        summary = describe_stream(client, stream)
    except StreamError as e:
        if create_shards is None or e.aws_code != "ResourceNotFoundException":
            raise StreamError(f"stream {stream!r} does not exist (pass create_if_missing=N to create it)"
                              if e.aws_code == "ResourceNotFoundException" else str(e), aws_code=e.aws_code) from e
        try:
            client.create_stream(StreamName=stream, ShardCount=create_shards)
            log.info("created stream %s with %d shards", stream, create_shards)
        except Exception as ce:
            if translate_aws_error(ce, operation="CreateStream").aws_code != "ResourceInUseException":
                raise translate_aws_error(ce, operation="CreateStream", resource=stream) from ce
        summary = describe_stream(client, stream)
    end = time.monotonic() + wait_s
    while summary.get("StreamStatus") not in ("ACTIVE", "UPDATING"):
        if summary.get("StreamStatus") == "DELETING" or time.monotonic() > end:
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
            response = call_with_retry(lambda: client.list_shards(NextToken=token), operation="ListShards",
                                       resource=stream, deadline_s=deadline_s)
        except Exception:
            response = call_with_retry(lambda: client.list_shards(StreamName=stream, NextToken=token),
                                       operation="ListShards", resource=stream, deadline_s=deadline_s)
    return sorted(shards, key=lambda s: s.shard_id)
