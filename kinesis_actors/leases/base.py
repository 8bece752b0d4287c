"""The lease logic, written once over a few storage primitives that each backend implements.

:class:`BaseLeaseStore` holds every rule of the lease table (take, renew, checkpoint,
set_start_position, release, get, list, is_expired, request_handoff) and the KCL-style
expiry judgement. A backend only stores rows, atomically, through five primitives:

=================================================== ===========================================
primitive                                           semantics
=================================================== ===========================================
``_read(key) -> dict | None``                       strongly consistent read of one row
``_scan(stream) -> list[dict]``                     every row of ``stream`` (may include rows
                                                    that are not shard rows; the base filters)
``_put_new(item) -> bool``                          create the row only if its key is absent
``_update(key, expect_owner, expect_counter,        apply the change only if the row exists,
set_fields, remove_fields, check_owner) ->          its counter equals ``expect_counter`` and
dict | None``                                       (when ``check_owner``) its owner equals
                                                    ``expect_owner`` (None: no owner); return
                                                    the new row, or None when the condition
                                                    failed (nothing changed)
``_delete(key) -> None``                            delete the row if present (presence rows)
=================================================== ===========================================

Rows are plain dicts with the attribute names of the lease table (see
:mod:`kinesis_actors.leases.protocol`): ``str`` for S, ``int`` for N and a tuple of
``str`` for ``parent_shard_ids``; an absent attribute is an absent key (never None).

Expiry (KCL's rule, immune to clock skew): the store keeps, per lease key, the counter
it last saw and when it first saw that counter, on its own monotonic ``clock``. A lease
is expired *for this store* once its counter has not changed for the row's
``lease_duration_ms``. A store that sees a row for the first time therefore waits one
full duration before it may take it. The wall clock (``wall_clock``) only fills the
informational ``lease_expiry`` attribute; no decision ever reads it.

Fault model: every write is a single conditional primitive, so of many racing writers
exactly one wins; a failed condition changes nothing. Writes by the holder (renew,
checkpoint, set_start_position, release) are fenced on owner AND counter and raise
:class:`~kinesis_actors.errors.LeaseLostError` when the condition fails. Every
successful write raises the counter by one (release too, so a fenced zombie cannot
write after a release and a re-take).

Balancing: presence rows (``"<stream>#instance#<owner>"``, refreshed by
:meth:`BaseLeaseStore.heartbeat`) tell which instances are live, judged by the same
observation rule; a graceful handoff is :meth:`BaseLeaseStore.request_handoff` (the
thief marks ``lease_next_owner``) then :meth:`BaseLeaseStore.hand_over` (the holder
gives the row to the thief in one fenced write, so no third instance can take it in
between), or :meth:`BaseLeaseStore.force_handoff` when the holder did not answer in time.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import InvalidError, LeaseLostError, LeaseStoreError
from .expiry import ExpiryObserver
from .presence import PresenceRows
from .protocol import (
    Instance,
    Lease,
    TableSnapshot,
    duration_to_ms,
    lease_key,
    validate_checkpoint,
    validate_names,
)
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
    STREAM_ARN,
    STREAM_CREATION_MS,
    SUB_SEQUENCE,
    WRITE_TOKEN,
    Row,
    is_shard_row,
    row_to_lease,
)

__all__ = ["BaseLeaseStore", "Row"]

logger = logging.getLogger(__name__)


def _validate_lease(lease: object, operation: str) -> Lease:
    if not isinstance(lease, Lease):
        raise InvalidError(f"{operation} needs a Lease, got {type(lease).__name__}")
    validate_names(lease.stream, lease.shard_id)
    if lease.owner is None or not isinstance(lease.owner, str) or not lease.owner.strip():
        raise InvalidError(f"{operation} needs a held lease; {lease.key!r} has no owner (owner={lease.owner!r})")
    return lease


class BaseLeaseStore(PresenceRows):
    """All the lease logic, over storage primitives that a subclass implements.

    Subclasses implement ``_read``, ``_scan``, ``_put_new`` and ``_update`` (see the module
    docstring) atomically; everything else lives here. Instances are picklable: the
    observation table (what this store has seen, and when) is per instance and starts
    empty after unpickling, which is the correct KCL behaviour for a new process.

    Args:
        clock: monotonic clock in seconds (default ``time.monotonic``); judges expiry.
        wall_clock: epoch clock in seconds (default ``time.time``); only fills the
            informational ``lease_expiry`` (epoch ms) of the rows written.
    """

    #: instance attributes not pickled (rebuilt by ``_init_transient``).
    _TRANSIENT: tuple[str, ...] = ("_expiry", "_unconfirmed", "_lock")

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not callable(clock) or not callable(wall_clock):
            raise InvalidError("clock and wall_clock must be callables returning seconds")
        self._clock = clock
        self._wall_clock = wall_clock
        self._init_transient()

    # ------------------------------------------------------------------ pickling
    def _init_transient(self) -> None:
        self._expiry = ExpiryObserver(self._clock)
        self._unconfirmed: dict[str, tuple[int, str]] = {}  # key -> (counter, token) of a write that raised
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in type(self)._all_transient():
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_transient()

    @classmethod
    def _all_transient(cls) -> set[str]:
        names: set[str] = set()
        for klass in cls.__mro__:
            names.update(getattr(klass, "_TRANSIENT", ()))
        return names

    def peer(
        self,
        *,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> BaseLeaseStore:
        """Another store over the same rows that has seen nothing yet (what a second host has).

        Args:
            clock: monotonic clock of the new store (seconds); default: this store's.
            wall_clock: epoch clock of the new store (seconds); default: this store's.

        Returns:
            A copy with an empty observation table (it waits one full duration before it
            judges any held lease expired). Shares the rows with this store.
        """
        other = object.__new__(type(self))  # no pickling round trip: a copy does no I/O
        transient = type(self)._all_transient()
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k not in transient})
        if clock is not None:
            other._clock = clock
        if wall_clock is not None:
            other._wall_clock = wall_clock
        other._init_transient()
        return other

    # ------------------------------------------------------------------ lifecycle
    def bind(self, aws: Any) -> BaseLeaseStore:
        """This store as it is: it has no AWS settings to inherit (``DynamoLeaseStore`` does)."""
        return self

    def open(self) -> BaseLeaseStore:
        """Nothing to create in this process (``MemoryLeaseStore`` creates its actor); returns self."""
        return self

    def close(self) -> None:
        """Nothing to release (``MemoryLeaseStore`` kills its actor)."""

    # ------------------------------------------------------------------ primitives
    def _read(self, key: str) -> Row | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _scan(self, stream: str) -> list[Row]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _put_new(self, item: Row) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def _update(
        self,
        key: str,
        expect_owner: str | None,
        expect_counter: int,
        set_fields: Mapping[str, Any],
        remove_fields: Iterable[str] = (),
        *,
        check_owner: bool = True,
    ) -> Row | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _delete(self, key: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ------------------------------------------------------------------ expiry
    def _note(self, row: Mapping[str, Any]) -> None:
        self._expiry.note(row)

    def is_expired(self, lease: Lease | Instance) -> bool:
        """True if the lease's counter has not changed for its duration, as this store saw it.

        The judgement uses only this store's monotonic clock: the first time the store
        sees a counter it notes the time, and the lease is expired once
        ``lease.duration_ms`` has passed since then with no newer counter seen. A lease
        this store has never seen is therefore not expired yet (it is noted now). The
        owner is not considered: a free row can be taken whether or not it is expired.

        Args:
            lease: a Lease (or a presence row's :class:`Instance`: True means stale) read
                or written by any store.

        Returns:
            True when expired for this store.

        Raises:
            InvalidError: ``lease`` is not a Lease or an Instance.
        """
        if not isinstance(lease, (Lease, Instance)):
            raise InvalidError(f"is_expired needs a Lease, got {type(lease).__name__}")
        return self._expiry.expired(lease.key, lease.counter, lease.duration_ms)

    def _wall_expiry_ms(self, duration_ms: int) -> int:
        return int(self._wall_clock() * 1000) + duration_ms

    # ------------------------------------------------------------------ operations
    def take(
        self,
        stream: str,
        shard_id: str,
        *,
        owner: str,
        duration_s: float,
        parent_shard_ids: tuple[str, ...] = (),
        stream_identity: tuple[str, int] | None = None,
    ) -> Lease | None:
        """Take the shard's lease for ``owner``; create the row if it is missing.

        Succeeds when the row is free, is already ``owner``'s (re-taking one's own row
        fences any older reader of that owner), or is expired for this store. The write
        is conditional on the owner and counter this store saw, so of many racing takers
        exactly one wins. The counter rises by one and ``lease_next_owner`` is cleared.

        Args:
            stream: stream name.
            shard_id: shard id, e.g. ``"shardId-000000000000"``.
            owner: owner id of the taker.
            duration_s: lease duration, seconds (any positive finite number).
            parent_shard_ids: parent shards, written only when the row is created (or
                restarted for a new stream incarnation).
            stream_identity: ``(stream ARN, creation time in epoch ms)`` of the stream as
                the taker sees it, or None. Written on a new row and on a row without one.
                A row of ANOTHER incarnation (the stream was deleted and re-created under
                the same name) is restarted by the take: its checkpoint, sub-sequence and
                start position are removed (a warning is logged), so the shard opens at
                the subscription's ``start_at``; its stale checkpoint is never applied.

        Returns:
            The new Lease, or None when another owner holds it live or won a race for it.

        Raises:
            InvalidError: empty stream, shard id or owner, a bad duration or parent list
                (before any I/O).
            LeaseStoreError: the store is missing or unreachable.
        """
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
        key = lease_key(stream, shard_id)

        row = self._read(key)
        if row is None:
            item: Row = {
                KEY: key,
                STREAM: stream,
                SHARD_ID: shard_id,
                OWNER: owner,
                COUNTER: 1,
                DURATION_MS: duration_ms,
                EXPIRY: self._wall_expiry_ms(duration_ms),
            }
            if parents:
                item[PARENTS] = tuple(sorted(set(parents)))
            item.update(identity)
            if self._put_new(item):
                self._note(item)
                logger.debug("lease %s created and taken by %s", key, owner)
                return row_to_lease(item)
            row = self._read(key)  # lost the creation race: judge the winner's row
            if row is None:
                return None
        self._note(row)
        current_owner = row.get(OWNER)
        counter = int(row[COUNTER])
        if current_owner is not None and current_owner != owner and not self._expiry.expired(
                key, counter, int(row.get(DURATION_MS, 0))):
            return None
        fields: Row = {
            OWNER: owner,
            COUNTER: counter + 1,
            WRITE_TOKEN: uuid.uuid4().hex[:16],
            DURATION_MS: duration_ms,
            EXPIRY: self._wall_expiry_ms(duration_ms),
        }
        remove: tuple[str, ...] = (NEXT_OWNER,)
        if identity and row.get(STREAM_ARN) is None:
            fields.update(identity)  # a row written without an identity: stamp it
        elif identity and (row.get(STREAM_ARN), row.get(STREAM_CREATION_MS)) != tuple(identity.values()):
            logger.warning(
                "lease %s belongs to another incarnation of stream %s (%s created %s ms, now %s created %s ms):"
                " its checkpoint %r is not applied; the shard opens at the subscription's start_at",
                key, stream, row.get(STREAM_ARN), row.get(STREAM_CREATION_MS), identity[STREAM_ARN],
                identity[STREAM_CREATION_MS], row.get(CHECKPOINT),
            )
            fields.update(identity)
            remove += (CHECKPOINT, SUB_SEQUENCE, START_POSITION)
            if parents:
                fields[PARENTS] = tuple(sorted(set(parents)))
            else:
                remove += (PARENTS,)
        new = self._update(key, current_owner, counter, fields, remove)
        if new is None:
            logger.debug("lease %s: %s lost the race to take it", key, owner)
            return None
        self._note(new)
        if current_owner is not None and current_owner != owner:
            logger.info("lease %s taken by %s from %s (expired)", key, owner, current_owner)
        return row_to_lease(new)

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

    def renew(self, lease: Lease, *, duration_s: float | None = None) -> Lease:
        """Extend a held lease; the counter rises by one.

        Conditional on the lease's owner AND counter (UpdateItem with a
        ConditionExpression on DynamoDB).

        Args:
            lease: the latest Lease the holder got from this store.
            duration_s: new lease duration, seconds; None keeps ``lease.duration_ms``.

        Returns:
            The new Lease.

        Raises:
            InvalidError: ``lease`` has no owner, or a bad duration (before any I/O).
            LeaseLostError: the lease is not held at that counter any more; nothing changed.
            LeaseStoreError: the store is missing or unreachable.
        """
        _validate_lease(lease, "renew")
        duration_ms = duration_to_ms(duration_s) if duration_s is not None else max(1, lease.duration_ms)
        return self._holder_write(
            lease, "renew", {DURATION_MS: duration_ms, EXPIRY: self._wall_expiry_ms(duration_ms)}
        )

    def checkpoint(self, lease: Lease, sequence_number: str, *, sub_sequence: int | None = None) -> Lease:
        """Record the last acknowledged sequence number (or ``SHARD_END``); counter +1.

        A checkpoint also renews the lease (its counter changes).

        Args:
            lease: the latest Lease the holder got from this store.
            sequence_number: decimal sequence number (any length, e.g. 56 digits; stored as
                a string) or ``SHARD_END``.
            sub_sequence: sub-sequence number inside a KPL aggregate; None removes it.

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

    def request_handoff(self, stream: str, shard_id: str, *, owner: str, expect_counter: int) -> bool:
        """Ask the holder for a graceful handoff: set ``lease_next_owner`` to ``owner``.

        Conditional on the counter only (whoever holds the row); the counter does NOT
        change, so the holder is not fenced and the lease does not look renewed. The
        holder sees the request in the Lease returned by its next renew or checkpoint;
        a later take clears it.

        Args:
            stream: stream name.
            shard_id: shard id.
            owner: owner id asking for the lease.
            expect_counter: the counter the asker saw.

        Returns:
            True if the request was written; False if the row is missing or its counter moved.

        Raises:
            InvalidError: empty names or owner, or a non-integer counter (before any I/O).
            LeaseStoreError: the store is missing or unreachable.
        """
        validate_names(stream, shard_id, owner)
        if isinstance(expect_counter, bool) or not isinstance(expect_counter, int):
            raise InvalidError(f"expect_counter must be an int, got {expect_counter!r}")
        key = lease_key(stream, shard_id)
        new = self._update(key, None, expect_counter, {NEXT_OWNER: owner}, (), check_owner=False)
        if new is None:
            return False
        self._note(new)
        return True

    def withdraw_handoff(self, stream: str, shard_id: str, *, owner: str) -> bool:
        """Take back ``owner``'s handoff request (a closing instance): clear ``lease_next_owner``
        if it still names ``owner``. Conditional on the counter read, like the request.

        Returns:
            True if the row no longer names ``owner`` as next owner (cleared now, or already
            gone); False if the row changed meanwhile (read it again: it may be ours now).

        Raises:
            InvalidError: empty names or owner (before any I/O).
            LeaseStoreError: the store is missing or unreachable.
        """
        validate_names(stream, shard_id, owner)
        key = lease_key(stream, shard_id)
        row = self._read(key)
        if row is None or row.get(NEXT_OWNER) != owner:
            return True
        new = self._update(key, None, int(row[COUNTER]), {}, (NEXT_OWNER,), check_owner=False)
        if new is None:
            return False
        self._note(new)
        return True

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

    def force_handoff(self, stream: str, shard_id: str, *, owner: str, duration_s: float) -> Lease | None:
        """Take a lease whose holder did not honour ``owner``'s handoff request in time.

        Succeeds only while the row still names ``owner`` as ``lease_next_owner`` (a
        later take or hand-over clears it); conditional on the owner and counter read,
        so it fences the holder exactly like taking an expired lease (its batch in
        flight is then not checkpointed and will be delivered again).

        Args:
            stream: stream name.
            shard_id: shard id.
            owner: owner id that requested the handoff.
            duration_s: lease duration of the new holder, seconds.

        Returns:
            The new Lease, or None when the request is gone or the row changed meanwhile.

        Raises:
            InvalidError: empty names or owner, or a bad duration (before any I/O).
            LeaseStoreError: the store is missing or unreachable.
        """
        validate_names(stream, shard_id, owner)
        duration_ms = duration_to_ms(duration_s)
        key = lease_key(stream, shard_id)
        row = self._read(key)
        if row is None or row.get(NEXT_OWNER) != owner or not is_shard_row(row):
            return None
        self._note(row)
        holder, counter = row.get(OWNER), int(row[COUNTER])
        new = self._update(
            key,
            holder,
            counter,
            {OWNER: owner, COUNTER: counter + 1, WRITE_TOKEN: uuid.uuid4().hex[:16], DURATION_MS: duration_ms,
             EXPIRY: self._wall_expiry_ms(duration_ms)},
            (NEXT_OWNER,),
        )
        if new is None:
            return None
        self._note(new)
        logger.warning("lease %s taken by %s from %s: the handoff was not honoured in time", key, owner, holder)
        return row_to_lease(new)

    def get(self, stream: str, shard_id: str) -> Lease | None:
        """The shard's row (strongly consistent read), or None if there is none.

        Args:
            stream: stream name.
            shard_id: shard id.

        Returns:
            The Lease, or None.

        Raises:
            InvalidError: empty stream or shard id (before any I/O).
            LeaseStoreError: the store is missing or unreachable.
        """
        validate_names(stream, shard_id)
        row = self._read(lease_key(stream, shard_id))
        if row is None or not is_shard_row(row):
            return None
        self._note(row)
        return row_to_lease(row)

    def list(self, stream: str) -> builtins.list[Lease]:
        """Every shard row of ``stream`` (strongly consistent), sorted by shard id.

        Rows of other streams and presence rows (``"<stream>#instance#<owner>"``) are
        never returned.

        Args:
            stream: stream name.

        Returns:
            The Leases, sorted by shard id.

        Raises:
            InvalidError: empty stream (before any I/O).
            LeaseStoreError: the store is missing or unreachable.
        """
        validate_names(stream)
        return self._shard_leases(self._scan(stream), stream)

    def _shard_leases(self, rows: Iterable[Row], stream: str) -> builtins.list[Lease]:
        shard_rows = [row for row in rows if is_shard_row(row, stream)]
        for row in shard_rows:
            self._note(row)
        return sorted((row_to_lease(row) for row in shard_rows), key=lambda lease: lease.shard_id)

    def snapshot(self, stream: str) -> TableSnapshot:
        """One scan of ``stream``'s rows: its shard leases (as :meth:`list`) and its live
        instances (as :meth:`instances`). What a Coordinator reads at each lease poll."""
        validate_names(stream)
        rows = self._scan(stream)
        return TableSnapshot(self._shard_leases(rows, stream), self._presence(rows, stream, False))
