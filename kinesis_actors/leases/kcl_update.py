"""One conditional ``UpdateItem`` on a KCL lease row for each change the lease logic asks for.

:class:`~kinesis_actors.leases.rules.LeaseRules` expresses every write as "fields to
set, fields to remove, on condition that the counter (and owner) are what I saw", in our
attribute names. :func:`kcl_update` turns that into the update KCL itself would make,
from ``leases/dynamodb/DynamoDBLeaseSerializer.java`` and ``DynamoDBLeaseRefresher.java``
(awslabs/amazon-kinesis-client, ``amazon-kinesis-client/src/main/java/software/amazon/kinesis/``):

- take / hand over (``lease_owner`` set): ``getDynamoTakeLeaseUpdate``: ``leaseOwner`` PUT,
  ``checkpointOwner`` DELETE, ``ownerSwitchesSinceCheckpoint`` ADD 1 when the holder changes
  from another owner; ``leaseCounter`` +1 (``getDynamoLeaseCounterUpdate``).
- release (``lease_owner`` removed): ``getDynamoEvictLeaseUpdate``: DELETE ``leaseOwner`` and
  ``checkpointOwner``, counter +1 (``KclLeaseStore.release`` turns a release during a pending
  handoff into the hand-over KCL's evict makes then: only ``checkpointOwner`` goes).
- checkpoint: ``DynamoDBCheckpointer.setCheckpoint`` + ``getDynamoUpdateLeaseUpdate``:
  ``checkpoint`` and ``checkpointSubSequenceNumber`` PUT, ``ownerSwitchesSinceCheckpoint``
  = 0, ``pendingCheckpoint*`` DELETE, counter +1.
- handoff request (``lease_next_owner`` set): ``initiateGracefulLeaseHandoff``:
  ``leaseOwner`` = the asker, ``checkpointOwner`` = the holder, counter unchanged.
- handoff withdrawn (``lease_next_owner`` removed alone): the holder (``checkpointOwner``)
  becomes ``leaseOwner`` again and ``checkpointOwner`` goes.

The owner condition is on KCL's actual owner (``Lease.actualOwner()``: ``checkpointOwner``
during a handoff, else ``leaseOwner``); every update also requires the row to exist and to
be a lease (``entityType`` absent or ``LEASE``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .kcl_rows import (
    A_ARN,
    A_CHECKPOINT,
    A_CREATED,
    A_START,
    A_TOKEN,
    K_CHECKPOINT,
    K_CHECKPOINT_OWNER,
    K_COUNTER,
    K_ENTITY,
    K_KEY,
    K_OWNER,
    K_PARENTS,
    K_PENDING,
    K_PENDING_STATE,
    K_PENDING_SUB,
    K_SUB,
    K_SWITCHES,
    K_THROUGHPUT,
    PENDING,
    start_checkpoint,
)
from .rows import (
    CHECKPOINT,
    COUNTER,
    NEXT_OWNER,
    OWNER,
    PARENTS,
    START_POSITION,
    STREAM_ARN,
    STREAM_CREATION_MS,
    SUB_SEQUENCE,
    THROUGHPUT,
    WRITE_TOKEN,
)

__all__ = ["KclUpdate", "kcl_update"]

_PENDING_FIELDS = (K_PENDING, K_PENDING_SUB, K_PENDING_STATE)


@dataclasses.dataclass
class KclUpdate:
    """The parts of one ``UpdateItem`` call (``to_attr`` already applied to the values)."""

    expression: str
    condition: str
    names: dict[str, str]
    values: dict[str, Any]


class _Builder:
    def __init__(self, to_attr: Callable[[Any], dict[str, Any]]) -> None:
        self.to_attr = to_attr
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self.sets: list[str] = []
        self.adds: list[str] = []
        self.removes: list[str] = []
        self.conditions: list[str] = []

    def name(self, attribute: str) -> str:
        alias = f"#a{len(self.names)}"
        for existing, value in self.names.items():
            if value == attribute:
                return existing
        self.names[alias] = attribute
        return alias

    def value(self, value: Any) -> str:
        alias = f":v{len(self.values)}"
        self.values[alias] = self.to_attr(value)
        return alias

    def set(self, attribute: str, value: Any) -> None:
        self.sets.append(f"{self.name(attribute)} = {self.value(value)}")

    def set_expr(self, attribute: str, expression: str) -> None:
        self.sets.append(f"{self.name(attribute)} = {expression}")

    def remove(self, *attributes: str) -> None:
        for attribute in attributes:
            alias = self.name(attribute)
            if alias not in self.removes:
                self.removes.append(alias)

    def build(self) -> KclUpdate:
        parts = []
        if self.sets:
            parts.append("SET " + ", ".join(self.sets))
        if self.adds:
            parts.append("ADD " + ", ".join(self.adds))
        if self.removes:
            parts.append("REMOVE " + ", ".join(self.removes))
        return KclUpdate(" ".join(parts), " AND ".join(self.conditions), self.names, self.values)


def _owner_condition(b: _Builder, expect_owner: str | None) -> str:
    owner, checkpoint_owner = b.name(K_OWNER), b.name(K_CHECKPOINT_OWNER)
    if expect_owner is None:
        return f"attribute_not_exists({owner}) AND attribute_not_exists({checkpoint_owner})"
    v = b.value(expect_owner)
    return f"((attribute_not_exists({checkpoint_owner}) AND {owner} = {v}) OR {checkpoint_owner} = {v})"


def _position_fields(b: _Builder, set_fields: Mapping[str, Any], removed: set[str]) -> None:
    """checkpoint / start position: KCL's checkpoint attributes plus our exact view."""
    if CHECKPOINT in set_fields:
        sub = set_fields.get(SUB_SEQUENCE)
        b.set(K_CHECKPOINT, set_fields[CHECKPOINT])
        b.set(K_SUB, 0 if sub is None else int(sub))
        b.set(K_SWITCHES, 0)  # DynamoDBCheckpointer.setCheckpoint: ownerSwitchesSinceCheckpoint(0L)
        b.set(A_CHECKPOINT, str(set_fields[CHECKPOINT]) + ("" if sub is None else f":{int(sub)}"))
    elif START_POSITION in set_fields or (CHECKPOINT in removed and START_POSITION in removed):
        # a new start (first open, seek), or a row restarted for a new stream incarnation
        start = set_fields.get(START_POSITION, PENDING)
        checkpoint, sub = start_checkpoint(start)
        b.set(K_CHECKPOINT, checkpoint)
        b.set(K_SUB, sub)
        b.set(A_START, start)
        b.remove(A_CHECKPOINT)
    else:
        return
    b.remove(*_PENDING_FIELDS)


