"""TableSink: the handle over one subscription's committer actor, which IcebergSink and DeltaSink share.

The handle is a picklable value: it travels to every reader process with its committer's
actor handle. A reader turns each batch into rows in its own process (:func:`to_rows`:
``batch.to_arrow()``, then ``transform``), and calls the committer: one Ray call per batch, as
an actor sink costs. The committer (:class:`~.committer.TableCommitter` in an async Ray actor,
``num_cpus=0``, built here by :func:`_make_actor_class`) is created by :meth:`TableSink.start`
when the subscription starts, and dies with the driver that created it: its staged rows are
lost then, and no checkpoint passed them.

This module holds the calls of the readers (fence, stage, commit, drop), the owner's calls
(stats, close) and the close rule; the table formats are in :mod:`.sink`, and what a read
loop calls, per shard lease, is in :mod:`.link`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...clock import monotonic_s
from ...errors import InvalidError, KinesisError, SinkError
from .backend import TableBackend
from .positions import ShardKey, TablePosition

if TYPE_CHECKING:
    from .link import ShardTableLink

__all__ = ["TableSink", "to_rows"]

log = logging.getLogger("kinesis_actors.sinks.tables")

def to_rows(records: Sequence[Any], transform: Callable[[Any], Any] | None) -> Any:
    """A batch as the rows a table sink writes: ``read_kinesis``'s columns (``batch.to_arrow()``),
    then ``transform(table)`` if given.

    Raises:
        SinkError: ``transform`` raised or did not return a ``pyarrow.Table`` (the cause chained).
    """
    import pyarrow as pa

    from ...arrow import records_to_table

    table = records_to_table(records)
    if transform is None:
        return table
    try:
        out = transform(table)
    except Exception as e:
        raise SinkError(f"the table sink's transform raised {type(e).__name__}: {str(e)[:300]}") from e
    if isinstance(out, pa.RecordBatch):
        out = pa.Table.from_batches([out])
    if not isinstance(out, pa.Table):
        raise SinkError(f"the table sink's transform must return a pyarrow.Table, got {type(out).__name__}")
    return out


def _make_actor_class() -> Any:
    import ray

    from .committer import DEFAULT_MAX_STAGED_BYTES, TableCommitter

    class TableCommitterActor:
        """Ray actor shell over :class:`TableCommitter` (async; table calls in a worker thread)."""

        def __init__(self, sink: TableSink) -> None:
            logging.basicConfig(level=logging.INFO)
            self.core = TableCommitter(sink.backend(), commit_interval_s=sink.commit_interval_s,
                                       create_if_missing=sink.create_if_missing,
                                       max_staged_bytes=sink.max_staged_bytes or DEFAULT_MAX_STAGED_BYTES)

        async def open_shard(self, key: ShardKey, counter: int, timeout_s: float) -> TablePosition | None:
            return await self.core.open_shard(key, counter, timeout_s=timeout_s)

        async def stage(self, key: ShardKey, counter: int, rows: Any, last: Any) -> TablePosition | None:
            return await self.core.stage(key, counter, rows, last)

        async def flush_shard(self, key: ShardKey, counter: int, timeout_s: float) -> TablePosition | None:
            return await self.core.flush_shard(key, counter, timeout_s=timeout_s)

        async def release_shard(self, key: ShardKey, counter: int) -> int:
            return self.core.release_shard(key, counter)

        async def close(self, timeout_s: float) -> bool:
            return await self.core.close(timeout_s)

        async def begin_close(self, timeout_s: float) -> bool:
            return await self.core.begin_close(timeout_s)

        async def end_close(self, timeout_s: float) -> int:
            dropped = self.core.drop_staged()
            await self.core.close(timeout_s)
            return dropped

        async def stats(self) -> dict[str, Any]:
            return self.core.stats()

    return ray.remote(num_cpus=0, max_restarts=0,  # type: ignore[call-overload]  # Ray types task options only
                      max_concurrency=1000)(TableCommitterActor)


_ACTOR_CLASS: Any = None


def _interval(commit_interval_s: object) -> float:
    if (isinstance(commit_interval_s, bool) or not isinstance(commit_interval_s, (int, float))
            or not math.isfinite(commit_interval_s) or commit_interval_s <= 0):
        raise InvalidError(f"commit_interval_s must be a finite number of seconds > 0, got {commit_interval_s!r}")
    return float(commit_interval_s)


class TableSink:
    """What IcebergSink and DeltaSink share: the committer actor and the calls of the readers.

    Not a plain :class:`~kinesis_actors.sinks.Sink`: the readers call :meth:`open_shard`,
    :meth:`stage`, :meth:`flush_shard` and :meth:`release_shard` with their lease counter
    (:class:`~.link.ShardTableLink` wraps them per lease); :meth:`deliver` refuses.

    Raises:
        InvalidError: a bad ``commit_interval_s``, ``transform`` or ``create_if_missing``.
    """

    kind = "table"

    def __init__(self, *, commit_interval_s: float, transform: Callable[[Any], Any] | None,
                 create_if_missing: bool) -> None:
        self.commit_interval_s = _interval(commit_interval_s)
        if transform is not None and not callable(transform):
            raise InvalidError(f"transform must be callable (pyarrow.Table -> pyarrow.Table), got {transform!r}")
        if not isinstance(create_if_missing, bool):
            raise InvalidError(f"create_if_missing must be a bool, got {create_if_missing!r}")
        self.transform = transform
        self.create_if_missing = create_if_missing
        self._actor: Any = None
        self.stream: str | None = None
        self.max_staged_bytes: int | None = None
        self.final_stats: dict[str, Any] = {}

    def backend(self) -> TableBackend:
        """The table, as the committer reaches it (built in the committer's process)."""
        raise NotImplementedError

    def validate(self) -> None:
        """Check what can be checked before any AWS call (``subscribe`` calls it first).

        Raises:
            InvalidError: the catalog cannot be loaded, or the table is missing and may not be created.
        """
        backend = self.backend()
        if not self.create_if_missing and backend.load() is None:
            raise InvalidError(f"table {backend.name} does not exist (create_if_missing=False)")

    def start(self, stream: str, max_staged_bytes: int | None = None) -> None:
        """Create the committer actor for the subscription of ``stream`` (Ray is running).

        ``max_staged_bytes``: Arrow bytes the committer stages for all shards together before a
        batch's staging (its acknowledgement) waits for a commit, which then starts at once
        (``subscribe`` passes the stream's ``max_buffered_bytes``, one reader's byte budget;
        None: 256 MiB). The waiting batch stays in its reader's byte budget, so a slow catalog
        slows reading.

        Raises:
            InvalidError: this sink already serves a subscription (one committer per subscription).
        """
        global _ACTOR_CLASS
        if self._actor is not None:
            raise InvalidError(f"{self!r} already serves the subscription of {self.stream!r}; "
                               "create one table sink per subscription")
        if _ACTOR_CLASS is None:
            _ACTOR_CLASS = _make_actor_class()
        self.stream = stream
        self.max_staged_bytes = max_staged_bytes
        self._actor = _ACTOR_CLASS.remote(self)

    def discard(self) -> None:
        """Stop the committer without committing (a subscription that failed to start). Idempotent."""
        actor, self._actor = self._actor, None
        if actor is not None:
            import ray

            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass

    @property
    def actor(self) -> Any:
        """The committer's Ray actor handle (None before :meth:`start`)."""
        return self._actor

    def _committer(self) -> Any:
        if self._actor is None:
            raise InvalidError(f"{self!r} is not started: pass it to subscribe(sink=...)")
        return self._actor

    # ------------------------------------------------------------------ readers' side (async)
    async def open_shard(self, stream: str, shard_id: str, lease_counter: int, *,
                         timeout_s: float = 60.0) -> TablePosition | None:
        """Fence the shard for the owner holding ``lease_counter``; see
        :meth:`~.committer.TableCommitter.open_shard` (same errors)."""
        position: TablePosition | None = await self._committer().open_shard.remote(
            ShardKey(stream, shard_id), lease_counter, timeout_s)
        return position

    async def stage(self, records: Sequence[Any], lease_counter: int) -> TablePosition | None:
        """Stage one batch (rows made here, in the reader's process): the acknowledgement.
        Returns the shard's committed position; see :meth:`~.committer.TableCommitter.stage`."""
        if not len(records):
            return None
        last = records[-1]
        rows = to_rows(records, self.transform)
        key = ShardKey(last.stream, last.shard_id)
        position: TablePosition | None = await self._committer().stage.remote(
            key, lease_counter, rows, (last.sequence_number, last.sub_sequence_number))
        return position

    async def flush_shard(self, stream: str, shard_id: str, lease_counter: int, *,
                          timeout_s: float = 10.0) -> TablePosition | None:
        """Commit the shard's staged rows now; see :meth:`~.committer.TableCommitter.flush_shard`."""
        position: TablePosition | None = await self._committer().flush_shard.remote(
            ShardKey(stream, shard_id), lease_counter, timeout_s)
        return position

    async def release_shard(self, stream: str, shard_id: str, lease_counter: int) -> int:
        """Stop recording the shard; rows not committed are dropped unwritten."""
        dropped: int = await self._committer().release_shard.remote(ShardKey(stream, shard_id), lease_counter)
        return dropped

    def shard_hook(self, stream: str, shard_id: str, lease_counter: int) -> ShardTableLink:
        """The :class:`~.link.ShardTableLink` of one lease (the reader's
        :class:`~kinesis_actors.sinks.hooks.ShardHook`: fence, stage, commit, drop)."""
        from .link import ShardTableLink

        return ShardTableLink(self, stream, shard_id, lease_counter)

    def deliver(self, records: Sequence[Any]) -> Any:
        """Refused: a table sink needs the shard's lease counter with every batch (:meth:`stage`).

        Raises:
            SinkError: always (not retriable).
        """
        raise SinkError(f"{self!r} is driven per lease through its shard_hook (fence, stage, commit, drop), "
                        "not by deliver(records)", retriable=False)

    # ------------------------------------------------------------------ owner's side
    def stats(self) -> dict[str, Any]:
        """The committer's counters (see :meth:`~.committer.TableCommitter.stats`); once the
        committer is stopped, its last counters (``final_stats``).

        Raises:
            InvalidError: never started. KinesisError: the committer could not be reached.
        """
        import ray

        if self._actor is None and self.final_stats:
            return self.final_stats
        try:
            stats: dict[str, Any] = ray.get(self._committer().stats.remote(), timeout=30)
        except KinesisError:
            raise
        except Exception as e:
            raise KinesisError(f"{self!r}: the committer's stats could not be read: {e!r:.300}") from e
        return stats

    # ------------------------------------------------------------------ the close rule (GatheringSink)
    def begin_close(self, finish_by_s: float) -> float:
        """The subscription is closing (:class:`~kinesis_actors.sinks.GatheringSink`): commit
        what is staged now, waiting up to half of ``finish_by_s`` seconds (the other half is
        the readers'), and from now on start a commit for every batch staged, so that each
        reader's last commit (its close, before its checkpoint and release) is quick.

        Returns:
            What is left of ``finish_by_s``, seconds (0.0 when the committer is not running, or
            ``finish_by_s <= 0``: then the call is sent and not waited for).
            The readers stop as soon as their last commits are done (each waits for its own
            up to half the lease duration), so this bounds the wait only. A commit still
            running when they give up may land: no checkpoint passed its rows, and the
            shards' next owners resume after the table's position (:meth:`open_shard`).

        Raises:
            KinesisError: the committer could not be reached within ``finish_by_s``.
        """
        import ray

        actor = self._actor
        if actor is None:
            return 0.0
        started = monotonic_s()
        ref = actor.begin_close.remote(max(0.0, finish_by_s) / 2)
        if finish_by_s <= 0:
            return 0.0  # no time to wait: the commits are hurried all the same
        try:
            ray.get(ref, timeout=finish_by_s)
        except Exception as e:
            raise KinesisError(f"{self!r}: the committer could not be told of the close: {e!r:.300}") from e
        return max(0.0, finish_by_s - (monotonic_s() - started))

    def end_close(self) -> int:
        """The readers have stopped: drop the rows still staged unwritten (their readers were
        stopped before a commit held them, so no checkpoint passed them and the shards' next
        owners read them again), let a commit already running land, stop the committer and
        keep its last counters (``final_stats``). The sink may then serve a new subscription.

        Returns:
            The rows dropped (one per record, unless ``transform`` changes that).

        Raises:
            KinesisError: the committer could not be reached (it is stopped all the same).
        """
        return int(self._stop_committer("end_close", lambda actor: actor.end_close.remote(10.0)) or 0)

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Commit what is staged, then stop the committer. Idempotent. Close the subscription
        first (its close already stopped the committer: this then returns its last counters).

        Returns:
            The final :meth:`stats` (also kept as ``final_stats``).

        Raises:
            KinesisError: the committer could not be reached.
        """
        done = self._stop_committer("close", lambda actor: actor.close.remote(timeout_s), timeout_s=timeout_s)
        if done is False:
            log.warning("%r: rows still staged after %.0f s; they were not committed", self, timeout_s)
        return self.final_stats

    def _stop_committer(self, what: str, call: Callable[[Any], Any], *, timeout_s: float = 10.0) -> Any:
        """Run ``call(actor)``, keep the final stats, kill the actor; the call's result (None
        when the committer was not running)."""
        import ray

        actor, self._actor = self._actor, None
        if actor is None:
            return None
        try:
            result = ray.get(call(actor), timeout=timeout_s + 30)
            self.final_stats = ray.get(actor.stats.remote(), timeout=30)
        except Exception as e:
            raise KinesisError(f"{self!r}: {what} on the committer failed: {e!r:.300}") from e
        finally:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        return result
