"""KinesisBroker: the handle users hold (configuration, connection, subscriptions, publishers).

:class:`~kinesis_actors.subscription.Subscription` and :class:`~kinesis_actors.seek.SeekHandle`
live in their own modules and are importable from here too.

Lifecycle: ``KinesisBroker(...)`` records configuration (no I/O) -> ``connect()`` builds
the settings, the lease store and the owner id (no Ray) ->
``subscribe(KinesisStream(...), sink=...)`` checks the stream, then starts Ray if it is not
running (and opens a lease store that lives in Ray) -> ``shutdown()`` closes every subscription
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
import uuid
from typing import Any

from .aws import AwsSettings
from .config import KinesisStream, positive_duration, validate_stream_name
from .connection import ConnectionState
from .delivery.options import check_picklable_filter, check_sink_mode
from .errors import InvalidError, LeaseStoreError, NotConnectedError
from .kinesis import ensure_stream
from .leases.protocol import LeaseStore
from .publisher import Publisher
from .seek import SeekHandle
from .sinks import as_sink, loaded_table_sink
from .subscription import Subscription

__all__ = ["KinesisBroker", "Subscription", "SeekHandle"]  # the last two live in subscription.py, seek.py

log = logging.getLogger(__name__)

_STORE_METHODS = ("bind", "open", "close", "take", "renew", "checkpoint", "set_start_position", "release", "get",
                  "list", "is_expired", "snapshot", "request_handoff", "withdraw_handoff", "hand_over",
                  "force_handoff", "heartbeat", "instances", "remove_presence")


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
    def connection(self) -> ConnectionState:
        """The connection state this broker shares with its copies, publishers, seek handles
        and subscriptions (settings once connected, ``closed``, the open subscriptions)."""
        return self._state

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
        """Build the settings, the lease store and the owner id. Ray is not started here: the
        first ``subscribe`` starts it (if it is not running) once ``DescribeStreamSummary``
        answered, so a wrong endpoint or a missing stream is named before Ray's start is
        paid. A ``DynamoLeaseStore`` is opened here; the default ``MemoryLeaseStore`` (a Ray
        actor) at that first ``subscribe``.

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
            from .leases.memory import MemoryLeaseStore

            store = self._lease_store
            owned_store = store is None
            if store is None:
                store = MemoryLeaseStore()
            store = store.bind(self._aws)
            in_ray = isinstance(store, MemoryLeaseStore)  # its rows live in a Ray actor: opened with Ray
            if not in_ray:
                store = store.open()
            self._state_extra.update(store=store, owned_store=owned_store, store_opened=not in_ray,
                                     owner_id=self._owner_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
            state.aws = self._aws
            log.info("connected: owner id %s, lease store %r", self.owner_id, store)
        return self

    def _start_ray(self, timeout_s: float, stream: KinesisStream, table_sink: Any) -> float:
        """Start Ray if it is not running (``ray.init()`` with Ray's defaults, at most ``timeout_s``
        seconds: :func:`~kinesis_actors.ray_start.start_ray`) and open a lease store that lives in
        Ray; then start ``table_sink``'s committer for ``stream`` (None: no table sink), staging at
        most the stream's ``max_buffered_bytes`` (one reader's byte budget). Called by ``subscribe``
        after the stream was checked. Returns the seconds Ray's start took; raises ``StartError``
        (saying what Ray was doing) when it took longer."""
        from .ray_start import start_ray

        spent = start_ray(timeout_s)
        with self._state.lock:
            if not self._state_extra.get("store_opened"):
                self._state_extra["store"] = self._state_extra["store"].open()
                self._state_extra["store_opened"] = True
        if table_sink is not None:
            table_sink.start(stream.name, max_staged_bytes=stream.max_buffered_bytes)
        return spent

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
            if self._state_extra.get("owned_store") and self._state_extra.get("store_opened") and store is not None:
                try:
                    store.close()
                except LeaseStoreError as e:  # its actor is gone already: nothing left to release
                    log.info("closing the memory lease store at shutdown: %r", e)
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

        return deregister_stream_consumer(self._state.client("kinesis", max_attempts=0), validate_stream_name(stream),
                                          consumer_name)

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

    def _checked_table_sink(self, stream: KinesisStream, sink: Any) -> Any:
        """``sink`` if it is a table sink that may serve ``stream`` here (see
        :func:`~.sinks.tables.check_table_sink`: InvalidError otherwise), None for other sinks."""
        table_sink = loaded_table_sink(sink)
        if table_sink is not None:
            from .sinks.tables import check_table_sink

            check_table_sink(stream, table_sink, self._state_extra.get("store"))
        return table_sink

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
                ``deliver(records)``, e.g. a ``DatasetSink``; a table sink). None: pull mode
                (``next_batch``, iteration).
            start_timeout_s: longest wait, seconds, for Ray's start (when this call starts
                it) and the first pass together (the default covers 128 shards on one 2-core
                node with room to spare).

        Returns:
            The :class:`Subscription`. An error of the first pass other than a start
            failure (``ListShards``, the lease table, a deleted stream) is reported by it
            (``next_batch``, iteration, ``wait``, ``close``), not raised here.

        Raises:
            InvalidError: not a KinesisStream, a sink that is neither an actor with the
                method nor a Sink, ``bisect_on_error`` or ``parallelization_factor > 1`` in pull
                mode, a ``record_filter`` Ray cannot serialise, a stream this broker already
                reads, or what a table sink refuses (``check_table_sink``), before any AWS call.
            NotConnectedError: not connected, or shut down; or the ``dead_letter`` publisher's
                broker is not connected (checked before any AWS call, naming that publisher).
            StreamError: the stream does not exist (and ``create_if_missing`` is unset), or
                authentication failed.
            StartError: Ray did not start within ``start_timeout_s`` or its start failed
                (the message says what ``ray.init()`` was doing: connecting to the cluster
                named by ``RAY_ADDRESS`` or by a ``ray start`` address file, or starting a
                local Ray); or not every shard leased by the first pass was open within
                ``start_timeout_s`` (readers slow or failing to start); the message says
                how many were and why. The leases taken are released.
        """
        start_timeout_s = positive_duration("start_timeout_s", start_timeout_s)
        sink = _checked_arguments(stream, sink)
        state = self._state
        aws = state.require()
        table_sink = self._checked_table_sink(stream, sink)  # before any AWS call
        with state.lock:
            if stream.name in state.subscriptions:
                raise InvalidError(f"this broker already reads stream {stream.name!r}; one subscription per stream")
            state.subscriptions[stream.name] = None  # type: ignore[assignment]  # reserved
        try:
            ensure_stream(state.client("kinesis", max_attempts=0), stream.name, create_shards=stream.create_if_missing)
            ray_start_s = self._start_ray(start_timeout_s, stream, table_sink)
            sub = Subscription(self, stream, sink, aws=aws, start_timeout_s=max(start_timeout_s - ray_start_s, 0.001))
        except BaseException:
            with state.lock:
                state.subscriptions.pop(stream.name, None)
            if table_sink is not None:
                table_sink.discard()
            raise
        with state.lock:
            state.subscriptions[stream.name] = sub
        return sub


def _checked_arguments(stream: KinesisStream, sink: Any) -> Any:
    """``subscribe()``'s checks that make no AWS call, in order; returns the sink to use.

    The dead-letter publisher is checked before the record filter and the sink, whose checks
    pickle them, and so before the publisher itself could be pickled for the readers.

    Raises:
        InvalidError: as ``subscribe()`` says. NotConnectedError: the dead-letter publisher's
            broker is not connected, or was shut down.
    """
    if not isinstance(stream, KinesisStream):
        raise InvalidError(f"subscribe() takes a KinesisStream, got {stream!r}")
    check_sink_mode(stream, sink)  # bisect / parallelism need a push sink
    if isinstance(stream.dead_letter, Publisher):
        stream.dead_letter.check_connected(f"the dead-letter publisher (dead_letter=) of stream {stream.name!r}:")
    check_picklable_filter(stream.record_filter)
    if sink is None or loaded_table_sink(sink) is not None:
        return sink  # pull mode; a table sink is pushed to as it is
    return as_sink(sink, stream.sink_method)
