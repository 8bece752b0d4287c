"""IcebergSink and DeltaSink: the handles a subscription's readers push to, over one committer actor.

The handle is a picklable value: it travels to every reader process with its committer's
actor handle. A reader turns each batch into rows in its own process (``batch.to_arrow()``,
then ``transform``), and calls the committer: one Ray call per batch, as an actor sink costs.
The committer (:class:`~.committer.TableCommitter` in an async Ray actor, ``num_cpus=0``) is
created by :meth:`TableSink.start` when the subscription starts, and dies with the driver
that created it: its staged rows are lost then, and no checkpoint passed them.

What a read loop calls, per shard lease, is in :mod:`.link`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...clock import monotonic_s
from ...errors import InvalidError, KinesisError, SinkError
from .backend import TableBackend
from .positions import ShardKey, TablePosition

if TYPE_CHECKING:
    from .link import ShardTableLink

__all__ = ["TableSink", "IcebergSink", "DeltaSink", "EXTRA_HINT", "to_rows", "is_table_sink"]

log = logging.getLogger("kinesis_actors.sinks.tables")

EXTRA_HINT = 'pip install "kinesis-actors[tables]"'


def _require(module: str, what: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as e:
        raise InvalidError(f"{what} needs the {module} package: {EXTRA_HINT}") from e


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

    from .committer import TableCommitter

    class TableCommitterActor:
        """Ray actor shell over :class:`TableCommitter` (async; table calls in a worker thread)."""

        def __init__(self, sink: TableSink) -> None:
            logging.basicConfig(level=logging.INFO)
            self.core = TableCommitter(sink.backend(), commit_interval_s=sink.commit_interval_s,
                                       create_if_missing=sink.create_if_missing)

        async def open_shard(self, key: ShardKey, counter: int, timeout_s: float) -> TablePosition | None:
            return await self.core.open_shard(key, counter, timeout_s=timeout_s)

        async def stage(self, key: ShardKey, counter: int, rows: Any, last: Any) -> TablePosition | None:
            return await self.core.stage(key, counter, rows, last)

        async def flush_shard(self, key: ShardKey, counter: int, timeout_s: float) -> TablePosition | None:
            return await self.core.flush_shard(key, counter, timeout_s=timeout_s)

        async def release_shard(self, key: ShardKey, counter: int) -> int:
            return self.core.release_shard(key, counter)

        async def committed(self, key: ShardKey, counter: int) -> TablePosition | None:
            return self.core.committed(key, counter)

        async def flush(self, timeout_s: float) -> bool:
            return await self.core.flush(timeout_s)

        async def close(self, timeout_s: float) -> bool:
            return await self.core.close(timeout_s)

        async def begin_close(self, timeout_s: float) -> float:
            started = monotonic_s()
            await self.core.begin_close(timeout_s)
            return monotonic_s() - started

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

    def start(self, stream: str) -> None:
        """Create the committer actor for the subscription of ``stream`` (Ray is running).

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
    def flush(self, timeout_s: float = 60.0) -> bool:
        """Commit everything staged now; True when done within ``timeout_s``."""
        import ray

        return bool(ray.get(self._committer().flush.remote(timeout_s), timeout=timeout_s + 30))

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
        what is staged now, waiting up to half of ``finish_by_s`` seconds, and from now on start
        a commit for every batch staged, so that each reader's last commit (its close, before
        its checkpoint and release) is quick.

        Returns:
            How long the readers may need for their last commit, seconds: three times what
            this commit took, at least 5 s (a commit's time varies with the catalog's load),
            at most what is left of ``finish_by_s``; 0.0 when the committer is not running.
            The readers stop as soon as their commits are done: this bounds the wait only.

        Raises:
            KinesisError: the committer could not be reached.
        """
        import ray

        actor = self._actor
        if actor is None:
            return 0.0
        started = monotonic_s()
        try:
            took = float(ray.get(actor.begin_close.remote(finish_by_s / 2), timeout=finish_by_s / 2 + 10))
        except Exception as e:
            raise KinesisError(f"{self!r}: the committer could not be told of the close: {e!r:.300}") from e
        left = max(0.0, finish_by_s - (monotonic_s() - started))
        return min(left, max(5.0, 3 * took))

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


class IcebergSink(TableSink):
    """Writes a stream into an Apache Iceberg table, every record exactly once.

    Each commit's snapshot summary holds ``kinesis-actors.position.<stream>/<shard id>`` (JSON:
    ``sequence_number``, ``sub_sequence_number``, ``lease_counter``) for every shard of the
    subscription, and ``kinesis-actors.commit-id``. What comes from the catalog: the commit is
    a compare-and-swap of the table's metadata location (the SQL catalog's conditional
    ``UPDATE``, Glue's conditional ``UpdateTable``, a REST catalog's server), so a late commit
    of a fenced owner is refused and none of its files becomes visible (:mod:`.iceberg`).

    Args:
        table: ``"namespace.name"``.
        catalog: the catalog's properties; every process that writes loads it as
            ``pyiceberg.catalog.load_catalog(catalog_name, **catalog)``.
        catalog_name: the catalog's name ("default"; pyiceberg scopes tables by it).
        commit_interval_s: seconds between commits (10.0; also at close, handoff, shard end).
        transform: ``Callable[[pyarrow.Table], pyarrow.Table]`` mapping ``read_kinesis``'s columns
            to the table's (cloudpickle-able), or None.
        create_if_missing: create a missing table (and namespace) with the first batch's schema.

    Raises:
        InvalidError: pyiceberg is not installed (``pip install "kinesis-actors[tables]"``),
            or a bad value (named in the message).

    Example::

        sink = IcebergSink("ka.events", catalog={"type": "sql", "uri": "sqlite:////data/catalog.db",
                                                 "warehouse": "file:///data/warehouse"}, commit_interval_s=1.0)
        sub = conn.subscribe(KinesisStream("orders", start_at=StartAt.trim_horizon()), sink=sink)
    """

    kind = "iceberg"

    def __init__(self, table: str, catalog: Mapping[str, Any], *, catalog_name: str = "default",
                 commit_interval_s: float = 10.0, transform: Callable[[Any], Any] | None = None,
                 create_if_missing: bool = True) -> None:
        _require("pyiceberg", "IcebergSink")
        from .iceberg import split_identifier

        split_identifier(table)
        if not isinstance(catalog, Mapping):
            raise InvalidError(f"catalog must be a mapping of catalog properties, got {type(catalog).__name__}")
        if not isinstance(catalog_name, str) or not catalog_name:
            raise InvalidError(f"catalog_name must be a non-empty string, got {catalog_name!r}")
        super().__init__(commit_interval_s=commit_interval_s, transform=transform,
                         create_if_missing=create_if_missing)
        self.table = table
        self.catalog = dict(catalog)
        self.catalog_name = catalog_name

    def backend(self) -> TableBackend:
        """An :class:`~.iceberg.IcebergBackend` over this table."""
        from .iceberg import IcebergBackend

        return IcebergBackend(self.table, self.catalog, self.catalog_name)

    def validate(self) -> None:
        """Load the catalog (InvalidError naming the problem), then as :meth:`TableSink.validate`."""
        from .iceberg import load_iceberg_catalog

        load_iceberg_catalog(self.catalog_name, self.catalog)
        super().validate()

    def __repr__(self) -> str:
        return f"IcebergSink({self.table!r}, catalog_name={self.catalog_name!r})"


class DeltaSink(TableSink):
    """Writes a stream into a Delta Lake table, every record exactly once.

    Each commit's ``commitInfo`` holds ``kinesis-actors.position.<stream>/<shard id>`` (as
    :class:`IcebergSink`'s snapshots do) and ``kinesis-actors.commit-id``, and one application
    transaction per shard (``appId = "kinesis-actors/<stream>/<shard id>"``, ``version`` = the
    lease counter). What comes from the table format: a commit is the atomic creation of the next
    ``_delta_log`` entry (create-if-absent on a local filesystem, a conditional PUT or the
    configured locking provider on S3), and two commits of one ``appId`` conflict, so a fenced
    owner's late commit is refused (:mod:`.delta`).

    Args:
        table_uri: the table's path or URI.
        storage_options: deltalake's storage options, or None.
        commit_interval_s: seconds between commits (10.0; also at close, handoff, shard end).
        transform: ``Callable[[pyarrow.Table], pyarrow.Table]`` mapping ``read_kinesis``'s columns
            to the table's (cloudpickle-able), or None.
        create_if_missing: create a missing table with the first batch's schema.

    Raises:
        InvalidError: deltalake is not installed (``pip install "kinesis-actors[tables]"``),
            or a bad value (named in the message).

    Example::

        sink = DeltaSink("/data/delta/events", commit_interval_s=1.0)
        sub = conn.subscribe(KinesisStream("orders"), sink=sink)
    """

    kind = "delta"

    def __init__(self, table_uri: str, *, storage_options: Mapping[str, str] | None = None,
                 commit_interval_s: float = 10.0, transform: Callable[[Any], Any] | None = None,
                 create_if_missing: bool = True) -> None:
        _require("deltalake", "DeltaSink")
        if not isinstance(table_uri, str) or not table_uri.strip():
            raise InvalidError(f"table_uri must be a non-empty path or URI, got {table_uri!r}")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise InvalidError(f"storage_options must be a mapping or None, got {type(storage_options).__name__}")
        super().__init__(commit_interval_s=commit_interval_s, transform=transform,
                         create_if_missing=create_if_missing)
        self.table_uri = table_uri
        self.storage_options = dict(storage_options) if storage_options else None

    def backend(self) -> TableBackend:
        """A :class:`~.delta.DeltaBackend` over this table."""
        from .delta import DeltaBackend

        return DeltaBackend(self.table_uri, self.storage_options)

    def __repr__(self) -> str:
        return f"DeltaSink({self.table_uri!r})"


def is_table_sink(sink: object) -> bool:
    """True for an IcebergSink or DeltaSink (driven per lease through :meth:`TableSink.shard_hook`)."""
    return isinstance(sink, TableSink)
