"""Records as Arrow: the one schema of :func:`~kinesis_actors.read_kinesis` blocks and of the
Dataset sink's windows. Imports only pyarrow (reader processes convert batches with it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from .records import Record

__all__ = ["RECORD_SCHEMA", "records_to_table", "batch_to_arrow"]

RECORD_SCHEMA = pa.schema(
    [
        pa.field("data", pa.binary(), nullable=False),
        pa.field("partition_key", pa.string(), nullable=False),
        pa.field("sequence_number", pa.string(), nullable=False),
        pa.field("sub_sequence_number", pa.int64(), nullable=True),  # KPL user records only
        pa.field("approximate_arrival_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
    ]
)
"""Columns of every block of :func:`~kinesis_actors.read_kinesis` and every Dataset sink window."""


def records_to_table(records: Sequence[Record]) -> pa.Table:
    """Records as one Arrow table with :data:`RECORD_SCHEMA` (one pass per column; a
    :class:`~kinesis_actors.batch.RecordBatch` through its buffers, without building Records)."""
    to_arrow = getattr(records, "to_arrow", None)  # a RecordBatch builds its columns from its buffers
    if to_arrow is not None:
        return pa.Table.from_batches([to_arrow()], schema=RECORD_SCHEMA)
    return pa.Table.from_arrays(
        [
            pa.array([r.data for r in records], pa.binary()),
            pa.array([r.partition_key for r in records], pa.string()),
            pa.array([r.sequence_number for r in records], pa.string()),
            pa.array([r.sub_sequence_number for r in records], pa.int64()),
            pa.array([r.approximate_arrival_timestamp for r in records], pa.timestamp("ms", tz="UTC")),
            pa.array([r.shard_id for r in records], pa.string()),
            pa.array([r.stream for r in records], pa.string()),
        ],
        schema=RECORD_SCHEMA,
    )


def _arrival_ms(arrival: Any) -> pa.Array:
    """Float epoch seconds (NaN: absent) as timestamp[ms, UTC], to the millisecond that
    ``datetime.fromtimestamp`` (microseconds, rounded half to even) then pyarrow's
    truncation give."""
    import pyarrow.compute as pc

    seconds = pa.array(arrival, pa.float64())
    whole = pc.floor(seconds)
    micros = pc.round(pc.multiply(pc.subtract(seconds, whole), 1e6), round_mode="half_to_even")
    millis = pc.add(pc.multiply(whole, 1000.0), pc.floor(pc.divide(micros, 1000.0)))
    valid = pc.invert(pc.is_nan(seconds))
    ms = pc.if_else(valid, pc.cast(pc.if_else(valid, millis, 0.0), pa.int64()), pa.scalar(None, pa.int64()))
    return ms.cast(pa.timestamp("ms", tz="UTC"))


def batch_to_arrow(columns: dict[str, Any]) -> pa.RecordBatch:
    """A :class:`~kinesis_actors.batch.RecordBatch`'s columns (its ``_columns()``) as a
    ``pyarrow.RecordBatch`` with :data:`RECORD_SCHEMA`; the binary and string columns wrap
    the batch's buffers (int32 offsets, no copy)."""
    n = columns["n"]

    def wrap(kind: pa.DataType, blob_off: tuple[bytes, Any]) -> pa.Array:
        blob, off = blob_off
        return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(off), pa.py_buffer(blob)])

    sub = columns["sub"]
    subs = pa.nulls(n, pa.int64()) if sub is None else pa.array([None if s < 0 else s for s in sub], pa.int64())
    return pa.RecordBatch.from_arrays(
        [
            wrap(pa.binary(), columns["data"]),
            wrap(pa.string(), columns["pk"]),
            wrap(pa.string(), columns["seq"]),
            subs,
            _arrival_ms(columns["arrival"]),
            pa.array([columns["shard_id"]] * n, pa.string()),
            pa.array([columns["stream"]] * n, pa.string()),
        ],
        schema=RECORD_SCHEMA,
    )
