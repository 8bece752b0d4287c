"""Publisher: ``PutRecords`` with automatic splitting, retries of failed entries, results in order."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .aws import AwsSettings
from .backoff import Backoff, Retry
from .config import validate_stream_name
from .connection import ConnectionState
from .errors import InvalidError, KinesisError, NotConnectedError, is_throttling, translate_aws_error

__all__ = ["Publisher", "PutResult", "MAX_RECORD_BYTES", "MAX_REQUEST_BYTES", "MAX_REQUEST_RECORDS", "PUT_BACKOFF"]

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = 1024 * 1024
"""Largest data blob of one record (1 MiB, the Kinesis limit)."""
MAX_REQUEST_BYTES = 5 * 1024 * 1024
"""Largest ``PutRecords`` request: data plus partition keys (5 MiB)."""
MAX_REQUEST_RECORDS = 500
"""Most records in one ``PutRecords`` call."""
_MAX_HASH_KEY = 2**128 - 1
PUT_BACKOFF = Backoff(base_s=0.1, cap_s=5.0)
"""Waits between ``PutRecords`` attempts of one chunk (a throttled call, or entries that
failed), seconds: full jitter from 0 up to 0.1 s doubling per attempt, at most 5 s."""


@dataclasses.dataclass(frozen=True, slots=True)
class PutResult:
    """Where a published record landed: ``shard_id`` and ``sequence_number`` (decimal string)."""

    shard_id: str
    sequence_number: str


def _entry(item: Sequence[Any]) -> dict[str, Any]:
    if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
        raise InvalidError("put_many items are (data, partition_key) or (data, partition_key, explicit_hash_key), "
                           f"got {item!r:.80}")
    data, key = item[0], item[1]
    ehk = item[2] if len(item) == 3 else None
    if isinstance(data, str):
        data = data.encode("utf-8")
    elif isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise InvalidError(f"record data must be bytes or str, got {type(data).__name__}")
    if len(data) > MAX_RECORD_BYTES:
        raise InvalidError(f"record data is {len(data)} bytes; the Kinesis limit is {MAX_RECORD_BYTES} (1 MiB)")
    if not isinstance(key, str) or not 1 <= len(key) <= 256:
        raise InvalidError(f"partition_key must be a str of 1-256 characters, got {key!r:.80}")
    entry: dict[str, Any] = {"Data": data, "PartitionKey": key}
    if ehk is not None:
        if not (isinstance(ehk, str) and ehk.isdigit() and int(ehk) <= _MAX_HASH_KEY):
            raise InvalidError(f"explicit_hash_key must be a decimal string in 0..2**128-1, got {ehk!r:.80}")
        entry["ExplicitHashKey"] = ehk
    return entry


def _chunks(entries: list[dict[str, Any]]) -> Iterable[list[int]]:
    """Indexes of ``entries`` split into requests of <= 500 records and <= 5 MiB."""
    chunk: list[int] = []
    size = 0
    for i, e in enumerate(entries):
        n = len(e["Data"]) + len(e["PartitionKey"].encode("utf-8"))
        if chunk and (len(chunk) == MAX_REQUEST_RECORDS or size + n > MAX_REQUEST_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(i)
        size += n
    if chunk:
        yield chunk


class Publisher:
    """Publishes records to one stream with ``PutRecords``.

    Taken from a broker (``broker.publisher("orders")``), before or after ``connect()``;
    it raises ``NotConnectedError`` before the broker connects and after it shuts down.
    It can be passed to Ray tasks and actors: it pickles its settings and rebuilds its
    boto3 client there.

    Failed entries of a ``PutRecords`` response (``ProvisionedThroughputExceededException``,
    ``InternalFailure``) and a throttled or transiently failing call are retried with
    exponential backoff and full jitter (0.1 s doubling to 5 s) up to ``max_attempts``
    calls, in one layer: the publisher's client is built without botocore's retries
    (``max_attempts=0``), so a throttled stream costs ``max_attempts`` calls, not
    ``max_attempts`` times botocore's.
    """

    def __init__(self, stream: str, state: ConnectionState, *, max_attempts: int = 10) -> None:
        self.stream = validate_stream_name(stream)
        self._state = state
        self._max_attempts = max_attempts

    @classmethod
    def standalone(cls, stream: str, *, endpoint: str | None = None, region: str | None = None,
                   test_credentials: bool = False, max_attempts: int = 10) -> Publisher:
        """A publisher of its own, with no broker and no Ray (publishing needs no actors).

        Args:
            stream: the stream name.
            endpoint: endpoint URL (an emulator), or None for AWS.
            region: AWS region, or None for boto3's default chain.
            test_credentials: fixed dummy keys, for emulators.
            max_attempts: ``PutRecords`` calls per record before giving up.

        Raises:
            InvalidError: a malformed stream name or endpoint (before any AWS call).
        """
        from .aws import AwsSettings

        if endpoint is not None and (not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))):
            raise InvalidError(f"endpoint must be an http(s) URL, got {endpoint!r}")
        aws = AwsSettings(endpoint=endpoint, region=region, test_credentials=bool(test_credentials))
        return cls(stream, ConnectionState.detached(aws), max_attempts=max_attempts)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_publisher, (self.stream, self._state.require(), self._max_attempts))

    def check_connected(self, role: str = "publisher") -> None:
        """Raise unless this publisher's broker is connected now (no AWS call).

        A publisher taken before ``connect()`` shares its broker's connection, so it passes
        once that broker is connected. ``subscribe()`` calls this on its ``dead_letter``
        publisher before any AWS call and before the publisher is pickled for the readers.

        Args:
            role: what the publisher is to the caller, for the message (``"dead_letter"``).

        Raises:
            NotConnectedError: its broker is not connected yet, or was shut down; the message
                names the publisher's stream and ``role``.
        """
        try:
            self._state.require()
        except NotConnectedError as e:
            raise NotConnectedError(f"{role} {self!r} cannot publish: {e} (connect() the broker it was taken "
                                    "from, or take it from a connected broker)") from None

    def __repr__(self) -> str:
        return f"Publisher({self.stream!r})"

    def put(self, data: bytes | str, partition_key: str, explicit_hash_key: str | None = None) -> PutResult:
        """Publish one record.

        Args:
            data: the payload (bytes, or str encoded as UTF-8), at most 1 MiB.
            partition_key: 1-256 characters; chooses the shard (MD5 hash) unless
                ``explicit_hash_key`` (a decimal string in 0..2**128-1) is given.

        Returns:
            The record's shard id and sequence number.

        Raises:
            InvalidError: bad data or key, before any AWS call.
            NotConnectedError: the broker is not connected or was shut down.
            StreamError: the stream does not exist or the credentials were refused.
            KinesisError: the record could not be published after ``max_attempts``.
        """
        item = (data, partition_key) if explicit_hash_key is None else (data, partition_key, explicit_hash_key)
        return self.put_many([item])[0]

    def put_many(self, items: Iterable[Sequence[Any]]) -> list[PutResult]:
        """Publish many records; results in input order.

        Args:
            items: ``(data, partition_key)`` or ``(data, partition_key, explicit_hash_key)``
                tuples. Split automatically into ``PutRecords`` calls of at most 500
                records and 5 MiB.

        Returns:
            One :class:`PutResult` per item, in input order.

        Raises:
            The same as :meth:`put`; every item is validated before the first call.
        """
        entries = [_entry(item) for item in items]
        client = self._state.client("kinesis", max_attempts=0)  # the retries are ours (Retry), in one layer
        results: list[PutResult | None] = [None] * len(entries)
        for chunk in _chunks(entries):
            self._put_chunk(client, entries, chunk, results)
        return results  # type: ignore[return-value]

    def _put_chunk(self, client: Any, entries: list[dict[str, Any]], pending: list[int],
                   results: list[PutResult | None]) -> None:
        """``PutRecords`` of the entries ``pending``, then of those that failed, paced by
        :data:`PUT_BACKOFF`, up to ``max_attempts`` calls in all (:class:`~kinesis_actors.backoff.Retry`).

        Raises:
            KinesisError: a call refused (translated), or entries still failing after ``max_attempts``.
        """
        def attempt() -> None:
            nonlocal pending
            response = client.put_records(StreamName=self.stream, Records=[entries[i] for i in pending])
            failed: list[int] = []
            codes: set[str] = set()
            for i, outcome in zip(pending, response["Records"]):
                code = outcome.get("ErrorCode")
                if code:
                    failed.append(i)
                    codes.add(code)
                else:
                    results[i] = PutResult(outcome["ShardId"], outcome["SequenceNumber"])
            if failed:
                log.debug("PutRecords on %s: %d of %d entries failed, retrying", self.stream, len(failed), len(pending))
                pending = failed
                raise _EntriesFailed(len(failed), codes)

        def retriable(e: Exception) -> bool:
            if isinstance(e, _EntriesFailed):
                return True
            return is_throttling(e) or translate_aws_error(e, operation="PutRecords", resource=self.stream).retriable

        try:
            Retry(PUT_BACKOFF, max_attempts=self._max_attempts).call(attempt, retry_on=retriable, sleep=time.sleep)
        except _EntriesFailed as e:
            codes = ", ".join(sorted(e.codes))
            raise KinesisError(f"PutRecords on {self.stream!r}: {e.count} records still failing after "
                               f"{self._max_attempts} attempts ({codes})", retriable=True) from None
        except Exception as e:  # botocore errors: translated in one place
            raise translate_aws_error(e, operation="PutRecords", resource=self.stream) from e


class _EntriesFailed(Exception):
    """Some entries of a ``PutRecords`` answer failed (``count`` of them, with ``codes``): retry those."""

    def __init__(self, count: int, codes: set[str]) -> None:
        super().__init__(f"{count} entries failed")
        self.count, self.codes = count, codes


def _rebuild_publisher(stream: str, aws: AwsSettings, max_attempts: int) -> Publisher:
    return Publisher(stream, ConnectionState.detached(aws), max_attempts=max_attempts)
