"""In-memory lease stores: :class:`MemoryLeaseStore` (rows in one Ray actor) and an in-process one.

Both keep the DynamoDB row layout (see :mod:`kinesis_actors.leases.protocol`) in a
:class:`~kinesis_actors.leases.rows.LocalRows` dict, each call atomic under a lock; the lease
rules are :class:`~kinesis_actors.leases.rules.LeaseRules`'s.

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
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..clock import Clock, WallClock, monotonic_s, wall_s
from ..errors import InvalidError, LeaseStoreError
from .rows import LocalRows, Row
from .rules import LeaseRules

__all__ = ["MemoryLeaseStore", "InProcessLeaseStore", "MemoryRows", "ACTOR_NAMESPACE"]

logger = logging.getLogger(__name__)

ACTOR_NAMESPACE = "kinesis_actors"
"""Ray namespace of the lease-table actors, so a handle finds its actor from any job."""


class MemoryLeaseTable(LocalRows):
    """The Ray actor body of :class:`MemoryLeaseStore`: one lease table in a dict.

    Run with ``max_concurrency=1`` (the default for a synchronous actor), so each call
    is atomic; the lock of ``LocalRows`` is then uncontended.
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


class MemoryRows:
    """The rows of a :class:`MemoryLeaseStore`: a client of its ``MemoryLeaseTable`` Ray actor.

    Every call is one primitive of :class:`~kinesis_actors.leases.rows.LocalRows` run in the
    actor (atomic there: the actor runs one call at a time); calls made by this process's
    threads at the same time travel in one actor call (:class:`_GroupCalls`). Picklable: a
    copy finds the actor by its name.

    Args:
        name: the actor's name (namespace ``kinesis_actors``).
        call_timeout_s: longest wait for one actor call, seconds.
    """

    presence = True

    def __init__(self, name: str, call_timeout_s: float) -> None:
        self.name = name
        self.call_timeout_s = call_timeout_s
        self.closed = False
        self._init_handle()

    def _init_handle(self) -> None:
        self._actor: Any = None
        self._actor_lock = threading.Lock()
        self._group = _GroupCalls()

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "call_timeout_s": self.call_timeout_s, "closed": self.closed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_handle()

    def peer(self) -> MemoryRows:
        """A new client of the same actor (no I/O)."""
        other = object.__new__(MemoryRows)
        other.__setstate__(self.__getstate__())
        return other

    def _handle(self) -> Any:
        if self.closed:
            raise LeaseStoreError(f"memory lease store {self.name!r} is closed", retriable=False)
        with self._actor_lock:
            if self._actor is None:
                try:
                    self._actor = _remote_class().options(name=self.name, namespace=ACTOR_NAMESPACE,
                                                          get_if_exists=True, lifetime=None).remote()
                except Exception as e:  # ray errors: GCS unreachable, not initialised...
                    raise LeaseStoreError(f"memory lease store {self.name!r}: cannot reach its actor: "
                                          f"{type(e).__name__}: {e}", retriable=True) from e
            return self._actor

    def kill(self) -> None:
        """Kill the actor (its rows are lost); idempotent; later calls raise ``LeaseStoreError``."""
        if self.closed:
            return
        self.closed = True
        import ray

        with self._actor_lock:
            actor, self._actor = self._actor, None
        try:
            if actor is None and ray.is_initialized():
                actor = ray.get_actor(self.name, namespace=ACTOR_NAMESPACE)
            if actor is not None:
                ray.kill(actor, no_restart=True)
        except ValueError:
            pass  # never created
        except Exception:  # pragma: no cover - best effort
            logger.warning("memory lease store %s: could not kill its actor", self.name, exc_info=True)

    def call(self, operation: str, *args: Any) -> Any:
        """Run one primitive in the actor (grouped with this process's concurrent calls).

        Raises:
            LeaseStoreError: see :class:`MemoryLeaseStore`. ValueError: an unknown operation.
        """
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
            results: list[Any] = ray.get(actor.call_many.remote(calls), timeout=self.call_timeout_s)
            return results
        except GetTimeoutError as e:
            raise LeaseStoreError(f"memory lease store {self.name!r}: {operation} timed out after "
                                  f"{self.call_timeout_s} s", retriable=True) from e
        except ActorUnavailableError as e:  # subclass of RayActorError: maybe back soon
            raise LeaseStoreError(f"memory lease store {self.name!r}: actor unavailable during {operation}",
                                  retriable=True) from e
        except RayActorError as e:
            raise LeaseStoreError(f"memory lease store {self.name!r}: its actor is gone (closed, or its owner "
                                  "process died); the rows are lost", retriable=False) from e
        except ray.exceptions.RayError as e:
            raise LeaseStoreError(f"memory lease store {self.name!r}: {operation} failed: {type(e).__name__}",
                                  retriable=True) from e

    def read(self, key: str) -> Row | None:
        """See :class:`~kinesis_actors.leases.rows.LeaseTable`."""
        row: Row | None = self.call("read", key)
        return row

    def scan(self, stream: str) -> list[Row]:
        """See :class:`~kinesis_actors.leases.rows.LeaseTable`."""
        rows: list[Row] = self.call("scan", stream)
        return rows

    def put_new(self, row: Row) -> bool:
        """See :class:`~kinesis_actors.leases.rows.LeaseTable`."""
        return bool(self.call("put_new", row))

    def update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
               remove_fields: Iterable[str] = (), check_owner: bool = True) -> Row | None:
        """See :class:`~kinesis_actors.leases.rows.LeaseTable`."""
        row: Row | None = self.call("update", key, expect_owner, expect_counter, dict(set_fields),
                                    tuple(remove_fields), check_owner)
        return row

    def delete(self, key: str) -> None:
        """See :class:`~kinesis_actors.leases.rows.LeaseTable`."""
        self.call("delete", key)


