"""IcebergSink and DeltaSink: the table sinks a subscription's readers push to.

Each is a :class:`~.handle.TableSink` (the handle over the subscription's one committer
actor, and the calls of the readers) over its table format's :class:`~.backend.TableBackend`:
:mod:`.iceberg` or :mod:`.delta`, imported only when a table is reached, so that the
``tables`` extra stays optional. :class:`TableSink` and :func:`to_rows` are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...errors import InvalidError
from .backend import TableBackend
from .handle import TableSink, to_rows

__all__ = ["TableSink", "IcebergSink", "DeltaSink", "EXTRA_HINT", "to_rows", "is_table_sink"]

EXTRA_HINT = 'pip install "kinesis-actors[tables]"'


def _require(module: str, what: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as e:
        raise InvalidError(f"{what} needs the {module} package: {EXTRA_HINT}") from e


class IcebergSink(TableSink):
    """Writes a stream into an Apache Iceberg table, every record exactly once.

    Each commit's snapshot summary holds ``kinesis-actors.position.<stream>/<shard id>`` (JSON:
    ``sequence_number``, ``sub_sequence_number``, ``lease_counter``) for every shard of the
    subscription, and ``kinesis-actors.commit-id``. What comes from the catalog: the commit is
    a compare-and-swap of the table's metadata location (the SQL catalog's conditional
    ``UPDATE``, Glue's conditional ``UpdateTable``, a REST catalog's server), so a late commit
    of a fenced owner is refused and none of its files becomes visible (:mod:`.iceberg`).

    Positions are read back from the current snapshot's ancestors (a committer's every commit
    carries the position of every shard it holds; an idle committer does not commit).
    Expiring (``expire_snapshots``) the snapshot that holds a shard's newest position loses
    it: the shard's next owner then resumes at its lease-table checkpoint, which may be
    behind the table (those records are written again).

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

    Positions are read back from the log's commits (``DeltaTable.history``), which the table
    keeps for ``delta.logRetentionDuration`` (30 days by default): once the commit holding a
    shard's newest position is gone, the shard's next owner resumes at its lease-table
    checkpoint, which may be behind the table (as for :class:`IcebergSink`).

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
