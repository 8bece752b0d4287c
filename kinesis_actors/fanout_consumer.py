"""Enhanced fan-out's stream consumer: register it (or reuse it) and wait for ``ACTIVE``,
and the explicit deregistration. Also importable from :mod:`kinesis_actors.fanout`.

Control-plane calls (``DescribeStreamConsumer``, ``RegisterStreamConsumer``,
``DeregisterStreamConsumer``) go through :func:`~kinesis_actors.kinesis.call_with_retry`
(throttling retried with the control-plane backoff until its deadline).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .clock import monotonic_s
from .errors import KinesisError, StreamError
from .kinesis import call_with_retry, describe_stream

__all__ = ["ensure_stream_consumer", "deregister_stream_consumer"]

log = logging.getLogger("kinesis_actors.fanout")

_CONSUMER_POLL_S = 0.25


def _consumer_description(client: Any, stream_arn: str, consumer_name: str) -> dict[str, Any] | None:
    try:
        response = call_with_retry(
            lambda: client.describe_stream_consumer(StreamARN=stream_arn, ConsumerName=consumer_name),
            operation="DescribeStreamConsumer", resource=consumer_name)
    except KinesisError as e:
        if e.aws_code == "ResourceNotFoundException":
            return None
        raise
    description: dict[str, Any] = response["ConsumerDescription"]
    return description


def ensure_stream_consumer(client: Any, stream: str, consumer_name: str, *, wait_s: float = 60.0) -> str:
    """Register the stream consumer ``consumer_name`` on ``stream``, or reuse the one that
    exists, and wait until it is ``ACTIVE``. Returns its ARN.

    Several readers and instances of one application share one consumer: whoever comes
    first registers it (``RegisterStreamConsumer``); the others find it with
    ``DescribeStreamConsumer``, and a race between two registrations
    (``ResourceInUseException``) is settled by describing it again. The consumer is never
    deregistered here (see :func:`deregister_stream_consumer`).

    Args:
        client: a boto3 Kinesis client.
        stream: the stream name. consumer_name: the consumer's name, used exactly.
        wait_s: longest wait for ``ACTIVE``, seconds (``DescribeStreamConsumer`` every 0.25 s).

    Raises:
        StreamError: the stream does not exist, or the consumer is being deleted.
        KinesisError: not ``ACTIVE`` within ``wait_s``, the limit of consumers per stream
            (``LimitExceededException`` past retries), or another error, translated.
    """
    arn = describe_stream(client, stream)["StreamARN"]
    end = monotonic_s() + wait_s
    description = _consumer_description(client, arn, consumer_name)
    if description is None:
        try:
            response = call_with_retry(lambda: client.register_stream_consumer(StreamARN=arn,
                                                                               ConsumerName=consumer_name),
                                       operation="RegisterStreamConsumer", resource=consumer_name)
            description = response["Consumer"]
            log.info("registered stream consumer %s on %s", consumer_name, stream)
        except KinesisError as e:
            if e.aws_code != "ResourceInUseException":
                raise
            description = _consumer_description(client, arn, consumer_name)  # registered by another instance
    while True:
        status = description.get("ConsumerStatus") if description else None
        if status == "ACTIVE" and description is not None:
            consumer_arn: str = description["ConsumerARN"]
            return consumer_arn
        if status == "DELETING":
            raise StreamError(f"stream consumer {consumer_name!r} of {stream!r} is being deleted")
        if monotonic_s() > end:
            raise KinesisError(f"stream consumer {consumer_name!r} of {stream!r} is {status}, not ACTIVE after "
                               f"{wait_s:.0f} s", retriable=True)
        time.sleep(_CONSUMER_POLL_S)
        description = _consumer_description(client, arn, consumer_name)


def deregister_stream_consumer(client: Any, stream: str, consumer_name: str) -> bool:
    """Deregister the stream consumer ``consumer_name`` of ``stream`` (the explicit call:
    closing a subscription never does it). Returns False if it did not exist.

    Every reader still subscribed through it loses its subscriptions (AWS ends them).

    Raises:
        StreamError: the stream does not exist. KinesisError: another error, translated.
    """
    arn = describe_stream(client, stream)["StreamARN"]
    try:
        call_with_retry(lambda: client.deregister_stream_consumer(StreamARN=arn, ConsumerName=consumer_name),
                        operation="DeregisterStreamConsumer", resource=consumer_name)
    except KinesisError as e:
        if e.aws_code == "ResourceNotFoundException":
            return False
        raise
    log.info("deregistered stream consumer %s of %s", consumer_name, stream)
    return True
