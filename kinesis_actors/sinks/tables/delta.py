"""A Delta Lake table as a :class:`~.backend.TableBackend` (deltalake, the delta-rs bindings).

Why deltalake: it writes and commits Delta tables from Python without a JVM or Spark, on local
files and object stores alike (``storage_options``).

What comes from the table format: a commit is the atomic creation of the next
``_delta_log/<version>.json``. On a local filesystem that is an atomic create-if-absent of the
file; on S3 it is a conditional PUT (``If-None-Match``) or the locking provider configured in
``storage_options``. When another commit took the version first, delta-rs checks the commits
that landed since the version the writer read: two commits that both carry an application
transaction (``txn``) with the same ``appId`` conflict, and the later one fails with
``CommitFailedError`` ("Concurrent transaction failed"); a commit with nothing in common with
them is moved to the next version. So each shard is one application transaction
(``appId = "kinesis-actors/<stream>/<shard id>"``, ``version`` = the lease counter of its
owner), carried by every commit of its committer: a fence of a new owner and a late commit of
the previous owner always conflict, and the loser's data files are never referenced. On the
local filesystem this holds between processes: two processes committing one shard's
transaction on one version land exactly one commit (tests/unit/test_table_commit.py).

Positions (sequence numbers, which do not fit a ``txn`` version) are top-level keys of the
commit's ``commitInfo`` (:mod:`.positions`), read back with ``DeltaTable.history``. The log keeps
them for ``delta.logRetentionDuration`` (30 days by default).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import InvalidError
from .backend import CommitConflict, CommitRecord
from .positions import ShardKey

__all__ = ["DeltaBackend", "app_id"]

log = logging.getLogger("kinesis_actors.sinks.tables")


def app_id(key: ShardKey) -> str:
    """The Delta application transaction id of a shard."""
    return f"kinesis-actors/{key.stream}/{key.shard_id}"


class DeltaBackend:
    """One Delta table at ``table_uri`` (a path or an object-store URI).

    Args:
        table_uri: where the table lives.
        storage_options: deltalake's storage options (credentials, endpoints), or None.

    Raises:
        InvalidError: ``table_uri`` is not a non-empty string.
    """

    def __init__(self, table_uri: str, storage_options: Mapping[str, str] | None = None) -> None:
        if not isinstance(table_uri, str) or not table_uri.strip():
            raise InvalidError(f"table_uri must be a non-empty path or URI, got {table_uri!r}")
        self.name = table_uri
        self.uri = table_uri
        self.storage_options = dict(storage_options) if storage_options else None

    def load(self) -> Any:
        """The table at its latest version, or None when there is none."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None

    def head(self, state: Any) -> Any:
        """The loaded version."""
        return state.version()

    def commits(self, state: Any, stop_at: Any = None) -> Iterator[CommitRecord]:
        """The commits (their ``commitInfo``), newest first, down to version ``stop_at``."""
        head = state.version()
        limit = None if stop_at is None else max(0, head - int(stop_at))
        if limit == 0:
            return
        for info in state.history(limit):
            version = info.get("version")
            if stop_at is not None and version is not None and version <= stop_at:
                break
            yield CommitRecord(version, info)

    def create(self, schema: Any) -> None:
        """Create the table (version 0, no rows) if missing; one created meanwhile is fine."""
        from deltalake import DeltaTable

        try:
            DeltaTable.create(self.uri, schema, mode="ignore", storage_options=self.storage_options)
        except Exception as e:  # lost the race for version 0: fine if the table is there now
            if self.load() is None:
                raise
            log.debug("Delta table %s created by another process meanwhile (%r)", self.uri, e)
        log.info("Delta table %s created (or found) with columns %s", self.uri, list(schema.names))

    def commit(self, state: Any, rows: Any, properties: Mapping[str, str], counters: Mapping[ShardKey, int]) -> None:
        """One commit on top of ``state``'s version: ``rows`` appended (data files written
        first) or none, ``properties`` in ``commitInfo``, one ``txn`` per shard.

        Raises:
            CommitConflict: delta-rs refused the commit (a concurrent commit of a shard of ours).
        """
        from deltalake import write_deltalake
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import CommitProperties, Transaction

        commit = CommitProperties(custom_metadata=dict(properties),
                                  app_transactions=[Transaction(app_id(k), int(c)) for k, c in counters.items()])
        try:
            if rows is not None:
                write_deltalake(state, rows, mode="append", commit_properties=commit)
            else:
                state.create_write_transaction([], mode="append", schema=state.schema(), commit_properties=commit)
        except CommitFailedError as e:
            raise CommitConflict(str(e)) from e
