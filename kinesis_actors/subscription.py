"""Subscription: one stream read by one broker (its Coordinator actor, pull queue and watchdog).

Taken from :meth:`KinesisBroker.subscribe <kinesis_actors.broker.KinesisBroker.subscribe>`
(also importable from :mod:`kinesis_actors.broker`). Pull mode hands batches to the
driver (``next_batch``, iteration); push mode sends them to a sink. ``close(timeout_s=)``
has one deadline for the whole close: what cannot be released by then is left to expire.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .aws import AwsSettings
from .clock import left_until, monotonic_s
from .config import KinesisStream, positive_duration
from .errors import InvalidError, KinesisError
from .leases.protocol import Lease, LeaseStore
from .records import Record, StartAt
from .sinks.protocol import GatheringSink, begin_sink_close, end_sink_close, gathering_sink
from .supervision import RayCoordinatorRef, Supervisor

if TYPE_CHECKING:
    from .broker import KinesisBroker

__all__ = ["Subscription", "DEFAULT_CLOSE_TIMEOUT_S"]

log = logging.getLogger(__name__)

_RAY_CALL_TIMEOUT_S = 60.0
_FIRST_PASS_ATTEMPTS = 3  # Coordinators started for one first pass before subscribe() gives up
_START_MARGIN_S = 30.0  # beyond start_timeout_s, for the Coordinator to report why its first pass missed it
DEFAULT_CLOSE_TIMEOUT_S = 15.0
"""Default deadline of :meth:`Subscription.close`, seconds: under a 30 s SIGTERM grace period
(Kubernetes' default, ``ray job stop``), with room for the process to exit."""
_CLOSE_ACK_TIMEOUT_S = 10.0  # at most this much of the deadline for the pull queue's last ack
_CLOSE_GRACE_S = {True: 0.5, False: 5.0}  # pull mode (queue) / push mode: a batch in flight may finish
_GATHER_MARGIN_S = 1.0  # a gathering sink's readers wait until this long before the deadline
_RELEASE_AFTER_WRITE_S = 2.0  # kept after a gathering sink's last write: the checkpoint and release writes


def _unwrap(e: BaseException) -> BaseException:
    """The user-facing error inside a Ray ``RayTaskError`` (our KinesisError family), else ``e``."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


def _close_ref(actor: Any, grace_s: float, timeout_s: float) -> Any:
    """Start the Coordinator actor's ``close`` with the deadline (``timeout_s``) and the readers' grace.

    Ray checks arguments against the method's signature in the caller (``TypeError`` before
    anything is sent), so a Coordinator whose ``close`` takes ``timeout_s`` but no
    ``grace_s``, or no ``timeout_s`` yet, is called with what it takes; this call still
    waits at most the deadline (:meth:`Subscription.close`).
    """
    error: TypeError | None = None
    for kwargs in ({"grace_s": grace_s, "timeout_s": timeout_s}, {"timeout_s": timeout_s}, {"grace_s": grace_s}):
        try:
            return actor.close.remote(release=True, **kwargs)
        except TypeError as e:
            error = e
    raise InvalidError(f"the Coordinator's close() takes neither timeout_s nor grace_s: {error}")


class Subscription:
    """One stream read by one broker: a Coordinator actor and its ShardReaders.

    Pull mode (``sink=None``): ``next_batch``, ``ack``, iteration, ``next_batch_async`` and
    ``async for``. Push mode: batches go to the sink actor; use ``wait``.
    Both: ``leases()``, ``stats()``, ``close()``, and use as a context manager. ``sink`` is
    what the readers push to (None in pull mode).

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
        claim = getattr(self._store, "claim_stream", None)
        if claim is not None:  # KclLeaseStore: a single-stream KCL table serves one stream (InvalidError)
            claim(stream.name)
        self._aws = aws
        self.sink = sink
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
            broker.renew_interval_s, self.sink, self._queue)
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

    def seek_shards(self, start_at: StartAt, shard_id: str | None) -> list[str]:
        """Ask the Coordinator in charge to reopen its shards (or only ``shard_id``) at ``start_at``.

        The Coordinator clears each shard's checkpoint and rewrites its ``start_position``
        in the lease row before it reopens the shard. ``SeekHandle.seek`` checks the
        arguments first; this method does not.

        Returns:
            The shard ids that were moved (those this broker holds now).

        Raises:
            KinesisError: what the Coordinator's ``seek`` raised (unwrapped from Ray's
                ``RayTaskError``); a Ray error when the actor call itself fails or takes
                longer than 60 s (``ray.get`` timeout).
        """
        moved: list[str] = self._call("seek", start_at, shard_id)
        return moved

    def _raise_parked(self) -> None:
        if self._error is None and not self._closed:
            import ray.exceptions as rex

            try:
                self._error = self._call("error", timeout_s=10)
            except KinesisError:
                raise
            except (rex.RayError, TimeoutError) as e:  # the Coordinator is being replaced: no parked error yet
                log.debug("%s: the parked error could not be read (%r)", self.stream.name, e)
        if self._error is not None:
            raise self._error

    # ------------------------------------------------------------------ pull mode
    def _require_pull(self) -> Any:
        if self._queue is None:
            raise InvalidError("next_batch/ack/iteration are for pull mode (sink=None); "
                               "this subscription pushes to a sink")
        return self._queue

    def next_batch(self, timeout_s: float = 5.0) -> Sequence[Record]:
        """The next batch (records of one shard, in sequence order: a compact
        :class:`~kinesis_actors.batch.RecordBatch`, a ``Sequence[Record]``), or ``[]`` after ``timeout_s``.

        Asking for the next batch acknowledges the previous one (its checkpoint is then
        written); a ``[]`` acknowledges nothing.

        Raises:
            KinesisError: the subscription's parked error (``SinkError``, ``StreamError``,
                ``LeaseStoreError``...).
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
        return self._received(batch)

    def _received(self, batch: Sequence[Record] | None) -> Sequence[Record]:
        """The batch the queue handed over, or ``[]`` after raising the parked error, if any."""
        if batch is None:
            self._raise_parked()
            return []
        return batch

    def ack(self, upto: int | None = None) -> None:
        """Acknowledge the batch last returned, now (its reader checkpoints it).

        Args:
            upto: acknowledge only its records ``[0, upto)``: the reader checkpoints them and
                the next ``next_batch`` returns the rest first (a push sink's
                ``PartialBatchError(failed_from=upto)``, Lambda's partial batch response; it
                counts against ``max_sink_retries``, after which the rest goes to the dead
                letters or fails the subscription). ``upto=0`` hands the whole batch out again.

        Raises:
            InvalidError: in push mode, or ``upto`` not an int in ``0..len(batch)`` (nothing
                is acknowledged then).
        """
        import ray

        if upto is not None and (isinstance(upto, bool) or not isinstance(upto, int) or upto < 0):
            raise InvalidError(f"ack(upto=...) takes an int >= 0, got {upto!r}")
        queue = self._require_pull()
        try:
            ray.get(queue.ack.remote(upto), timeout=_RAY_CALL_TIMEOUT_S)
        except Exception as e:
            raise _unwrap(e) from None

    def __iter__(self) -> Iterator[Sequence[Record]]:
        """Blocking iteration over batches until the subscription closes (raises its error)."""
        while not self._closed:
            batch = self.next_batch(timeout_s=1.0)
            if batch:
                yield batch

    async def next_batch_async(self, timeout_s: float = 5.0) -> Sequence[Record]:
        """The asyncio twin of :meth:`next_batch`."""
        queue = self._require_pull()
        if self._closed:
            raise InvalidError("this subscription is closed")
        try:
            batch = await queue.next.remote(float(timeout_s), True)
        except Exception as e:
            raise _unwrap(e) from None
        return self._received(batch)

    async def __aiter__(self) -> AsyncIterator[Sequence[Record]]:
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
        deadline = None if timeout_s is None else monotonic_s() + timeout_s
        while not self._closed:
            left = 5.0 if deadline is None else min(5.0, deadline - monotonic_s())
            if left <= 0:
                return False
            try:
                ended = self._call("wait", left, timeout_s=left + _RAY_CALL_TIMEOUT_S)
            except KinesisError:
                raise
            except Exception as e:  # Ray's errors while the watchdog replaces the Coordinator
                log.debug("%s: wait() asked a Coordinator being replaced (%r)", self.stream.name, e)
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

        * ``shards``: per shard id: records, bytes, batches, get_records_calls, throttles, expired_iterators,
          sink_failures, ``millis_behind_latest`` (ms), checkpoint, checkpoint_age_s, lease_counter, state
          (a ``ConsumerState`` value), ``bytes_per_s`` and ``records_per_s`` (averages over ``load_window_s``,
          0.0 before a full window), and where its reader runs (``reader``, ``node_id`` in hex, ``pid``).
        * ``readers``: per ShardReader process: ``id`` (the ``reader`` of its shards), pid, node_id, ``cpu``
          (cores over ``load_window_s``: 0.0 before a full window, the last known figure while it does not
          answer), shards (a count), buffered_bytes / peak_buffered_bytes / max_buffered_bytes (the byte
          budget), budget_waits, kinesis_call_limit and its cuts.
        * ``coordinator``: its pid and node_id.
        * This instance's lease counts: leases_held, leases_taken, leases_lost, readers_replaced,
          shards_rehomed, shards_moved (moves by load), shards_ended, reader_start_failures and the handoff
          counters; target and live_instances of the balancing plan.
        """
        figures: dict[str, Any] = self._call("stats")
        return figures

    def close(self, *, ack: bool = True, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """Stop the readers, checkpoint what was acknowledged, release the leases, within ``timeout_s``.

        In pull mode the batch last returned is acknowledged first unless ``ack=False``
        (leaving a ``with`` block on an exception acknowledges nothing more). One deadline
        covers the whole close: that acknowledgement, the Coordinator's ``close(release=True,
        timeout_s=...)`` (readers stopped, leases released, presence row removed, handoff
        requests withdrawn) and the wait for it. When the deadline passes (a lease table
        that does not answer, a Coordinator that hangs), the Coordinator and its readers are
        killed and a warning names the stream and owner whose leases are left to expire
        (within ``lease_duration_s``; other instances then take them and re-deliver the
        unacknowledged batches: at-least-once). Returns within ``timeout_s`` plus about a
        second (the kills). Idempotent.

        A sink that gathers batches (a :class:`~kinesis_actors.sinks.protocol.GatheringSink`,
        such as ``DatasetSink``) is told first (``begin_close``): it writes what it holds at
        once, so the readers' batches in flight are acknowledged and checkpointed before
        their leases are released, and close() returns as soon as that is done instead of
        waiting for the sink's window. The readers then wait for their batch until about a
        second before the deadline. A batch the sink cannot write in time is dropped
        unwritten (``end_close``, once the readers have stopped): never acknowledged, it is
        read again, once, by the shards' next owner. The one way left to a record written
        twice is a write the sink started in time that then runs past the deadline (it
        cannot be taken back; its records are not checkpointed).

        Args:
            ack: pull mode: acknowledge the batch last returned first.
            timeout_s: the deadline of the whole close, seconds (default 15.0, under a 30 s
                SIGTERM grace period).

        Raises:
            InvalidError: ``timeout_s`` is not a finite number > 0 (checked before anything
                is stopped or sent).
            KinesisError: the subscription's parked error, if any, after closing.
        """
        timeout_s = positive_duration("timeout_s", timeout_s)
        deadline = monotonic_s() + timeout_s
        with self._lock:
            if self._closed:
                return
            self._closed = True
        coordinator = self._supervisor.stop()  # no restart from now on
        gathering = gathering_sink(self.sink)
        try:
            if self._queue is not None and ack:
                self._ack_at_close(min(_CLOSE_ACK_TIMEOUT_S, left_until(deadline)))
            self._park_error_at_close(min(_CLOSE_ACK_TIMEOUT_S, left_until(deadline)))
            if isinstance(coordinator, RayCoordinatorRef):
                self._close_coordinator(coordinator, deadline, timeout_s, gathering)
        finally:
            if coordinator is not None:
                coordinator.kill()
            if gathering is not None:  # the readers are stopped: what the sink did not write is dropped
                end_sink_close(gathering, self.stream.name)
            self._discard(self._queue)
        if self._error is not None:
            raise self._error

    def _ack_at_close(self, timeout_s: float) -> None:
        import ray
        import ray.exceptions as rex

        assert self._queue is not None
        try:
            ray.get(self._queue.ack.remote(), timeout=timeout_s)
        except (rex.RayError, TimeoutError) as e:  # GetTimeoutError is a TimeoutError too
            log.warning("%s: acknowledging the last batch at close failed (%r); it will be delivered again",
                        self.stream.name, e)

    def _park_error_at_close(self, timeout_s: float) -> None:
        import ray.exceptions as rex

        if self._error is not None:
            return
        try:
            self._error = self._call("error", timeout_s=timeout_s)
        except KinesisError as e:
            self._error = e
        except (rex.RayError, TimeoutError) as e:
            log.info("%s: the Coordinator's parked error could not be read at close (%r)", self.stream.name, e)

    def _close_coordinator(self, coordinator: RayCoordinatorRef, deadline: float, timeout_s: float,
                           gathering: GatheringSink | None) -> None:
        """Ask the Coordinator to close within what is left of ``deadline``; wait no longer.
        A gathering sink is told first, and its readers' grace runs to shortly before the deadline."""
        import ray
        import ray.exceptions as rex

        if gathering is not None:
            finish_by_s = left_until(deadline) - _GATHER_MARGIN_S - _RELEASE_AFTER_WRITE_S
            wait_s = begin_sink_close(gathering, self.stream.name, finish_by_s)
            grace = min(wait_s + _RELEASE_AFTER_WRITE_S, left_until(deadline) - _GATHER_MARGIN_S)
        else:
            grace = min(_CLOSE_GRACE_S[self._queue is not None], left_until(deadline) / 2)
        left = left_until(deadline)
        grace = max(0.0, grace)
        try:
            ray.get(_close_ref(coordinator.actor, grace, left), timeout=max(left, 0.001))
            return
        except (rex.GetTimeoutError, TimeoutError):
            what = f"did not finish within the {timeout_s:.1f} s deadline of close()"
        except (rex.RayError, KinesisError) as e:
            what = f"failed ({_unwrap(e)!r})"
        log.warning("%s: closing the Coordinator %s; killing it and its readers: the leases of owner %s not "
                    "released yet are left to expire (within %.1f s) and their unacknowledged batches will be "
                    "delivered again", self.stream.name, what, self.owner_id, self._broker.lease_duration_s)

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
        except (ray.exceptions.RayError, TimeoutError) as e:  # a dead Coordinator's readers die with it
            log.info("%s: abort could not list the readers (%r); they die with their Coordinator", self.stream.name, e)
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
                except (ValueError, ray.exceptions.RayError) as e:  # not an actor handle; Ray shut down already
                    log.info("%s: killing %r: %r", self.stream.name, actor, e)
        state = self._broker.connection
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
            except Exception as e:  # the with-block's own exception is the one that propagates
                log.warning("%s: error while closing after an exception in the with block: %r", self.stream.name, e)
