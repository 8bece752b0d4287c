"""What a read loop calls, per shard lease, when its sink is a table sink: :class:`ShardTableLink`.

The calls and where they go in a read loop (one lease, counter ``c``)::

    link = ShardTableLink(sink, stream, shard_id, lease.counter)
    start = await link.open(lease.checkpoint, lease.checkpoint_sub_sequence)
        # BEFORE the first GetShardIterator: fences the shard in the table (a commit of c);
        # start is StartAt.after_sequence_number(table position) when the table is ahead of
        # the lease-table checkpoint, else None (resume as usual). LeaseLostError: a newer
        # owner fenced the shard: stop as LOST.
    await link.deliver(batch)          # instead of the sink call; returning is the acknowledgement
    point = link.checkpointable()      # at each checkpoint opportunity (a renewal, a pacer
                                       # flush): the committed (sequence, sub-sequence) not yet
                                       # checkpointed, or None. Checkpoint THIS, never the batch
                                       # just acknowledged, nor a filtered batch's position.
    point = await link.finish(timeout_s)   # close, handoff, SHARD_END: commit now, then checkpoint
                                           # `point` (SHARD_END only if every batch was committed:
                                           # link.all_committed)
    await link.release()               # after the checkpoint, before releasing the lease (and on
                                       # LOST or failure): rows not committed are dropped unwritten

The checkpoint so written never runs ahead of the table; the table may run ahead of it (a crash
between a commit and the checkpoint), which :meth:`ShardTableLink.open` of the next owner reads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ...records import StartAt
from .positions import TablePosition, later, resume_after
from .sink import TableSink

__all__ = ["ShardTableLink", "is_table_sink", "link_for"]

log = logging.getLogger("kinesis_actors.sinks.tables")

Point = tuple[str, "int | None"]


def is_table_sink(sink: object) -> bool:
    """True for an IcebergSink or DeltaSink (anything driven per lease through :class:`ShardTableLink`)."""
    return isinstance(sink, TableSink)


class ShardTableLink:
    """One shard lease's calls to its table sink (see the module docstring for where they go).

    Args:
        sink: the subscription's table sink (started).
        stream / shard_id: the shard.
        lease_counter: the lease counter of the lease as the owner took it (its fencing token,
            constant for this link: a newer take of the shard makes a new link).
    """

    def __init__(self, sink: TableSink, stream: str, shard_id: str, lease_counter: int) -> None:
        self.sink = sink
        self.stream = stream
        self.shard_id = shard_id
        self.lease_counter = lease_counter
        self.table_position: TablePosition | None = None  # where the table stood at open
        self._committed: TablePosition | None = None
        self._checkpointed: Point | None = None
        self._staged: Point | None = None  # last position staged

    async def open(self, checkpoint: str | None, checkpoint_sub_sequence: int | None = None, *,
                   timeout_s: float = 60.0) -> StartAt | None:
        """Fence the shard in the table; where to resume if the table is ahead of ``checkpoint``.

        Raises:
            LeaseLostError: the table holds a newer owner's counter for the shard.
            SinkError: the fence was not committed within ``timeout_s`` (retriable).
        """
        self.table_position = await self.sink.open_shard(self.stream, self.shard_id, self.lease_counter,
                                                         timeout_s=timeout_s)
        self._checkpointed = None if checkpoint is None else (checkpoint, checkpoint_sub_sequence)
        start = resume_after(checkpoint, checkpoint_sub_sequence, self.table_position)
        if start is not None:
            log.info("%s/%s: the table is ahead of the lease checkpoint; resuming after %s",
                     self.stream, self.shard_id, start.sequence_number)
        return start

    async def deliver(self, batch: Sequence[Any]) -> None:
        """Stage ``batch`` for the next commit (the acknowledgement).

        Raises:
            LeaseLostError: refused (a newer owner). SinkError: the rows do not fit, or no room in time.
        """
        if not len(batch):
            return
        last = batch[-1]
        self._note(await self.sink.stage(batch, self.lease_counter))
        self._staged = (last.sequence_number, last.sub_sequence_number)

    def checkpointable(self) -> Point | None:
        """The committed position not yet handed out for a checkpoint, or None; handing it out
        marks it checkpointed (call it when about to write a checkpoint)."""
        committed = self._committed.point if self._committed is not None else None
        if committed is None or not later(committed, self._checkpointed):
            return None
        self._checkpointed = committed
        return committed

    @property
    def all_committed(self) -> bool:
        """True when every staged record is committed (a shard end may be checkpointed)."""
        committed = self._committed.point if self._committed is not None else None
        return self._staged is None or not later(self._staged, committed)

    async def finish(self, timeout_s: float = 10.0) -> Point | None:
        """Commit now and wait up to ``timeout_s``; returns :meth:`checkpointable` after it.

        Raises:
            LeaseLostError: refused by the table (a newer owner).
        """
        self._note(await self.sink.flush_shard(self.stream, self.shard_id, self.lease_counter, timeout_s=timeout_s))
        return self.checkpointable()

    async def release(self) -> None:
        """Stop recording the shard in commits; rows not committed are dropped unwritten. Best effort."""
        try:
            await self.sink.release_shard(self.stream, self.shard_id, self.lease_counter)
        except Exception as e:  # the committer gone: its staged rows are gone too
            log.info("%s/%s: release on the table sink failed (%r)", self.stream, self.shard_id, e)

    def _note(self, committed: TablePosition | None) -> None:
        if committed is not None and (self._committed is None or later(committed.point, self._committed.point)):
            self._committed = committed


def link_for(deliver: Any, stream: str, shard_id: str, lease_counter: int) -> ShardTableLink | None:
    """A :class:`ShardTableLink` when ``deliver`` is a table sink's ``deliver`` (the reader's
    one sink call, bound to the sink), else None."""
    sink = getattr(deliver, "__self__", None)
    return ShardTableLink(sink, stream, shard_id, lease_counter) if isinstance(sink, TableSink) else None
