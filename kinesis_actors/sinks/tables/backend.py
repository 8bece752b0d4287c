"""The seam between the committer and a table format: :class:`TableBackend`.

A backend makes blocking calls to one table (pyiceberg, deltalake); the committer runs them in
a worker thread, one at a time. It adds nothing to the table's own concurrency control: a
commit either lands whole or raises, and :class:`CommitConflict` means the table's optimistic
check refused it (another commit landed first), so nothing of it is visible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from .positions import ShardKey

__all__ = ["TableBackend", "CommitConflict", "CommitRecord"]


class CommitConflict(Exception):
    """The table refused a commit because another commit landed since its state was read
    (pyiceberg's ``CommitFailedException``, deltalake's ``CommitFailedError``). Nothing of the
    refused commit is visible; its data files stay unreferenced. Re-read and try again."""


@dataclasses.dataclass(frozen=True)
class CommitRecord:
    """One commit of the table, as the backend reads it back.

    Attributes:
        token: the commit's identity in the table's history (an Iceberg snapshot id, a Delta version).
        properties: its properties (Iceberg summary, Delta ``commitInfo``); only the keys of
            :mod:`.positions` are read.
    """

    token: Any
    properties: Mapping[str, object]


class TableBackend(Protocol):
    """One table, as the committer needs it (blocking calls)."""

    name: str
    """The table, for messages (``"ns.events"``, a path)."""

    def load(self) -> Any:
        """The table's current state (a handle that later calls read), or None when it does not exist."""
        ...

    def head(self, state: Any) -> Any:
        """The newest commit's token in ``state`` (None: no commit yet)."""
        ...

    def commits(self, state: Any, stop_at: Any = None) -> Iterator[CommitRecord]:
        """The commits of ``state``'s history, newest first, down to (not including) ``stop_at``
        (None: as far as the table keeps its history)."""
        ...

    def create(self, schema: Any) -> None:
        """Create the table (and its namespace) with this ``pyarrow.Schema``; a table created
        meanwhile by another process is not an error."""
        ...

    def commit(self, state: Any, rows: Any, properties: Mapping[str, str], counters: Mapping[ShardKey, int]) -> None:
        """One commit on top of ``state``: ``rows`` (a ``pyarrow.Table``, or None for a commit of
        positions only), with ``properties`` in the commit, and ``counters`` (each shard's lease
        counter) where the format keeps them apart (Delta's application transactions).

        Raises:
            CommitConflict: the table moved since ``state`` (refused; nothing visible).
            Exception: anything else: the outcome is unknown (the committer looks for the commit id).
        """
        ...
