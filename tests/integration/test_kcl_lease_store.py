"""KclLeaseStore on the emulator: take over a stopped KCL application's lease table, hand it back.

The table is created with boto3 as KCL creates it and seeded with rows as KCL's serializer
writes them (awslabs/amazon-kinesis-client,
``amazon-kinesis-client/src/main/java/software/amazon/kinesis/leases/dynamodb/DynamoDBLeaseSerializer.java``
``toDynamoRecord``; see tests/kcl_tables.py). Real Coordinator and ShardReader actors read
through the store; the emulator is reached over HTTP.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kinesis_actors import KclLeaseStore, KinesisBroker, KinesisStream, LeaseStoreError, StartAt
from kinesis_actors.leases.kcl import KclFleetLiveError
from kinesis_actors.testing import kpl_aggregate
from tests.kcl_tables import create_kcl_table, kcl_item

from .helpers import create_stream, dynamodb_client, kinesis_client, wait_until

FAST = dict(lease_duration_s=2.0, renew_interval_s=0.5)
POLL = dict(shard_sync_interval_s=1.0, lease_poll_interval_s=0.3)
_DIGITS = re.compile(r"^[0-9]+$")
_KCL_ATTRIBUTES = {"leaseKey", "leaseOwner", "leaseCounter", "ownerSwitchesSinceCheckpoint", "checkpoint",
                   "checkpointSubSequenceNumber", "pendingCheckpoint", "pendingCheckpointSubSequenceNumber",
                   "pendingCheckpointState", "parentShardId", "childShardIds", "startingHashKey", "endingHashKey",
                   "throughputKBps", "checkpointOwner", "entityType", "streamName", "shardId"}


@pytest.fixture
def broker_for(endpoint: str) -> Iterator[Any]:
    brokers: list[KinesisBroker] = []

    def make(store: KclLeaseStore) -> KinesisBroker:
        broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True, lease_store=store,
                               **FAST).connect()
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.shutdown()


def _put(kinesis: Any, stream: str, hash_key: str, data: bytes, key: str = "k") -> str:
    return str(kinesis.put_record(StreamName=stream, Data=data, PartitionKey=key,
                                  ExplicitHashKey=hash_key)["SequenceNumber"])


def _seed(endpoint: str, stream: str, table: str) -> tuple[set[bytes], set[bytes]]:
    """Publish to three shards and seed the KCL rows; returns (must arrive, must not arrive)."""
    kinesis = kinesis_client(endpoint)
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    low = [s["HashKeyRange"]["StartingHashKey"] for s in shards]
    ids = [s["ShardId"] for s in shards]
    want: set[bytes] = set()
    never: set[bytes] = set()
    for i in range(5):  # shard 0: TRIM_HORIZON: everything
        _put(kinesis, stream, low[0], f"s0-{i}".encode())
        want.add(f"s0-{i}".encode())
    never.add(b"s1-pre")
    _put(kinesis, stream, low[1], b"s1-pre")
    pk, _, blob = kpl_aggregate([(f"user-{i}", f"s1-agg-{i}".encode()) for i in range(5)])
    aggregate_seq = _put(kinesis, stream, low[1], blob, pk)
    never |= {f"s1-agg-{i}".encode() for i in range(3)}  # checkpointed through user record 2
    want |= {b"s1-agg-3", b"s1-agg-4"}
    seqs2 = [_put(kinesis, stream, low[2], f"s2-{i}".encode()) for i in range(6)]
    never |= {f"s2-{i}".encode() for i in range(3)}  # a dead worker checkpointed s2-2
    want |= {f"s2-{i}".encode() for i in range(3, 6)}
    dynamodb = dynamodb_client(endpoint)
    create_kcl_table(dynamodb, table)
    for item in (kcl_item(ids[0], counter=3, checkpoint="TRIM_HORIZON"),
                 kcl_item(ids[1], counter=12, checkpoint=aggregate_seq, sub=2, switches=1),
                 kcl_item(ids[2], counter=17, owner="kcl-worker-dead", checkpoint=seqs2[2])):
        dynamodb.put_item(TableName=table, Item=item)
    return want, never


def _scan(endpoint: str, table: str) -> list[dict[str, Any]]:
    return dynamodb_client(endpoint).scan(TableName=table, ConsistentRead=True)["Items"]


def _assert_valid_kcl_rows(items: list[dict[str, Any]], shard_ids: set[str]) -> None:
    """What KCL's fromDynamoRecord reads: every attribute KCL knows has KCL's type; ours are
    only the kinesisActors* ones; no presence or foreign rows."""
    assert {item["leaseKey"]["S"] for item in items} == shard_ids
    for item in items:
        assert set(item) - _KCL_ATTRIBUTES <= {"kinesisActorsCheckpoint", "kinesisActorsStartPosition",
                                              "kinesisActorsWriteToken", "kinesisActorsStreamArn",
                                              "kinesisActorsStreamCreationMs"}, item
        assert "leaseOwner" not in item and "checkpointOwner" not in item, item  # released as evictLease does
        assert _DIGITS.match(item["leaseCounter"]["N"]) and _DIGITS.match(item["ownerSwitchesSinceCheckpoint"]["N"])
        assert _DIGITS.match(item["checkpoint"]["S"]) or item["checkpoint"]["S"] in ("TRIM_HORIZON", "LATEST")
        assert _DIGITS.match(item["checkpointSubSequenceNumber"]["N"])


@pytest.mark.usefixtures("ray_session")
def test_takes_over_a_stopped_kcl_application_and_leaves_valid_kcl_rows(broker_for: Any, endpoint: str) -> None:
    stream, table = f"kcl-orders-{uuid.uuid4().hex[:6]}", f"kcl-app-{uuid.uuid4().hex[:6]}"
    create_stream(endpoint, stream, 3)
    want, never = _seed(endpoint, stream, table)
    counters = {i["leaseKey"]["S"]: int(i["leaseCounter"]["N"]) for i in _scan(endpoint, table)}
    broker = broker_for(KclLeaseStore(table))
    # start_at LATEST: the checkpoints and KCL's TRIM_HORIZON sentinel decide, not start_at
    sub = broker.subscribe(KinesisStream(stream, start_at=StartAt.latest(), **POLL))
    got: list[Any] = []
    deadline = time.monotonic() + 60
    while not want <= {r.data for r in got}:
        assert time.monotonic() < deadline, f"missing {sorted(want - {r.data for r in got})}"
        got.extend(sub.next_batch(timeout_s=0.5))
    late = _put(kinesis_client(endpoint), stream, "0", b"s0-late")  # published after the takeover
    wait_until(lambda: got.extend(sub.next_batch(timeout_s=0.5)) or b"s0-late" in {r.data for r in got},
               timeout_s=30, what="a record published after the takeover")
    delivered = [r.data for r in got]
    assert not never & set(delivered), sorted(never & set(delivered))
    sub.close()
    items = _scan(endpoint, table)
    _assert_valid_kcl_rows(items, set(counters))
    by_key = {i["leaseKey"]["S"]: i for i in items}
    assert all(int(by_key[k]["leaseCounter"]["N"]) > c for k, c in counters.items())  # KCL's fencing moved on
    shard0 = next(k for k in by_key if k.endswith("0"))
    assert by_key[shard0]["checkpoint"]["S"] == late  # a KCL fleet resumes after the last record we delivered


def test_missing_or_foreign_table_is_refused_at_open(endpoint: str) -> None:
    """``open()`` is what ``KinesisBroker.connect()`` calls on its store, before any stream is read."""
    with pytest.raises(LeaseStoreError, match=r"does not exist.*never creates it"):
        KclLeaseStore(f"no-such-kcl-app-{uuid.uuid4().hex[:6]}", endpoint=endpoint, region="us-east-1",
                      test_credentials=True).open()
    foreign = f"ours-{uuid.uuid4().hex[:6]}"
    dynamodb_client(endpoint).create_table(
        TableName=foreign, AttributeDefinitions=[{"AttributeName": "lease_key", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "lease_key", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
    with pytest.raises(LeaseStoreError, match="not a KCL lease table"):
        KclLeaseStore(foreign, endpoint=endpoint, region="us-east-1", test_credentials=True).open()


def test_a_live_kcl_worker_is_refused(endpoint: str) -> None:
    """A KCL renewal (DynamoDBLeaseRefresher.renewLease: leaseCounter +1, nothing of ours) seen
    between two reads raises KclFleetLiveError; a dead worker's row (counter still) does not."""
    table = f"kcl-app-{uuid.uuid4().hex[:6]}"
    dynamodb = dynamodb_client(endpoint)
    create_kcl_table(dynamodb, table)
    dynamodb.put_item(TableName=table, Item=kcl_item("shardId-000000000000", counter=5, owner="dead", checkpoint="1"))
    dynamodb.put_item(TableName=table, Item=kcl_item("shardId-000000000001", counter=8, owner="live", checkpoint="1"))
    store = KclLeaseStore(table, endpoint=endpoint, region="us-east-1", test_credentials=True).open()
    assert [lease.owner for lease in store.list("orders")] == ["dead", "live"]
    dynamodb.update_item(TableName=table, Key={"leaseKey": {"S": "shardId-000000000001"}},
                         UpdateExpression="SET leaseCounter = :c", ExpressionAttributeValues={":c": {"N": "9"}})
    with pytest.raises(KclFleetLiveError, match=r"'live'.*Stop the KCL fleet"):
        store.list("orders")
    with pytest.raises(KclFleetLiveError):
        store.take("orders", "shardId-000000000000", owner="me", duration_s=1.0)


