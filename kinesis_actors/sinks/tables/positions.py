"""Shard positions as a table's own commits record them, and the rules that compare them.

Every commit of a table sink records, for each shard its committer holds, one property::

    kinesis-actors.position.<stream>/<shard id> =
        {"sequence_number": "4959...", "sub_sequence_number": null, "lease_counter": 17}

(an Iceberg snapshot summary property; a top-level key of a Delta commit's ``commitInfo``),
plus ``kinesis-actors.commit-id`` (a random id of that commit attempt). ``sequence_number`` is
the last record of the shard the table holds (null: none yet, a fence); ``lease_counter`` is
the lease counter of the owner that wrote it. The position of a shard is the one in the newest
commit that mentions it. Stream names hold no ``/`` (Kinesis allows ``[a-zA-Z0-9_.-]``), so the
key splits unambiguously.

Sequence numbers are compared as integers (they are opaque decimal strings of up to 128 digits);
a sub-sequence number (a KPL user record) orders records inside one sequence number, and a
position without one is the whole aggregate.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from ...leases.protocol import SHARD_END
from ...records import StartAt
from ..hooks import Point

__all__ = ["ShardKey", "TablePosition", "POSITION_PREFIX", "COMMIT_ID_KEY", "position_key", "encode_positions",
           "decode_positions", "later", "resume_after"]

POSITION_PREFIX = "kinesis-actors.position."
"""Prefix of a shard's position property in a table commit."""

COMMIT_ID_KEY = "kinesis-actors.commit-id"
"""The property that names one commit attempt (a random hex id): a commit whose outcome was
unknown is found again by it, so it is never made twice."""


@dataclasses.dataclass(frozen=True, order=True)
class ShardKey:
    """One shard of one stream (shard ids repeat across streams)."""

    stream: str
    shard_id: str

    def __str__(self) -> str:
        return f"{self.stream}/{self.shard_id}"


@dataclasses.dataclass(frozen=True)
class TablePosition:
    """Where a shard stands in a table, as one commit recorded it.

    Attributes:
        lease_counter: the lease counter of the owner that wrote the commit (its fencing token).
        sequence_number: the last record of the shard in the table, or None (nothing yet).
        sub_sequence_number: its sub-sequence number (KPL user records), or None.
    """

    lease_counter: int
    sequence_number: str | None = None
    sub_sequence_number: int | None = None

    def with_counter(self, lease_counter: int) -> TablePosition:
        """The same records, recorded under another lease counter (a fence of a new owner)."""
        return dataclasses.replace(self, lease_counter=lease_counter)

    @property
    def point(self) -> Point | None:
        """``(sequence_number, sub_sequence_number)``, or None without a record."""
        return None if self.sequence_number is None else (self.sequence_number, self.sub_sequence_number)


def position_key(key: ShardKey) -> str:
    """The commit property that holds ``key``'s position."""
    return f"{POSITION_PREFIX}{key.stream}/{key.shard_id}"


def encode_positions(positions: Mapping[ShardKey, TablePosition], commit_id: str) -> dict[str, str]:
    """The properties of one commit: every position, plus :data:`COMMIT_ID_KEY`."""
    out = {COMMIT_ID_KEY: commit_id}
    for key, p in positions.items():
        out[position_key(key)] = json.dumps({"sequence_number": p.sequence_number,
                                             "sub_sequence_number": p.sub_sequence_number,
                                             "lease_counter": p.lease_counter}, separators=(",", ":"))
    return out


def decode_positions(properties: Mapping[str, object]) -> dict[ShardKey, TablePosition]:
    """The positions recorded in one commit's properties (other keys are ignored; a malformed
    value of ours is skipped: another writer's commit never breaks the reading of the rest)."""
    out: dict[ShardKey, TablePosition] = {}
    for name, value in properties.items():
        if not name.startswith(POSITION_PREFIX):
            continue
        stream, sep, shard_id = name[len(POSITION_PREFIX):].partition("/")
        if not sep or not stream or not shard_id:
            continue
        try:
            doc: Any = json.loads(value) if isinstance(value, str) else value
            counter = int(doc["lease_counter"])
            seq = doc.get("sequence_number")
            sub = doc.get("sub_sequence_number")
            out[ShardKey(stream, shard_id)] = TablePosition(counter, None if seq is None else str(seq),
                                                            None if sub is None else int(sub))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    return out


def _order(point: Point) -> tuple[int, int]:
    seq, sub = point
    return int(seq), (1 << 62) if sub is None else sub  # no sub-sequence: the whole aggregate, after its parts


def later(a: Point | None, b: Point | None) -> bool:
    """True when position ``a`` is after position ``b`` (None: before every record)."""
    if a is None:
        return False
    if b is None:
        return True
    return _order(a) > _order(b)


def resume_after(checkpoint: str | None, checkpoint_sub_sequence: int | None,
                 table: TablePosition | None) -> StartAt | None:
    """Where a new owner of a shard opens it: after the table's position when that is ahead of
    the lease-table checkpoint, else None (the read loop's own rule applies: after the
    checkpoint, or the recorded start position).

    Args:
        checkpoint: the lease row's checkpoint (a sequence number, ``SHARD_END``, or None).
        checkpoint_sub_sequence: its sub-sequence number, or None.
        table: the shard's position in the table (from the fence), or None.
    """
    if table is None or table.point is None or checkpoint == SHARD_END:
        return None
    lease_point = None if checkpoint is None else (checkpoint, checkpoint_sub_sequence)
    if not later(table.point, lease_point):
        return None
    seq, sub = table.point
    return StartAt.after_sequence_number(seq, sub)
