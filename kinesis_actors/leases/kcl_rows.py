"""Rows of a KCL 2.x/3.x lease table, and their translation to and from the library's rows.

The schema is the Kinesis Client Library's own, read from its source
(awslabs/amazon-kinesis-client, ``amazon-kinesis-client/src/main/java/software/amazon/kinesis/``):

- ``leases/dynamodb/DynamoDBLeaseSerializer.java`` (``toDynamoRecord``, ``fromDynamoRecord``,
  ``getDynamoTakeLeaseUpdate``, ``getDynamoEvictLeaseUpdate``, ``getDynamoUpdateLeaseUpdate``):
  hash key ``leaseKey`` (S); ``leaseOwner`` (S, absent when free); ``leaseCounter`` (N);
  ``ownerSwitchesSinceCheckpoint`` (N); ``checkpoint`` (S: a sequence number or a sentinel)
  and ``checkpointSubSequenceNumber`` (N, always written, 0 outside a KPL aggregate);
  ``pendingCheckpoint``, ``pendingCheckpointSubSequenceNumber``, ``pendingCheckpointState``;
  ``parentShardId`` and ``childShardIds`` (SS); ``startingHashKey`` / ``endingHashKey`` (S);
  ``throughputKBps`` (N); ``checkpointOwner`` (S, KCL 3.x graceful handoff); ``entityType``
  (S, ``"LEASE"`` on lease rows; a row without it is a lease for backward compatibility,
  ``leases/EntityType.java``; other values are KCL 3.x coordinator-state and worker-metrics
  entities that newer KCL versions keep in the lease table, never leases).
- ``leases/dynamodb/DynamoDBMultiStreamLeaseSerializer.java`` and ``leases/MultiStreamLease.java``:
  a multi-stream application's ``leaseKey`` is ``streamIdentifier + ":" + shardId`` with the
  stream identifier ``account:stream:creationEpoch`` (``common/StreamIdentifier.java``
  ``serialize()``, creation epoch in seconds), plus the attributes ``streamName`` (that
  identifier) and ``shardId``. A single-stream application's ``leaseKey`` is the shard id.
- ``checkpoint/SentinelCheckpoint.java`` and ``retrieval/kpl/ExtendedSequenceNumber.java``:
  the sentinels ``TRIM_HORIZON``, ``LATEST``, ``SHARD_END``, ``AT_TIMESTAMP``. KCL resumes a
  sequence-number checkpoint ``AT_SEQUENCE_NUMBER`` and drops every user record whose
  (sequence, sub-sequence) is ``<=`` the checkpoint (``lifecycle/ProcessTask.java``
  ``filterAndGetMaxExtendedSequenceNumber``).
- ``checkpoint/dynamodb/DynamoDBCheckpointer.java`` ``setCheckpoint``: a checkpoint writes
  ``checkpoint`` and ``checkpointSubSequenceNumber``, clears the pending checkpoint and
  resets ``ownerSwitchesSinceCheckpoint`` to 0, conditioned on ``leaseCounter``.
- ``leases/dynamodb/DynamoDBLeaseRefresher.java``: ``takeLease`` (counter condition; owner
  PUT, counter +1, ``checkpointOwner`` DELETE, ``ownerSwitchesSinceCheckpoint`` ADD 1 when the
  owner changes), ``evictLease`` (DELETE ``leaseOwner`` unless a handoff is pending, DELETE
  ``checkpointOwner``, counter +1), ``initiateGracefulLeaseHandoff`` (``leaseOwner`` = the
  next owner, ``checkpointOwner`` = the holder, counter unchanged): during a KCL 3.x handoff
  the holder is ``checkpointOwner`` (``Lease.actualOwner()``).

How the library's row (``kinesis_actors.leases.rows``) maps onto that:

====================== ===================================================================
ours                   KCL
====================== ===================================================================
``lease_owner``        ``checkpointOwner`` when present (a handoff is pending), else ``leaseOwner``
``lease_next_owner``   ``leaseOwner`` while ``checkpointOwner`` is present
``lease_counter``      ``leaseCounter`` (KCL's own fencing token: same meaning)
``checkpoint`` + sub   ``checkpoint`` + ``checkpointSubSequenceNumber``
``start_position``     a sentinel ``checkpoint`` (``TRIM_HORIZON``, ``LATEST``, ``AT_TIMESTAMP``)
``parent_shard_ids``   ``parentShardId``
``lease_duration_ms``  not stored: KCL's ``failoverTimeMillis`` is the application's setting
``lease_expiry``       not stored (informational only in our table)
====================== ===================================================================

Five attributes of ours, which every KCL version ignores (its serializer reads only the
names above and ``UpdateItem`` leaves other attributes alone): ``kinesisActorsCheckpoint``
(our exact checkpoint, ``<seq>[:<sub>]``: a KCL row says sub-sequence 0 both for a plain
record and for the first user record of an aggregate, ours says which) and
``kinesisActorsStartPosition`` (where we opened the shard, a serialised ``StartAt``, or
``pending`` on a row we created before choosing), each used only while KCL's
``checkpoint`` still says the same thing, so a KCL checkpoint written after ours always
wins; ``kinesisActorsWriteToken`` (tells our own writes from a KCL worker's renewals);
``kinesisActorsStreamArn`` and ``kinesisActorsStreamCreationMs`` (the stream incarnation,
which a single-stream KCL table does not record).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .protocol import SHARD_END
from .rows import (
    CHECKPOINT,
    COUNTER,
    DURATION_MS,
    KEY,
    NEXT_OWNER,
    OWNER,
    PARENTS,
    SHARD_ID,
    START_POSITION,
    STREAM,
    STREAM_ARN,
    STREAM_CREATION_MS,
    SUB_SEQUENCE,
    THROUGHPUT,
    WRITE_TOKEN,
    Row,
    lease_key,
)

__all__ = ["K_KEY", "K_OWNER", "K_COUNTER", "K_SWITCHES", "K_CHECKPOINT", "K_SUB", "K_PENDING", "K_PENDING_SUB",
           "K_PENDING_STATE", "K_PARENTS", "K_CHILDREN", "K_CHECKPOINT_OWNER", "K_ENTITY", "K_STREAM_NAME",
           "K_SHARD_ID", "K_THROUGHPUT", "K_START_HASH", "K_END_HASH", "A_CHECKPOINT", "A_START", "A_TOKEN",
           "A_ARN", "A_CREATED",
           "TRIM_HORIZON", "LATEST", "AT_TIMESTAMP", "SENTINELS", "PENDING", "is_lease_item", "stream_of_identifier",
           "multi_stream_identifier", "start_checkpoint", "item_to_row", "new_item", "view_row"]

# KCL's attribute names (DynamoDBLeaseSerializer / DynamoDBMultiStreamLeaseSerializer).
K_KEY = "leaseKey"
K_OWNER = "leaseOwner"
K_COUNTER = "leaseCounter"
K_SWITCHES = "ownerSwitchesSinceCheckpoint"
K_CHECKPOINT = "checkpoint"
K_SUB = "checkpointSubSequenceNumber"
K_PENDING = "pendingCheckpoint"
K_PENDING_SUB = "pendingCheckpointSubSequenceNumber"
K_PENDING_STATE = "pendingCheckpointState"
K_PARENTS = "parentShardId"
K_CHILDREN = "childShardIds"
K_START_HASH = "startingHashKey"
K_END_HASH = "endingHashKey"
K_CHECKPOINT_OWNER = "checkpointOwner"
K_ENTITY = "entityType"
K_STREAM_NAME = "streamName"  # multi-stream: the stream identifier "account:stream:creationEpoch"
K_SHARD_ID = "shardId"  # multi-stream only
K_THROUGHPUT = "throughputKBps"  # KCL 3.x: the lease's recent throughput, KB/s (KCL 2.x ignores it)

# Ours (KCL ignores them).
A_CHECKPOINT = "kinesisActorsCheckpoint"
A_START = "kinesisActorsStartPosition"
A_TOKEN = "kinesisActorsWriteToken"
A_ARN = "kinesisActorsStreamArn"
A_CREATED = "kinesisActorsStreamCreationMs"

TRIM_HORIZON = "TRIM_HORIZON"
LATEST = "LATEST"
AT_TIMESTAMP = "AT_TIMESTAMP"
SENTINELS = frozenset({TRIM_HORIZON, LATEST, SHARD_END, AT_TIMESTAMP})
PENDING = "pending"  # a row we created whose start position is not chosen yet (start_at applies)

_DIGITS = re.compile(r"^[0-9]{1,128}$")
_IDENTIFIER = re.compile(r"^(?P<account>[0-9]+):(?P<stream>[^:]+):(?P<epoch>[0-9]+)$")  # StreamIdentifier.java
_ARN_ACCOUNT = re.compile(r"^arn:[^:]+:kinesis:[^:]*:(?P<account>[0-9]+):stream/")


def is_lease_item(item: Mapping[str, Any]) -> bool:
    """True for a KCL lease row: ``entityType`` absent or ``"LEASE"``, with a ``leaseKey`` and a
    ``leaseCounter`` (``DynamoDBLeaseSerializer.fromDynamoRecord``)."""
    entity = item.get(K_ENTITY)
    return (entity is None or entity == "LEASE") and isinstance(item.get(K_KEY), str) and K_COUNTER in item


def stream_of_identifier(identifier: str) -> str | None:
    """The stream name inside a multi-stream identifier ``account:stream:creationEpoch``, or None."""
    match = _IDENTIFIER.match(identifier)
    return match.group("stream") if match else None


def multi_stream_identifier(stream: str, identity: tuple[str, int] | None) -> str | None:
    """KCL's multi-stream identifier ``account:stream:creationEpoch`` (epoch in seconds) built from
    ``(stream ARN, creation epoch ms)``, or None when the ARN names no account."""
    if identity is None:
        return None
    match = _ARN_ACCOUNT.match(identity[0])
    if not match:
        return None
    return f"{match.group('account')}:{stream}:{int(identity[1]) // 1000}"


def start_checkpoint(position: str) -> tuple[str, int]:
    """KCL's ``(checkpoint, checkpointSubSequenceNumber)`` for one of our start positions.

    ``TRIM_HORIZON`` and ``LATEST`` are KCL's sentinels; ``AFTER_SEQUENCE_NUMBER`` is a KCL
    checkpoint of that record. Anything KCL cannot say exactly (``AT_TIMESTAMP``, whose
    timestamp KCL takes from its configuration, not the row, and ``AT_SEQUENCE_NUMBER``)
    becomes ``TRIM_HORIZON``: a KCL fleet started later re-reads more, never less. Our
    ``pending`` marker (a row we created, no position chosen yet) is ``TRIM_HORIZON`` too.
    """
    kind, _, rest = position.partition(":")
    if kind in (TRIM_HORIZON, LATEST):
        return kind, 0
    if kind == "AFTER_SEQUENCE_NUMBER":
        seq, _, sub = rest.partition(":")
        if _DIGITS.match(seq):
            return seq, int(sub) if sub.isdigit() else 0
    return TRIM_HORIZON, 0


def _checkpoint_attr(value: str) -> tuple[str, int | None]:
    seq, _, sub = value.partition(":")
    return seq, int(sub) if sub.isdigit() else None


def _position(row: Row, item: Mapping[str, Any]) -> None:
    """Fill ``row``'s checkpoint / sub-sequence / start position from a KCL item (see the module).

    Our own attributes are used only while KCL's ``checkpoint`` still says what they say, so
    a KCL checkpoint written after ours always wins."""
    checkpoint = item.get(K_CHECKPOINT)
    sub_raw = item.get(K_SUB)
    sub = int(sub_raw) if isinstance(sub_raw, (int, float)) else 0
    ours, start = item.get(A_CHECKPOINT), item.get(A_START)
    if isinstance(start, str) and start != PENDING:
        row[START_POSITION] = start
    if isinstance(ours, str) and _checkpoint_attr(ours)[0] == checkpoint and (_checkpoint_attr(ours)[1] or 0) == sub:
        seq, our_sub = _checkpoint_attr(ours)
        row[CHECKPOINT] = seq
        if our_sub is not None:
            row[SUB_SEQUENCE] = our_sub
        return
    if isinstance(start, str) and isinstance(checkpoint, str) and start_checkpoint(start) == (checkpoint, sub):
        if start == PENDING:
            row.pop(START_POSITION, None)  # no position chosen yet: the subscription's start_at applies
        return
    row.pop(START_POSITION, None)  # KCL wrote the position: ours is stale
    if isinstance(checkpoint, str) and _DIGITS.match(checkpoint):
        row[CHECKPOINT] = checkpoint
        row[SUB_SEQUENCE] = sub  # 0 too: KCL drops (seq, 0) itself and resumes after it
    elif checkpoint == SHARD_END:
        row[CHECKPOINT] = SHARD_END
    elif checkpoint == LATEST:
        row[START_POSITION] = LATEST  # resolved once by KclLeaseStore.take
    else:  # TRIM_HORIZON; AT_TIMESTAMP (its timestamp is KCL's configuration); missing or unknown
        row[START_POSITION] = TRIM_HORIZON


def item_to_row(item: Mapping[str, Any], stream: str, shard_id: str, duration_ms: int) -> Row:
    """Our row (``kinesis_actors.leases.rows`` names) of a KCL lease item of ``stream``/``shard_id``.

    Args:
        item: the KCL item as plain values (S: str, N: int, SS: tuple of str).
        stream: the stream the row belongs to. shard_id: its shard id.
        duration_ms: the lease duration to judge it by (KCL's ``failoverTimeMillis``: the
            application's setting, not in the row).

    Returns:
        A row dict; KCL attributes without a counterpart of ours are not in it.
    """
    row: Row = {KEY: lease_key(stream, shard_id), STREAM: stream, SHARD_ID: shard_id,
                COUNTER: int(item[K_COUNTER]), DURATION_MS: duration_ms}
    owner, checkpoint_owner = item.get(K_OWNER), item.get(K_CHECKPOINT_OWNER)
    if isinstance(checkpoint_owner, str):  # a KCL 3.x graceful handoff: the holder checkpoints
        row[OWNER] = checkpoint_owner
        if isinstance(owner, str) and owner != checkpoint_owner:
            row[NEXT_OWNER] = owner
    elif isinstance(owner, str):
        row[OWNER] = owner
    _position(row, item)
    parents = item.get(K_PARENTS)
    if parents:
        row[PARENTS] = tuple(sorted(parents))
    if isinstance(item.get(A_TOKEN), str):
        row[WRITE_TOKEN] = item[A_TOKEN]
    if isinstance(item.get(A_ARN), str) and item.get(A_CREATED) is not None:
        row[STREAM_ARN] = item[A_ARN]
        row[STREAM_CREATION_MS] = int(item[A_CREATED])
    if isinstance(item.get(K_THROUGHPUT), (int, float)):
        row[THROUGHPUT] = float(item[K_THROUGHPUT])
    return row


def new_item(row: Mapping[str, Any], kcl_key: str, identifier: str | None) -> dict[str, Any]:
    """The KCL item of a row we create (``DynamoDBLeaseSerializer.toDynamoRecord``'s attributes).

    ``checkpoint`` is ``TRIM_HORIZON`` (KCL's sentinel for a child shard; a KCL fleet started
    before we choose a position re-reads from the oldest record) with our ``pending`` marker;
    ``identifier`` (multi-stream) adds ``streamName`` and ``shardId``. No hash key range:
    KCL backfills a missing one itself (``coordinator/PeriodicShardSyncManager.java``
    ``fillWithHashRangesIfRequired``).
    """
    item: dict[str, Any] = {K_KEY: kcl_key, K_COUNTER: int(row[COUNTER]), K_SWITCHES: 0,
                            K_CHECKPOINT: TRIM_HORIZON, K_SUB: 0, A_START: PENDING}
    if row.get(OWNER) is not None:
        item[K_OWNER] = row[OWNER]
    if row.get(PARENTS):
        item[K_PARENTS] = tuple(sorted(row[PARENTS]))
    if row.get(STREAM_ARN) is not None and row.get(STREAM_CREATION_MS) is not None:
        item[A_ARN] = row[STREAM_ARN]
        item[A_CREATED] = int(row[STREAM_CREATION_MS])
    if identifier is not None:
        item[K_STREAM_NAME] = identifier
        item[K_SHARD_ID] = row[SHARD_ID]
    return item


def view_row(item: Mapping[str, Any], stream: str | None) -> dict[str, Any] | None:
    """A KCL lease item as ``kinesis_actors.leases.view`` prints rows, or None for a non-lease item.

    Args:
        item: the item as plain values. stream: the stream of a single-stream table
            (which does not record it), or None.

    Returns:
        ``stream`` (None if unknown), ``shard_id``, ``owner`` (the holder: ``checkpointOwner``
        during a handoff), ``counter``, ``checkpoint`` (with ``.sub`` for a sub-sequence
        other than 0), ``expiry_ms`` None (a KCL row records no expiry).
    """
    if not is_lease_item(item):
        return None
    key = str(item[K_KEY])
    identifier = item.get(K_STREAM_NAME)
    row_stream, shard_id = stream, key
    if isinstance(identifier, str) and isinstance(item.get(K_SHARD_ID), str):
        row_stream, shard_id = stream_of_identifier(identifier) or identifier, item[K_SHARD_ID]
    checkpoint = item.get(K_CHECKPOINT)
    sub = int(item.get(K_SUB) or 0)
    if isinstance(checkpoint, str) and sub:
        checkpoint = f"{checkpoint}.{sub}"
    return {"stream": row_stream, "shard_id": shard_id,
            "owner": item.get(K_CHECKPOINT_OWNER) or item.get(K_OWNER),
            "counter": int(item[K_COUNTER]), "checkpoint": checkpoint, "expiry_ms": None}
