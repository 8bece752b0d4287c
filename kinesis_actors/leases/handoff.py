"""Handoff requests of :class:`~kinesis_actors.leases.base.BaseLeaseStore` (lease balancing):
the thief marks ``lease_next_owner`` (:meth:`HandoffRequests.request_handoff`), may take the
mark back (:meth:`~HandoffRequests.withdraw_handoff`), and takes the lease itself when the
holder did not hand it over in time (:meth:`~HandoffRequests.force_handoff`). The holder's
side, ``hand_over``, is a fenced holder write (:mod:`~kinesis_actors.leases.writes`).
:class:`HandoffRequests` is a mixin over the store's primitives and observation table.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import InvalidError
from .protocol import Lease, duration_to_ms, lease_key, validate_names
from .rows import COUNTER, DURATION_MS, EXPIRY, NEXT_OWNER, OWNER, WRITE_TOKEN, Row, is_shard_row, row_to_lease

__all__ = ["HandoffRequests"]

logger = logging.getLogger("kinesis_actors.leases.base")


class HandoffRequests:
    """Ask for, withdraw and force a handoff (a mixin: the store supplies the primitives)."""

    _read: Callable[[str], Row | None]
    _update: Callable[..., Row | None]
    _note: Callable[[Any], None]
    _wall_expiry_ms: Callable[[int], int]

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
