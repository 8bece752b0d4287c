"""Records as Arrow: the one schema of :func:`~kinesis_actors.read_kinesis` blocks and of the
Dataset sink's windows. Imports only pyarrow (reader processes convert batches with it)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from .records import Record

__all__ = ["RECORD_SCHEMA", "records_to_table"]

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
    """Records as one Arrow table with :data:`RECORD_SCHEMA` (one pass per column)."""
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
