"""ShardHook: a sink's part in the life of each shard lease, called by the read loop.

An ordinary sink has no part: each batch its ``deliver`` acknowledges may be checkpointed,
and the read loop calls no hook at all for it (:func:`shard_hooks` is None: nothing per
lease, nothing per batch). :class:`ShardHook`'s methods are the defaults a hook overrides.
A sink that keeps its own positions (a table sink keeps them in the table's commits)
implements :class:`LeaseHookSink`: the reader then asks it for one hook per lease and the
lease's consumer
(:class:`~kinesis_actors.reader.ShardConsumer`) calls it at its state transitions:

1. :meth:`ShardHook.open` in ``INITIALIZING``, before the first shard iterator (not for a
   row already at ``SHARD_END``): the sink may fence the shard, and may move the start
   past the lease's checkpoint (what it already holds); the lease's checkpoint then
   catches up.
2. :attr:`ShardHook.deliver`, when set, is the lease's sink call instead of the sink's
   ``deliver`` (returning is the acknowledgement, as ever).
3. :meth:`ShardHook.checkpointable` after each acknowledgement: the position the lease's
   checkpoint may move to (the default: the acknowledged batch's last record), or None.
4. :meth:`ShardHook.finish` in ``SHUTTING_DOWN``, before the last checkpoint of a close,
   a handoff or a shard end: the sink finishes what it holds for the lease and says what
   may be checkpointed; ``SHARD_END`` is written only if it returns.
5. :meth:`ShardHook.release` once the lease's loop has ended, however it ended (released,
   handed over, lost, failed, cancelled): the sink forgets the lease.

The consumer keeps the lease renewed while it awaits a hook (it stays alive meanwhile), and
a ``LeaseLostError`` from a hook ends the lease as lost (nothing more written).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..leases.protocol import Lease
    from ..records import Record, StartAt

__all__ = ["ShardHook", "LeaseHookSink", "Point", "shard_hooks"]

Point = tuple[str, "int | None"]
"""A checkpoint position: (sequence number, sub-sequence number or None)."""


class ShardHook:
    """What a sink does at one shard lease's state transitions (see the module docstring);
    this base class does nothing (the behaviour of a sink without hooks), and a hook
    overrides what it needs.

    Attributes:
        deliver: the lease's sink call (``async deliver(records)``) in place of the sink's
            own ``deliver``, or None (the sink's).
    """

    deliver: Callable[[Sequence[Record]], Awaitable[Any]] | None = None

    async def open(self, lease: Lease) -> StartAt | None:
        """The lease is held and its shard not read yet: where to start instead of after the
        lease's checkpoint (a position after it), or None (the lease's position).

        Raises:
            LeaseLostError: the sink knows of a newer owner. KinesisError: the shard cannot be
            opened now (the lease then fails and is taken again).
        """
        return None

    def checkpointable(self, last: Record) -> Point | None:
        """Every record up to ``last`` was acknowledged: the position the checkpoint may move
        to now (``last``'s by default), or None (not yet)."""
        return (last.sequence_number, last.sub_sequence_number)

    async def finish(self, *, shard_end: bool, timeout_s: float) -> Point | None:
        """The lease is being let go (a close, a handoff; a shard end when ``shard_end``): finish
        what the sink holds for it within about ``timeout_s`` seconds; the position that may be
        checkpointed now, or None (what was checkpointable before).

        Raises:
            LeaseLostError: the sink knows of a newer owner. KinesisError: not finished (for a
            shard end: ``SHARD_END`` must not be written; otherwise the last checkpoint is
            written at what was checkpointable before).
        """
        return None

    async def release(self) -> None:
        """The lease's loop has ended: forget the lease. Never raises."""
        return None


@runtime_checkable
class LeaseHookSink(Protocol):
    """A sink that takes a part in each shard lease's life (a table sink)."""

    def shard_hook(self, stream: str, shard_id: str, lease_counter: int) -> ShardHook:
        """The hook of one lease of ``stream``/``shard_id`` taken with ``lease_counter`` (its
        fencing token: a newer take of the shard gets a new hook)."""
        ...


def shard_hooks(sink: Any) -> Callable[[str, str, int], ShardHook] | None:
    """``sink.shard_hook`` when ``sink`` is a :class:`LeaseHookSink`, else None (no hooks)."""
    return sink.shard_hook if isinstance(sink, LeaseHookSink) else None
