"""In-memory lease stores: :class:`MemoryLeaseStore` (rows in one Ray actor) and an in-process one.

Both keep the DynamoDB row layout (see :mod:`kinesis_actors.leases.protocol`) in a dict
and apply each primitive atomically under a lock; all the lease logic is in
:class:`~kinesis_actors.leases.base.BaseLeaseStore`.

- :class:`MemoryLeaseStore`, the broker's default: the rows live in one named Ray actor
  (``num_cpus=0``), so every pickled copy of the store, in any process of the Ray
  cluster, reaches the same rows. It suits one instance (one broker) and is empty after
  a restart, so every shard then opens at its ``start_at``.
- ``InProcessLeaseStore`` (exported by :mod:`kinesis_actors.testing`): the rows live in
  this process; no Ray needed. For unit tests.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import InvalidError, LeaseStoreError
from .base import BaseLeaseStore
from .rows import COUNTER, KEY, OWNER, STREAM, Row

__all__ = ["MemoryLeaseStore", "InProcessLeaseStore", "ACTOR_NAMESPACE"]

logger = logging.getLogger(__name__)

ACTOR_NAMESPACE = "kinesis_actors"
"""Ray namespace of the lease-table actors, so a handle finds its actor from any job."""


class _LocalRows:
    """The rows of a lease table in a dict; every primitive is atomic under one lock.

    Picklable: a pickled copy is a snapshot (its own dict and lock).
    """

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
        with self._lock:
            row = self._rows.get(key)
            return dict(row) if row is not None else None

    def scan(self, stream: str) -> list[Row]:
        with self._lock:
            return [dict(row) for row in self._rows.values() if row.get(STREAM) == stream]

    def put_new(self, item: Mapping[str, Any]) -> bool:
        with self._lock:
            if item[KEY] in self._rows:
                return False
            self._rows[item[KEY]] = dict(item)
            return True

    def update(
        self,
        key: str,
        expect_owner: str | None,
        expect_counter: int,
        set_fields: Mapping[str, Any],
        remove_fields: Iterable[str] = (),
        check_owner: bool = True,
    ) -> Row | None:
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
        with self._lock:
            self._rows.pop(key, None)

    def size(self) -> int:
        with self._lock:
            return len(self._rows)


class InProcessLeaseStore(BaseLeaseStore):
    """A lease store whose rows live in this process (a dict and a lock); no Ray, no I/O.

    For unit tests of code that uses a :class:`~kinesis_actors.leases.LeaseStore`.
    :meth:`peer` returns a store over the same rows with its own observation table
    (another "host"). A pickled copy is a snapshot with its own rows.

    Args:
        rows: rows to share with another store (internal; default: a new empty table).
        clock: monotonic clock, seconds (judges expiry).
        wall_clock: epoch clock, seconds (informational ``lease_expiry`` only).

    Example:
        >>> store = InProcessLeaseStore()
        >>> lease = store.take("orders", "shardId-000000000000", owner="a", duration_s=10.0)
        >>> store.checkpoint(lease, "1").checkpoint
        '1'
    """

    def __init__(
        self,
        rows: _LocalRows | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(clock=clock, wall_clock=wall_clock)
        self._rows = rows if rows is not None else _LocalRows()

    def __repr__(self) -> str:
        return f"InProcessLeaseStore(rows={self._rows.size()})"

    def _read(self, key: str) -> Row | None:
        return self._rows.read(key)

    def _scan(self, stream: str) -> list[Row]:
        return self._rows.scan(stream)

    def _put_new(self, item: Row) -> bool:
        return self._rows.put_new(item)

    def _update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
                remove_fields: Iterable[str] = (), *, check_owner: bool = True) -> Row | None:
        return self._rows.update(key, expect_owner, expect_counter, set_fields, tuple(remove_fields), check_owner)

    def _delete(self, key: str) -> None:
        self._rows.delete(key)


class MemoryLeaseTable(_LocalRows):
    """The Ray actor body of :class:`MemoryLeaseStore`: one lease table in a dict.

    Run with ``max_concurrency=1`` (the default for a synchronous actor), so each call
    is atomic; the lock of ``_LocalRows`` is then uncontended.
    """

    def call(self, operation: str, *args: Any) -> Any:
        """Run one primitive (``read``, ``scan``, ``put_new``, ``update``, ``delete``, ``size``).

        Raises:
            ValueError: an unknown operation.
        """
        if operation not in _OPERATIONS:
            raise ValueError(f"unknown lease-table operation {operation!r}")
        return getattr(self, operation)(*args)

    def call_many(self, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Run several primitives in order, each atomic (one actor call for a whole group).

        Returns:
            One result per call; a call that raised gives its exception instead (the others still run).
        """
        results: list[Any] = []
        for operation, args in calls:
            try:
                results.append(self.call(operation, *args))
            except Exception as e:  # a bad operation: that caller's error only
                results.append(e)
        return results


