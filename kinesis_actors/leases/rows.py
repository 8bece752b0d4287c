"""Rows of the lease table as stored: the attribute names (one place), and rows to and
from :class:`~kinesis_actors.leases.protocol.Lease` and
:class:`~kinesis_actors.leases.protocol.Instance`.

A row is a plain dict with the table's attribute names: ``str`` for S, ``int`` for N and
a tuple of ``str`` for ``parent_shard_ids``; an absent attribute is an absent key (never
None). Shard rows have the key ``"<stream>:<shard id>"``, presence rows
``"<stream>#instance#<owner>"``; a shard row is never a presence row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .protocol import Instance, Lease, lease_key, presence_key

__all__ = ["Row", "KEY", "STREAM", "SHARD_ID", "OWNER", "COUNTER", "DURATION_MS", "EXPIRY", "CHECKPOINT",
           "SUB_SEQUENCE", "START_POSITION", "PARENTS", "NEXT_OWNER", "STREAM_ARN", "STREAM_CREATION_MS",
           "WRITE_TOKEN", "THROUGHPUT", "is_shard_row", "is_presence_row", "row_to_lease", "row_to_instance"]

Row = dict[str, Any]

# Attribute names of the lease table (one place).
KEY = "lease_key"
STREAM = "stream"
SHARD_ID = "shard_id"
OWNER = "lease_owner"
COUNTER = "lease_counter"
DURATION_MS = "lease_duration_ms"
EXPIRY = "lease_expiry"
CHECKPOINT = "checkpoint"
SUB_SEQUENCE = "checkpoint_sub_sequence"
START_POSITION = "start_position"
PARENTS = "parent_shard_ids"
NEXT_OWNER = "lease_next_owner"
STREAM_ARN = "stream_arn"
STREAM_CREATION_MS = "stream_creation_ms"
WRITE_TOKEN = "lease_write_token"  # random, per write that raises the counter: tells our own landed write
THROUGHPUT = "throughput_kbps"  # the shard's recent KB/s, written with renewals (KCL 3.x: throughputKBps)


def is_shard_row(row: Mapping[str, Any], stream: str | None = None) -> bool:
    """True if ``row`` is a shard row (key ``"<stream>:<shard id>"``), of ``stream`` if given.

    Presence rows (``"<stream>#instance#<owner>"``) and foreign rows are never shard rows.
    """
    key, row_stream, shard_id = row.get(KEY), row.get(STREAM), row.get(SHARD_ID)
    if not (isinstance(key, str) and isinstance(row_stream, str) and isinstance(shard_id, str)):
        return False
    if stream is not None and row_stream != stream:
        return False
    return key == lease_key(row_stream, shard_id) and COUNTER in row


def is_presence_row(row: Mapping[str, Any], stream: str | None = None) -> bool:
    """True if ``row`` is a presence row (key ``"<stream>#instance#<owner>"``), of ``stream`` if given."""
    key, row_stream, owner = row.get(KEY), row.get(STREAM), row.get(OWNER)
    if not (isinstance(key, str) and isinstance(row_stream, str) and isinstance(owner, str)):
        return False
    if stream is not None and row_stream != stream:
        return False
    return key == presence_key(row_stream, owner) and COUNTER in row


def row_to_instance(row: Mapping[str, Any]) -> Instance:
    """Build the immutable :class:`Instance` of a presence row."""
    return Instance(
        stream=row[STREAM],
        owner=row[OWNER],
        counter=int(row[COUNTER]),
        duration_ms=int(row.get(DURATION_MS, 0)),
        expiry_ms=int(row.get(EXPIRY, 0)),
    )


def row_to_lease(row: Mapping[str, Any]) -> Lease:
    """Build the immutable :class:`Lease` of a shard row."""
    parents = row.get(PARENTS) or ()
    sub = row.get(SUB_SEQUENCE)
    return Lease(
        stream=row[STREAM],
        shard_id=row[SHARD_ID],
        owner=row.get(OWNER),
        counter=int(row[COUNTER]),
        expiry_ms=int(row.get(EXPIRY, 0)),
        duration_ms=int(row.get(DURATION_MS, 0)),
        checkpoint=row.get(CHECKPOINT),
        checkpoint_sub_sequence=None if sub is None else int(sub),
        start_position=row.get(START_POSITION),
        parent_shard_ids=tuple(sorted(parents)),
        next_owner=row.get(NEXT_OWNER),
        stream_arn=row.get(STREAM_ARN),
        stream_creation_ms=None if row.get(STREAM_CREATION_MS) is None else int(row[STREAM_CREATION_MS]),
        throughput_kbps=None if row.get(THROUGHPUT) is None else float(row[THROUGHPUT]),
    )
