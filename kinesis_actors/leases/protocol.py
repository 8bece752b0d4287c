"""The lease model: :class:`Lease` (one row of the lease table) and the :class:`LeaseStore` protocol.

A lease is one row per shard, keyed ``"<stream>:<shard id>"`` (shard ids repeat across
streams), in the style of the Kinesis Client Library's lease table:

================================ ==== =================================================
attribute                        type meaning
================================ ==== =================================================
``lease_key``                    S    hash key, ``"<stream>:<shard id>"``
``lease_owner``                  S    owner id of the holder; absent when free
``lease_counter``                N    +1 on every take, renew and checkpoint (fencing token)
``lease_duration_ms``            N    the holder's lease duration
``lease_expiry``                 N    holder's wall clock + duration, epoch ms (for people)
``checkpoint``                   S    last acknowledged sequence number, or ``SHARD_END``
``checkpoint_sub_sequence``      N    sub-sequence inside a KPL aggregate
``start_position``               S    where a never-checkpointed shard was first opened
``parent_shard_ids``             SS   parents of a child shard (resharding)
``lease_next_owner``             S    an instance asking for a graceful handoff
================================ ==== =================================================

Expiry is judged as KCL judges it: never by comparing another host's wall clock. Each
store notes, per row, the counter it last saw and when it first saw it (its own
monotonic clock); the lease is expired *for that store* once the counter has stayed
the same for the row's ``lease_duration_ms``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol, runtime_checkable

from ..errors import InvalidError

__all__ = ["Lease", "LeaseStore", "SHARD_END", "lease_key", "validate_names", "validate_checkpoint"]

SHARD_END = "SHARD_END"
"""Checkpoint value of a shard read to its end and fully acknowledged (KCL's sentinel)."""

_SEQUENCE_RE = re.compile(r"^[0-9]{1,128}$")


def lease_key(stream: str, shard_id: str) -> str:
    """The lease table's hash key for a shard: ``"<stream>:<shard id>"``."""
    return f"{stream}:{shard_id}"


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


@dataclasses.dataclass(frozen=True)
class Lease:
    """One row of the lease table, as a store last wrote or read it (immutable).

    Attributes:
        stream: stream name.
        shard_id: shard id, e.g. ``"shardId-000000000000"``.
        owner: owner id of the holder, or None when the lease is free.
        counter: lease counter; raised by every successful take, renew and checkpoint.
        expiry_ms: holder's wall clock at its last write + duration, epoch milliseconds.
            Informational only: expiry decisions never read it.
        duration_ms: the holder's lease duration, milliseconds.
        checkpoint: last acknowledged sequence number, ``SHARD_END``, or None.
        checkpoint_sub_sequence: user-record sub-sequence inside a KPL aggregate, or None.
        start_position: where a never-checkpointed shard was first opened (a
            serialised ``StartAt``), so a replacement reader never re-resolves ``LATEST``.
        parent_shard_ids: parent shards of a child shard (after a split or merge).
        next_owner: owner id of an instance waiting for a graceful handoff, or None.
    """

    stream: str
    shard_id: str
    owner: str | None
    counter: int
    expiry_ms: int = 0
    duration_ms: int = 0
    checkpoint: str | None = None
    checkpoint_sub_sequence: int | None = None
    start_position: str | None = None
    parent_shard_ids: tuple[str, ...] = ()
    next_owner: str | None = None

    @property
    def key(self) -> str:
        """The row's hash key, ``"<stream>:<shard id>"``."""
        return lease_key(self.stream, self.shard_id)

    @property
    def finished(self) -> bool:
        """True once the shard was read to its end and acknowledged (``checkpoint == SHARD_END``)."""
        return self.checkpoint == SHARD_END


@runtime_checkable
class LeaseStore(Protocol):
    """Storage of the lease table: take, renew, checkpoint, get, release, list.

    Every write is conditional on the owner and counter the caller holds (fencing) and
    returns the new :class:`Lease`; a failed condition raises ``LeaseLostError`` and
    changes nothing. Reads are strongly consistent. Implementations:
    ``MemoryLeaseStore`` (one Ray actor) and ``DynamoLeaseStore`` (a DynamoDB table).
    Methods may raise ``InvalidError`` (bad input, before any I/O) and
    ``LeaseStoreError`` (table missing or unreachable past retries).
    """

    def take(self, stream: str, shard_id: str, *, owner: str, duration_s: float) -> Lease | None:
        """Take the shard's lease for ``owner`` if it is free, already ``owner``'s, or expired
        for this store; create the row if missing. Returns the new Lease, or None when another
        owner holds it live or won a race for it."""
        ...

    def renew(self, lease: Lease, *, duration_s: float | None = None) -> Lease:
        """Extend a held lease (counter +1). ``LeaseLostError`` if not held any more."""
        ...

    def checkpoint(self, lease: Lease, sequence_number: str, *, sub_sequence: int | None = None) -> Lease:
        """Record the last acknowledged sequence number (or ``SHARD_END``); counter +1."""
        ...

    def set_start_position(self, lease: Lease, position: str) -> Lease:
        """Record where the shard opens and clear its checkpoint (first open, or a seek)."""
        ...

    def release(self, lease: Lease) -> Lease:
        """Clear the owner, keep the checkpoint. ``LeaseLostError`` if not held any more."""
        ...

    def get(self, stream: str, shard_id: str) -> Lease | None:
        """The shard's row (consistent read), or None."""
        ...

    def list(self, stream: str) -> list[Lease]:
        """Every shard row of ``stream`` (consistent read), sorted by shard id."""
        ...

    def is_expired(self, lease: Lease) -> bool:
        """True if the row's counter has not changed for its duration, as this store saw it."""
        ...
