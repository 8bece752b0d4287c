"""Presence rows: which instances read a stream (lease balancing).

One row per live instance, key ``"<stream>#instance#<owner>"``, with ``lease_owner``,
``lease_counter`` (+1 on every heartbeat), ``lease_duration_ms`` and ``lease_expiry``.
An instance heartbeats more often than its duration; other stores judge its row stale
by the lease rule (:mod:`~kinesis_actors.leases.expiry`: the counter unchanged for the
duration, on their own clock). Presence rows are never returned by ``list()``.

:class:`PresenceRows` is a mixin of :class:`~kinesis_actors.leases.base.BaseLeaseStore`,
over the same storage primitives (``_read``, ``_scan``, ``_put_new``, ``_update``,
``_delete``) and observation table.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import LeaseStoreError
from .expiry import ExpiryObserver
from .protocol import Instance, duration_to_ms, presence_key, validate_names
from .rows import COUNTER, DURATION_MS, EXPIRY, KEY, OWNER, STREAM, Row, is_presence_row, row_to_instance

__all__ = ["PresenceRows"]


class PresenceRows:
    """Heartbeat, list and delete presence rows (a mixin: the store supplies the primitives)."""

    _expiry: ExpiryObserver
    _read: Callable[[str], Row | None]
    _scan: Callable[[str], builtins.list[Row]]
    _put_new: Callable[[Row], bool]
    _update: Callable[..., Row | None]
    _delete: Callable[[str], None]
    _wall_expiry_ms: Callable[[int], int]
    _note: Callable[[Any], None]

    def _presence(self, rows: Iterable[Row], stream: str, include_stale: bool) -> builtins.list[Instance]:
        found = []
        for row in rows:
            if not is_presence_row(row, stream):
                continue
            self._note(row)
            if include_stale or not self._expiry.expired(row[KEY], int(row[COUNTER]), int(row.get(DURATION_MS, 0))):
                found.append(row_to_instance(row))
        return sorted(found, key=lambda instance: instance.owner)

    def heartbeat(self, stream: str, owner: str, *, duration_s: float) -> Instance:
        """Create or refresh ``owner``'s presence row for ``stream``; the counter rises by one.

        An instance heartbeats more often than ``duration_s``; other stores judge it stale
        once its counter has not changed for ``duration_s`` since they first saw that
        counter (the lease rule: no wall clock is compared). Only the instance itself
        writes its row, so the write is conditional on the counter this store last saw
        (one ``UpdateItem``), re-reading once if another process of the same owner id
        (a restarted Coordinator) wrote meanwhile.

        Args:
            stream: stream name.
            owner: the instance's owner id.
            duration_s: how long the row stays fresh without a heartbeat, seconds.

        Returns:
            The presence row as an :class:`Instance`.

        Raises:
            InvalidError: empty names, or a bad duration (before any I/O).
            LeaseStoreError: the store is missing or unreachable, or the row kept changing.
        """
        validate_names(stream, None, owner)
        duration_ms = duration_to_ms(duration_s)
        key = presence_key(stream, owner)
        fields: Row = {OWNER: owner, DURATION_MS: duration_ms, EXPIRY: self._wall_expiry_ms(duration_ms)}
        counter = self._expiry.last_counter(key)
        for _ in range(4):
            if counter is not None:
                new = self._update(key, owner, counter, {**fields, COUNTER: counter + 1})
                if new is not None:
                    self._note(new)
                    return row_to_instance(new)
            row = self._read(key)
            if row is None:
                item: Row = {KEY: key, STREAM: stream, COUNTER: 1, **fields}
                if self._put_new(item):
                    self._note(item)
                    return row_to_instance(item)
                counter = None
                continue
            counter = int(row[COUNTER])
        raise LeaseStoreError(f"presence row {key!r} kept changing; heartbeat not written", retriable=True)

    def instances(self, stream: str, *, include_stale: bool = False) -> builtins.list[Instance]:
        """The presence rows of ``stream``: the instances reading it (consistent read).

        Args:
            stream: stream name.
            include_stale: also return rows whose counter has not changed for their
                duration as this store saw it (a crashed instance's row).

        Returns:
            The Instances, sorted by owner id. A row this store sees for the first time is
            fresh (it waits one full duration before calling it stale).

        Raises:
            InvalidError: empty stream (before any I/O).
            LeaseStoreError: the store is missing or unreachable.
        """
        validate_names(stream)
        return self._presence(self._scan(stream), stream, include_stale)

    def remove_presence(self, stream: str, owner: str) -> None:
        """Delete ``owner``'s presence row for ``stream`` (a clean close); idempotent.

        Raises:
            InvalidError: empty names (before any I/O).
            LeaseStoreError: the store is missing or unreachable.
        """
        validate_names(stream, None, owner)
        key = presence_key(stream, owner)
        self._delete(key)
        self._expiry.forget(key)
