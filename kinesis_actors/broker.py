"""KinesisBroker (the handle users hold), Subscription and SeekHandle.

Lifecycle: ``KinesisBroker(...)`` records configuration (no I/O) -> ``connect()`` builds
the settings, the lease store and the owner id and starts Ray if it is not running ->
``subscribe(KinesisStream(...), sink=...)`` -> ``shutdown()`` closes every subscription
(checkpoint, release) and marks the connection closed.

Example::

    from kinesis_actors import KinesisBroker, KinesisStream, StartAt

    with KinesisBroker(endpoint=url, region="us-east-1", test_credentials=True).connect() as conn:
        conn.publisher("orders").put(b"hello", partition_key="k")
        with conn.subscribe(KinesisStream("orders", start_at=StartAt.trim_horizon())) as sub:
            for batch in sub:
                ...
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .aws import AwsSettings
from .config import KinesisStream, positive_duration, validate_stream_name
from .connection import ConnectionState
from .delivery.options import check_picklable_filter, check_sink_mode
from .errors import InvalidError, KinesisError, NotConnectedError
from .kinesis import ensure_stream
from .leases.protocol import Lease, LeaseStore
from .publisher import Publisher
from .records import Record, StartAt
from .supervision import RayCoordinatorRef, Supervisor

__all__ = ["KinesisBroker", "Subscription", "SeekHandle"]

log = logging.getLogger(__name__)

_RAY_CALL_TIMEOUT_S = 60.0
_FIRST_PASS_ATTEMPTS = 3  # Coordinators started for one first pass before subscribe() gives up
_STORE_METHODS = ("bind", "open", "close", "take", "renew", "checkpoint", "set_start_position", "release", "get",
                  "list", "is_expired", "snapshot", "request_handoff", "withdraw_handoff", "hand_over",
                  "force_handoff", "heartbeat", "instances", "remove_presence")
_START_MARGIN_S = 30.0  # beyond start_timeout_s, for the Coordinator to report why its first pass missed it


def _unwrap(e: BaseException) -> BaseException:
    """The user-facing error inside a Ray ``RayTaskError`` (our KinesisError family), else ``e``."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


