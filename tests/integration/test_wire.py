"""The fast ``GetRecords`` path (kinesis_actors.wire) returns what botocore returns, on
moto, kinesalite and kinesis-mock: the same records (KPL aggregates split), the same
Arrow columns, the same end-of-shard answer, the same errors.

Each case reads ONE shard iterator twice, through ``client.get_records`` and through
``WireGetRecords.call`` (a Kinesis iterator may be used more than once)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from kinesis_actors.arrow import records_to_table
from kinesis_actors.batch import RecordBatch
from kinesis_actors.kinesis import ShardFetcher
from kinesis_actors.records import StartAt, records_from_response
from kinesis_actors.testing import kpl_aggregate
from kinesis_actors.wire import WireGetRecords, wire_get_records

from .helpers import create_stream, kinesis_client

SHARD = "shardId-000000000000"


def _both(client: Any, iterator: str, stream: str, shard_id: str = SHARD, limit: int = 10_000) -> tuple[Any, Any]:
    boto = client.get_records(ShardIterator=iterator, Limit=limit)
    fast = WireGetRecords(client).call(iterator, limit, shard_id=shard_id, stream=stream)
    return boto, fast


def assert_same(boto: dict[str, Any], fast: dict[str, Any], stream: str, shard_id: str = SHARD) -> RecordBatch:
    """Records equal (field by field, arrival to the microsecond), Arrow columns equal, and
    the rest of the answer as ShardFetcher reads it."""
    expected = records_from_response(boto["Records"], shard_id=shard_id, stream=stream)
    batch = fast["Records"]
    assert isinstance(batch, RecordBatch)
    assert batch == expected and list(batch) == expected
    assert [r.approximate_arrival_timestamp for r in batch] == [r.approximate_arrival_timestamp for r in expected]
    assert all(r.approximate_arrival_timestamp is None or r.approximate_arrival_timestamp.utcoffset().total_seconds() == 0
               for r in batch)
    assert records_to_table(batch).equals(records_to_table(expected))
    assert (fast.get("NextShardIterator") is None) == (boto.get("NextShardIterator") is None)
    # kinesalite's lag of a closed shard grows with the time since it closed: compare what
    # ShardFetcher reads of it (absent, zero or not)
    lags = fast.get("MillisBehindLatest"), boto.get("MillisBehindLatest")
    assert (lags[0] is None, not lags[0]) == (lags[1] is None, not lags[1])
    children = [(c["ShardId"], sorted(c["ParentShards"])) for c in boto.get("ChildShards") or []]
    assert [(c["ShardId"], sorted(c["ParentShards"])) for c in fast.get("ChildShards") or []] == children
    return batch


def _iterator(client: Any, stream: str, shard_id: str = SHARD, kind: str = "TRIM_HORIZON") -> str:
    it: str = client.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType=kind)["ShardIterator"]
    return it


def _publish_mixed(client: Any, stream: str) -> list[bytes]:
    """Plain records (binary, empty-ish, unicode keys, 1 KiB) and two KPL aggregates."""
    sent = []
    for i in range(40):
        data = os.urandom(1024) if i % 3 else bytes([i]) * (i + 1)
        client.put_record(StreamName=stream, Data=data, PartitionKey=f"clé-{i}" if i % 4 == 0 else f"k{i}")
        sent.append(data)
    for n in (3, 7):
        pk, ehk, blob = kpl_aggregate([(f"user-{n}-{j}", f"agg{n}-{j}".encode()) for j in range(n)])
        client.put_record(StreamName=stream, Data=blob, PartitionKey=pk, **({"ExplicitHashKey": ehk} if ehk else {}))
    return sent


def _check_emulator(url: str, stream: str) -> None:
    create_stream(url, stream, 1)
    client = kinesis_client(url)
    assert wire_get_records(client) is not None
    _publish_mixed(client, stream)
    boto, fast = _both(client, _iterator(client, stream), stream)
    batch = assert_same(boto, fast, stream)
    assert len(batch) == 40 + 3 + 7 and batch[-1].sub_sequence_number == 6
    assert [r.explicit_hash_key for r in batch[40:]] == [r.explicit_hash_key for r in
                                                          records_from_response(boto["Records"], shard_id=SHARD,
                                                                                stream=stream)[40:]]
    # a small Limit, then the rest
    boto, fast = _both(client, _iterator(client, stream), stream, limit=5)
    assert len(assert_same(boto, fast, stream)) == 5
    # empty: an iterator at the tip
    boto, fast = _both(client, _iterator(client, stream, kind="LATEST"), stream)
    assert len(assert_same(boto, fast, stream)) == 0 and fast["Records"] == []
    # errors from the emulator itself: a malformed iterator
    bad = _rejected_iterator(client, _iterator(client, stream))
    _same_error(lambda: client.get_records(ShardIterator=bad), lambda: WireGetRecords(client).call(
        bad, 10, shard_id=SHARD, stream=stream))


def _rejected_iterator(client: Any, good: str) -> str:
    """An iterator with its tail overwritten that the emulator rejects. kinesis-mock's
    iterator is an AES ciphertext: now and then an overwritten tail still decrypts to one
    it accepts (a CI run saw it), so a few tails are tried; one must be rejected."""
    for tail in ("AAAAAA", "BBBBBB", "zzzzzz", "012345"):
        bad = good[:-6] + tail
        try:
            client.get_records(ShardIterator=bad, Limit=1)
        except ClientError:  # the emulator's error answer (an unreachable emulator is no answer)
            return bad
    raise AssertionError(f"the emulator accepted every malformed iterator made from {good!r}")


def _same_error(boto: Callable[[], Any], fast: Callable[[], Any]) -> None:
    with pytest.raises(Exception) as want:
        boto()
    with pytest.raises(Exception) as got:
        fast()
    assert type(got.value) is type(want.value)
    assert got.value.response["Error"] == want.value.response["Error"]  # type: ignore[attr-defined]
    assert got.value.response["ResponseMetadata"]["HTTPStatusCode"] == \
        want.value.response["ResponseMetadata"]["HTTPStatusCode"]  # type: ignore[attr-defined]


def test_moto_fast_path_equals_botocore(endpoint: str, unique: str) -> None:
    _check_emulator(endpoint, f"wire-{unique}")


def test_the_parser_over_urllib3_equals_botocore(endpoint: str, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """KINESIS_ACTORS_WIRE_HTTP=0: the same parser, the requests sent by urllib3, not WirePool."""
    from kinesis_actors.wire import HTTP_ENV

    monkeypatch.setenv(HTTP_ENV, "0")
    client = kinesis_client(endpoint)
    assert WireGetRecords(client)._http is None
    _check_emulator(endpoint, f"wire-u3-{unique}")


def test_a_shard_fetcher_reads_through_the_fast_path_on_moto(endpoint: str, unique: str) -> None:
    stream = f"wire-fetch-{unique}"
    create_stream(endpoint, stream, 1)
    client = kinesis_client(endpoint)
    sent = _publish_mixed(client, stream)
    fetcher = ShardFetcher(client, stream, SHARD, StartAt.trim_horizon(), max_records=7)
    assert fetcher._wire is not None
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 50 and time.monotonic() < deadline:
        time.sleep(fetcher.due_in())
        step = fetcher.step()
        if step is not None:
            assert step.bytes == step.records.nbytes
            got.extend(step.records)
    assert [r.data for r in got[:40]] == sent and len(got) == 50
    assert fetcher.position == StartAt.after_sequence_number(got[-1].sequence_number, 6)


@pytest.mark.kinesalite
def test_kinesalite_fast_path_equals_botocore(kinesalite: str, unique: str) -> None:
    _check_emulator(kinesalite, f"wire-{unique}")


@pytest.mark.kinesalite
def test_kinesalite_end_of_a_closed_shard_equals_botocore(kinesalite: str, unique: str) -> None:
    """kinesalite ends a closed shard with a null ``NextShardIterator`` (no ``ChildShards``;
    AWS's ``ChildShards`` answer is canned in test_wire_errors.py)."""
    from .kinesalite_bench import split

    stream = f"wire-split-{unique}"
    create_stream(kinesalite, stream, 1)
    client = kinesis_client(kinesalite)
    for i in range(5):
        client.put_record(StreamName=stream, Data=f"before-{i}".encode(), PartitionKey=f"k{i}")
    split(kinesalite, stream)
    iterator: str | None = _iterator(client, stream)
    ends = 0
    for _ in range(20):  # read the closed parent to its end
        assert iterator is not None
        boto, fast = _both(client, iterator, stream)
        assert_same(boto, fast, stream)
        iterator = boto.get("NextShardIterator")
        if iterator is None:
            ends += 1
            assert [c["ShardId"] for c in fast.get("ChildShards") or []] == \
                [c["ShardId"] for c in boto.get("ChildShards") or []]
            break
    assert ends == 1, "the closed parent never ended"


@pytest.mark.kinesis_mock
def test_kinesis_mock_fast_path_equals_botocore(kinesis_mock: str, unique: str) -> None:
    _check_emulator(kinesis_mock, f"wire-{unique}")
