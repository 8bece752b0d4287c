"""Rows of the lease table as stored, and the table interface every backend implements.

A row is a plain dict with the table's attribute names (one place, below): ``str`` for S,
``int`` for N and a tuple of ``str`` for ``parent_shard_ids``; an absent attribute is an
absent key (never None). Shard rows have the key ``"<stream>:<shard id>"``, presence rows
``"<stream>#instance#<owner>"``; a shard row is never a presence row.

:class:`LeaseTable` is all a backend stores rows through; the rules of the lease table
(:class:`~kinesis_actors.leases.rules.LeaseRules`) are written once over it:

=================================================== ===========================================
call                                                semantics (each atomic)
=================================================== ===========================================
``read(key) -> Row | None``                         strongly consistent read of one row
``scan(stream) -> list[Row]``                       every row of ``stream`` (shard and presence
                                                    rows; the rules filter)
``put_new(row) -> bool``                            create the row only if its key is absent
``update(key, expect_owner, expect_counter,         apply the change only if the row exists,
set_fields, remove_fields, check_owner) ->          its counter equals ``expect_counter`` and
Row | None``                                        (when ``check_owner``) its owner equals
                                                    ``expect_owner`` (None: no owner); the new
                                                    row, or None when the condition failed
``delete(key) -> None``                             delete the row if present (presence rows)
=================================================== ===========================================

Backends: :class:`LocalRows` (a dict in this process; the Ray actor of ``MemoryLeaseStore``
holds one), ``DynamoRows`` (a DynamoDB table) and ``KclRows`` (a KCL application's table).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from ..errors import InvalidError
from .protocol import SHARD_END, Instance, Lease

__all__ = ["Row", "LeaseTable", "LocalRows", "KEY", "STREAM", "SHARD_ID", "OWNER", "COUNTER", "DURATION_MS",
           "EXPIRY", "CHECKPOINT", "SUB_SEQUENCE", "START_POSITION", "PARENTS", "NEXT_OWNER", "STREAM_ARN",
           "STREAM_CREATION_MS", "WRITE_TOKEN", "THROUGHPUT", "lease_key", "presence_key", "validate_names",
           "validate_checkpoint", "duration_to_ms", "is_shard_row", "is_presence_row", "row_to_lease",
           "row_to_instance", "validate_held", "take_args", "take_fields", "throughput_fields", "ExpiryObserver"]

logger = logging.getLogger("kinesis_actors.leases")

Row = dict[str, Any]

# Attribute names of the lease table (one place).
KEY = "lease_key"
STREAM = "stream"
SHARD_ID = "shard_id"
OWNER = "lease_owner"
COUNTER = "lease_counter"
DURATION_MS = "lease_duration_ms"
EXPIRY = "lease_expiry"
CHECKPOINT = "checkpoint"
SUB_SEQUENCE = "checkpoint_sub_sequence"
START_POSITION = "start_position"
PARENTS = "parent_shard_ids"
NEXT_OWNER = "lease_next_owner"
STREAM_ARN = "stream_arn"
STREAM_CREATION_MS = "stream_creation_ms"
WRITE_TOKEN = "lease_write_token"  # random, per write that raises the counter: tells our own landed write
THROUGHPUT = "throughput_kbps"  # the shard's recent KB/s, written with renewals (KCL 3.x: throughputKBps)


_SEQUENCE_RE = re.compile(r"^[0-9]{1,128}$")


def lease_key(stream: str, shard_id: str) -> str:
    """The lease table's hash key for a shard: ``"<stream>:<shard id>"``."""
    return f"{stream}:{shard_id}"


def presence_key(stream: str, owner: str) -> str:
    """The key of an instance's presence row: ``"<stream>#instance#<owner>"`` (never a shard's key)."""
    return f"{stream}#instance#{owner}"


def validate_names(stream: str, shard_id: str | None = None, owner: str | None = None) -> None:
    """Raise :class:`InvalidError` for an empty or non-string stream, shard id or owner."""
    for what, value in (("stream", stream), ("shard_id", shard_id), ("owner", owner)):
        if value is None and what != "stream":
            continue
        if not isinstance(value, str) or not value.strip():
            raise InvalidError(f"{what} must be a non-empty string, got {value!r}")
    if ":" in stream or "#" in stream:
        raise InvalidError(f"stream name {stream!r} may not contain ':' or '#'")


