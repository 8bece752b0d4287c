"""The one error family of ``kinesis_actors`` and the single botocore translation point.

Hierarchy::

    KinesisError                      base of everything this library raises
    ├── NotConnectedError             broker not connected yet, or shut down
    ├── InvalidError                  bad argument, refused before any AWS call
    ├── StreamError                   stream missing / deleted / bad credentials
    ├── LeaseLostError                conditional write failed: someone else holds the lease
    ├── LeaseStoreError               lease table missing or unreachable past retries
    ├── SinkError                     the downstream gave up after ``max_sink_retries``
    ├── PartialBatchError             raised BY a sink: records ``[0, failed_from)`` are done, retry the rest
    └── StartError                    ``subscribe()``'s Ray start or first pass did not finish in time

Every error carries ``retriable`` (a retry of the same call may succeed) and, when it
was translated from botocore, ``aws_code`` (the AWS error code, e.g.
``ResourceNotFoundException``) with the botocore exception chained as ``__cause__``.
Messages never contain credentials: only operation names, codes and resource names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "KinesisError",
    "NotConnectedError",
    "InvalidError",
    "StreamError",
    "LeaseLostError",
    "LeaseStoreError",
    "SinkError",
    "PartialBatchError",
    "StartError",
    "aws_error_code",
    "translate_aws_error",
    "is_throttling",
    "is_unreachable",
    "THROTTLING_CODES",
    "ray_call_errors",
    "AUTH_CODES",
]


class KinesisError(Exception):
    """Base class of every error raised by ``kinesis_actors``.

    Attributes:
        retriable: True when repeating the same call later may succeed
            (throttling, a network error); False for a definite answer.
        aws_code: the AWS error code this error was translated from, or None.
    """

    retriable: bool = False

    def __init__(self, message: str, *, aws_code: str | None = None, retriable: bool | None = None):
        super().__init__(message)
        self.aws_code = aws_code
        if retriable is not None:
            self.retriable = retriable

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep keyword attributes when the error crosses a Ray process boundary.
        return (_rebuild_error, (type(self), str(self), self.aws_code, self.retriable))


def _rebuild_error(cls: type[KinesisError], message: str, aws_code: str | None, retriable: bool) -> KinesisError:
    return cls(message, aws_code=aws_code, retriable=retriable)


class NotConnectedError(KinesisError):
    """The broker is not connected yet, or ``shutdown()`` closed it.

    Raised by publishers and seek handles that outlive their connection: never a
    silent success.
    """


class InvalidError(KinesisError, ValueError):
    """An argument is invalid; raised before any AWS call. The message names the bad value."""


class StreamError(KinesisError):
    """The stream is missing, was deleted while being read, or AWS refused the credentials."""


class LeaseLostError(KinesisError):
    """A conditional lease write failed: the caller no longer holds the lease.

    Nothing was written. The reader holding it stops at once and acknowledges nothing more.
    """


class LeaseStoreError(KinesisError):
    """The lease table is missing (without ``create_if_missing``) or unreachable past retries."""


class SinkError(KinesisError):
    """The downstream raised on a batch ``max_sink_retries`` times; the cause is chained."""


class PartialBatchError(KinesisError):
    """Raised by a push sink to acknowledge part of a batch: records ``[0, failed_from)``.

    The reader acknowledges and checkpoints those records and retries the batch from
    record ``failed_from`` on, in order; the retry counts against ``max_sink_retries``
    (after them, ``bisect_on_error``, the dead letters or ``SinkError`` apply to the
    rest). This is Lambda's partial batch response (``ReportBatchItemFailures``) with the
    first failed record given by its index. As in Lambda, a value the reader cannot use
    (not an int, below 0 or beyond the batch) counts as a failure of the whole batch;
    ``failed_from`` equal to the batch's length acknowledges all of it.

    It crosses Ray (the sink actor raises it; the reader reads ``failed_from`` from the
    ``RayTaskError`` Ray raises in its place, which is also an instance of this class).

    Args:
        message: what failed (optional).
        failed_from: index of the first record not acknowledged (keyword).

    Example:
        >>> raise PartialBatchError(failed_from=3)  # doctest: +SKIP
    """

    retriable = True

    def __init__(self, message: str = "", *, failed_from: int, aws_code: str | None = None,
                 retriable: bool | None = None) -> None:
        super().__init__(message or f"records from index {failed_from} failed", aws_code=aws_code,
                         retriable=retriable)
        self.failed_from = failed_from

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_partial, (str(self), self.failed_from, self.aws_code, self.retriable))


def _rebuild_partial(message: str, failed_from: int, aws_code: str | None, retriable: bool) -> PartialBatchError:
    return PartialBatchError(message, failed_from=failed_from, aws_code=aws_code, retriable=retriable)


class StartError(KinesisError):
    """``subscribe()`` could not open every shard it leased within ``start_timeout_s``, or
    could not start Ray within it.

    The message says how many shards opened and why the others did not (readers still
    starting or failing to start, opens timing out). Nothing was delivered; the leases
    taken were released. For Ray's start it says what ``ray.init()`` was doing (connecting
    to the cluster named by ``RAY_ADDRESS`` or by a ``ray start`` address file, or starting a
    local Ray); no lease was taken then.

    Attributes:
        started: shards open (holding their first iterator) at the deadline.
        total: shards leased by the first pass.
    """

    retriable = True

    def __init__(self, message: str, *, started: int = 0, total: int = 0, aws_code: str | None = None,
                 retriable: bool | None = None) -> None:
        super().__init__(message, aws_code=aws_code, retriable=retriable)
        self.started = started
        self.total = total

    def __reduce__(self) -> tuple[Any, ...]:
        return (StartError, (str(self),), {"started": self.started, "total": self.total,
                                            "aws_code": self.aws_code, "retriable": self.retriable})


THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "LimitExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "InternalFailure",
        "InternalServerError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "KMSThrottlingException",
    }
)
AUTH_CODES = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "AccessDeniedException",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "MissingAuthenticationToken",
        "IncompleteSignature",
    }
)


def aws_error_code(exc: BaseException) -> str | None:
    """Return the AWS error code of a botocore ``ClientError`` (``Error.Code``), else None."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def is_throttling(exc: BaseException) -> bool:
    """True for throttling, service-side transient errors and network errors (retry with backoff)."""
    from botocore.exceptions import (  # local import: keeps `import kinesis_actors` light
        ConnectionError as BotoConnectionError,
    )
    from botocore.exceptions import (
        HTTPClientError,
        ReadTimeoutError,
    )

    if isinstance(exc, (BotoConnectionError, HTTPClientError, ReadTimeoutError)):
        return True
    code = aws_error_code(exc)
    if code in THROTTLING_CODES:
        return True
    status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    return isinstance(status, int) and status >= 500


