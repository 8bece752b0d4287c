"""The downstream seam: a :class:`Sink` takes one shard's batch; its answer is the acknowledgement.

A reader calls ``await sink.deliver(records)`` for each batch and writes the checkpoint
only after that returns without an exception; an exception is a failed delivery (retried
with backoff, then ``SinkError`` or the dead-letter publisher). Sinks cross into reader
processes, so they are picklable values: a Ray actor handle and a method name
(:class:`ActorSink`), the pull queue of a subscription in pull mode, or a
:class:`~kinesis_actors.sinks.dataset.DatasetSink`. The shape is Quix Streams' ``Sink``
(one write call, failure by exception), over Ray's object refs.

A sink that gathers batches and acknowledges them only once it has written a group of them
(a window, a table commit) also implements :class:`GatheringSink`: the subscription's
``close`` calls it so that what the sink holds is written, acknowledged and checkpointed
before the leases are released, or dropped unwritten, never written after the readers
gave up on it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import InvalidError
from ..records import Record

log = logging.getLogger(__name__)

__all__ = ["Sink", "GatheringSink", "ActorSink", "as_sink", "gathering_sink", "begin_sink_close", "end_sink_close"]


@runtime_checkable
class Sink(Protocol):
    """Where a reader delivers a batch (records of one shard, in sequence order)."""

    def deliver(self, records: Sequence[Record]) -> Awaitable[Any]:
        """Start delivering ``records``; the awaitable completing without an exception is the
        acknowledgement (its value is ignored), raising is a failed delivery."""
        ...


@runtime_checkable
class GatheringSink(Sink, Protocol):
    """A :class:`Sink` that holds batches before writing them as a group (a window, a commit).

    Such a sink lets a batch be checkpointed only once the group holding it is written: it
    answers the reader's ``deliver`` then (``DatasetSink``), or answers at once and hands the
    written position to the checkpoint through its lease hook
    (:meth:`~kinesis_actors.sinks.hooks.ShardHook.checkpointable`: ``IcebergSink``,
    ``DeltaSink``). So at a close the readers wait for it. The rule it keeps
    with :meth:`Subscription.close <kinesis_actors.subscription.Subscription.close>`: every
    batch it holds is either written, acknowledged and checkpointed before the leases are
    released, or dropped unwritten (never acknowledged: the next owner of the shard reads it
    again, once). It never acknowledges a batch it did not write, and it starts no write it
    does not expect to finish while the readers still wait, so nothing it writes is read
    again by a later owner. A write cannot be taken back once started: one that runs past
    the close deadline (far past what the sink expected) ends with its records written but
    not checkpointed, and the next owner reads them again (at-least-once, as after a
    crash). The close calls, in this order:

    1. :meth:`begin_close` before the readers are stopped;
    2. the Coordinator's close: each reader stops asking for new batches, waits up to its
       grace (what :meth:`begin_close` returned plus the time for a checkpoint and a
       release) for the batch in flight, checkpoints what was acknowledged and releases
       its lease;
    3. :meth:`end_close` once the readers are stopped (or killed at the close deadline).

    The calls are blocking, on the caller's thread, and may raise ``KinesisError`` (the
    close logs it and goes on: a sink that cannot be told keeps its own rules).
    """

    def begin_close(self, finish_by_s: float) -> float:
        """The subscription is closing: write what is held now, without waiting for the
        group to fill, and go on writing each batch that arrives as soon as possible.
        Start no write that is not expected to finish within ``finish_by_s`` seconds from
        now (the readers wait no longer); a group not started by then is dropped unwritten
        and its batches are never acknowledged.

        Returns:
            How long, at most, the readers need to wait for an acknowledgement, seconds
            (``<= finish_by_s``): 0.0 when nothing more will be written, so the readers
            stop at once. The readers' grace is this plus the time for their checkpoint
            and release.
        """
        ...

    def end_close(self) -> int:
        """The readers have stopped: drop every batch not written yet (its ``deliver``
        fails with ``SinkError``, never acknowledges) and return the number of records
        dropped. A write already running cannot be taken back: it finishes. The sink then
        gathers as before (it may serve another subscription)."""
        ...


class ActorSink:
    """A Ray actor as a sink: ``deliver(records)`` calls ``handle.<method>.remote(records)``
    and awaits its ``ObjectRef`` (Ray pickles the records into the object store).

    Cancelling the wait cancels the actor call (``ray.cancel``, not forced): a reader that
    stops or loses its lease leaves no batch behind. Ray drops a call the actor has not
    started, and cancels a running call of an async actor (the pull queue: the batch
    leaves it and never reaches the driver); a call already running in a sync actor runs
    to its end, and its result is ignored (the next owner delivers the batch again).

    Args:
        handle: a Ray actor handle.
        method: the name of its method that takes a batch (``"process_batch"``).
    """

    def __init__(self, handle: Any, method: str = "process_batch") -> None:
        self.handle = handle
        self.method = method

    def deliver(self, records: Sequence[Record]) -> Awaitable[Any]:
        """Start ``handle.<method>.remote(records)``; the awaitable ends with its result."""
        return _until_done_or_cancelled(getattr(self.handle, self.method).remote(records))

    def __repr__(self) -> str:
        return f"ActorSink({self.handle!r}, {self.method!r})"


async def _until_done_or_cancelled(ref: Any) -> Any:
    """Await ``ref`` (a Ray ``ObjectRef``); when this wait is cancelled, cancel the task too."""
    try:
        return await ref
    except asyncio.CancelledError:
        import ray

        ray.cancel(ref)  # asynchronous, never raises for a finished or unknown task
        raise


def as_sink(target: Any, method: str = "process_batch") -> Sink:
    """``target`` as a :class:`Sink`: a Ray actor handle becomes an :class:`ActorSink` over
    ``method``; an object with a ``deliver`` method (a ``DatasetSink``, your own) is used as it is.

    Raises:
        InvalidError: ``target`` is neither, or the actor has no method ``method``.
    """
    import ray

    if isinstance(target, ray.actor.ActorHandle):
        if not hasattr(target, method):
            raise InvalidError(f"sink {target!r} has no method {method!r}")
        return ActorSink(target, method)
    if isinstance(target, Sink):
        return target
    raise InvalidError(f"sink must be a Ray actor handle (with a {method!r} method) or have deliver(records); "
                       f"got {target!r}")


def gathering_sink(target: Any) -> GatheringSink | None:
    """``target`` (what was given as ``sink=``) when it is a :class:`GatheringSink` object,
    else None: a Ray actor handle (an :class:`ActorSink`, whose call is the whole delivery),
    pull mode's ``None`` and a plain :class:`Sink` have no window to settle at a close."""
    actor_module = sys.modules.get("ray.actor")  # not imported: ``target`` cannot be an actor handle
    if target is None or (actor_module is not None and isinstance(target, actor_module.ActorHandle)):
        return None
    return target if isinstance(target, GatheringSink) else None


