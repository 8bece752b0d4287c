"""KCL lease tables for tests: created with boto3 exactly as KCL creates them, and rows
written as KCL's serializer writes them.

The schema is KCL's (awslabs/amazon-kinesis-client,
``amazon-kinesis-client/src/main/java/software/amazon/kinesis/leases/dynamodb/DynamoDBLeaseSerializer.java``
``getKeySchema`` / ``getAttributeDefinitions``: hash key ``leaseKey`` S; ``toDynamoRecord``
for the attributes of a row).
"""

from __future__ import annotations

from typing import Any


def create_kcl_table(dynamodb: Any, name: str) -> None:
    """Create ``name`` as KCL does (hash key ``leaseKey`` S, on-demand) and wait until it is ACTIVE."""
    dynamodb.create_table(TableName=name, AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
                          KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
    dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})


def kcl_item(lease_key: str, *, counter: int, owner: str | None = None, checkpoint: str = "TRIM_HORIZON",
             sub: int = 0, switches: int = 0, parents: tuple[str, ...] = (), children: tuple[str, ...] = (),
             hash_range: tuple[str, str] | None = None, checkpoint_owner: str | None = None,
             stream_name: str | None = None, shard_id: str | None = None,
             entity_type: str | None = "LEASE") -> dict[str, Any]:
    """A DynamoDB item (AttributeValue dicts) as ``DynamoDBLeaseSerializer.toDynamoRecord`` writes it
    (``DynamoDBMultiStreamLeaseSerializer`` adds ``streamName`` and ``shardId``)."""
    item: dict[str, Any] = {
        "leaseKey": {"S": lease_key},
        "leaseCounter": {"N": str(counter)},
        "ownerSwitchesSinceCheckpoint": {"N": str(switches)},
        "checkpoint": {"S": checkpoint},
        "checkpointSubSequenceNumber": {"N": str(sub)},
    }
    if owner is not None:
        item["leaseOwner"] = {"S": owner}
    if parents:
        item["parentShardId"] = {"SS": list(parents)}
    if children:
        item["childShardIds"] = {"SS": list(children)}
    if hash_range is not None:
        item["startingHashKey"] = {"S": hash_range[0]}
        item["endingHashKey"] = {"S": hash_range[1]}
    if checkpoint_owner is not None:
        item["checkpointOwner"] = {"S": checkpoint_owner}
    if entity_type is not None:
        item["entityType"] = {"S": entity_type}
    if stream_name is not None:
        item["streamName"] = {"S": stream_name}
        item["shardId"] = {"S": shard_id or lease_key.rsplit(":", 1)[1]}
    return item


def plain(item: dict[str, Any]) -> dict[str, Any]:
    """An item's AttributeValues as plain values (S: str, N: int, SS: sorted tuple)."""
    out: dict[str, Any] = {}
    for name, attr in item.items():
        (kind, value), = attr.items()
        out[name] = int(value) if kind == "N" else tuple(sorted(value)) if kind == "SS" else value
    return out
