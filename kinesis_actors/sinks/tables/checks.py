"""The options a table sink refuses, checked by ``subscribe`` before any AWS call."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidError
from .handle import TableSink

__all__ = ["check_table_sink"]


def check_table_sink(stream: Any, sink: TableSink, lease_store: Any) -> None:
    """Refuse what exactly-once output to a table cannot keep, then validate the sink.

    * ``parallelization_factor > 1``, ``bisect_on_error``: the table's position of a shard is
      one sequence number, below which every record is in the table; batches of one shard
      committed out of order, or split and skipped, would break that.
    * ``dead_letter``, ``max_record_age_s``: a record sent elsewhere is not in the table.
    * a ``MemoryLeaseStore``: its lease counters restart with the process, and the table's
      fencing compares counters across restarts; a durable store (``DynamoLeaseStore``,
      ``KclLeaseStore``) keeps them.

    Args:
        stream: the :class:`~kinesis_actors.KinesisStream`.
        sink: the table sink.
        lease_store: the broker's lease store (or None: the default ``MemoryLeaseStore``).

    Raises:
        InvalidError: one of the above (named), or the sink's own validation (a catalog that
            cannot be loaded, a missing table with ``create_if_missing=False``).
    """
    name = type(sink).__name__
    if stream.parallelization_factor > 1:
        raise InvalidError(f"{name} needs parallelization_factor=1 (got {stream.parallelization_factor}): "
                           "a shard's records are committed in order")
    if stream.bisect_on_error:
        raise InvalidError(f"{name} does not take bisect_on_error: a record skipped would leave a hole "
                           "below the shard's position in the table")
    if stream.dead_letter is not None:
        raise InvalidError(f"{name} does not take dead_letter: every record goes to the table")
    if stream.max_record_age_s is not None:
        raise InvalidError(f"{name} does not take max_record_age_s: every record goes to the table")
    from ...leases.memory import MemoryLeaseStore

    if lease_store is None or isinstance(lease_store, MemoryLeaseStore):
        raise InvalidError(f"{name} needs a durable lease store (DynamoLeaseStore or KclLeaseStore): the "
                           "MemoryLeaseStore's lease counters restart with it, and the table fences by them")
    sink.validate()
