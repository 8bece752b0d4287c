"""A table sink's part in each shard lease's life: :class:`ShardTableLink`, its
:class:`~kinesis_actors.sinks.hooks.ShardHook`.

What the read loop calls, for one lease taken with counter ``c``
(:class:`~kinesis_actors.reader.ShardConsumer` at its state transitions)::

    link = sink.shard_hook(stream, shard_id, c)
    start = await link.open(lease)     # INITIALIZING, BEFORE the first GetShardIterator:
        # fences the shard in the table (a commit of c); start is
        # StartAt.after_sequence_number(table position) when the table is ahead of the
        # lease-table checkpoint, else None (resume as usual). LeaseLostError: a newer
        # owner fenced the shard: the lease ends as LOST.
    await link.deliver(batch)          # the sink call: stages the rows; returning is the acknowledgement
    point = link.checkpointable(last)  # after each acknowledgement: the COMMITTED (sequence,
        # sub-sequence) not yet checkpointed, or None; never the batch just staged.
    point = await link.finish(shard_end=..., timeout_s=...)   # SHUTTING_DOWN (close, handoff,
        # SHARD_END): commit now, then checkpoint `point`; at a shard end it raises SinkError
        # until every staged batch is committed, so SHARD_END never passes a staged record.
    await link.release()               # the loop ended (also after LOST or a failure): rows
        # not committed are dropped unwritten

The checkpoint so written never runs ahead of the table; the table may run ahead of it (a crash
between a commit and the checkpoint), which :meth:`ShardTableLink.open` of the next owner reads.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import SinkError
from ...leases.protocol import Lease
from ...records import Record, StartAt
from ..hooks import Point, ShardHook
from .positions import TablePosition, later, resume_after

if TYPE_CHECKING:
    from .handle import TableSink

__all__ = ["ShardTableLink"]

log = logging.getLogger("kinesis_actors.sinks.tables")


class ShardTableLink(ShardHook):
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

    async def open(self, lease: Lease, *, timeout_s: float = 60.0) -> StartAt | None:
        """Fence the shard in the table; where to resume if the table is ahead of ``lease``'s checkpoint.

        Raises:
            LeaseLostError: the table holds a newer owner's counter for the shard.
            SinkError: the fence was not committed within ``timeout_s`` (retriable).
        """
        checkpoint, checkpoint_sub_sequence = lease.checkpoint, lease.checkpoint_sub_sequence
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

    def checkpointable(self, last: Record | None = None) -> Point | None:
        """The committed position not yet handed out for a checkpoint, or None; handing it out
        marks it checkpointed (call it when about to write a checkpoint). ``last``, the batch
        just acknowledged (staged), is not checkpointable until a commit holds it."""
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

    async def finish(self, *, shard_end: bool = False, timeout_s: float = 10.0) -> Point | None:
        """Commit now and wait up to ``timeout_s``; returns :meth:`checkpointable` after it.

        Raises:
            LeaseLostError: refused by the table (a newer owner). SinkError: ``shard_end`` and
            a staged record is not committed yet (retriable; nothing handed out).
        """
        self._note(await self.sink.flush_shard(self.stream, self.shard_id, self.lease_counter, timeout_s=timeout_s))
        if shard_end and not self.all_committed:
            raise SinkError(f"{self.stream}/{self.shard_id}: staged records not committed within {timeout_s:.1f} s",
                            retriable=True)
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