def is_unreachable(exc: BaseException) -> bool:
    """True when the endpoint refused or could not be reached (nothing listens there, DNS,
    TLS): botocore already retried it, and waiting longer rarely helps a caller that has
    not started yet."""
    from botocore.exceptions import EndpointConnectionError

    return isinstance(exc, EndpointConnectionError)


def _endpoint_of(exc: BaseException) -> str | None:
    kwargs = getattr(exc, "kwargs", None)
    url = kwargs.get("endpoint_url") if isinstance(kwargs, dict) else None
    if not isinstance(url, str):
        return None
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else url


def _reason_of(exc: BaseException) -> str:
    """The innermost cause's message (e.g. ``Connection refused``), short."""
    cause: BaseException | None = exc
    while cause is not None and (cause.__cause__ is not None or cause.__context__ is not None):
        cause = cause.__cause__ or cause.__context__
    text = str(cause or exc)
    for marker in ("Connection refused", "Name or service not known", "timed out", "No route to host"):
        if marker in text:
            return marker
    return type(cause or exc).__name__


def translate_aws_error(exc: BaseException, *, operation: str, resource: str = "") -> KinesisError:
    """Translate a botocore exception into the ``KinesisError`` family (the one place that does).

    Args:
        exc: the botocore exception (``ClientError``, ``NoCredentialsError``, a network error).
        operation: the AWS API called, e.g. ``"GetRecords"``; goes into the message.
        resource: the stream or table name, for the message. Never a credential.

    Returns:
        The translated error; the caller raises it ``from exc`` to chain the cause.
    """
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError

    where = f"{operation} on {resource!r}" if resource else operation
    if isinstance(exc, KinesisError):
        return exc
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return StreamError(f"{where}: no AWS credentials found (authentication failed)", retriable=False)
    if is_unreachable(exc):
        endpoint = _endpoint_of(exc) or "the endpoint"
        return KinesisError(f"{where}: cannot reach {endpoint}: {_reason_of(exc)} (is the service or emulator "
                            "running there?)", retriable=True)
    code = aws_error_code(exc)
    if code in AUTH_CODES:
        return StreamError(f"{where}: AWS refused the credentials (authentication failed: {code})", aws_code=code)
    if code == "ResourceNotFoundException":
        return StreamError(f"{where}: resource not found", aws_code=code)
    if code in ("InvalidArgumentException", "ValidationException"):
        return InvalidError(f"{where}: {exc}", aws_code=code)
    if is_throttling(exc):
        return KinesisError(f"{where}: {code or type(exc).__name__} (transient; retries gave up)", aws_code=code,
                            retriable=True)
    return KinesisError(f"{where}: {code or type(exc).__name__}: {exc}", aws_code=code)


@contextlib.contextmanager
def ray_call_errors(*, gone: type[Exception], unreachable: type[Exception]) -> Iterator[None]:
    """Map the errors of one Ray actor call (``await actor.m.remote()`` or ``ray.get``) inside the block.

    The one translation of Ray's actor errors, used by the Coordinator's reader handles
    and by the subscription's supervision of the Coordinator:

    * ``ActorUnavailableError`` (a subclass of ``RayActorError``: the actor may come back,
      e.g. while Ray learns whether its process died) and ``GetTimeoutError`` (no answer
      within ``ray.get``'s timeout) raise ``unreachable``: retry later.
    * any other ``RayActorError`` (``ActorDiedError``: the process or its node is dead)
      raises ``gone``: replace the actor.
    * ``RayTaskError`` (the actor method itself raised) raises the method's own error,
      unwrapped (Ray's ``cause``), without the Ray wrapper chained.

    Every other error passes through unchanged. Imports Ray only when an error is raised.

    Args:
        gone: the exception type raised for a dead actor (built with one message string).
        unreachable: the exception type raised for an actor that may come back.
    """
    try:
        yield
    except Exception as e:
        mapped = _map_ray_error(e, gone, unreachable)
        if mapped is e:
            raise
        if isinstance(mapped, (gone, unreachable)):
            raise mapped from e
        raise mapped from None


def _map_ray_error(e: Exception, gone: type[Exception], unreachable: type[Exception]) -> BaseException:
    import ray.exceptions as rex

    if isinstance(e, rex.ActorUnavailableError):  # checked first: it is a RayActorError too
        return unreachable(type(e).__name__)
    if isinstance(e, rex.RayActorError):
        return gone(type(e).__name__)
    if isinstance(e, rex.GetTimeoutError):
        return unreachable(f"no answer in time ({type(e).__name__})")
    if isinstance(e, rex.RayTaskError):
        return e.cause if isinstance(e.cause, BaseException) else e
    return e
