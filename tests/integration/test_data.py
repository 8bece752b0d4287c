"""read_kinesis on the emulator: counts, schema, boundedness, KPL de-aggregation, end_at, closed shards."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pyarrow as pa
import pytest

from kinesis_actors import InvalidError, StartAt, StreamError
from kinesis_actors.data import RECORD_SCHEMA, KinesisDatasource, read_kinesis

from .helpers import create_stream, kinesis_client

pytestmark = pytest.mark.usefixtures("ray_session")


def put(endpoint: str, stream: str, prefix: str, n: int) -> list[bytes]:
    client = kinesis_client(endpoint)
    payloads = [f"{prefix}-{i}".encode() for i in range(n)]
    for start in range(0, n, 500):
        chunk = payloads[start : start + 500]
        response = client.put_records(StreamName=stream, Records=[
            {"Data": p, "PartitionKey": f"key-{start + i}"} for i, p in enumerate(chunk)])
        assert response["FailedRecordCount"] == 0
    return payloads


def read(endpoint: str, stream: str, **kwargs: Any) -> Any:
    return read_kinesis(stream, endpoint=endpoint, region="us-east-1", test_credentials=True, **kwargs)


def table(ds: Any) -> pa.Table:
    import ray

    blocks = ray.get(ds.to_arrow_refs())
    return pa.concat_tables(blocks) if blocks else RECORD_SCHEMA.empty_table()


def test_reads_every_record_with_the_fixed_schema(endpoint: str, unique: str) -> None:
    stream = f"data-all-{unique}"
    create_stream(endpoint, stream, 3)
    payloads = put(endpoint, stream, "r", 300)
    ds = read(endpoint, stream)
    assert ds.count() == 300
    t = table(ds)
    assert t.schema.equals(RECORD_SCHEMA)
    assert sorted(t.column("data").to_pylist()) == sorted(payloads)
    assert set(t.column("stream").to_pylist()) == {stream}
    assert len(set(t.column("shard_id").to_pylist())) == 3
    assert t.column("sub_sequence_number").null_count == 300
    arrivals = t.column("approximate_arrival_timestamp")
    assert arrivals.type == pa.timestamp("ms", tz="UTC") and arrivals.null_count == 0
    # per shard, rows keep sequence order
    for shard in set(t.column("shard_id").to_pylist()):
        seqs = [int(s) for s, sid in zip(t.column("sequence_number").to_pylist(), t.column("shard_id").to_pylist()) if sid == shard]
        assert seqs == sorted(seqs)


def test_one_read_task_per_shard(endpoint: str, unique: str) -> None:
    from kinesis_actors.aws import AwsSettings

    stream = f"data-tasks-{unique}"
    create_stream(endpoint, stream, 4)
    source = KinesisDatasource(stream, start_at=StartAt.trim_horizon(), end_at=None,
                               aws=AwsSettings(endpoint=endpoint, region="us-east-1", test_credentials=True),
                               max_records_per_block=100)
    tasks = source.get_read_tasks(1)
    assert len(tasks) == 4
    assert [t.metadata.input_files[0] for t in tasks] == [f"kinesis://{stream}/shardId-00000000000{i}" for i in range(4)]
    assert all(t.schema == RECORD_SCHEMA for t in tasks)


def test_records_published_after_the_call_are_excluded(endpoint: str, unique: str) -> None:
    stream = f"data-bound-{unique}"
    create_stream(endpoint, stream, 2)
    before = put(endpoint, stream, "before", 40)
    ds = read(endpoint, stream)  # lazy: nothing is read yet
    after = put(endpoint, stream, "after", 40)
    got = table(ds).column("data").to_pylist()
    assert sorted(got) == sorted(before)
    assert not set(got) & set(after)
    assert read(endpoint, stream).count() == 80  # a later call sees both


def test_end_at_and_start_at_timestamp(endpoint: str, unique: str) -> None:
    stream = f"data-end-{unique}"
    create_stream(endpoint, stream, 2)
    early = put(endpoint, stream, "early", 20)
    time.sleep(0.05)  # arrival timestamps have millisecond precision: keep the two groups apart
    cut = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.05)
    late = put(endpoint, stream, "late", 20)
    assert sorted(table(read(endpoint, stream, end_at=cut)).column("data").to_pylist()) == sorted(early)
    assert sorted(table(read(endpoint, stream, end_at=cut.timestamp())).column("data").to_pylist()) == sorted(early)
    got = table(read(endpoint, stream, start_at=StartAt.at_timestamp(cut))).column("data").to_pylist()
    assert sorted(got) == sorted(late)


def test_kpl_aggregates_are_split_into_user_records(endpoint: str, unique: str) -> None:
    from kinesis_actors.testing import kpl_aggregate

    stream = f"data-kpl-{unique}"
    create_stream(endpoint, stream, 1)
    users = [f"user-{i}".encode() for i in range(10)]
    pk, ehk, blob = kpl_aggregate([(f"pk-{i}", u) for i, u in enumerate(users)])
    client = kinesis_client(endpoint)
    client.put_record(StreamName=stream, Data=b"plain-before", PartitionKey="p")
    client.put_record(StreamName=stream, Data=blob, PartitionKey=pk, **({"ExplicitHashKey": ehk} if ehk else {}))
    client.put_record(StreamName=stream, Data=b"plain-after", PartitionKey="p")
    t = table(read(endpoint, stream))
    assert t.column("data").to_pylist() == [b"plain-before", *users, b"plain-after"]
    assert t.column("sub_sequence_number").to_pylist() == [None, *range(10), None]
    assert t.column("partition_key").to_pylist()[1:11] == [f"pk-{i}" for i in range(10)]
    assert len(set(t.column("sequence_number").to_pylist()[1:11])) == 1


def test_closed_shards_are_read_to_their_end(endpoint: str, unique: str) -> None:
    stream = f"data-split-{unique}"
    create_stream(endpoint, stream, 1)
    payloads = put(endpoint, stream, "parent", 30)
    client = kinesis_client(endpoint)
    client.split_shard(StreamName=stream, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(2**127))
    client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})
    shards = client.list_shards(StreamName=stream)["Shards"]
    assert len(shards) == 3 and "EndingSequenceNumber" in shards[0]["SequenceNumberRange"]
    t = table(read(endpoint, stream))  # three read tasks; the closed parent's ends at its tip
    assert sorted(t.column("data").to_pylist()) == sorted(payloads)
    assert set(t.column("shard_id").to_pylist()) == {"shardId-000000000000"}


def test_small_blocks_and_override_num_blocks(endpoint: str, unique: str) -> None:
    stream = f"data-blocks-{unique}"
    create_stream(endpoint, stream, 1)
    put(endpoint, stream, "b", 50)
    ds = read(endpoint, stream, max_records_per_block=8, ray_remote_args={"num_cpus": 0.5})
    assert ds.count() == 50
    ds4 = read(endpoint, stream, override_num_blocks=4)
    assert ds4.count() == 50


def test_empty_stream_gives_an_empty_dataset(endpoint: str, unique: str) -> None:
    stream = f"data-empty-{unique}"
    create_stream(endpoint, stream, 2)
    ds = read(endpoint, stream)
    assert ds.count() == 0


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"stream": "bad name!"}, "bad name!"),
        ({"stream": ""}, "''"),
        ({"start_at": StartAt.latest()}, "latest"),
        ({"start_at": "TRIM_HORIZON"}, "TRIM_HORIZON"),
        ({"start_at": StartAt.after_sequence_number("12")}, "12"),
        ({"end_at": dt.datetime(2020, 1, 1)}, "2020"),
        ({"end_at": "yesterday"}, "yesterday"),
        ({"max_records_per_block": 0}, "0"),
        ({"override_num_blocks": -1}, "-1"),
        ({"endpoint": "localhost:4567"}, "localhost:4567"),
        ({"ray_remote_args": ["num_cpus"]}, "num_cpus"),
        ({"start_at": StartAt.at_timestamp(time.time() + 3600)}, "AT_TIMESTAMP"),
    ],
)
def test_bad_arguments_are_refused_before_any_read(kwargs: dict[str, Any], bad: str) -> None:
    options: dict[str, Any] = {"stream": "fine", "endpoint": "http://127.0.0.1:9", "region": "us-east-1",
                               "test_credentials": True, **kwargs}
    stream = options.pop("stream")
    with pytest.raises(InvalidError, match=None) as info:
        read_kinesis(stream, **options)
    assert bad.lower() in str(info.value).lower()


def test_missing_stream_is_a_stream_error(endpoint: str, unique: str) -> None:
    with pytest.raises(StreamError, match=f"nope-{unique}"):
        read(endpoint, f"nope-{unique}")
