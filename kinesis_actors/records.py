"""Records, start positions and sequence-number helpers.

* :class:`Record` is what a downstream receives: one user record of one shard.
* :class:`StartAt` is an initial position (``LATEST``, ``TRIM_HORIZON``,
  ``AT_TIMESTAMP``, ``AT_SEQUENCE_NUMBER``, ``AFTER_SEQUENCE_NUMBER``), serialisable
  into the lease row's ``start_position`` so it is resolved once (invariant 9).
* :func:`records_from_response` turns a ``GetRecords`` response into Records,
  de-aggregating KPL aggregates with the ``aws-kinesis-agg`` package's protobuf
  schema (we check the 4-byte KPL magic and the MD5 trailer ourselves instead of its
  Lambda-event API, which would base64 every record on the read path). An aggregate
  whose checksum or protobuf does not verify is delivered as one plain record, as KCL does.

Sequence numbers are opaque decimal strings (moto: ``"1"``; AWS: 56 digits): compare
them as integers with :func:`seq_key`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import logging
from collections.abc import Iterable
from typing import Any

from .errors import InvalidError

__all__ = ["Record", "StartAt", "seq_key", "records_from_response", "KPL_MAGIC"]

log = logging.getLogger(__name__)

KPL_MAGIC = b"\xf3\x89\x9a\xc2"
_KPL_DIGEST = 16
_SEQ_MAX_LEN = 128


def seq_key(sequence_number: str) -> int:
    """Order key of a sequence number (a decimal string of up to 128 digits) as an int."""
    return int(sequence_number)


_UTC = _dt.timezone.utc
_FIELDS = ("data", "partition_key", "sequence_number", "sub_sequence_number", "approximate_arrival_timestamp",
           "shard_id", "stream", "explicit_hash_key")


class Record:
    """One user record of one shard, as delivered downstream (immutable).

    Attributes:
        data: the payload bytes (at most 1 MiB).
        partition_key: the partition key it was published with.
        sequence_number: its sequence number (decimal string); user records of one KPL
            aggregate share the aggregate's sequence number.
        sub_sequence_number: index of the user record inside a KPL aggregate, else None.
        approximate_arrival_timestamp: when Kinesis accepted it (timezone-aware UTC); AWS
            always sets it (None only from an emulator that leaves it out). Built lazily:
            a record read off the wire holds the epoch seconds of the JSON answer
            (:attr:`arrival_epoch_s`) until this is first read.
        shard_id: the shard it was read from.
        stream: the stream name.
        explicit_hash_key: the explicit hash key inside a KPL aggregate, else None.

    ``approximate_arrival_timestamp`` may be given as a ``datetime`` (a naive one is taken
    as UTC) or as float epoch seconds; equality and hashing compare the instant.

    Raises:
        dataclasses.FrozenInstanceError: on assignment to an attribute.
    """

    __slots__ = (
        "_arrival",
        "data",
        "explicit_hash_key",
        "partition_key",
        "sequence_number",
        "shard_id",
        "stream",
        "sub_sequence_number",
    )

    data: bytes
    partition_key: str
    sequence_number: str
    sub_sequence_number: int | None
    _arrival: _dt.datetime | float | None
    shard_id: str
    stream: str
    explicit_hash_key: str | None

    def __init__(self, data: bytes, partition_key: str, sequence_number: str, sub_sequence_number: int | None,
                 approximate_arrival_timestamp: _dt.datetime | float | None, shard_id: str, stream: str,
                 explicit_hash_key: str | None = None) -> None:
        put = object.__setattr__
        put(self, "data", data)
        put(self, "partition_key", partition_key)
        put(self, "sequence_number", sequence_number)
        put(self, "sub_sequence_number", sub_sequence_number)
        put(self, "_arrival", approximate_arrival_timestamp)
        put(self, "shard_id", shard_id)
        put(self, "stream", stream)
        put(self, "explicit_hash_key", explicit_hash_key)

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    @property
    def approximate_arrival_timestamp(self) -> _dt.datetime | None:
        """When Kinesis accepted the record, timezone-aware UTC (None if the service left it out)."""
        arrival = self._arrival
        if arrival is None or isinstance(arrival, _dt.datetime):
            if arrival is not None and arrival.tzinfo is None:
                arrival = arrival.replace(tzinfo=_UTC)
                object.__setattr__(self, "_arrival", arrival)
            return arrival
        # botocore's own conversion of a JSON epoch number (fromtimestamp of the float):
        # the same datetime to the microsecond.
        stamp = _dt.datetime.fromtimestamp(arrival, _UTC)
        object.__setattr__(self, "_arrival", stamp)
        return stamp

    @property
    def arrival_epoch_s(self) -> float | None:
        """The arrival time as float epoch seconds (None if absent), without building a datetime."""
        arrival = self._arrival
        if arrival is None or not isinstance(arrival, _dt.datetime):
            return arrival
        return (arrival if arrival.tzinfo is not None else arrival.replace(tzinfo=_UTC)).timestamp()

    def _key(self) -> tuple[Any, ...]:
        return (self.data, self.partition_key, self.sequence_number, self.sub_sequence_number,
                self.approximate_arrival_timestamp, self.shard_id, self.stream, self.explicit_hash_key)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Record:
            return NotImplemented
        assert isinstance(other, Record)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"Record({fields})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A plain tuple of fields (the arrival as it is held: epoch seconds until read).
        return (Record, (self.data, self.partition_key, self.sequence_number, self.sub_sequence_number,
                         self._arrival, self.shard_id, self.stream, self.explicit_hash_key))

    @property
    def position(self) -> tuple[int, int]:
        """``(sequence number as int, sub-sequence or -1)``: this record's place in its shard."""
        return seq_key(self.sequence_number), -1 if self.sub_sequence_number is None else self.sub_sequence_number


