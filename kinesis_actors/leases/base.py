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

from ..errors import InvalidError
from .expiry import ExpiryObserver
from .handoff import HandoffRequests
from .presence import PresenceRows
from .protocol import (
    Instance,
    Lease,
    TableSnapshot,
    duration_to_ms,
    lease_key,
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
from .writes import HolderWrites

__all__ = ["BaseLeaseStore", "Row"]

logger = logging.getLogger(__name__)


def _args(stream: str, shard_id: str, owner: str, duration_s: float, parent_shard_ids: tuple[str, ...] | None,
          stream_identity: tuple[str, int] | None) -> tuple[int, tuple[str, ...], Row]:
    """A take's checked arguments: (duration ms, parent shard ids, identity attributes); InvalidError otherwise."""
    validate_names(stream, shard_id, owner)
    return duration_to_ms(duration_s), _parents(parent_shard_ids), _identity(stream_identity)


def _parents(parent_shard_ids: tuple[str, ...] | None) -> tuple[str, ...]:
    """``parent_shard_ids`` of a take as a tuple of shard ids; InvalidError otherwise."""
    if isinstance(parent_shard_ids, str):
        raise InvalidError(f"parent_shard_ids must be a tuple of shard ids, got {parent_shard_ids!r}")
    parents = tuple(parent_shard_ids or ())
    if not all(isinstance(p, str) and p.strip() for p in parents):
        raise InvalidError(f"parent_shard_ids must be non-empty strings, got {parent_shard_ids!r}")
    return parents


def _identity(stream_identity: tuple[str, int] | None) -> Row:
    """The row attributes of a take's ``stream_identity`` (ARN, creation epoch ms); InvalidError otherwise."""
    if stream_identity is None:
        return {}
    arn, created_ms = stream_identity
    if not isinstance(arn, str) or not arn or isinstance(created_ms, bool) or not isinstance(created_ms, int):
        raise InvalidError(f"stream_identity must be (ARN, creation epoch ms), got {stream_identity!r}")
    return {STREAM_ARN: arn, STREAM_CREATION_MS: created_ms}


class BaseLeaseStore(HolderWrites, HandoffRequests, PresenceRows):
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
        duration_ms, parents, identity = _args(stream, shard_id, owner, duration_s, parent_shard_ids, stream_identity)
        key = lease_key(stream, shard_id)
        row = self._read(key)
        if row is None:
            item = self._new_row(key, stream, shard_id, owner, duration_ms, parents, identity)
            if self._put_new(item):
                self._note(item)
                logger.debug("lease %s created and taken by %s", key, owner)
                return row_to_lease(item)
            row = self._read(key)  # lost the creation race: judge the winner's row
        if row is None or self._held_live_by_another(row, owner):
            return None
        fields, remove = self._take_fields(row, owner, duration_ms, parents, identity)
        new = self._update(key, row.get(OWNER), int(row[COUNTER]), fields, remove)
        if new is None:
            logger.debug("lease %s: %s lost the race to take it", key, owner)
            return None
        self._note(new)
        if row.get(OWNER) not in (None, owner):
            logger.info("lease %s taken by %s from %s (expired)", key, owner, row.get(OWNER))
        return row_to_lease(new)

    def _held_live_by_another(self, row: Row, owner: str) -> bool:
        """Note ``row``; True when another owner holds it and it is not expired for this store."""
        self._note(row)
        holder = row.get(OWNER)
        return holder is not None and holder != owner and not self._expiry.expired(
            row[KEY], int(row[COUNTER]), int(row.get(DURATION_MS, 0)))

    def _new_row(self, key: str, stream: str, shard_id: str, owner: str, duration_ms: int,
                 parents: tuple[str, ...], identity: Row) -> Row:
        """The row a take creates: owned by ``owner`` at counter 1."""
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
        return item

    def _take_fields(self, row: Row, owner: str, duration_ms: int, parents: tuple[str, ...],
                     identity: Row) -> tuple[Row, tuple[str, ...]]:
        """What a take of an existing ``row`` sets and removes: a new owner and counter, and a
        restart of the row when it belongs to another incarnation of the stream."""
        fields: Row = {
            OWNER: owner,
            COUNTER: int(row[COUNTER]) + 1,
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
                row[KEY], row.get(STREAM), row.get(STREAM_ARN), row.get(STREAM_CREATION_MS), identity[STREAM_ARN],
                identity[STREAM_CREATION_MS], row.get(CHECKPOINT),
            )
            fields.update(identity)
            remove += (CHECKPOINT, SUB_SEQUENCE, START_POSITION)
            if parents:
                fields[PARENTS] = tuple(sorted(set(parents)))
            else:
                remove += (PARENTS,)
        return fields, remove

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