def _owner_fields(b: _Builder, expect_owner: str | None, set_fields: Mapping[str, Any],
                  removed: set[str]) -> None:
    """Owner changes: take / hand over, release (evict), handoff request and withdrawal."""
    owner, checkpoint_owner = b.name(K_OWNER), b.name(K_CHECKPOINT_OWNER)
    if OWNER in set_fields:
        new_owner = set_fields[OWNER]
        b.set(K_OWNER, new_owner)
        b.remove(K_CHECKPOINT_OWNER)
        if expect_owner is not None and expect_owner != new_owner:
            b.adds.append(f"{b.name(K_SWITCHES)} {b.value(1)}")
    elif OWNER in removed:
        b.remove(K_OWNER, K_CHECKPOINT_OWNER)
    elif NEXT_OWNER in set_fields:
        b.set_expr(K_CHECKPOINT_OWNER, f"if_not_exists({checkpoint_owner}, {owner})")
        b.set(K_OWNER, set_fields[NEXT_OWNER])
        b.conditions.append(f"attribute_exists({owner})")
    elif NEXT_OWNER in removed:
        b.set_expr(K_OWNER, checkpoint_owner)
        b.remove(K_CHECKPOINT_OWNER)
        b.conditions.append(f"attribute_exists({checkpoint_owner})")


def kcl_update(
    expect_owner: str | None,
    expect_counter: int,
    set_fields: Mapping[str, Any],
    remove_fields: Iterable[str],
    *,
    check_owner: bool,
    to_attr: Callable[[Any], dict[str, Any]],
) -> KclUpdate:
    """The KCL ``UpdateItem`` for one change of the lease logic (see the module docstring).

    Args:
        expect_owner: the holder the writer saw (None: free). expect_counter: the counter it saw.
        set_fields / remove_fields: the change, in our attribute names
            (``kinesis_actors.leases.rows``); ``lease_duration_ms`` and ``lease_expiry`` are
            not stored in a KCL row and are ignored here.
        check_owner: also condition on the owner (every holder write; not a handoff request).
        to_attr: Python value -> DynamoDB AttributeValue.

    Returns:
        The :class:`KclUpdate` (expression, condition, names, values).
    """
    b = _Builder(to_attr)
    removed = set(remove_fields)
    b.conditions.append(f"attribute_exists({b.name(K_KEY)})")
    b.conditions.append(f"{b.name(K_COUNTER)} = {b.value(int(expect_counter))}")
    entity = b.name(K_ENTITY)
    b.conditions.append(f"(attribute_not_exists({entity}) OR {entity} = {b.value('LEASE')})")
    if check_owner:
        b.conditions.append(_owner_condition(b, expect_owner))
    if COUNTER in set_fields:
        b.set(K_COUNTER, int(set_fields[COUNTER]))
    if WRITE_TOKEN in set_fields:
        b.set(A_TOKEN, set_fields[WRITE_TOKEN])
    if STREAM_ARN in set_fields and STREAM_CREATION_MS in set_fields:
        b.set(A_ARN, set_fields[STREAM_ARN])
        b.set(A_CREATED, int(set_fields[STREAM_CREATION_MS]))
    if THROUGHPUT in set_fields:
        b.set(K_THROUGHPUT, float(set_fields[THROUGHPUT]))
    if set_fields.get(PARENTS):
        b.set(K_PARENTS, tuple(sorted(set_fields[PARENTS])))
    elif PARENTS in removed:
        b.remove(K_PARENTS)
    _owner_fields(b, expect_owner, set_fields, removed)
    _position_fields(b, set_fields, removed)
    return b.build()