def validate_checkpoint(sequence_number: object, sub_sequence: object = None) -> None:
    """Raise :class:`InvalidError` unless ``sequence_number`` is a decimal string or ``SHARD_END``."""
    if sequence_number != SHARD_END and not (
        isinstance(sequence_number, str) and _SEQUENCE_RE.match(sequence_number)
    ):
        raise InvalidError(
            f"checkpoint must be a Kinesis sequence number (decimal digits) or {SHARD_END!r}, "
            f"got {sequence_number!r}"
        )
    if sub_sequence is not None and (not isinstance(sub_sequence, int) or sub_sequence < 0):
        raise InvalidError(f"sub_sequence must be a non-negative int or None, got {sub_sequence!r}")


def duration_to_ms(duration_s: object, what: str = "duration_s") -> int:
    """Validate a lease duration in seconds and return it in whole milliseconds (at least 1)."""
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)):
        raise InvalidError(f"{what} must be a positive number of seconds, got {duration_s!r}")
    if not math.isfinite(duration_s) or duration_s <= 0:
        raise InvalidError(f"{what} must be a positive finite number of seconds, got {duration_s!r}")
    return max(1, round(duration_s * 1000))


def is_shard_row(row: Mapping[str, Any], stream: str | None = None) -> bool:
    """True if ``row`` is a shard row (key ``"<stream>:<shard id>"``), of ``stream`` if given.

    Presence rows (``"<stream>#instance#<owner>"``) and foreign rows are never shard rows.
    """
    key, row_stream, shard_id = row.get(KEY), row.get(STREAM), row.get(SHARD_ID)
    if not (isinstance(key, str) and isinstance(row_stream, str) and isinstance(shard_id, str)):
        return False
    if stream is not None and row_stream != stream:
        return False
    return key == lease_key(row_stream, shard_id) and COUNTER in row


def is_presence_row(row: Mapping[str, Any], stream: str | None = None) -> bool:
    """True if ``row`` is a presence row (key ``"<stream>#instance#<owner>"``), of ``stream`` if given."""
    key, row_stream, owner = row.get(KEY), row.get(STREAM), row.get(OWNER)
    if not (isinstance(key, str) and isinstance(row_stream, str) and isinstance(owner, str)):
        return False
    if stream is not None and row_stream != stream:
        return False
    return key == presence_key(row_stream, owner) and COUNTER in row


def row_to_instance(row: Mapping[str, Any]) -> Instance:
    """Build the immutable :class:`Instance` of a presence row."""
    return Instance(
        stream=row[STREAM],
        owner=row[OWNER],
        counter=int(row[COUNTER]),
        duration_ms=int(row.get(DURATION_MS, 0)),
        expiry_ms=int(row.get(EXPIRY, 0)),
    )


def row_to_lease(row: Mapping[str, Any]) -> Lease:
    """Build the immutable :class:`Lease` of a shard row."""
    parents = row.get(PARENTS) or ()
    sub = row.get(SUB_SEQUENCE)
    return Lease(
        stream=row[STREAM],
        shard_id=row[SHARD_ID],
        owner=row.get(OWNER),
        counter=int(row[COUNTER]),
        expiry_ms=int(row.get(EXPIRY, 0)),
        duration_ms=int(row.get(DURATION_MS, 0)),
        checkpoint=row.get(CHECKPOINT),
        checkpoint_sub_sequence=None if sub is None else int(sub),
        start_position=row.get(START_POSITION),
        parent_shard_ids=tuple(sorted(parents)),
        next_owner=row.get(NEXT_OWNER),
        stream_arn=row.get(STREAM_ARN),
        stream_creation_ms=None if row.get(STREAM_CREATION_MS) is None else int(row[STREAM_CREATION_MS]),
        throughput_kbps=None if row.get(THROUGHPUT) is None else float(row[THROUGHPUT]),
    )