def begin_sink_close(sink: GatheringSink, name: str, finish_by_s: float) -> float:
    """Tell ``sink`` its subscription's close begins (:meth:`GatheringSink.begin_close`).

    Args:
        sink: the subscription's gathering sink.
        name: the stream's name, for the log.
        finish_by_s: seconds from now by which the sink's writes must end (negative reads as 0).

    Returns:
        How long the readers may wait for the sink, seconds, within ``finish_by_s``. A sink that
        raises keeps its own rules: the close goes on and the readers get ``finish_by_s``.
    """
    finish_by_s = max(0.0, finish_by_s)
    try:
        return min(finish_by_s, max(0.0, float(sink.begin_close(finish_by_s))))
    except Exception as e:  # a sink that cannot be told keeps its own rules; the close goes on
        log.warning("%s: telling the sink %r that the subscription closes failed (%r)", name, sink, e)
        return finish_by_s


def end_sink_close(sink: GatheringSink, name: str) -> None:
    """End the close on ``sink`` (:meth:`GatheringSink.end_close`): what it did not write is dropped
    unwritten, for the shards' next owner to read. Logs the dropped count; never raises."""
    try:
        dropped = sink.end_close()
    except Exception as e:
        log.warning("%s: the sink %r did not drop its unwritten batches at close (%r)", name, sink, e)
        return
    if dropped:
        log.warning("%s: %d records the sink could not write before the close's deadline were dropped "
                    "unwritten; the shards' next owner reads them again", name, dropped)
