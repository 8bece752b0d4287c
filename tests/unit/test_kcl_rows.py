"""KCL lease rows <-> the library's rows, with rows written as KCL's serializer writes them.

Source of every row here: awslabs/amazon-kinesis-client,
``amazon-kinesis-client/src/main/java/software/amazon/kinesis/leases/dynamodb/DynamoDBLeaseSerializer.java``
(``toDynamoRecord``: ``leaseKey``, ``leaseCounter``, ``leaseOwner`` when held,
``ownerSwitchesSinceCheckpoint``, ``checkpoint``, ``checkpointSubSequenceNumber`` always,
``parentShardId`` / ``childShardIds`` when not empty, ``startingHashKey`` / ``endingHashKey``,
``checkpointOwner`` during a handoff, ``entityType`` ``LEASE``) and
``DynamoDBMultiStreamLeaseSerializer.java`` (``streamName``, ``shardId``); the updates are
``getDynamoTakeLeaseUpdate``, ``getDynamoEvictLeaseUpdate``, ``getDynamoUpdateLeaseUpdate``
and ``DynamoDBLeaseRefresher.initiateGracefulLeaseHandoff``. No I/O, no Ray.
"""

from __future__ import annotations

from typing import Any

import pytest

from kinesis_actors import KclLeaseStore
from kinesis_actors.balancing import ShardState, plan_leases
from kinesis_actors.errors import InvalidError
from kinesis_actors.leases.dynamodb import to_attr
from kinesis_actors.leases.kcl_rows import (
    is_lease_item,
    item_to_row,
    multi_stream_identifier,
    new_item,
    start_checkpoint,
    stream_of_identifier,
    view_row,
)
from kinesis_actors.leases.kcl_update import kcl_update
from kinesis_actors.leases.rows import row_to_lease
from tests.kcl_tables import kcl_item, plain

SHARD = "shardId-000000000001"
SEQ = "49590338271490256608559692538361571095921575989136588898"


def lease_of(item: dict[str, Any], stream: str = "orders", shard: str = SHARD) -> Any:
    return row_to_lease(item_to_row(plain(item), stream, shard, 10_000))


def test_sequence_checkpoint_of_a_plain_record() -> None:
    lease = lease_of(kcl_item(SHARD, counter=41, owner="kcl-worker-1", checkpoint=SEQ, switches=2,
                              hash_range=("0", "170141183460469231731687303715884105727")))
    assert (lease.owner, lease.counter, lease.checkpoint) == ("kcl-worker-1", 41, SEQ)
    # KCL writes sub-sequence 0 for a plain record AND for an aggregate's first user record;
    # resuming after (SEQ, 0) is right for both (KCL drops ESN <= checkpoint: ProcessTask.java).
    assert lease.checkpoint_sub_sequence == 0
    assert lease.start_position is None and lease.next_owner is None
    assert lease.key == f"orders:{SHARD}" and lease.duration_ms == 10_000


def test_kpl_sub_sequence_checkpoint() -> None:
    lease = lease_of(kcl_item(SHARD, counter=7, checkpoint=SEQ, sub=3))
    assert (lease.owner, lease.checkpoint, lease.checkpoint_sub_sequence) == (None, SEQ, 3)


@pytest.mark.parametrize("sentinel,start", [("TRIM_HORIZON", "TRIM_HORIZON"), ("LATEST", "LATEST"),
                                            ("AT_TIMESTAMP", "TRIM_HORIZON")])
def test_sentinels_are_start_positions(sentinel: str, start: str) -> None:
    """SentinelCheckpoint.java: a sentinel is where to start, not a record; AT_TIMESTAMP's time is
    KCL's configuration, not the row's, so it reads as the oldest record (never a loss)."""
    lease = lease_of(kcl_item(SHARD, counter=1, checkpoint=sentinel))
    assert lease.checkpoint is None and lease.start_position == start


def test_shard_end_and_parents() -> None:
    parent = lease_of(kcl_item("shardId-000000000000", counter=9, checkpoint="SHARD_END",
                               children=("shardId-000000000001", "shardId-000000000002")),
                      shard="shardId-000000000000")
    assert parent.finished
    child = lease_of(kcl_item(SHARD, counter=1, parents=("shardId-000000000000",)))
    assert child.parent_shard_ids == ("shardId-000000000000",) and child.start_position == "TRIM_HORIZON"


def test_kcl3_handoff_in_progress_is_held_by_the_checkpoint_owner() -> None:
    """initiateGracefulLeaseHandoff: leaseOwner = next owner, checkpointOwner = holder (actualOwner())."""
    lease = lease_of(kcl_item(SHARD, counter=5, owner="worker-b", checkpoint_owner="worker-a", checkpoint=SEQ))
    assert (lease.owner, lease.next_owner) == ("worker-a", "worker-b")


