"""The rules of the lease table, written once over the table interface of every backend.

:class:`LeaseRules` is every operation of :class:`~kinesis_actors.leases.protocol.LeaseStore`
(take, renew, checkpoint, set_start_position, release, hand_over, the handoff requests,
presence rows, get, list, snapshot) over a :class:`~kinesis_actors.leases.rows.LeaseTable`,
which only stores rows atomically. The public stores are this class with their table:
``MemoryLeaseStore`` (rows in a Ray actor), ``DynamoLeaseStore`` (a DynamoDB table),
``KclLeaseStore`` (a KCL application's table) and ``kinesis_actors.testing.InProcessLeaseStore``
(a dict in this process).

Expiry (KCL's rule, immune to clock skew): an ``ExpiryObserver`` keeps, per row, the counter
this store last saw and when it first saw it, on the store's own monotonic clock. A lease is
expired *for this store* once its counter has not changed for the row's ``lease_duration_ms``,
so a store that sees a row for the first time waits one full duration before it may take it.
The wall clock only fills the informational ``lease_expiry``; no decision reads it. Presence
rows are judged the same way (stale = expired).

Fault model: every write is ONE conditional table update, so of many racing writers exactly
one wins and a failed condition changes nothing. Writes by the holder (renew, checkpoint,
set_start_position, release, hand_over) are conditioned on owner AND counter, raise the
counter by one (release too, so a fenced zombie cannot write after a release and a re-take)
and raise :class:`~kinesis_actors.errors.LeaseLostError` when the condition fails. Each such
write carries a random ``lease_write_token``, so a write that landed although its caller saw
an error is recognised by the write that follows it (:meth:`LeaseRules._holder_write`).
"""

from __future__ import annotations

import builtins
import logging
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from .. import mutation
from ..clock import Clock, WallClock, monotonic_s, wall_s
from ..errors import InvalidError, LeaseLostError, LeaseStoreError
from .protocol import Instance, Lease, TableSnapshot
from .rows import (
    CHECKPOINT,
    COUNTER,
    DURATION_MS,
    EXPIRY,
    KEY,
    NEXT_OWNER,
    OWNER,
    PARENTS,
    SHARD_ID,
    START_POSITION,
    STREAM,
    SUB_SEQUENCE,
    WRITE_TOKEN,
    ExpiryObserver,
    LeaseTable,
    Row,
    duration_to_ms,
    is_presence_row,
    is_shard_row,
    lease_key,
    presence_key,
    row_to_instance,
    row_to_lease,
    take_args,
    take_fields,
    throughput_fields,
    validate_checkpoint,
    validate_held,
    validate_names,
)

__all__ = ["LeaseRules"]

logger = logging.getLogger("kinesis_actors.leases")

_BLIND_TAKE = mutation.register("take_without_counter_condition",
                                "a take overwrites the row whatever owner and counter it holds by then")


def _take_condition(table: LeaseTable, key: str, row: Row) -> tuple[str | None, int]:
    """The condition of a take's write: the owner and counter of the ``row`` it judged. The
    planted bug ``take_without_counter_condition`` reads the row again instead, so the write
    holds for whatever the row is by then (an unconditional write, on every backend)."""
    if _BLIND_TAKE in mutation.ACTIVE:
        row = table.read(key) or row
    return row.get(OWNER), int(row[COUNTER])


