"""What became of a batch, and what a sink's error says about it: :class:`DeliveryResult`
(the counts of one delivered batch), :func:`partial_failed_from` (the acknowledged prefix a
``PartialBatchError`` names, through Ray's wrapping) and :func:`given_up` (the
``SinkError`` of a record given up with no dead letters configured).

Used by :class:`~kinesis_actors.delivery.engine.DeliveryEngine`; all three are also
importable from :mod:`kinesis_actors.delivery`.
"""

from __future__ import annotations

import dataclasses

from ..errors import SinkError
from ..records import Record

__all__ = ["DeliveryResult", "partial_failed_from", "given_up"]


@dataclasses.dataclass
class DeliveryResult:
    """What became of one batch; every record is done when :meth:`DeliveryEngine.deliver` returns.

    Attributes:
        acknowledged: records ``[0, acknowledged)`` are done (the whole batch on return).
        delivered: records the sink acknowledged.
        filtered: records ``record_filter`` rejected.
        dead_lettered: records sent to the dead letters (either reason).
        attempts: sink calls made.
    """

    acknowledged: int = 0
    delivered: int = 0
    filtered: int = 0
    dead_lettered: int = 0
    attempts: int = 0


def partial_failed_from(error: BaseException) -> int | None:
    """``failed_from`` of a ``PartialBatchError``, also when Ray wrapped it; else None.

    Ray raises a ``RayTaskError`` in place of an actor's exception; it subclasses the
    original class and keeps the original as ``cause``. A chained ``__cause__`` is looked
    at too (a sink wrapper that re-raises).
    """
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        value = e.__dict__.get("failed_from") if hasattr(e, "__dict__") else None
        if value is not None:
            return value if isinstance(value, int) and not isinstance(value, bool) else -1
        cause = getattr(e, "cause", None)
        e = cause if isinstance(cause, BaseException) else e.__cause__
    return None


def given_up(record: Record, attempts: int, error: BaseException | None) -> SinkError:
    """The error that fails a batch when ``record`` is given up and there are no dead letters:
    it names the record's shard, sequence number (and KPL sub-sequence) and how many times
    the sink refused it (``attempts``), with ``error`` (the sink's last one) in the message;
    the caller chains it as the cause."""
    sub = f" (sub-sequence {record.sub_sequence_number})" if record.sub_sequence_number is not None else ""
    return SinkError(f"the sink refused shard {record.shard_id} sequence number {record.sequence_number}{sub} "
                     f"{attempts} times: {error!r:.300}")