def throughput_fields(throughput_kbps: object) -> Row:
    """What a holder's write sets for the shard's throughput: ``{}`` for None (the row keeps
    its figure), else ``{THROUGHPUT: KB/s}`` rounded to 3 places.

    Raises:
        InvalidError: not a finite, non-negative number of KB/s (before any I/O).
    """
    if throughput_kbps is None:
        return {}
    if isinstance(throughput_kbps, bool) or not isinstance(throughput_kbps, (int, float)) \
            or not math.isfinite(throughput_kbps) or throughput_kbps < 0:
        raise InvalidError(f"throughput_kbps must be a finite number of KB/s >= 0, got {throughput_kbps!r}")
    return {THROUGHPUT: round(float(throughput_kbps), 3)}


def validate_held(lease: object, operation: str) -> Lease:
    """``lease`` as a held Lease; InvalidError (before any I/O) otherwise."""
    if not isinstance(lease, Lease):
        raise InvalidError(f"{operation} needs a Lease, got {type(lease).__name__}")
    validate_names(lease.stream, lease.shard_id)
    if not isinstance(lease.owner, str) or not lease.owner.strip():
        raise InvalidError(f"{operation} needs a held lease; {lease.stream}:{lease.shard_id} has no owner "
                           f"(owner={lease.owner!r})")
    return lease


def take_args(stream: str, shard_id: str, owner: str, duration_s: float, parent_shard_ids: Iterable[str] | None,
               stream_identity: tuple[str, int] | None) -> tuple[int, tuple[str, ...], Row]:
    """A take's checked arguments: (duration ms, parent shard ids, identity attributes); InvalidError otherwise."""
    validate_names(stream, shard_id, owner)
    duration_ms = duration_to_ms(duration_s)
    if isinstance(parent_shard_ids, str):
        raise InvalidError(f"parent_shard_ids must be a tuple of shard ids, got {parent_shard_ids!r}")
    parents = tuple(parent_shard_ids or ())
    if not all(isinstance(p, str) and p.strip() for p in parents):
        raise InvalidError(f"parent_shard_ids must be non-empty strings, got {parent_shard_ids!r}")
    identity: Row = {}
    if stream_identity is not None:
        arn, created_ms = stream_identity
        if not isinstance(arn, str) or not arn or isinstance(created_ms, bool) or not isinstance(created_ms, int):
            raise InvalidError(f"stream_identity must be (ARN, creation epoch ms), got {stream_identity!r}")
        identity = {STREAM_ARN: arn, STREAM_CREATION_MS: created_ms}
    return duration_ms, parents, identity


def take_fields(row: Row, owner: str, duration_ms: int, expiry_ms: int, parents: tuple[str, ...],
                 identity: Row) -> tuple[Row, tuple[str, ...]]:
    """What a take of an existing ``row`` sets and removes: a new owner and counter, and a restart
    of the row (checkpoint, sub-sequence and start position dropped) when it belongs to another
    incarnation of the stream (another ARN or creation time)."""
    fields: Row = {OWNER: owner, COUNTER: int(row[COUNTER]) + 1, WRITE_TOKEN: uuid.uuid4().hex[:16],
                   DURATION_MS: duration_ms, EXPIRY: expiry_ms}
    remove: tuple[str, ...] = (NEXT_OWNER,)
    if identity and row.get(STREAM_ARN) is None:
        fields.update(identity)  # a row written without an identity: stamp it
    elif identity and (row.get(STREAM_ARN), row.get(STREAM_CREATION_MS)) != tuple(identity.values()):
        logger.warning("lease %s belongs to another incarnation of stream %s (%s created %s ms, now %s created %s "
                       "ms): its checkpoint %r is not applied; the shard opens at the subscription's start_at",
                       row[KEY], row.get(STREAM), row.get(STREAM_ARN), row.get(STREAM_CREATION_MS),
                       identity[STREAM_ARN], identity[STREAM_CREATION_MS], row.get(CHECKPOINT))
        fields.update(identity)
        remove += (CHECKPOINT, SUB_SEQUENCE, START_POSITION)
        if parents:
            fields[PARENTS] = tuple(sorted(set(parents)))
        else:
            remove += (PARENTS,)
    return fields, remove