_KINDS = ("LATEST", "TRIM_HORIZON", "AT_TIMESTAMP", "AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER")


@dataclasses.dataclass(frozen=True)
class StartAt:
    """Where a shard with no checkpoint opens (the ``ShardIteratorType`` of ``GetShardIterator``).

    Build one with the class methods: ``StartAt.latest()``, ``StartAt.trim_horizon()``,
    ``StartAt.at_timestamp(dt)``, ``StartAt.at_sequence_number(s)``,
    ``StartAt.after_sequence_number(s)``.

    Attributes:
        kind: one of ``LATEST``, ``TRIM_HORIZON``, ``AT_TIMESTAMP``,
            ``AT_SEQUENCE_NUMBER``, ``AFTER_SEQUENCE_NUMBER``.
        timestamp_ms: epoch milliseconds, for ``AT_TIMESTAMP``.
        sequence_number: decimal string, for the two sequence-number kinds.
        sub_sequence_number: resume inside a KPL aggregate (``AFTER_SEQUENCE_NUMBER`` only):
            user records with a sub-sequence <= this one are skipped.
    """

    kind: str
    timestamp_ms: int | None = None
    sequence_number: str | None = None
    sub_sequence_number: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise InvalidError(f"StartAt kind must be one of {_KINDS}, got {self.kind!r}")
        if self.kind == "AT_TIMESTAMP" and not isinstance(self.timestamp_ms, int):
            raise InvalidError(f"AT_TIMESTAMP needs timestamp_ms, got {self.timestamp_ms!r}")
        if self.kind.endswith("SEQUENCE_NUMBER"):
            s = self.sequence_number
            if not (isinstance(s, str) and s.isdigit() and len(s) <= _SEQ_MAX_LEN):
                raise InvalidError(f"{self.kind} needs a decimal sequence number string, got {s!r}")

    @classmethod
    def latest(cls) -> StartAt:
        """Just after the newest record when the shard is opened (resolved once, then recorded)."""
        return cls("LATEST")

    @classmethod
    def trim_horizon(cls) -> StartAt:
        """The oldest record still within the stream's retention."""
        return cls("TRIM_HORIZON")

    @classmethod
    def at_timestamp(cls, when: _dt.datetime | float | int) -> StartAt:
        """The first record that arrived at or after ``when``.

        Args:
            when: a timezone-aware ``datetime`` (a naive one is refused), or epoch seconds.

        Raises:
            InvalidError: naive datetime or a value of another type.
        """
        if isinstance(when, _dt.datetime):
            if when.tzinfo is None:
                raise InvalidError("at_timestamp needs a timezone-aware datetime (e.g. tzinfo=timezone.utc)")
            return cls("AT_TIMESTAMP", timestamp_ms=int(when.timestamp() * 1000))
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            return cls("AT_TIMESTAMP", timestamp_ms=int(when * 1000))
        raise InvalidError(f"at_timestamp needs a datetime or epoch seconds, got {when!r}")

    @classmethod
    def at_sequence_number(cls, sequence_number: str) -> StartAt:
        """The record with this sequence number, then the ones after it (needs a shard id)."""
        return cls("AT_SEQUENCE_NUMBER", sequence_number=sequence_number)

    @classmethod
    def after_sequence_number(cls, sequence_number: str, sub_sequence_number: int | None = None) -> StartAt:
        """The records after this sequence number (needs a shard id). This is how checkpoints resume."""
        return cls("AFTER_SEQUENCE_NUMBER", sequence_number=sequence_number, sub_sequence_number=sub_sequence_number)

    @property
    def needs_shard(self) -> bool:
        """True for the sequence-number kinds, which only make sense for one shard."""
        return self.sequence_number is not None

    def iterator_args(self) -> dict[str, Any]:
        """Keyword arguments for boto3's ``get_shard_iterator`` (``ShardIteratorType`` and friends)."""
        args: dict[str, Any] = {"ShardIteratorType": self.kind}
        if self.kind == "AT_TIMESTAMP":
            assert self.timestamp_ms is not None  # __post_init__ requires it for AT_TIMESTAMP
            args["Timestamp"] = _dt.datetime.fromtimestamp(self.timestamp_ms / 1000, tz=_dt.timezone.utc)
        elif self.sequence_number is not None:
            # Resuming inside a KPL aggregate re-reads the aggregate and skips the user records done.
            kind = "AT_SEQUENCE_NUMBER" if self.sub_sequence_number is not None else self.kind
            args.update(ShardIteratorType=kind, StartingSequenceNumber=self.sequence_number)
        return args

    def to_str(self) -> str:
        """Serialise for the lease row's ``start_position``, e.g. ``"AT_TIMESTAMP:1700000000000"``."""
        if self.kind == "AT_TIMESTAMP":
            return f"AT_TIMESTAMP:{self.timestamp_ms}"
        if self.sequence_number is not None:
            sub = "" if self.sub_sequence_number is None else f":{self.sub_sequence_number}"
            return f"{self.kind}:{self.sequence_number}{sub}"
        return self.kind

    @classmethod
    def parse(cls, text: str) -> StartAt:
        """Inverse of :meth:`to_str`. Raises InvalidError on anything else."""
        kind, _, rest = str(text).partition(":")
        if kind == "AT_TIMESTAMP":
            try:
                return cls(kind, timestamp_ms=int(rest))
            except ValueError:
                raise InvalidError(f"bad start position {text!r}") from None
        if kind.endswith("SEQUENCE_NUMBER"):
            seq, _, sub = rest.partition(":")
            return cls(kind, sequence_number=seq, sub_sequence_number=int(sub) if sub else None)
        return cls(kind)

    def __str__(self) -> str:
        return self.to_str()


