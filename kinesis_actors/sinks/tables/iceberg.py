"""An Apache Iceberg table as a :class:`~.backend.TableBackend` (pyiceberg).

Why pyiceberg: it is the project's own Python implementation, and it loads every catalog the
Iceberg project defines (SQL, REST, Glue, Hive, DynamoDB) from one mapping of properties.

What comes from the catalog: a commit is pyiceberg's optimistic commit. The new metadata file is
written first; then the catalog checks the commit's requirements (the ``main`` branch still at
the snapshot the commit was built on) against its current metadata and swaps the table's
metadata location only if it did not change meanwhile: the SQL catalog with an ``UPDATE ...
WHERE metadata_location = <the one read>`` (a compare-and-swap in one statement), Glue with a
conditional ``UpdateTable`` on the version it read, a REST catalog on its server. A refused
commit raises ``CommitFailedException`` and nothing of it is visible; its data files stay
unreferenced (``remove_orphan_files`` deletes them).

pyiceberg can retry a refused append by itself, rebased onto whatever the table holds then
(``commit.retry.num-retries``). That rebase would let a fenced writer's rows in, so this backend
commits through a view of the table whose ``commit.retry.num-retries`` is 0 (in memory only:
the table's properties are not changed) and the committer retries after re-reading the positions.

Positions are snapshot summary properties (:mod:`.positions`); they are read back by walking
the ``main`` branch's ancestry from the current snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import InvalidError
from .backend import CommitConflict, CommitRecord
from .positions import ShardKey

__all__ = ["IcebergBackend", "load_iceberg_catalog", "split_identifier"]

log = logging.getLogger("kinesis_actors.sinks.tables")

_CATALOG_ATTEMPTS = 5


def split_identifier(table: object) -> tuple[str, str]:
    """``"namespace.name"`` (the namespace may itself hold dots) as ``(namespace, name)``.

    Raises:
        InvalidError: not a string of that shape.
    """
    if not isinstance(table, str) or "." not in table.strip(".") or any(not p for p in table.split(".")):
        raise InvalidError(f"table must be 'namespace.name', got {table!r}")
    namespace, _, name = table.rpartition(".")
    return namespace, name


def load_iceberg_catalog(catalog_name: str, catalog: Mapping[str, Any]) -> Any:
    """``pyiceberg.catalog.load_catalog(catalog_name, **catalog)``, as every writer loads it.

    A fresh SQL catalog creates its own tables on first load; several processes doing so at
    once may see "already exists" from the database: that load is tried again.

    Raises:
        InvalidError: the catalog cannot be loaded (the cause chained, named in the message).
    """
    from pyiceberg.catalog import load_catalog

    last: Exception | None = None
    for _ in range(_CATALOG_ATTEMPTS):
        try:
            return load_catalog(catalog_name, **dict(catalog))
        except Exception as e:
            last = e
            if "already exists" not in str(e):
                break
    raise InvalidError(f"cannot load the Iceberg catalog {catalog_name!r} ({_describe(catalog)}): "
                       f"{type(last).__name__}: {str(last)[:300]}") from last


def _describe(catalog: Mapping[str, Any]) -> str:
    """type, uri and warehouse, with any user and password taken out of the URIs (never a credential)."""
    from urllib.parse import urlsplit, urlunsplit

    shown = []
    for k in ("type", "uri", "warehouse"):
        if k not in catalog:
            continue
        value = str(catalog[k])
        try:
            parts = urlsplit(value)
            if parts.username or parts.password:
                host = parts.hostname or ""
                value = urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))
        except ValueError:
            value = "<unparsable>"
        shown.append(f"{k}={value}")
    return ", ".join(shown) or "no type, uri or warehouse"


def _without_commit_retries(table: Any) -> Any:
    """A view of ``table`` whose commits pyiceberg does not retry by itself (see the module docstring)."""
    from pyiceberg.table import Table

    metadata = table.metadata
    properties = {**metadata.properties, "commit.retry.num-retries": "0"}
    return Table(table.name(), metadata.model_copy(update={"properties": properties}), table.metadata_location,
                 table.io, table.catalog)


class IcebergBackend:
    """One Iceberg table (``"namespace.name"`` in the catalog ``load_catalog(catalog_name, **catalog)``).

    Args:
        table: ``"namespace.name"``.
        catalog: the catalog's properties (``type``, ``uri``, ``warehouse``...).
        catalog_name: the catalog's name (pyiceberg scopes tables by it).

    Raises:
        InvalidError: a malformed ``table``.
    """

    def __init__(self, table: str, catalog: Mapping[str, Any], catalog_name: str = "default") -> None:
        self.namespace, self.table_name = split_identifier(table)
        self.name = table
        self._properties = dict(catalog)
        self._catalog_name = catalog_name
        self._catalog: Any = None

    @property
    def catalog(self) -> Any:
        """The loaded catalog (loaded on first use)."""
        if self._catalog is None:
            self._catalog = load_iceberg_catalog(self._catalog_name, self._properties)
        return self._catalog

    def load(self) -> Any:
        """The table, or None when it (or its namespace) does not exist."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog.load_table(self.name)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def head(self, state: Any) -> Any:
        """The current snapshot's id (None: no snapshot)."""
        snapshot = state.current_snapshot()
        return None if snapshot is None else snapshot.snapshot_id

    def commits(self, state: Any, stop_at: Any = None) -> Iterator[CommitRecord]:
        """The ``main`` branch's snapshots, newest first (pyiceberg's ``ancestors_of`` the current
        snapshot), down to ``stop_at`` (a snapshot id; not included)."""
        from pyiceberg.table.snapshots import ancestors_of

        for snapshot in ancestors_of(state.current_snapshot(), state.metadata):
            if snapshot.snapshot_id == stop_at:
                return
            summary = snapshot.summary
            yield CommitRecord(snapshot.snapshot_id, dict(summary.additional_properties) if summary else {})

    def create(self, schema: Any) -> None:
        """Create the namespace and the table if missing (another process creating them at once is fine)."""
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError

        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except NamespaceAlreadyExistsError:
            pass
        try:
            self.catalog.create_table_if_not_exists(self.name, schema=schema)
        except TableAlreadyExistsError:
            pass
        log.info("Iceberg table %s created (or found) with columns %s", self.name, list(schema.names))

    def commit(self, state: Any, rows: Any, properties: Mapping[str, str], counters: Mapping[ShardKey, int]) -> None:
        """One snapshot on top of ``state``: ``rows`` appended (data files written first), or a
        snapshot of positions only; ``properties`` in its summary. ``counters`` are in the
        properties already.

        Raises:
            CommitConflict: the catalog refused the commit (the table moved).
        """
        from pyiceberg.exceptions import CommitFailedException

        tx = _without_commit_retries(state).transaction()
        try:
            if rows is not None:
                tx.append(rows, snapshot_properties=dict(properties))
            else:
                with tx.update_snapshot(snapshot_properties=dict(properties)).fast_append():
                    pass
            tx.commit_transaction()
        except CommitFailedException as e:
            raise CommitConflict(str(e)) from e
