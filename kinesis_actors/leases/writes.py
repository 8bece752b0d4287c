"""The conditional-write engine of :class:`~kinesis_actors.leases.base.BaseLeaseStore`:
every write by a lease's holder (renew, checkpoint, set_start_position, release, hand_over).

Each is ONE conditional ``_update`` on owner AND counter that raises the counter by one,
so a fenced zombie's write changes nothing and raises
:class:`~kinesis_actors.errors.LeaseLostError`. A write whose answer was lost (botocore
retried it, or the caller timed out) is recognised by its random ``lease_write_token``
(:meth:`HolderWrites._holder_write`). :class:`HolderWrites` is a mixin over the store's
primitives and observation table.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import InvalidError, LeaseLostError, LeaseStoreError
from .protocol import Lease, duration_to_ms, validate_checkpoint, validate_names
from .rows import (
    CHECKPOINT,
    COUNTER,
    DURATION_MS,
    EXPIRY,
    NEXT_OWNER,
    OWNER,
    START_POSITION,
    SUB_SEQUENCE,
    THROUGHPUT,
    WRITE_TOKEN,
    Row,
    row_to_lease,
)

__all__ = ["HolderWrites"]

logger = logging.getLogger("kinesis_actors.leases.base")


def _validate_lease(lease: object, operation: str) -> Lease:
    if not isinstance(lease, Lease):
        raise InvalidError(f"{operation} needs a Lease, got {type(lease).__name__}")
    validate_names(lease.stream, lease.shard_id)
    if lease.owner is None or not isinstance(lease.owner, str) or not lease.owner.strip():
        raise InvalidError(f"{operation} needs a held lease; {lease.key!r} has no owner (owner={lease.owner!r})")
    return lease


class HolderWrites:
    """The holder's fenced writes (a mixin: the store supplies the primitives and the clocks)."""

    _read: Callable[[str], Row | None]
    _update: Callable[..., Row | None]
    _note: Callable[[Any], None]
    _wall_expiry_ms: Callable[[int], int]
    _wall_clock: Callable[[], float]
    _lock: threading.Lock
    _unconfirmed: dict[str, tuple[int, str]]

    def _holder_write(
        self, lease: Lease, operation: str, set_fields: dict[str, Any], remove_fields: tuple[str, ...] = ()
    ) -> Lease:
        """A write by the holder: conditional on owner AND counter; LeaseLostError if it failed.

        A write can land although its caller saw an error: botocore retries an
        ``UpdateItem`` whose answer timed out, and the retry then fails its condition; or
        a call times out here and the caller tries again with the same Lease. So every
        write carries a random ``lease_write_token``, and a failed condition re-reads the
        row: if it holds this write's counter and token, the write landed; if it holds
        those of this store's last unconfirmed write for the row (one that raised a
        transient error), that one landed, and this write is applied on top of it. Any
        other row, including our own owner id re-taken by a Coordinator (a new token),
        is a lost lease.
        """
        token = uuid.uuid4().hex[:16]
        key = lease.key
        fields = {COUNTER: lease.counter + 1, WRITE_TOKEN: token, **set_fields}
        try:
            new = self._update(key, lease.owner, lease.counter, fields, remove_fields)
        except LeaseStoreError as e:
            if e.retriable:
                with self._lock:
                    self._unconfirmed[key] = (lease.counter + 1, token)
            raise
        if new is None:
            row = self._read(key)
            with self._lock:
                earlier = self._unconfirmed.get(key)
            if row is not None and (int(row[COUNTER]), row.get(WRITE_TOKEN)) == (lease.counter + 1, token):
                new = row  # this very write landed on an earlier attempt
            elif row is not None and earlier is not None and (int(row[COUNTER]), row.get(WRITE_TOKEN)) == earlier \
                    and row.get(OWNER) == lease.owner:
                logger.info("lease %s: an earlier %s write landed although it failed; applying %s on top",
                            key, lease.owner, operation)
                with self._lock:
                    self._unconfirmed.pop(key, None)
                self._note(row)
                return self._holder_write(row_to_lease(row), operation, set_fields, remove_fields)
            else:
                raise LeaseLostError(
                    f"{operation} of lease {key!r}: not held by {lease.owner!r} at counter {lease.counter} any more"
                )
        with self._lock:
            self._unconfirmed.pop(key, None)
        self._note(new)
        return row_to_lease(new)

    def renew(self, lease: Lease, *, duration_s: float | None = None, throughput_kbps: float | None = None) -> Lease:
        """Extend a held lease; the counter rises by one.

        Conditional on the lease's owner AND counter (UpdateItem with a
        ConditionExpression on DynamoDB).

        Args:
            lease: the latest Lease the holder got from this store.
            duration_s: new lease duration, seconds; None keeps ``lease.duration_ms``.
            throughput_kbps: the shard's recent throughput, KB/s, stored in the same write
                (``throughput_kbps``; ``throughputKBps`` in a KCL table); None keeps the row's.

        Returns:
            The new Lease.

        Raises:
            InvalidError: ``lease`` has no owner, or a bad duration (before any I/O).
            LeaseLostError: the lease is not held at that counter any more; nothing changed.
            LeaseStoreError: the store is missing or unreachable.
        """
        _validate_lease(lease, "renew")
        duration_ms = duration_to_ms(duration_s) if duration_s is not None else max(1, lease.duration_ms)
        fields: dict[str, Any] = {DURATION_MS: duration_ms, EXPIRY: self._wall_expiry_ms(duration_ms)}
        if throughput_kbps is not None:
            fields[THROUGHPUT] = round(max(0.0, float(throughput_kbps)), 3)
        return self._holder_write(lease, "renew", fields)

    def checkpoint(self, lease: Lease, sequence_number: str, *, sub_sequence: int | None = None,
                   throughput_kbps: float | None = None) -> Lease:
        """Record the last acknowledged sequence number (or ``SHARD_END``); counter +1.

        A checkpoint also renews the lease (its counter changes).

        Args:
            lease: the latest Lease the holder got from this store.
            sequence_number: decimal sequence number (any length, e.g. 56 digits; stored as
                a string) or ``SHARD_END``.
            sub_sequence: sub-sequence number inside a KPL aggregate; None removes it.
            throughput_kbps: the shard's recent throughput, KB/s, stored in the same write
                (as :meth:`renew` does); None keeps the row's.

        Returns:
            The new Lease.

        Raises:
            InvalidError: ``lease`` has no owner, or the checkpoint is neither a decimal
                sequence number nor ``SHARD_END`` (before any I/O).
            LeaseLostError: the lease is not held at that counter any more; nothing changed.
            LeaseStoreError: the store is missing or unreachable.
        """
        _validate_lease(lease, "checkpoint")
        validate_checkpoint(sequence_number, sub_sequence)
        duration_ms = max(1, lease.duration_ms)
        fields: dict[str, Any] = {CHECKPOINT: sequence_number, EXPIRY: self._wall_expiry_ms(duration_ms)}
        remove: tuple[str, ...] = ()
        if sub_sequence is None:
            remove = (SUB_SEQUENCE,)
        else:
            fields[SUB_SEQUENCE] = int(sub_sequence)
        if throughput_kbps is not None:
            fields[THROUGHPUT] = round(max(0.0, float(throughput_kbps)), 3)
        return self._holder_write(lease, "checkpoint", fields, remove)

    def set_start_position(self, lease: Lease, position: str) -> Lease:
        """Record where the shard opens and remove its checkpoint (first open, or a seek).

        Args:
            lease: the latest Lease the holder got from this store.
            position: a serialised start position (opaque, non-empty string).

        Returns:
            The new Lease (counter +1, ``checkpoint`` and ``checkpoint_sub_sequence`` removed).

        Raises:
            InvalidError: ``lease`` has no owner, or ``position`` is empty (before any I/O).
            LeaseLostError: the lease is not held at that counter any more; nothing changed.
            LeaseStoreError: the store is missing or unreachable.
        """
        _validate_lease(lease, "set_start_position")
        if not isinstance(position, str) or not position.strip():
            raise InvalidError(f"position must be a non-empty string, got {position!r}")
        duration_ms = max(1, lease.duration_ms)
        return self._holder_write(
            lease,
            "set_start_position",
            {START_POSITION: position, EXPIRY: self._wall_expiry_ms(duration_ms)},
            (CHECKPOINT, SUB_SEQUENCE),
        )

    def release(self, lease: Lease) -> Lease:
        """Clear the owner and keep the checkpoint; the counter rises by one.

        Raising the counter fences any zombie writer of the old holder even if the same
        owner takes the row again.

        Args:
            lease: the latest Lease the holder got from this store.

        Returns:
            The new, free Lease (``owner`` None).

        Raises:
            InvalidError: ``lease`` has no owner (before any I/O).
            LeaseLostError: the lease is not held at that counter any more; nothing changed.
            LeaseStoreError: the store is missing or unreachable.
        """
        _validate_lease(lease, "release")
        new = self._holder_write(lease, "release", {EXPIRY: int(self._wall_clock() * 1000)}, (OWNER,))
        logger.debug("lease %s released by %s", lease.key, lease.owner)
        return new

    def hand_over(self, lease: Lease, *, to: str | None = None) -> Lease:
        """The holder gives its lease to another owner in one fenced write (graceful handoff).

        The owner becomes ``to`` (default: ``lease.next_owner``, the instance that asked),
        the counter rises by one, ``lease_next_owner`` is cleared and the checkpoint is
        kept. The row is never free in between, so no third instance can take it; the
        new owner re-takes its own row at once and resumes after the checkpoint.

        Args:
            lease: the latest Lease the holder got from this store.
            to: owner id of the receiver; default ``lease.next_owner``.

        Returns:
            The new Lease (owned by ``to``).

        Raises:
            InvalidError: ``lease`` has no owner, or there is no receiver other than the
                holder (before any I/O).
            LeaseLostError: the lease is not held at that counter any more; nothing changed.
            LeaseStoreError: the store is missing or unreachable.
        """
        _validate_lease(lease, "hand_over")
        receiver = to if to is not None else lease.next_owner
        if not isinstance(receiver, str) or not receiver.strip() or receiver == lease.owner:
            raise InvalidError(f"hand_over of {lease.key!r} needs a receiver other than {lease.owner!r}, "
                               f"got {receiver!r}")
        duration_ms = max(1, lease.duration_ms)
        new = self._holder_write(
            lease, "hand_over", {OWNER: receiver, EXPIRY: self._wall_expiry_ms(duration_ms)}, (NEXT_OWNER,)
        )
        logger.info("lease %s handed over by %s to %s", lease.key, lease.owner, receiver)
        return new