_OPERATIONS = frozenset({"read", "scan", "put_new", "update", "delete", "size"})
_Call = tuple[str, tuple[Any, ...]]  # (operation, its arguments)


class _Waiter:
    """One primitive waiting in a :class:`_GroupCalls` queue."""

    __slots__ = ("call", "done", "error", "lead", "result")

    def __init__(self, call: tuple[str, tuple[Any, ...]]) -> None:
        self.call = call
        self.done = threading.Event()
        self.lead = False  # woken to send the next group rather than with a result
        self.result: Any = None
        self.error: BaseException | None = None


class _GroupCalls:
    """Group commit: the primitives this process's threads call at the same time go to the
    table actor as ONE actor call (``call_many``).

    A call finding no group in flight sends at once, alone (no added latency); calls arriving
    while a group is in flight queue, and the first of them sends the whole queue as soon as
    that group returns. So a reader renewing many leases from its store threads pays one Ray
    actor call (about 1 ms of CPU on each side here) per group rather than per lease.
    A call waits for the group before its own and then its own, each bounded by the actor
    call's timeout.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Waiter] = []
        self._busy = False
        self.groups = 0  # actor calls sent
        self.calls = 0  # primitives they carried

    def run(self, call: _Call, send: Callable[[list[_Call]], list[Any]]) -> Any:
        """Run ``call`` within a group; ``send(calls)`` makes the actor call (raises for the whole group).

        Raises:
            whatever ``send`` raised for the group; the primitive's own exception.
        """
        me = _Waiter(call)
        with self._lock:
            self._queue.append(me)
            lead = not self._busy
            self._busy = True
        if not lead:
            me.done.wait()
            if not me.lead:
                if me.error is not None:
                    raise me.error
                return me.result
        with self._lock:
            group, self._queue = self._queue, []
        try:
            results = send([w.call for w in group])
            for w, r in zip(group, results):
                w.error, w.result = (r, None) if isinstance(r, Exception) else (None, r)
        except BaseException as e:  # the whole group failed (timeout, dead actor): every caller gets it
            for w in group:
                w.error = e
        finally:
            with self._lock:
                self.groups += 1
                self.calls += len(group)
                nxt = self._queue[0] if self._queue else None
                if nxt is None:
                    self._busy = False
                else:
                    nxt.lead = True
            for w in group:
                if w is not me:
                    w.done.set()
            if nxt is not None:
                nxt.done.set()
        if me.error is not None:
            raise me.error
        return me.result


_REMOTE_CLASS: Any = None
_REMOTE_LOCK = threading.Lock()


def _remote_class() -> Any:
    """``ray.remote(MemoryLeaseTable)``, built once per process (keeps ``import`` free of Ray)."""
    global _REMOTE_CLASS
    with _REMOTE_LOCK:
        if _REMOTE_CLASS is None:
            import ray

            _REMOTE_CLASS = ray.remote(num_cpus=0, max_restarts=0)(MemoryLeaseTable)
        return _REMOTE_CLASS


class MemoryLeaseStore(BaseLeaseStore):
    """The broker's default lease store: the rows live in one Ray actor (``MemoryLeaseTable``).

    The actor is a named actor (not detached: ``lifetime=None``; ``num_cpus=0``) in the
    ``kinesis_actors`` namespace, created on first use with ``get_if_exists=True``
    (starting a local Ray runtime if none is running, as any Ray call does); its name is
    generated once in the constructor, so every pickled copy of this store, in any
    process, reaches the same actor. Call
    :meth:`open` in the driver to create it there (its owner is then the driver, not a
    short-lived worker): a Ray actor dies with the process that created it.
    :meth:`close` kills it. This class owns the actor's lifecycle; users never call
    ``ray.kill`` on it.

    Suits one instance (one broker): the table is not shared with other Ray clusters
    or jobs of other instances, and it is empty after a restart, so every shard then
    opens at its ``start_at`` (default ``LATEST``). Use
    :class:`~kinesis_actors.leases.DynamoLeaseStore` to share shards between instances
    or to keep checkpoints across restarts.

    Each actor call waits at most ``call_timeout_s``. Errors: a timeout or an unavailable
    actor -> ``LeaseStoreError(retriable=True)``; a dead actor (closed, or its owner
    process died: the rows are gone) -> ``LeaseStoreError(retriable=False)``.

    Args:
        clock: monotonic clock, seconds (judges expiry).
        wall_clock: epoch clock, seconds (informational ``lease_expiry`` only).
        call_timeout_s: longest wait for one actor call, seconds (default 10).

    Example:
        >>> store = MemoryLeaseStore().open()  # in the driver, after ray.init()
        >>> lease = store.take("orders", "shardId-000000000000", owner="a", duration_s=10.0)
        >>> store.close()
    """

    _TRANSIENT = ("_actor", "_actor_lock", "_group")

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        call_timeout_s: float = 10.0,
    ) -> None:
        if isinstance(call_timeout_s, bool) or not isinstance(call_timeout_s, (int, float)) or not call_timeout_s > 0:
            raise InvalidError(f"call_timeout_s must be a positive number of seconds, got {call_timeout_s!r}")
        self._name = f"kinesis_actors-leases-{uuid.uuid4().hex}"
        self._call_timeout_s = float(call_timeout_s)
        self._closed = False
        super().__init__(clock=clock, wall_clock=wall_clock)

    def _init_transient(self) -> None:
        super()._init_transient()
        self._actor: Any = None
        self._actor_lock = threading.Lock()
        self._group = _GroupCalls()

    @property
    def name(self) -> str:
        """The Ray actor name of this store's table (in namespace ``kinesis_actors``)."""
        return self._name

    def __repr__(self) -> str:
        return f"MemoryLeaseStore(name={self._name!r})"

    # ------------------------------------------------------------------ lifecycle
    def _handle(self) -> Any:
        if self._closed:
            raise LeaseStoreError(f"memory lease store {self._name!r} is closed", retriable=False)
        with self._actor_lock:
            if self._actor is None:
                try:
                    self._actor = (
                        _remote_class()
                        .options(
                            name=self._name,
                            namespace=ACTOR_NAMESPACE,
                            get_if_exists=True,
                            lifetime=None,
                        )
                        .remote()
                    )
                except Exception as e:  # ray errors: GCS unreachable, not initialised...
                    raise LeaseStoreError(
                        f"memory lease store {self._name!r}: cannot reach its actor: {type(e).__name__}: {e}",
                        retriable=True,
                    ) from e
            return self._actor

    def open(self) -> MemoryLeaseStore:
        """Create the table actor now (owned by the calling process) and wait until it answers.

        Returns:
            This store.

        Raises:
            LeaseStoreError: the actor did not answer within ``call_timeout_s``, or the
                store was closed.
        """
        self._call("size")
        return self

    def close(self) -> None:
        """Kill the table actor (its rows are lost); idempotent.

        Later calls on this store raise ``LeaseStoreError``; other copies get
        ``LeaseStoreError`` once they notice the actor is gone.
        """
        if self._closed:
            return
        self._closed = True
        import ray

        with self._actor_lock:
            actor, self._actor = self._actor, None
        try:
            if actor is None and ray.is_initialized():
                actor = ray.get_actor(self._name, namespace=ACTOR_NAMESPACE)
            if actor is not None:
                ray.kill(actor, no_restart=True)
        except ValueError:
            pass  # never created
        except Exception:  # pragma: no cover - best effort
            logger.warning("memory lease store %s: could not kill its actor", self._name, exc_info=True)

    def _call(self, operation: str, *args: Any) -> Any:
        if operation not in _OPERATIONS:
            raise ValueError(f"unknown lease-table operation {operation!r}")
        actor = self._handle()
        return self._group.run((operation, args), lambda calls: self._send(actor, calls))

    def _send(self, actor: Any, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """One actor call for a group of primitives; a Ray error becomes the group's LeaseStoreError."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        operation = "+".join(sorted({op for op, _ in calls}))
        try:
            results: list[Any] = ray.get(actor.call_many.remote(calls), timeout=self._call_timeout_s)
            return results
        except GetTimeoutError as e:
            raise LeaseStoreError(
                f"memory lease store {self._name!r}: {operation} timed out after {self._call_timeout_s} s",
                retriable=True,
            ) from e
        except ActorUnavailableError as e:  # subclass of RayActorError: maybe back soon
            raise LeaseStoreError(
                f"memory lease store {self._name!r}: actor unavailable during {operation}", retriable=True
            ) from e
        except RayActorError as e:
            raise LeaseStoreError(
                f"memory lease store {self._name!r}: its actor is gone (closed, or its owner process died); "
                "the rows are lost",
                retriable=False,
            ) from e
        except ray.exceptions.RayError as e:
            raise LeaseStoreError(
                f"memory lease store {self._name!r}: {operation} failed: {type(e).__name__}", retriable=True
            ) from e

    # ------------------------------------------------------------------ primitives
    def _read(self, key: str) -> Row | None:
        row: Row | None = self._call("read", key)
        return row

    def _scan(self, stream: str) -> list[Row]:
        rows: list[Row] = self._call("scan", stream)
        return rows

    def _put_new(self, item: Row) -> bool:
        return bool(self._call("put_new", item))

    def _update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
                remove_fields: Iterable[str] = (), *, check_owner: bool = True) -> Row | None:
        row: Row | None = self._call(
            "update", key, expect_owner, expect_counter, dict(set_fields), tuple(remove_fields), check_owner
        )
        return row

    def _delete(self, key: str) -> None:
        self._call("delete", key)