def _aggregate_body(data: bytes) -> bytes | None:
    """The protobuf body of a KPL aggregate (between the magic and the MD5 trailer), or None
    when ``data`` is not one (no magic, too short, bad MD5)."""
    if len(data) <= len(KPL_MAGIC) + _KPL_DIGEST or not data.startswith(KPL_MAGIC):
        return None
    body, digest = data[len(KPL_MAGIC) : -_KPL_DIGEST], data[-_KPL_DIGEST:]
    if hashlib.md5(body).digest() != digest:
        log.warning("KPL aggregate with a bad checksum: delivered as one plain record")
        return None
    return body


def _parse_aggregate(body: bytes) -> Any | None:
    import aws_kinesis_agg.deaggregator  # noqa: F401  (puts the package's protobuf modules on sys.path)
    from aws_kinesis_agg import messages_pb2

    message = messages_pb2.AggregatedRecord()
    try:
        message.ParseFromString(body)
    except Exception:  # protobuf DecodeError
        log.warning("KPL aggregate that does not parse: delivered as one plain record")
        return None
    return message


def records_from_response(
    raw_records: Iterable[dict[str, Any]], *, shard_id: str, stream: str
) -> list[Record]:
    """Records of one ``GetRecords`` response, KPL aggregates split into user records.

    Args:
        raw_records: ``response["Records"]`` of boto3's ``get_records`` (dicts with
            ``Data`` bytes, ``PartitionKey``, ``SequenceNumber``, ``ApproximateArrivalTimestamp``).
        shard_id: shard they were read from. stream: stream name.

    Returns:
        Records in shard order; user records of an aggregate carry ``sub_sequence_number``.
    """
    out: list[Record] = []
    for raw in raw_records:
        data = raw["Data"]
        arrival = raw.get("ApproximateArrivalTimestamp")
        if isinstance(arrival, _dt.datetime) and arrival.tzinfo is None:
            arrival = arrival.replace(tzinfo=_dt.timezone.utc)
        seq = raw["SequenceNumber"]
        body = _aggregate_body(data) if data[:4] == KPL_MAGIC else None
        message = _parse_aggregate(body) if body is not None else None
        if message is None:
            out.append(Record(data, raw["PartitionKey"], seq, None, arrival, shard_id, stream))
            continue
        pks = list(message.partition_key_table)
        ehks = list(message.explicit_hash_key_table)
        for sub, user in enumerate(message.records):
            ehk = ehks[user.explicit_hash_key_index] if user.HasField("explicit_hash_key_index") and ehks else None
            out.append(Record(user.data, pks[user.partition_key_index], seq, sub, arrival, shard_id, stream, ehk))
    return out