def test_entities_that_are_not_leases_are_skipped() -> None:
    """EntityType.java: KCL 3.x keeps worker metrics and coordinator state as other entity types."""
    assert is_lease_item(plain(kcl_item(SHARD, counter=1, entity_type=None)))  # pre-3.x rows have none
    assert is_lease_item(plain(kcl_item(SHARD, counter=1)))
    for entity in ("WORKER_METRIC_STATS", "LEADER", "STREAM", "CLIENT_VERSION_MIGRATION"):
        assert not is_lease_item(plain(kcl_item("worker-1", counter=1, entity_type=entity)))
    assert view_row(plain(kcl_item("worker-1", counter=1, entity_type="WORKER_METRIC_STATS")), None) is None


def test_our_exact_checkpoint_is_used_only_while_kcl_agrees() -> None:
    item = plain(kcl_item(SHARD, counter=3, checkpoint="100"))
    item["kinesisActorsCheckpoint"] = "100"  # we checkpointed a plain record: no sub-sequence
    assert row_to_lease(item_to_row(item, "s", SHARD, 1)).checkpoint_sub_sequence is None
    item.update(checkpoint="200", checkpointSubSequenceNumber=4)  # then a KCL worker checkpointed
    lease = row_to_lease(item_to_row(item, "s", SHARD, 1))
    assert (lease.checkpoint, lease.checkpoint_sub_sequence) == ("200", 4)


def test_our_start_position_is_used_only_while_kcl_agrees() -> None:
    item = plain(kcl_item(SHARD, counter=3, checkpoint="TRIM_HORIZON"))
    item["kinesisActorsStartPosition"] = "AT_TIMESTAMP:1700000000000"
    assert row_to_lease(item_to_row(item, "s", SHARD, 1)).start_position == "AT_TIMESTAMP:1700000000000"
    item["kinesisActorsStartPosition"] = "pending"  # a row we created: the subscription's start_at applies
    assert row_to_lease(item_to_row(item, "s", SHARD, 1)).start_position is None
    item["checkpoint"] = "LATEST"  # KCL re-created the lease meanwhile: KCL wins
    assert row_to_lease(item_to_row(item, "s", SHARD, 1)).start_position == "LATEST"


def test_start_positions_as_kcl_checkpoints() -> None:
    assert start_checkpoint("TRIM_HORIZON") == ("TRIM_HORIZON", 0)
    assert start_checkpoint("LATEST") == ("LATEST", 0)
    assert start_checkpoint(f"AFTER_SEQUENCE_NUMBER:{SEQ}") == (SEQ, 0)
    assert start_checkpoint(f"AFTER_SEQUENCE_NUMBER:{SEQ}:2") == (SEQ, 2)
    assert start_checkpoint("AT_TIMESTAMP:1700000000000") == ("TRIM_HORIZON", 0)  # re-read more, never less
    assert start_checkpoint(f"AT_SEQUENCE_NUMBER:{SEQ}") == ("TRIM_HORIZON", 0)
    assert start_checkpoint("pending") == ("TRIM_HORIZON", 0)


def test_multi_stream_keys() -> None:
    """StreamIdentifier.serialize(): account:stream:creationEpoch (seconds); leaseKey = that + ':' + shard."""
    identity = ("arn:aws:kinesis:us-east-1:123456789012:stream/orders", 1_700_000_000_123)
    assert multi_stream_identifier("orders", identity) == "123456789012:orders:1700000000"
    assert multi_stream_identifier("orders", ("not-an-arn", 1)) is None
    assert stream_of_identifier("123456789012:orders:1700000000") == "orders"
    assert stream_of_identifier("orders") is None
    item = plain(kcl_item(f"123456789012:orders:1700000000:{SHARD}", counter=2, checkpoint=SEQ,
                          stream_name="123456789012:orders:1700000000"))
    assert view_row(item, None) == {"stream": "orders", "shard_id": SHARD, "owner": None, "counter": 2,
                                    "checkpoint": SEQ, "expiry_ms": None}
    row = {"lease_key": f"orders:{SHARD}", "stream": "orders", "shard_id": SHARD, "lease_owner": "me",
           "lease_counter": 1, "lease_duration_ms": 1000, "parent_shard_ids": ("shardId-000000000000",)}
    created = new_item(row, f"123456789012:orders:1700000000:{SHARD}", "123456789012:orders:1700000000")
    assert created["streamName"] == "123456789012:orders:1700000000" and created["shardId"] == SHARD
    assert (created["checkpoint"], created["checkpointSubSequenceNumber"], created["leaseOwner"]) == \
        ("TRIM_HORIZON", 0, "me")
    assert created["parentShardId"] == ("shardId-000000000000",) and created["ownerSwitchesSinceCheckpoint"] == 0


