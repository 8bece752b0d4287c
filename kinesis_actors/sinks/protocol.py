"""The downstream seam: a :class:`Sink` takes one shard's batch; its answer is the acknowledgement.

A reader calls ``await sink.deliver(records)`` for each batch and writes the checkpoint
only after that returns without an exception; an exception is a failed delivery (retried
with backoff, then ``SinkError`` or the dead-letter publisher). Sinks cross into reader
processes, so they are picklable values: a Ray actor handle and a method name
(:class:`ActorSink`), the pull queue of a subscription in pull mode, or a
:class:`~kinesis_actors.sinks.dataset.DatasetSink`. The shape is Quix Streams' ``Sink``
(one write call, failure by exception), over Ray's object refs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import InvalidError
from ..records import Record

__all__ = ["Sink", "ActorSink", "as_sink"]


@runtime_checkable
class Sink(Protocol):
    """Where a reader delivers a batch (records of one shard, in sequence order)."""

    def deliver(self, records: Sequence[Record]) -> Awaitable[Any]:
        """Start delivering ``records``; the awaitable completing without an exception is the
        acknowledgement (its value is ignored), raising is a failed delivery."""
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
