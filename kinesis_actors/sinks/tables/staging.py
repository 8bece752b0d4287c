"""What a :class:`~.committer.TableCommitter` holds per shard between commits.

* :class:`HeldShard`: one shard's lease counter, its fence state, its table positions (the
  one before its owner, the last committed) and its staged rows (``pyarrow.Table`` each).
* :class:`RowsSchema`: the schema every staged batch is made to fit, so that one commit
  round writes one schema.

Plain values, no I/O: the committer's event loop is their only user.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import SinkError
from ..hooks import Point
from .positions import TablePosition

__all__ = ["HeldShard", "RowsSchema"]


@dataclasses.dataclass
class HeldShard:
    """One shard as the committer holds it, under its owner's lease counter.

    ``opening``: the owner's fence is not committed yet; ``fenced``: a round committed it;
    ``base``: the table's position of the shard before this owner (None: none, or no table);
    ``committed``: the position last committed under this counter (what a checkpoint may
    pass); ``rows``/``last``: staged since the last round; ``lost``: why the table refused
    the shard (a newer owner fenced it), or None.
    """

    counter: int
    fenced: bool = False
    opening: bool = True
    base: Point | None = None
    committed: TablePosition | None = None
    rows: list[Any] = dataclasses.field(default_factory=list)
    last: Point | None = None
    lost: str | None = None

    def base_position(self) -> TablePosition | None:
        """The table's position of the shard before this owner, under this owner's counter."""
        if self.base is None:
            return None
        return TablePosition(self.counter, *self.base)

    def drop_rows(self) -> tuple[int, int]:
        """Forget the staged rows unwritten. Returns ``(rows, Arrow bytes)`` dropped."""
        dropped = int(sum(t.num_rows for t in self.rows)), int(sum(t.nbytes for t in self.rows))
        self.rows, self.last = [], None
        return dropped


class RowsSchema:
    """The schema of the first non-empty batch staged; later batches are made to fit it.

    Args:
        name: the table's name (for error messages).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.schema: Any = None

    def conform(self, rows: Any) -> Any:
        """``rows`` (a ``pyarrow.Table``) with the schema of the rows before: the same columns
        selected in that order and cast (pyarrow's ``select`` and ``cast``).

        Raises:
            SinkError: the columns cannot be selected or cast (not retriable).
        """
        if self.schema is None:
            if rows.num_rows:
                self.schema = rows.schema
            return rows
        if rows.schema.equals(self.schema, check_metadata=False):
            return rows
        try:
            return rows.select(self.schema.names).cast(self.schema)
        except Exception as e:
            raise SinkError(f"table {self.name}: a batch's columns {rows.schema.names} do not fit the schema "
                            f"of the rows before ({self.schema}): {e!r:.300}", retriable=False) from e
