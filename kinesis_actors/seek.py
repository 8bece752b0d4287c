"""SeekHandle: moves the shards a broker reads of one stream to another position.

Taken from :meth:`KinesisBroker.seek_handle <kinesis_actors.broker.KinesisBroker.seek_handle>`
(also importable from :mod:`kinesis_actors.broker`).
"""

from __future__ import annotations

from .connection import ConnectionState
from .errors import InvalidError
from .records import StartAt
from .sinks import loaded_table_sink

__all__ = ["SeekHandle"]


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
            InvalidError: not a StartAt, a sequence-number position without shard_id, or a
                stream written to a table sink (``IcebergSink``, ``DeltaSink``: its positions
                live in the table, which a seek would contradict; not supported yet).
        """
        self._state.require()
        if not isinstance(start_at, StartAt):
            raise InvalidError(f"seek() takes a StartAt, got {start_at!r}")
        if start_at.needs_shard and shard_id is None:
            raise InvalidError(f"{start_at.kind} names one shard's sequence number: pass shard_id")
        sub = self._state.subscriptions.get(self.stream)
        if sub is None:
            return []
        if loaded_table_sink(sub.sink) is not None:
            raise InvalidError(f"seek() on stream {self.stream!r}, written to {sub.sink!r}, is not supported yet: "
                               "its positions live in the table")
        moved: list[str] = sub.seek_shards(start_at, shard_id)
        return moved