class KinesisBroker:
    """Configuration of one instance: AWS access, the lease store, the owner id, lease timing.

    The constructor does no I/O. ``copy.copy(broker)`` shares its connection.

    Args:
        endpoint: endpoint URL for Kinesis and DynamoDB (an emulator), or None for AWS.
        region: AWS region, or None for boto3's default chain.
        test_credentials: fixed dummy keys, for emulators.
        lease_store: a ``LeaseStore``; default a new ``MemoryLeaseStore`` (one instance,
            empty after a restart). A ``DynamoLeaseStore`` inherits the broker's endpoint,
            region and credentials where it has none of its own.
        owner_id: this instance's lease owner id; default host name + random suffix.
        lease_duration_s: lease duration, seconds (10.0); any positive value.
        renew_interval_s: renewal interval, seconds (3.0); must be below the duration.

    Raises:
        InvalidError: a bad value (before any I/O).
    """

    def __init__(self, *, endpoint: str | None = None, region: str | None = None, test_credentials: bool = False,
                 lease_store: LeaseStore | None = None, owner_id: str | None = None,
                 lease_duration_s: float = 10.0, renew_interval_s: float = 3.0,
                 _credentials: tuple[str, str, str | None] | None = None, _profile: str | None = None) -> None:
        if endpoint is not None and (not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))):
            raise InvalidError(f"endpoint must be an http(s) URL, got {endpoint!r}")
        if owner_id is not None and (not isinstance(owner_id, str) or not owner_id.strip()):
            raise InvalidError(f"owner_id must be a non-empty string, got {owner_id!r}")
        self.lease_duration_s = positive_duration("lease_duration_s", lease_duration_s)
        self.renew_interval_s = positive_duration("renew_interval_s", renew_interval_s)
        if self.renew_interval_s >= self.lease_duration_s:
            raise InvalidError(f"renew_interval_s ({renew_interval_s}) must be shorter than "
                               f"lease_duration_s ({lease_duration_s})")
        if lease_store is not None and not isinstance(lease_store, LeaseStore):
            missing = sorted(m for m in _STORE_METHODS if not callable(getattr(lease_store, m, None)))
            raise InvalidError(f"lease_store must be a LeaseStore (missing {', '.join(missing)}), got {lease_store!r}")
        self._aws = AwsSettings(endpoint=endpoint, region=region, test_credentials=bool(test_credentials),
                                credentials=_credentials, profile=_profile)
        self._lease_store = lease_store
        self._owner_id = owner_id
        self._state = ConnectionState()
        self._state_extra: dict[str, Any] = {}

    @classmethod
    def from_session(cls, session: Any, **kwargs: Any) -> KinesisBroker:
        """A broker that takes a ``boto3.Session`` as it is (its credentials, region and profile).

        The session's credentials are frozen now (``get_frozen_credentials``) so they can
        be handed to Ray actors; no network call is made for static credentials.
        """
        creds = session.get_credentials()
        frozen = creds.get_frozen_credentials() if creds is not None else None
        kwargs.setdefault("region", session.region_name)
        return cls(_credentials=(frozen.access_key, frozen.secret_key, frozen.token) if frozen else None, **kwargs)

    def __repr__(self) -> str:
        state = "closed" if self._state.closed else "connected" if self._state.aws else "new"
        return f"KinesisBroker(endpoint={self._aws.endpoint!r}, region={self._aws.region!r}, {state})"

    # ------------------------------------------------------------------ lifecycle
    @property
    def owner_id(self) -> str | None:
        """This instance's lease owner id (set by ``connect()`` unless given)."""
        return self._state_extra.get("owner_id", self._owner_id)

    @property
    def lease_store(self) -> LeaseStore | None:
        """The lease store in use (built by ``connect()`` unless given)."""
        return self._state_extra.get("store", self._lease_store)

    def inject_faults(self, injector: Any) -> KinesisBroker:
        """Route every Kinesis call of this broker's clients through a test fault injector.

        For tests: ``kinesis_actors.testing.with_faults`` is the entry point. Every
        Kinesis client built from this broker's settings (the driver's, the
        Coordinator's, each ShardReader's) carries the injector's botocore hooks.

        Args:
            injector: a ``kinesis_actors.testing.FaultInjector`` (picklable), or None to
                remove one.

        Returns:
            self.

        Raises:
            InvalidError: the broker is already connected (the settings are fixed then).
        """
        if self._state.aws is not None:
            raise InvalidError("inject_faults() must be called before connect()")
        self._aws = dataclasses.replace(self._aws, faults=injector)
        return self

    def connect(self) -> KinesisBroker:
        """Build the settings, the lease store and the owner id; start Ray if it is not running.

        Idempotent: a second call returns the same connection. Credentials are fetched
        lazily by boto3, so a bad credential fails the first ``subscribe``, not this.

        Returns:
            This broker, connected (also usable as a context manager that shuts down).

        Raises:
            NotConnectedError: the broker was shut down.
        """
        state = self._state
        with state.lock:
            if state.closed:
                raise NotConnectedError("this broker was shut down; create a new KinesisBroker")
            if state.aws is not None:
                return self
            import ray

            if not ray.is_initialized():
                ray.init(configure_logging=False)
            store = self._lease_store
            owned_store = store is None
            if store is None:
                from .leases.memory import MemoryLeaseStore

                store = MemoryLeaseStore()
            store = store.bind(self._aws).open()
            self._state_extra.update(store=store, owned_store=owned_store,
                                     owner_id=self._owner_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
            state.aws = self._aws
            log.info("connected: owner id %s, lease store %r", self.owner_id, store)
        return self

    def __copy__(self) -> KinesisBroker:
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)  # shares _state and _state_extra: one connection
        return clone

    def __enter__(self) -> KinesisBroker:
        return self.connect()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Close every open subscription (checkpoint what was acknowledged, release the leases),
        then mark the connection closed. Later publisher and seek calls raise ``NotConnectedError``.
        Idempotent; returns None."""
        state = self._state
        with state.lock:
            if state.closed:
                return None
            subs = list(state.subscriptions.values())
        for sub in subs:
            try:
                sub.close()
            except Exception as e:  # reported, never swallowed silently
                log.warning("closing the subscription to %s at shutdown: %r", sub.stream.name, e)
        with state.lock:
            state.closed = True
            store = self._state_extra.get("store")
            if self._state_extra.get("owned_store") and store is not None:
                try:
                    store.close()
                except Exception:
                    log.debug("closing the memory lease store failed", exc_info=True)
        return None

    def deregister_stream_consumer(self, stream: str, consumer_name: str) -> bool:
        """Deregister the enhanced fan-out stream consumer ``consumer_name`` of ``stream``
        (``DeregisterStreamConsumer``): the explicit call, as closing a subscription never
        does it (KCL neither). Every subscription still reading through it loses its
        ``SubscribeToShard`` streams. Returns False if it did not exist.

        Raises:
            InvalidError: a malformed stream name. NotConnectedError: not connected.
            StreamError: the stream does not exist. KinesisError: another error, translated.
        """
        from .fanout import deregister_stream_consumer

        return deregister_stream_consumer(self._state.client("kinesis"), validate_stream_name(stream), consumer_name)

    # ------------------------------------------------------------------ handles
    def publisher(self, stream: str) -> Publisher:
        """A :class:`Publisher` for ``stream``; may be taken before ``connect()``.

        Raises:
            InvalidError: a malformed stream name.
        """
        return Publisher(stream, self._state)

    def seek_handle(self, stream: str) -> SeekHandle:
        """A :class:`SeekHandle` for ``stream``. Raises InvalidError for a malformed name."""
        return SeekHandle(validate_stream_name(stream), self._state)

    def subscribe(self, stream: KinesisStream, sink: Any = None, *, start_timeout_s: float = 120.0) -> Subscription:
        """Open a subscription: validate, ``DescribeStreamSummary`` (or ``CreateStream`` and wait
        up to 60 s), then the Coordinator's first pass. Returns once every shard leased by the
        first pass holds its first iterator, so with ``LATEST`` a record published after this
        returns is delivered.

        Args:
            stream: a :class:`KinesisStream`.
            sink: push mode: a Ray actor handle (its ``process_batch(records)``, or
                ``KinesisStream.sink_method``, is called with each batch; returning is the
                acknowledgement), or any :class:`~kinesis_actors.sinks.Sink` (an object with
                ``deliver(records)``, e.g. a ``DatasetSink``). None: pull mode (``next_batch``,
                iteration).
            start_timeout_s: longest wait for the first pass, seconds (the default covers
                128 shards on one 2-core node with room to spare).

        Returns:
            The :class:`Subscription`. An error of the first pass other than a start
            failure (``ListShards``, the lease table, a deleted stream) is reported by it
            (``next_batch``, iteration, ``wait``, ``close``), not raised here.

        Raises:
            InvalidError: not a KinesisStream, a sink that is neither an actor with the
                method nor a Sink, ``bisect_on_error`` or ``parallelization_factor > 1`` in pull
                mode, a ``record_filter`` Ray cannot serialise, or a stream this broker already
                reads (before any AWS call).
            NotConnectedError: not connected, or shut down.
            StreamError: the stream does not exist (and ``create_if_missing`` is unset), or
                authentication failed.
            StartError: not every shard leased by the first pass was open within
                ``start_timeout_s`` (readers slow or failing to start); the message says
                how many were and why. The leases taken are released.
        """
        if not isinstance(stream, KinesisStream):
            raise InvalidError(f"subscribe() takes a KinesisStream, got {stream!r}")
        start_timeout_s = positive_duration("start_timeout_s", start_timeout_s)
        check_sink_mode(stream, sink)  # bisect / parallelism need a push sink
        check_picklable_filter(stream.record_filter)
        if sink is not None:
            from .sinks import as_sink

            sink = as_sink(sink, stream.sink_method)
        state = self._state
        aws = state.require()
        with state.lock:
            if stream.name in state.subscriptions:
                raise InvalidError(f"this broker already reads stream {stream.name!r}; one subscription per stream")
            state.subscriptions[stream.name] = None  # type: ignore[assignment]  # reserved
        try:
            ensure_stream(state.client("kinesis"), stream.name, create_shards=stream.create_if_missing)
            sub = Subscription(self, stream, sink, aws=aws, start_timeout_s=start_timeout_s)
        except BaseException:
            with state.lock:
                state.subscriptions.pop(stream.name, None)
            raise
        with state.lock:
            state.subscriptions[stream.name] = sub
        return sub


class Subscription:
    """One stream read by one broker: a Coordinator actor and its ShardReaders.

    Pull mode (``sink=None``): ``next_batch``, ``ack``, iteration, ``next_batch_async`` and
    ``async for``. Push mode: batches go to the sink actor; use ``wait``.
    Both: ``leases()``, ``stats()``, ``close()``, and use as a context manager.

    The handle watches its Coordinator and starts a new one if it dies; the new one
    re-takes this owner's leases and resumes after the checkpoints.
    """

    def __init__(self, broker: KinesisBroker, stream: KinesisStream, sink: Any, *, aws: AwsSettings,
                 start_timeout_s: float) -> None:
        from .sinks.pull import make_pull_queue

        self.stream = stream
        self.owner_id: str = broker.owner_id  # type: ignore[assignment]
        self._broker = broker
        self._store: LeaseStore = broker.lease_store  # type: ignore[assignment]
        self._aws = aws
        self._sink = sink
        self._queue = make_pull_queue() if sink is None else None
        self._closed = False
        self._error: BaseException | None = None
        self._lock = threading.RLock()
        self._supervisor = Supervisor(self._spawn, name=stream.name, start_timeout_s=start_timeout_s,
                                      period_s=max(0.2, min(1.0, broker.renew_interval_s / 2)),
                                      attempts=_FIRST_PASS_ATTEMPTS)
        try:
            self._supervisor.start()
        except BaseException:
            self._closed = True
            self._discard(self._queue)
            raise
        self._watchdog = threading.Thread(target=self._supervisor.run, name=f"ka-watch-{stream.name}", daemon=True)
        self._watchdog.start()

    def __repr__(self) -> str:
        return f"Subscription({self.stream.name!r}, owner={self.owner_id!r}, {'closed' if self._closed else 'open'})"

    # ------------------------------------------------------------------ coordinator
    @property
    def coordinator_restarts(self) -> int:
        """How many Coordinators replaced one that died (in its first pass or later)."""
        return self._supervisor.restarts

    def _spawn(self) -> RayCoordinatorRef:
        """A new Coordinator actor (``stream.coordinator_options``), not started yet."""
        from .coordinator import Coordinator

        broker = self._broker
        actor = Coordinator.options(**self.stream.coordinator_actor_options()).remote(
            self.stream, self._aws, self._store, self.owner_id, broker.lease_duration_s,
            broker.renew_interval_s, self._sink, self._queue)
        return RayCoordinatorRef(actor, call_timeout_s=_RAY_CALL_TIMEOUT_S, start_margin_s=_START_MARGIN_S)

    @property
    def _coordinator(self) -> Any:
        """The actor handle of the Coordinator in charge now."""
        current = self._supervisor.current
        assert isinstance(current, RayCoordinatorRef)
        return current.actor

    def _call(self, method: str, *args: Any, timeout_s: float = _RAY_CALL_TIMEOUT_S) -> Any:
        import ray

        try:
            return ray.get(getattr(self._coordinator, method).remote(*args), timeout=timeout_s)
        except Exception as e:
            raise _unwrap(e) from None

    def _raise_parked(self) -> None:
        if self._error is None and not self._closed:
            try:
                self._error = self._call("error", timeout_s=10)
            except KinesisError:
                raise
            except Exception:
                pass
        if self._error is not None:
            raise self._error

    # ------------------------------------------------------------------ pull mode
    def _require_pull(self) -> Any:
        if self._queue is None:
            raise InvalidError("next_batch/ack/iteration are for pull mode (sink=None); "
                               "this subscription pushes to a sink")
        return self._queue

    def next_batch(self, timeout_s: float = 5.0) -> list[Record]:
        """The next batch (records of one shard, in sequence order), or ``[]`` after ``timeout_s``.

        Asking for the next batch acknowledges the previous one (its checkpoint is then
        written); a ``[]`` acknowledges nothing.

        Raises:
            The subscription's parked error (``SinkError``, ``StreamError``, ``LeaseStoreError``...).
            InvalidError: in push mode, or after ``close()``.
        """
        import ray

        queue = self._require_pull()
        if self._closed:
            self._raise_parked()
            raise InvalidError("this subscription is closed")
        try:
            batch = ray.get(queue.next.remote(float(timeout_s), True), timeout=float(timeout_s) + _RAY_CALL_TIMEOUT_S)
        except Exception as e:
            raise _unwrap(e) from None
        if batch is None:
            self._raise_parked()
            return []
        records: list[Record] = batch
        return records

    def ack(self) -> None:
        """Acknowledge the batch last returned, now (its reader checkpoints it)."""
        import ray

        ray.get(self._require_pull().ack.remote(), timeout=_RAY_CALL_TIMEOUT_S)

    def __iter__(self) -> Iterator[list[Record]]:
        """Blocking iteration over batches until the subscription closes (raises its error)."""
        while not self._closed:
            batch = self.next_batch(timeout_s=1.0)
            if batch:
                yield batch

    async def next_batch_async(self, timeout_s: float = 5.0) -> list[Record]:
        """The asyncio twin of :meth:`next_batch`."""
        queue = self._require_pull()
        if self._closed:
            raise InvalidError("this subscription is closed")
        try:
            batch = await queue.next.remote(float(timeout_s), True)
        except Exception as e:
            raise _unwrap(e) from None
        if batch is None:
            self._raise_parked()
            return []
        records: list[Record] = batch
        return records

    async def __aiter__(self) -> AsyncIterator[list[Record]]:
        while not self._closed:
            batch = await self.next_batch_async(timeout_s=1.0)
            if batch:
                yield batch

    # ------------------------------------------------------------------ both modes
    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the subscription fails or closes, and raise its error.

        Returns:
            True if it closed without error, False if ``timeout_s`` passed first.
        Raises:
            The parked fatal error (``SinkError``, ``StreamError``...).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._closed:
            left = 5.0 if deadline is None else min(5.0, deadline - time.monotonic())
            if left <= 0:
                return False
            try:
                ended = self._call("wait", left, timeout_s=left + _RAY_CALL_TIMEOUT_S)
            except KinesisError:
                raise
            except Exception:
                ended = False
                time.sleep(min(0.2, left))  # the Coordinator is being restarted
            if ended:
                break
        self._raise_parked()
        return True

    def leases(self) -> list[Lease]:
        """This subscription's rows of the lease table (a consistent read of the table)."""
        return [lease for lease in self._store.list(self.stream.name) if lease.owner == self.owner_id]

    def stats(self) -> dict[str, Any]:
        """This subscription's figures, from its Coordinator and readers (plain data).

        * ``shards``: per shard id: records, bytes, batches, get_records_calls, throttles,
          expired_iterators, sink_failures, ``millis_behind_latest`` (ms), checkpoint,
          checkpoint_age_s, lease_counter, state (a ``ConsumerState`` value), and where
          its reader runs (``reader`` number, ``node_id``: Ray node id hex, ``pid``).
        * ``readers``: per ShardReader process: reader, pid, node_id, shards,
          buffered_bytes / peak_buffered_bytes / max_buffered_bytes (the byte budget),
          budget_waits, kinesis_call_limit and its cuts.
        * ``coordinator``: its pid and node_id.
        * This instance's lease counts: leases_held, leases_taken, leases_lost,
          readers_replaced, shards_rehomed, shards_ended, reader_start_failures and the
          handoff counters; target and live_instances of the balancing plan.
        """
        figures: dict[str, Any] = self._call("stats")
        return figures

    def close(self, *, ack: bool = True) -> None:
        """Stop the readers, checkpoint what was acknowledged, release the leases.

        In pull mode the batch last returned is acknowledged first unless ``ack=False``
        (leaving a ``with`` block on an exception acknowledges nothing more).
        Idempotent. Raises the subscription's parked error, if any, after closing.
        """
        import ray

        with self._lock:
            if self._closed:
                return
            self._closed = True
        coordinator = self._supervisor.stop()  # no restart from now on
        try:
            if self._queue is not None and ack:
                try:
                    ray.get(self._queue.ack.remote(), timeout=10)
                except Exception:
                    log.debug("ack at close failed", exc_info=True)
            grace = 5.0 if self._queue is None else 0.5
            try:
                self._error = self._error or self._call("error", timeout_s=10)
            except Exception as e:
                self._error = e if isinstance(e, KinesisError) else None
            try:
                if coordinator is not None:
                    coordinator.close(True, grace)
            except Exception as e:
                log.warning("%s: closing the Coordinator failed (%r); leases will expire", self.stream.name, e)
        finally:
            if coordinator is not None:
                coordinator.kill()
            self._discard(self._queue)
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Stop as if this process had crashed, for failover drills and tests: the
        Coordinator and its readers are killed at once; nothing more is acknowledged,
        checkpointed or released. The leases stay with this owner id until they expire
        (``lease_duration_s``), then other instances take them and re-deliver the batches
        that were in flight (at-least-once). Idempotent; the subscription is closed after."""
        import ray

        with self._lock:
            self._closed = True
        coordinator = self._supervisor.stop()
        # Readers die with their Coordinator (Ray fate sharing), but that can lag by seconds
        # on a loaded machine while they keep renewing: kill them first, so the crash is whole.
        try:
            readers = list(ray.get(self._coordinator.reader_handles.remote(), timeout=10).values())
        except Exception:
            readers = []
        self._discard(*readers, self._queue)
        if coordinator is not None:
            coordinator.kill()

    def _discard(self, *actors: Any) -> None:
        """Kill ``actors`` (None and already-dead ones are fine) and forget this subscription."""
        import ray

        for actor in actors:
            if actor is not None:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:
                    pass
        state = self._broker._state
        with state.lock:
            if state.subscriptions.get(self.stream.name) is self:
                del state.subscriptions[self.stream.name]

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            try:
                self.close(ack=False)
            except Exception:
                log.debug("error while closing after an exception", exc_info=True)


class SeekHandle:
    """Moves the shards this broker reads of one stream to another position.

    ``seek`` is the one operation that moves a stored checkpoint backwards: the
    checkpoint is cleared and ``start_position`` rewritten, so a restart reopens there too.
    """

    def __init__(self, stream: str, state: ConnectionState) -> None:
        self.stream = stream
        self._state = state

    def seek(self, start_at: StartAt, shard_id: str | None = None) -> list[str]:
        """Reopen the shards this broker holds now (or only ``shard_id``) at ``start_at``.

        Args:
            start_at: the new position; ``at_sequence_number``/``after_sequence_number``
                need ``shard_id``.
            shard_id: one shard, or None for every shard held now.

        Returns:
            The shard ids that were moved (those this broker holds now).

        Raises:
            NotConnectedError: the broker is not connected or was shut down.
            InvalidError: not a StartAt, or a sequence-number position without shard_id.
        """
        self._state.require()
        if not isinstance(start_at, StartAt):
            raise InvalidError(f"seek() takes a StartAt, got {start_at!r}")
        if start_at.needs_shard and shard_id is None:
            raise InvalidError(f"{start_at.kind} names one shard's sequence number: pass shard_id")
        sub = self._state.subscriptions.get(self.stream)
        if sub is None:
            return []
        moved: list[str] = sub._call("seek", start_at, shard_id)
        return moved