def _clauses(update: Any) -> str:
    """The update expression with attribute names and values substituted, for reading."""
    text = update.expression + " IF " + update.condition
    for alias in sorted(update.names, key=len, reverse=True):
        text = text.replace(alias, update.names[alias])
    for alias in sorted(update.values, key=len, reverse=True):
        (_, value), = update.values[alias].items()
        text = text.replace(alias, repr(value))
    return text


def test_take_writes_what_take_lease_writes() -> None:
    """getDynamoTakeLeaseUpdate: owner PUT, checkpointOwner DELETE, switches ADD 1 on a change of owner."""
    text = _clauses(kcl_update("kcl-worker-1", 41, {"lease_owner": "me", "lease_counter": 42,
                                                    "lease_write_token": "t", "lease_duration_ms": 5},
                               ("lease_next_owner",), check_owner=True, to_attr=to_attr))
    assert "leaseOwner = 'me'" in text and "leaseCounter = '42'" in text and "kinesisActorsWriteToken = 't'" in text
    assert "ADD ownerSwitchesSinceCheckpoint '1'" in text and "REMOVE checkpointOwner" in text
    assert "leaseCounter = '41'" in text.split(" IF ")[1] and "leaseOwner = 'kcl-worker-1'" in text.split(" IF ")[1]
    assert "duration" not in text  # KCL rows have no duration: failoverTimeMillis is the application's
    free = _clauses(kcl_update(None, 3, {"lease_owner": "me", "lease_counter": 4}, ("lease_next_owner",),
                               check_owner=True, to_attr=to_attr))
    assert "ADD" not in free and "attribute_not_exists(leaseOwner)" in free


def test_checkpoint_writes_what_set_checkpoint_writes() -> None:
    """DynamoDBCheckpointer.setCheckpoint: checkpoint + sub, switches reset, pending checkpoint removed."""
    text = _clauses(kcl_update("me", 4, {"checkpoint": SEQ, "lease_counter": 5}, ("checkpoint_sub_sequence",),
                               check_owner=True, to_attr=to_attr))
    assert f"checkpoint = '{SEQ}'" in text and "checkpointSubSequenceNumber = '0'" in text
    assert "ownerSwitchesSinceCheckpoint = '0'" in text
    assert "REMOVE pendingCheckpoint, pendingCheckpointSubSequenceNumber, pendingCheckpointState" in text
    kpl = _clauses(kcl_update("me", 5, {"checkpoint": SEQ, "checkpoint_sub_sequence": 3, "lease_counter": 6}, (),
                              check_owner=True, to_attr=to_attr))
    assert "checkpointSubSequenceNumber = '3'" in kpl and f"kinesisActorsCheckpoint = '{SEQ}:3'" in kpl


def test_release_writes_what_evict_lease_writes() -> None:
    """getDynamoEvictLeaseUpdate (no handoff pending): DELETE leaseOwner and checkpointOwner, counter +1."""
    text = _clauses(kcl_update("me", 6, {"lease_counter": 7}, ("lease_owner",), check_owner=True, to_attr=to_attr))
    assert "REMOVE leaseOwner, checkpointOwner" in text and "leaseCounter = '7'" in text
    assert "checkpoint =" not in text  # the checkpoint is kept


def test_handoff_request_and_withdrawal_use_checkpoint_owner() -> None:
    """initiateGracefulLeaseHandoff: leaseOwner = asker, checkpointOwner = holder, counter unchanged."""
    ask = _clauses(kcl_update(None, 6, {"lease_next_owner": "thief"}, (), check_owner=False, to_attr=to_attr))
    assert "checkpointOwner = if_not_exists(checkpointOwner, leaseOwner)" in ask and "leaseOwner = 'thief'" in ask
    assert "leaseCounter =" not in ask.split(" IF ")[0]
    back = _clauses(kcl_update(None, 6, {}, ("lease_next_owner",), check_owner=False, to_attr=to_attr))
    assert "leaseOwner = checkpointOwner" in back and "REMOVE checkpointOwner" in back