class ExpiryObserver:
    """What one store has seen of each row's counter, and since when (thread-safe).

    Args:
        clock: monotonic clock, seconds.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._seen: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    def note(self, row: Mapping[str, Any]) -> None:
        """Record that ``row``'s counter was seen now, unless this counter was seen before."""
        if COUNTER not in row:
            return
        key, counter, now = row[KEY], int(row[COUNTER]), self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen[0] != counter:
                self._seen[key] = (counter, now)

    def expired(self, key: str, counter: int, duration_ms: int) -> bool:
        """True when the newest counter seen for ``key`` has not changed for ``duration_ms``.
        A counter newer than any seen is noted (not expired); an older one (a stale Lease of
        the caller) is judged by the newest counter seen."""
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen[0] < counter:
                self._seen[key] = (counter, now)
                return False
            return (now - seen[1]) * 1000.0 >= duration_ms

    def last_counter(self, key: str) -> int | None:
        """The newest counter seen for ``key``, or None."""
        with self._lock:
            seen = self._seen.get(key)
        return None if seen is None else seen[0]

    def forget(self, key: str) -> None:
        """Drop what was seen of ``key`` (its row was deleted)."""
        with self._lock:
            self._seen.pop(key, None)


class LeaseTable(Protocol):
    """The storage a lease store's rules run over: five atomic calls on rows (see the module
    docstring), plus what the table can hold. Implementations are picklable (a copy reaches
    the same rows, except :class:`LocalRows`, whose copy is a snapshot).

    Attributes:
        presence: True if the table keeps presence rows (a KCL table does not: KCL would
            read them as leases).
    """

    presence: bool

    def read(self, key: str) -> Row | None:
        """The row with hash key ``key`` (strongly consistent), or None."""
        ...

    def scan(self, stream: str) -> list[Row]:
        """Every row of ``stream`` (strongly consistent)."""
        ...

    def put_new(self, row: Row) -> bool:
        """Create ``row`` if its key is absent; False if a row with that key exists."""
        ...

    def update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
               remove_fields: Iterable[str] = (), check_owner: bool = True) -> Row | None:
        """Apply the change if the condition holds (see the module docstring); the new row, or None."""
        ...

    def delete(self, key: str) -> None:
        """Delete the row if present."""
        ...

    def peer(self) -> LeaseTable:
        """The table for another store over the same rows (what it keeps per store starts empty)."""
        ...


class LocalRows:
    """A lease table in a dict of this process; every call is atomic under one lock.

    The in-process table of ``kinesis_actors.testing.InProcessLeaseStore``, and the body of
    ``MemoryLeaseStore``'s Ray actor. Picklable: a pickled copy is a snapshot (its own dict
    and lock).
    """

    presence = True

    def __init__(self) -> None:
        self._rows: dict[str, Row] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"rows": {key: dict(row) for key, row in self._rows.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._rows = state["rows"]
        self._lock = threading.Lock()

    def read(self, key: str) -> Row | None:
        """A copy of the row with hash key ``key``, or None."""
        with self._lock:
            row = self._rows.get(key)
            return dict(row) if row is not None else None

    def scan(self, stream: str) -> list[Row]:
        """Copies of every row whose ``stream`` attribute is ``stream``."""
        with self._lock:
            return [dict(row) for row in self._rows.values() if row.get(STREAM) == stream]

    def put_new(self, row: Mapping[str, Any]) -> bool:
        """Store a copy of ``row`` unless its key exists; True if stored."""
        with self._lock:
            if row[KEY] in self._rows:
                return False
            self._rows[row[KEY]] = dict(row)
            return True

    def update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
               remove_fields: Iterable[str] = (), check_owner: bool = True) -> Row | None:
        """The conditional update of :class:`LeaseTable`; a copy of the new row, or None."""
        with self._lock:
            row = self._rows.get(key)
            if row is None or row.get(COUNTER) != expect_counter:
                return None
            if check_owner and row.get(OWNER) != expect_owner:
                return None
            new = dict(row)
            new.update(set_fields)
            for name in remove_fields:
                new.pop(name, None)
            self._rows[key] = new
            return dict(new)

    def delete(self, key: str) -> None:
        """Delete the row if present."""
        with self._lock:
            self._rows.pop(key, None)

    def peer(self) -> LocalRows:
        """This table: it keeps nothing per store."""
        return self

    def size(self) -> int:
        """How many rows the table holds."""
        with self._lock:
            return len(self._rows)