class MemoryLeaseStore(LeaseRules):
    """The broker's default lease store: the rules of :class:`LeaseRules` over rows kept in one
    Ray actor (``MemoryLeaseTable``, reached through :class:`MemoryRows`).

    The actor is a named actor (not detached: ``lifetime=None``; ``num_cpus=0``) in the
    ``kinesis_actors`` namespace, created on first use with ``get_if_exists=True``
    (starting a local Ray runtime if none is running, as any Ray call does); its name is
    generated once in the constructor, so every pickled copy of this store, in any
    process, reaches the same actor. Call :meth:`open` in the driver to create it there
    (its owner is then the driver, not a short-lived worker): a Ray actor dies with the
    process that created it. :meth:`close` kills it. This class owns the actor's
    lifecycle; users never call ``ray.kill`` on it.

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

    Raises:
        InvalidError: a ``call_timeout_s`` that is not a positive number.

    Example:
        >>> store = MemoryLeaseStore().open()  # in the driver, after ray.init()
        >>> lease = store.take("orders", "shardId-000000000000", owner="a", duration_s=10.0)
        >>> store.close()
    """

    def __init__(self, *, clock: Clock = monotonic_s, wall_clock: WallClock = wall_s,
                 call_timeout_s: float = 10.0) -> None:
        if isinstance(call_timeout_s, bool) or not isinstance(call_timeout_s, (int, float)) or not call_timeout_s > 0:
            raise InvalidError(f"call_timeout_s must be a positive number of seconds, got {call_timeout_s!r}")
        super().__init__(MemoryRows(f"kinesis_actors-leases-{uuid.uuid4().hex}", float(call_timeout_s)),
                         clock=clock, wall_clock=wall_clock)

    @property
    def _memory(self) -> MemoryRows:
        assert isinstance(self.rows, MemoryRows)
        return self.rows

    @property
    def name(self) -> str:
        """The Ray actor name of this store's table (in namespace ``kinesis_actors``)."""
        return self._memory.name

    def __repr__(self) -> str:
        return f"MemoryLeaseStore(name={self.name!r})"

    def open(self) -> MemoryLeaseStore:
        """Create the table actor now (owned by the calling process) and wait until it answers.

        Raises:
            LeaseStoreError: the actor did not answer within ``call_timeout_s``, or the store was closed.
        """
        self._memory.call("size")
        return self

    def close(self) -> None:
        """Kill the table actor (its rows are lost); idempotent. Later calls on this store raise
        ``LeaseStoreError``; other copies get it once they notice the actor is gone."""
        self._memory.kill()


class InProcessLeaseStore(LeaseRules):
    """A lease store whose rows live in this process (:class:`~kinesis_actors.leases.rows.LocalRows`);
    no Ray, no I/O. For unit tests of code that uses a :class:`~kinesis_actors.leases.LeaseStore`.

    :meth:`peer` returns a store over the same rows with its own observation table
    (another "host"). A pickled copy is a snapshot with its own rows.

    Args:
        rows: rows to share with another store (default: a new empty table).
        clock: monotonic clock, seconds (judges expiry).
        wall_clock: epoch clock, seconds (informational ``lease_expiry`` only).

    Example:
        >>> store = InProcessLeaseStore()
        >>> lease = store.take("orders", "shardId-000000000000", owner="a", duration_s=10.0)
        >>> store.checkpoint(lease, "1").checkpoint
        '1'
    """

    def __init__(self, rows: LocalRows | None = None, *, clock: Clock = monotonic_s,
                 wall_clock: WallClock = wall_s) -> None:
        super().__init__(rows if rows is not None else LocalRows(), clock=clock, wall_clock=wall_clock)

    @property
    def _rows(self) -> LocalRows:
        """The rows (shared by :meth:`peer` copies and by stores built over them)."""
        assert isinstance(self.rows, LocalRows)
        return self.rows

    def __repr__(self) -> str:
        return f"InProcessLeaseStore(rows={self._rows.size()})"
