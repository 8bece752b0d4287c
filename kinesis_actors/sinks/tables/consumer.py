"""TableShardConsumer: the read loop of one shard lease whose sink is a table sink.

A :class:`~kinesis_actors.reader.ShardConsumer` with the calls of :mod:`.link` at their places
(see that module's docstring): the shard is fenced in the table before it is read, and opened
after the table's position when that is ahead of the lease-table checkpoint; each batch is
staged (the acknowledgement); checkpoints carry what the table holds, never what was staged;
close, handoff and shard end commit first; when the loop ends, what is not committed is dropped
unwritten (the next owner reads it again).
"""

from __future__ import annotations

import logging
from typing import Any

from ...errors import KinesisError, LeaseLostError, SinkError
from ...leases.protocol import SHARD_END, Lease, LeaseStore
from ...reader.consumer import ShardConsumer
from ...reader.fetcher import new_fetcher
from ...reader.spec import Deliver, ReaderSpec
from ...reader.states import ConsumerState, Stop
from ...records import Record
from .link import ShardTableLink, link_for

__all__ = ["TableShardConsumer", "consumer_class"]

log = logging.getLogger("kinesis_actors.reader")

SHARD_END_WAITS = 20
"""Waits of half a lease duration each for the last commit before ``SHARD_END`` (a slow catalog
delays the shard's end; only one that stays down that long fails the shard, which is then read
again from the table's position by its next owner)."""


def consumer_class(deliver: Deliver) -> type[ShardConsumer]:
    """:class:`TableShardConsumer` when ``deliver`` is a table sink's, else :class:`ShardConsumer`."""
    return TableShardConsumer if link_for(deliver, "", "", 0) is not None else ShardConsumer


class TableShardConsumer(ShardConsumer):
    """A shard consumer writing to a table sink (same arguments as :class:`ShardConsumer`).

    Raises:
        InvalidError: ``deliver`` is not a table sink's.
    """

    def __init__(self, spec: ReaderSpec, lease: Lease, store: LeaseStore, deliver: Deliver, kinesis: Any,
                 **kwargs: Any) -> None:
        link = link_for(deliver, spec.stream, spec.shard_id, lease.counter)
        if link is None:
            from ...errors import InvalidError

            raise InvalidError(f"TableShardConsumer needs a table sink, got {deliver!r}")
        self.table: ShardTableLink = link
        super().__init__(spec, lease, store, link.deliver, kinesis, **kwargs)

    async def open(self) -> None:
        """Fence the shard in the table, then open it as :meth:`ShardConsumer.open` does, or
        after the table's position when the table is ahead of the checkpoint.

        Raises:
            LeaseLostError: the table holds a newer owner's counter. SinkError: the fence was
            not committed in time. As :meth:`ShardConsumer.open` otherwise.
        """
        lease = self.lease
        if self.state is not ConsumerState.INITIALIZING or self.reading.fetcher is not None \
                or lease.checkpoint == SHARD_END:
            return await super().open()
        start = await self.delivery.await_alive(self.table.open(lease.checkpoint, lease.checkpoint_sub_sequence))
        if start is None:
            return await super().open()
        assert start.sequence_number is not None
        self.checkpoints.acknowledged(start.sequence_number, start.sub_sequence_number)  # the lease catches up
        self.reading.fetcher = fetcher = new_fetcher(self.spec, self._kinesis, start, restart_at=start,
                                                     clock=self._clock)
        while not fetcher.has_iterator:
            await self.reading.pace()
            if self._stopping():
                return None
            await self.reading.step()
            self._alive()
        self._to(ConsumerState.PROCESSING)
        return None

    async def _checkpoint_after(self, last: Record, *, partial: bool = False) -> None:
        """Checkpoint what the table holds (committed), when due; never the batch just staged."""
        point = self.table.checkpointable()
        if point is not None:
            self.checkpoints.acknowledged(*point)
        await self.checkpoints.flush(due_only=True)

    async def _finish_table(self, *, shard_end: bool = False) -> None:
        """Commit now, waiting half a lease duration (the lease is renewed meanwhile); at a shard
        end up to :data:`SHARD_END_WAITS` such waits, since SHARD_END needs every record committed."""
        for _ in range(SHARD_END_WAITS if shard_end else 1):
            point = await self.delivery.await_alive(self.table.finish(max(1.0, self.spec.lease_duration_s / 2)))
            if point is not None:
                self.checkpoints.acknowledged(*point)
            if self.table.all_committed:
                return
        if shard_end:
            raise SinkError(f"shard {self.spec.shard_id}: its last records are not committed to the table after "
                            f"{SHARD_END_WAITS} waits", retriable=True)

    async def _shard_end(self) -> None:
        """Commit every staged record, then ``SHARD_END`` (SinkError if the commit is late)."""
        await self._finish_table(shard_end=True)
        await super()._shard_end()

    async def _shut_down(self, stop: Stop) -> None:
        """Commit what is staged (within half a lease duration), then as :meth:`ShardConsumer._shut_down`."""
        try:
            await self._finish_table()
        except LeaseLostError:
            self._to(ConsumerState.LOST)
            return
        except KinesisError as e:
            log.warning("shard %s: the last table commit did not finish (%s); checkpointing what it holds",
                        self.spec.shard_id, e)
        await super()._shut_down(stop)

    async def _end_tasks(self) -> None:
        await self.table.release()  # rows not committed by now are dropped unwritten
        await super()._end_tasks()