def test_balancing_without_presence_rows_counts_lease_owners() -> None:
    """A KCL table has no presence rows: the planner counts the owners of live leases, as KCL 2.x
    does, so a newcomer holding nothing steals until the split is even."""
    shards = [f"shardId-{i:012d}" for i in range(4)]
    owner = dict.fromkeys(shards, "a")
    for _ in range(6):
        for me in ("b", "a"):
            states = [ShardState(s, owner[s]) for s in shards]
            plan = plan_leases(me, states, held=[s for s in shards if owner[s] == me], live_instances=[])
            for shard_id, _victim in plan.steal:
                owner[shard_id] = me  # the handoff completes
    assert sorted(owner.values()) == ["a", "a", "b", "b"]


def test_store_refuses_another_stream_and_writes_no_presence_without_io() -> None:
    store = KclLeaseStore("my-kcl-app", endpoint="http://127.0.0.1:9", region="us-east-1", test_credentials=True)
    store.claim_stream("orders")
    with pytest.raises(InvalidError, match="single-stream"):
        store.claim_stream("payments")
    assert store.heartbeat("orders", "me", duration_s=10.0).owner == "me"
    assert store.instances("orders") == [] and store.remove_presence("orders", "me") is None
    assert store.kcl.dynamo.client is None  # none of that reached DynamoDB
    with pytest.raises(InvalidError):
        KclLeaseStore("my-kcl-app", stream="a:b")
    with pytest.raises(InvalidError):
        KclLeaseStore("x")  # not a DynamoDB table name


def test_a_child_read_before_needs_no_parent_lease() -> None:
    """KCL's LeaseCleanupManager deletes a finished parent's lease once its children are read: a
    child row with a checkpoint is readable although its parent (still listed) has no row; a
    child never read still waits for its parents."""
    from kinesis_actors.config import KinesisStream
    from kinesis_actors.coordinator import CoordinatorCore
    from kinesis_actors.kinesis import ShardInfo
    from kinesis_actors.leases.protocol import Lease
    from kinesis_actors.testing import FakeKinesis, InProcessLeaseStore

    core = CoordinatorCore(KinesisStream("s"), aws=None, store=InProcessLeaseStore(), owner_id="me",  # type: ignore[arg-type]
                           lease_duration_s=1.0, renew_interval_s=0.2, launcher=lambda _: None,
                           kinesis=FakeKinesis(0))
    parent, child = ShardInfo("shardId-000000000000"), ShardInfo(SHARD, parent_shard_ids=("shardId-000000000000",))
    core.leases.shards = {parent.shard_id: parent, child.shard_id: child}
    assert not core.leases.parents_done(child, {})
    assert not core.leases.parents_done(child, {SHARD: Lease("s", SHARD, None, 1, start_position="TRIM_HORIZON")})
    assert core.leases.parents_done(child, {SHARD: Lease("s", SHARD, None, 4, checkpoint=SEQ)})


def test_a_live_kcl_worker_fails_the_subscription() -> None:
    """KclFleetLiveError is ``fatal``: the Coordinator's control loop fails the subscription
    (parks the error, releases) instead of retrying the poll."""
    import asyncio

    from kinesis_actors.config import KinesisStream
    from kinesis_actors.coordinator import CoordinatorCore
    from kinesis_actors.leases.kcl import KclFleetLiveError
    from kinesis_actors.records import StartAt
    from kinesis_actors.testing import FakeKinesis, InProcessLeaseStore

    class LiveKcl(InProcessLeaseStore):
        polls = 0

        def snapshot(self, stream: str) -> Any:
            LiveKcl.polls += 1
            if LiveKcl.polls > 1:
                raise KclFleetLiveError("a KCL worker is running on this table")
            return super().snapshot(stream)

    async def scenario() -> None:
        core = CoordinatorCore(KinesisStream("s", start_at=StartAt.trim_horizon(), lease_poll_interval_s=0.05),
                               aws=None, store=LiveKcl(), owner_id="me",  # type: ignore[arg-type]
                               lease_duration_s=1.0, renew_interval_s=0.2, launcher=lambda _: None,
                               kinesis=FakeKinesis(0), call_timeout_s=5.0)
        await core.start()
        deadline = asyncio.get_running_loop().time() + 10
        while core.error() is None:
            assert asyncio.get_running_loop().time() < deadline, "the subscription did not fail"
            await asyncio.sleep(0.02)
        assert isinstance(core.error(), KclFleetLiveError)
        await core.close()

    asyncio.run(scenario())


def test_kcl_fleet_live_error_is_exported_from_the_package() -> None:
    """Users catch it from the package, as they catch every error of the family."""
    import kinesis_actors
    from kinesis_actors import KclFleetLiveError, LeaseStoreError
    from kinesis_actors.leases.kcl import KclFleetLiveError as defined

    assert KclFleetLiveError is defined and "KclFleetLiveError" in kinesis_actors.__all__
    assert issubclass(KclFleetLiveError, LeaseStoreError)