class LeaseRules:
    """Every rule of the lease table over one :class:`~kinesis_actors.leases.rows.LeaseTable`.

    Picklable: the table pickles itself; what this store has seen (its observation table) is
    per instance and starts empty after unpickling, which is KCL's behaviour for a new process.

    Args:
        table: the rows (a backend).
        clock: monotonic clock in seconds; judges expiry.
        wall_clock: epoch clock in seconds, kept as ``wall_clock``; only fills the informational ``lease_expiry``.

    Raises:
        InvalidError: a clock that is not callable.
    """

    def __init__(self, table: LeaseTable, *, clock: Clock = monotonic_s, wall_clock: WallClock = wall_s) -> None:
        if not callable(clock) or not callable(wall_clock):
            raise InvalidError("clock and wall_clock must be callables returning seconds")
        self._table = table
        self._clock = clock
        self.wall_clock = wall_clock
        self._init_observations()

    def _init_observations(self) -> None:
        self._expiry = ExpiryObserver(self._clock)
        self._unconfirmed: dict[str, tuple[int, str]] = {}  # key -> (counter, token) of a write that raised
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_expiry", "_unconfirmed", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_observations()

    @property
    def rows(self) -> LeaseTable:
        """The table this store's rules run over."""
        return self._table

    def peer(self, *, clock: Clock | None = None, wall_clock: WallClock | None = None,
             rows: LeaseTable | None = None) -> Any:
        """Another store over the same rows that has seen nothing yet (what a second host has).

        Args:
            clock: monotonic clock of the new store (seconds); default: this store's.
            wall_clock: epoch clock of the new store (seconds); default: this store's.
            rows: the new store's table (the same rows); default: ``self.rows.peer()``.

        Returns:
            A store of the same class with an empty observation table (it waits one full
            duration before it judges any held lease expired). No I/O.
        """
        other = object.__new__(type(self))
        other.__dict__.update(self.__getstate__())
        other._table = rows if rows is not None else self._table.peer()
        other._clock = clock if clock is not None else self._clock
        other.wall_clock = wall_clock if wall_clock is not None else self.wall_clock
        other._init_observations()
        return other

    def bind(self, aws: Any) -> Any:
        """This store as it is (``DynamoLeaseStore`` and ``KclLeaseStore`` inherit the broker's settings)."""
        return self

    def open(self) -> Any:
        """Nothing to create in this process (``MemoryLeaseStore`` creates its actor); returns self."""
        return self

    def close(self) -> None:
        """Nothing to release (``MemoryLeaseStore`` kills its actor)."""

    # ------------------------------------------------------------------ expiry
    def _expiry_ms(self, duration_ms: int) -> int:
        return int(self.wall_clock() * 1000) + duration_ms

    def is_expired(self, lease: Lease | Instance) -> bool:
        """True if the row's counter has not changed for its duration, as this store saw it.

        Judged on this store's monotonic clock only: a counter seen for the first time is
        noted now (not expired). The owner is not considered.

        Raises:
            InvalidError: ``lease`` is not a Lease or an Instance.
        """
        if not isinstance(lease, (Lease, Instance)):
            raise InvalidError(f"is_expired needs a Lease, got {type(lease).__name__}")
        return self._expiry.expired(lease.key, lease.counter, lease.duration_ms)

    # ------------------------------------------------------------------ reads and takes
    def take(self, stream: str, shard_id: str, *, owner: str, duration_s: float,
             parent_shard_ids: tuple[str, ...] = (), stream_identity: tuple[str, int] | None = None) -> Lease | None:
        """Take the shard's lease for ``owner``; create the row if it is missing.

        Succeeds when the row is free, already ``owner``'s (re-taking one's own row fences any
        older reader of that owner), or expired for this store; conditional on the owner and
        counter read, so of racing takers exactly one wins. Counter +1, ``lease_next_owner``
        cleared; ``parent_shard_ids`` written on a new row only; ``stream_identity`` (ARN,
        creation epoch ms) stamped on a row without one, and a row of ANOTHER identity restarted
        (checkpoint and start position removed), so a stale checkpoint is never applied.

        Returns:
            The new Lease, or None when another owner holds it live or won a race for it.

        Raises:
            InvalidError: bad arguments (before any I/O). LeaseStoreError: table missing or unreachable.
        """
        duration_ms, parents, identity = take_args(stream, shard_id, owner, duration_s, parent_shard_ids,
                                                    stream_identity)
        key = lease_key(stream, shard_id)
        row = self._table.read(key)
        if row is None:
            item: Row = {KEY: key, STREAM: stream, SHARD_ID: shard_id, OWNER: owner, COUNTER: 1,
                         DURATION_MS: duration_ms, EXPIRY: self._expiry_ms(duration_ms), **identity}
            if parents:
                item[PARENTS] = tuple(sorted(set(parents)))
            if self._table.put_new(item):
                self._expiry.note(item)
                return row_to_lease(item)
            row = self._table.read(key)  # lost the creation race: judge the winner's row
        if row is None or self._held_live_by_another(row, owner):
            return None
        fields, remove = take_fields(row, owner, duration_ms, self._expiry_ms(duration_ms), parents, identity)
        new = self._table.update(key, *_take_condition(self._table, key, row), fields, remove)
        if new is None:
            logger.debug("lease %s: %s lost the race to take it", key, owner)
            return None
        self._expiry.note(new)
        if row.get(OWNER) not in (None, owner):
            logger.info("lease %s taken by %s from %s (expired)", key, owner, row.get(OWNER))
        return row_to_lease(new)

    def _held_live_by_another(self, row: Row, owner: str) -> bool:
        """Note ``row``; True when another owner holds it and it is not expired for this store."""
        self._expiry.note(row)
        holder = row.get(OWNER)
        return holder is not None and holder != owner and not self._expiry.expired(
            row[KEY], int(row[COUNTER]), int(row.get(DURATION_MS, 0)))

    def get(self, stream: str, shard_id: str) -> Lease | None:
        """The shard's row (strongly consistent read), or None. Raises InvalidError for empty
        names (before any I/O), LeaseStoreError when the table is missing or unreachable."""
        validate_names(stream, shard_id)
        row = self._table.read(lease_key(stream, shard_id))
        if row is None or not is_shard_row(row):
            return None
        self._expiry.note(row)
        return row_to_lease(row)

    def list(self, stream: str) -> builtins.list[Lease]:
        """Every shard row of ``stream`` (strongly consistent), sorted by shard id; never a
        presence row or another stream's row. Raises as :meth:`get`."""
        validate_names(stream)
        return self._shard_leases(self._table.scan(stream), stream)

    def snapshot(self, stream: str) -> TableSnapshot:
        """One scan of ``stream``'s rows: its shard leases (as :meth:`list`) and its live
        instances (as :meth:`instances`). What a Coordinator reads at each lease poll."""
        validate_names(stream)
        rows = self._table.scan(stream)
        return TableSnapshot(self._shard_leases(rows, stream), self._presence(rows, stream, False))

    def _shard_leases(self, rows: Iterable[Row], stream: str) -> builtins.list[Lease]:
        shard_rows = [row for row in rows if is_shard_row(row, stream)]
        for row in shard_rows:
            self._expiry.note(row)
        return sorted((row_to_lease(row) for row in shard_rows), key=lambda lease: lease.shard_id)

    # ------------------------------------------------------------------ the holder's writes
    def _holder_write(self, lease: Lease, operation: str, set_fields: Row, remove: tuple[str, ...] = ()) -> Lease:
        """A write by the holder: conditional on owner AND counter; LeaseLostError if it failed.

        A write can land although its caller saw an error (a call that timed out, retried by
        its caller with the same Lease). So every write carries a random ``lease_write_token``,
        and a failed condition re-reads the row: if it holds this write's counter and token,
        the write landed; if it holds those of this store's last unconfirmed write for the row
        (one that raised a transient error), that one landed and this write is applied on top.
        Any other row, including our owner id re-taken by a Coordinator (a new token), is a
        lost lease.
        """
        token, key = uuid.uuid4().hex[:16], lease_key(lease.stream, lease.shard_id)
        mine = (lease.counter + 1, token)
        try:
            new = self._table.update(key, lease.owner, lease.counter, {COUNTER: mine[0], WRITE_TOKEN: token,
                                                                       **set_fields}, remove)
        except LeaseStoreError as e:
            if e.retriable:
                with self._lock:
                    self._unconfirmed[key] = mine
            raise
        if new is None:
            row = self._table.read(key)
            found = None if row is None else (int(row[COUNTER]), row.get(WRITE_TOKEN))
            with self._lock:
                earlier = self._unconfirmed.get(key)
            if row is None or found not in (mine, earlier) or (found != mine and row.get(OWNER) != lease.owner):
                raise LeaseLostError(f"{operation} of lease {key!r}: not held by {lease.owner!r} at counter "
                                     f"{lease.counter} any more")
            if found != mine:
                logger.info("lease %s: an earlier %s write landed although it failed; applying %s on top",
                            key, lease.owner, operation)
                with self._lock:
                    self._unconfirmed.pop(key, None)
                self._expiry.note(row)
                return self._holder_write(row_to_lease(row), operation, set_fields, remove)
            new = row  # this very write landed on an earlier attempt
        with self._lock:
            self._unconfirmed.pop(key, None)
        self._expiry.note(new)
        return row_to_lease(new)

    def renew(self, lease: Lease, *, duration_s: float | None = None, throughput_kbps: float | None = None) -> Lease:
        """Extend a held lease (counter +1); ``duration_s`` None keeps ``lease.duration_ms``;
        ``throughput_kbps`` (the shard's KB/s) is set in the same write, None keeps the row's.

        Raises:
            InvalidError: no owner, a bad duration or throughput (before any I/O).
            LeaseLostError: not held at that counter any more; nothing changed.
            LeaseStoreError: the table is missing or unreachable (``retriable`` when transient).
        """
        validate_held(lease, "renew")
        duration_ms = duration_to_ms(duration_s) if duration_s is not None else max(1, lease.duration_ms)
        return self._holder_write(lease, "renew", {DURATION_MS: duration_ms, EXPIRY: self._expiry_ms(duration_ms),
                                                   **throughput_fields(throughput_kbps)})

    def checkpoint(self, lease: Lease, sequence_number: str, *, sub_sequence: int | None = None,
                   throughput_kbps: float | None = None) -> Lease:
        """Record the last acknowledged sequence number (or ``SHARD_END``); counter +1, so it
        renews the lease in the same write. ``sub_sequence`` (inside a KPL aggregate) None
        removes it; ``throughput_kbps`` as :meth:`renew`.

        Raises:
            InvalidError: no owner, neither decimal digits nor ``SHARD_END``, a bad throughput.
            LeaseLostError / LeaseStoreError: as :meth:`renew`.
        """
        validate_held(lease, "checkpoint")
        validate_checkpoint(sequence_number, sub_sequence)
        fields: Row = {CHECKPOINT: sequence_number, EXPIRY: self._expiry_ms(max(1, lease.duration_ms)),
                       **throughput_fields(throughput_kbps)}
        if sub_sequence is None:
            return self._holder_write(lease, "checkpoint", fields, (SUB_SEQUENCE,))
        fields[SUB_SEQUENCE] = int(sub_sequence)
        return self._holder_write(lease, "checkpoint", fields)

    def set_start_position(self, lease: Lease, position: str) -> Lease:
        """Record where the shard opens (an opaque serialised position) and remove its
        checkpoint (first open, or a seek); counter +1.

        Raises:
            InvalidError: no owner, or an empty ``position`` (before any I/O).
            LeaseLostError / LeaseStoreError: as :meth:`renew`.
        """
        validate_held(lease, "set_start_position")
        if not isinstance(position, str) or not position.strip():
            raise InvalidError(f"position must be a non-empty string, got {position!r}")
        return self._holder_write(lease, "set_start_position", {
            START_POSITION: position, EXPIRY: self._expiry_ms(max(1, lease.duration_ms))}, (CHECKPOINT, SUB_SEQUENCE))

    def release(self, lease: Lease) -> Lease:
        """Clear the owner and keep the checkpoint; counter +1 (fences the old holder's zombies
        even if the same owner takes the row again).

        Raises:
            InvalidError: no owner (before any I/O). LeaseLostError / LeaseStoreError: as :meth:`renew`.
        """
        validate_held(lease, "release")
        new = self._holder_write(lease, "release", {EXPIRY: self._expiry_ms(0)}, (OWNER,))
        logger.debug("lease %s released by %s", lease.key, lease.owner)
        return new

    def hand_over(self, lease: Lease, *, to: str | None = None) -> Lease:
        """The holder gives its lease to ``to`` (default ``lease.next_owner``) in one fenced
        write: counter +1, ``lease_next_owner`` cleared, checkpoint kept; the row is never free
        in between, so no third instance can take it.

        Raises:
            InvalidError: no owner, or no receiver other than the holder (before any I/O).
            LeaseLostError / LeaseStoreError: as :meth:`renew`.
        """
        validate_held(lease, "hand_over")
        receiver = to if to is not None else lease.next_owner
        if not isinstance(receiver, str) or not receiver.strip() or receiver == lease.owner:
            raise InvalidError(f"hand_over of {lease.key!r} needs a receiver other than {lease.owner!r}, "
                               f"got {receiver!r}")
        fields = {OWNER: receiver, EXPIRY: self._expiry_ms(max(1, lease.duration_ms))}
        new = self._holder_write(lease, "hand_over", fields, (NEXT_OWNER,))
        logger.info("lease %s handed over by %s to %s", lease.key, lease.owner, receiver)
        return new

    # ------------------------------------------------------------------ handoff requests
    def request_handoff(self, stream: str, shard_id: str, *, owner: str, expect_counter: int) -> bool:
        """Ask the holder for a graceful handoff: set ``lease_next_owner`` to ``owner``, on
        condition of the counter only. The counter does NOT change (the holder is not fenced);
        the holder sees the request in the Lease its next write returns.

        Returns True if written; False if the row is missing or its counter moved. Raises
        InvalidError for bad names or counter (before any I/O), LeaseStoreError as :meth:`get`.
        """
        validate_names(stream, shard_id, owner)
        if isinstance(expect_counter, bool) or not isinstance(expect_counter, int):
            raise InvalidError(f"expect_counter must be an int, got {expect_counter!r}")
        new = self._table.update(lease_key(stream, shard_id), None, expect_counter, {NEXT_OWNER: owner}, (),
                                 check_owner=False)
        if new is not None:
            self._expiry.note(new)
        return new is not None

    def withdraw_handoff(self, stream: str, shard_id: str, *, owner: str) -> bool:
        """Clear ``lease_next_owner`` if it still names ``owner`` (conditional on the counter read).

        Returns True if the row no longer names ``owner``; False if it changed meanwhile (read
        it again). Raises as :meth:`get`.
        """
        validate_names(stream, shard_id, owner)
        key = lease_key(stream, shard_id)
        row = self._table.read(key)
        if row is None or row.get(NEXT_OWNER) != owner:
            return True
        new = self._table.update(key, None, int(row[COUNTER]), {}, (NEXT_OWNER,), check_owner=False)
        if new is not None:
            self._expiry.note(new)
        return new is not None

    def force_handoff(self, stream: str, shard_id: str, *, owner: str, duration_s: float) -> Lease | None:
        """Take a lease whose holder did not honour ``owner``'s handoff request in time: only while
        the row still names ``owner`` as next owner, conditional on the owner and counter read
        (it fences the holder, as taking an expired lease does).

        Returns the new Lease, or None when the request is gone or the row changed meanwhile.
        Raises InvalidError for bad names or duration (before any I/O), LeaseStoreError as :meth:`get`.
        """
        validate_names(stream, shard_id, owner)
        duration_ms = duration_to_ms(duration_s)
        key = lease_key(stream, shard_id)
        row = self._table.read(key)
        if row is None or row.get(NEXT_OWNER) != owner or not is_shard_row(row):
            return None
        self._expiry.note(row)
        holder, counter = row.get(OWNER), int(row[COUNTER])
        new = self._table.update(key, holder, counter, {
            OWNER: owner, COUNTER: counter + 1, WRITE_TOKEN: uuid.uuid4().hex[:16], DURATION_MS: duration_ms,
            EXPIRY: self._expiry_ms(duration_ms)}, (NEXT_OWNER,))
        if new is None:
            return None
        self._expiry.note(new)
        logger.warning("lease %s taken by %s from %s: the handoff was not honoured in time", key, owner, holder)
        return row_to_lease(new)

    # ------------------------------------------------------------------ presence rows
    def _presence(self, rows: Iterable[Row], stream: str, include_stale: bool) -> builtins.list[Instance]:
        found = []
        for row in rows if self._table.presence else ():
            if is_presence_row(row, stream):
                self._expiry.note(row)
                if include_stale or not self._expiry.expired(row[KEY], int(row[COUNTER]),
                                                             int(row.get(DURATION_MS, 0))):
                    found.append(row_to_instance(row))
        return sorted(found, key=lambda instance: instance.owner)

    def heartbeat(self, stream: str, owner: str, *, duration_s: float) -> Instance:
        """Create or refresh ``owner``'s presence row (counter +1), conditional on the counter
        this store last saw, re-reading when another process of the same owner id wrote meanwhile.
        A table without presence rows (KCL's) writes nothing and returns the row as it would be.

        Raises InvalidError for bad names or duration (before any I/O), LeaseStoreError when
        the table is unreachable or the row kept changing.
        """
        validate_names(stream, None, owner)
        duration_ms = duration_to_ms(duration_s)
        key = presence_key(stream, owner)
        fields: Row = {OWNER: owner, DURATION_MS: duration_ms, EXPIRY: self._expiry_ms(duration_ms)}
        if not self._table.presence:
            return Instance(stream=stream, owner=owner, counter=0, duration_ms=duration_ms, expiry_ms=fields[EXPIRY])
        counter = self._expiry.last_counter(key)
        for _ in range(4):
            new = None if counter is None else self._table.update(key, owner, counter, {**fields, COUNTER: counter + 1})
            if new is None:
                row = self._table.read(key)
                new = {KEY: key, STREAM: stream, COUNTER: 1, **fields} if row is None else None
                counter = None if row is None else int(row[COUNTER])
                if new is not None and not self._table.put_new(new):
                    new = None
            if new is not None:
                self._expiry.note(new)
                return row_to_instance(new)
        raise LeaseStoreError(f"presence row {key!r} kept changing; heartbeat not written", retriable=True)

    def instances(self, stream: str, *, include_stale: bool = False) -> builtins.list[Instance]:
        """The presence rows of ``stream`` (fresh ones only unless ``include_stale``), sorted by
        owner; always empty on a table without presence rows. Raises as :meth:`get`."""
        validate_names(stream)
        return self._presence(self._table.scan(stream) if self._table.presence else (), stream, include_stale)

    def remove_presence(self, stream: str, owner: str) -> None:
        """Delete ``owner``'s presence row for ``stream`` (a clean close); idempotent. Raises as :meth:`get`."""
        validate_names(stream, None, owner)
        if self._table.presence:
            key = presence_key(stream, owner)
            self._table.delete(key)
            self._expiry.forget(key)