def test_leases_command_prints_a_kcl_table(endpoint: str) -> None:
    """``kinesis-actors leases --kcl-table T`` prints KCL rows as it prints ours; worker-metrics
    entities (KCL 3.x, EntityType.java) are not leases and are not printed."""
    from click.testing import CliRunner

    from kinesis_actors.cli import cli

    table = f"kcl-app-{uuid.uuid4().hex[:6]}"
    dynamodb = dynamodb_client(endpoint)
    create_kcl_table(dynamodb, table)
    dynamodb.put_item(TableName=table, Item=kcl_item("shardId-000000000000", counter=5, owner="worker-a",
                                                     checkpoint="4959033827149025660855969253836157"))
    dynamodb.put_item(TableName=table, Item=kcl_item("shardId-000000000001", counter=2, checkpoint="777", sub=3))
    dynamodb.put_item(TableName=table, Item=kcl_item("worker-a", counter=1, entity_type="WORKER_METRIC_STATS"))
    result = CliRunner().invoke(cli, ["leases", "--kcl-table", table, "--stream", "orders", "--no-lag",
                                      "--endpoint", endpoint], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert f"KCL lease table {table}, stream orders (2 shards)" in result.output
    lines = [line for line in result.output.splitlines() if "shardId-" in line]
    assert "worker-a" in lines[0] and "4959033827149025660855969253836157" in lines[0]
    assert "free" in lines[1] and "777.3" in lines[1]
    assert "worker-a" not in result.output.split("shardId-000000000001")[1]  # no metrics row printed
    both = CliRunner().invoke(cli, ["leases", "--table", "t", "--kcl-table", table, "--endpoint", endpoint])
    assert both.exit_code == 2 and "exactly one of --table and --kcl-table" in both.output


def test_takeover_with_in_process_readers(endpoint: str) -> None:
    """The same takeover without Ray: the Coordinator's and readers' logic in this event loop
    (``CoordinatorCore`` + ``ShardReaderCore``), on the emulator over HTTP, through KclLeaseStore."""
    import asyncio

    from kinesis_actors.coordinator import CoordinatorCore
    from kinesis_actors.reader import ReaderIo, ShardReaderCore
    from kinesis_actors.testing import LocalReader

    stream, table = f"kcl-local-{uuid.uuid4().hex[:6]}", f"kcl-app-{uuid.uuid4().hex[:6]}"
    create_stream(endpoint, stream, 3)
    want, never = _seed(endpoint, stream, table)
    counters = {i["leaseKey"]["S"]: int(i["leaseCounter"]["N"]) for i in _scan(endpoint, table)}
    store = KclLeaseStore(table, endpoint=endpoint, region="us-east-1", test_credentials=True, stream=stream).open()
    kinesis = kinesis_client(endpoint)
    delivered: list[Any] = []

    async def deliver(records: list[Any]) -> None:
        delivered.extend(records)

    def launch(_: int) -> LocalReader:
        return LocalReader(ShardReaderCore(store=store.peer(), deliver=deliver, kinesis=kinesis,
                                           io=ReaderIo(kinesis_threads=2, store_threads=2)))

    async def scenario() -> None:
        core = CoordinatorCore(KinesisStream(stream, start_at=StartAt.latest(), **POLL), aws=None,  # type: ignore[arg-type]
                               store=store, owner_id="ours", lease_duration_s=2.0, renew_interval_s=0.5,
                               launcher=launch, kinesis=kinesis, call_timeout_s=10.0)
        await core.start()
        deadline = time.monotonic() + 60
        while not want <= {r.data for r in delivered}:
            assert core.error() is None, core.error()
            assert time.monotonic() < deadline, f"missing {sorted(want - {r.data for r in delivered})}"
            await asyncio.sleep(0.1)
        await core.close()

    asyncio.run(scenario())
    assert not never & {r.data for r in delivered}, sorted(never & {r.data for r in delivered})
    items = _scan(endpoint, table)
    _assert_valid_kcl_rows(items, set(counters))
    assert all(int(i["leaseCounter"]["N"]) > counters[i["leaseKey"]["S"]] for i in items)


def test_multi_stream_table(endpoint: str) -> None:
    """A multi-stream KCL table (DynamoDBMultiStreamLeaseSerializer: leaseKey
    ``account:stream:creationEpoch:shardId``, ``streamName``, ``shardId``): detected at open,
    rows found by stream name, new rows keyed as KCL keys them, other streams kept apart."""
    table = f"kcl-multi-{uuid.uuid4().hex[:6]}"
    dynamodb = dynamodb_client(endpoint)
    create_kcl_table(dynamodb, table)
    orders, payments = "123456789012:orders:1700000000", "123456789012:payments:1700000001"
    for identifier in (orders, payments):
        dynamodb.put_item(TableName=table, Item=kcl_item(f"{identifier}:shardId-000000000000", counter=4,
                                                         checkpoint="111", stream_name=identifier))
    store = KclLeaseStore(table, endpoint=endpoint, region="us-east-1", test_credentials=True).open()
    assert store.multi_stream is True
    [lease] = store.list("orders")
    assert (lease.shard_id, lease.checkpoint, lease.counter) == ("shardId-000000000000", "111", 4)
    taken = store.take("orders", "shardId-000000000000", owner="me", duration_s=1.0)
    assert taken is not None and taken.checkpoint == "111"
    store.checkpoint(taken, "222")
    child = store.take("orders", "shardId-000000000001", owner="me", duration_s=1.0,
                       parent_shard_ids=("shardId-000000000000",),
                       stream_identity=("arn:aws:kinesis:us-east-1:123456789012:stream/orders", 1_700_000_000_000))
    assert child is not None and child.parent_shard_ids == ("shardId-000000000000",)
    items = {i["leaseKey"]["S"]: i for i in _scan(endpoint, table)}
    new = items[f"{orders}:shardId-000000000001"]
    assert (new["streamName"]["S"], new["shardId"]["S"], new["checkpoint"]["S"]) == \
        (orders, "shardId-000000000001", "TRIM_HORIZON")
    assert items[f"{orders}:shardId-000000000000"]["checkpoint"]["S"] == "222"
    assert items[f"{payments}:shardId-000000000000"]["checkpoint"]["S"] == "111"  # another stream: untouched
    assert [lease.checkpoint for lease in store.list("payments")] == ["111"]
