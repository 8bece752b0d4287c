"""ShardScan (the read task of read_kinesis) against a fake Kinesis client: no Ray, no network."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from kinesis_actors.data import RECORD_SCHEMA, ShardScan, records_to_table
from kinesis_actors.kinesis import ShardInfo
from kinesis_actors.records import Record, StartAt
from kinesis_actors.testing import FakeShard, client_error

T0 = 1_700_000_000.0


def scan(kinesis: FakeShard, bound_s: float, **kwargs: Any) -> tuple[ShardScan, list[Any]]:
    s = ShardScan(kinesis, "s", ShardInfo("shardId-000000000000"), StartAt.trim_horizon(), bound_s,
                  sleep=lambda _s: None, **kwargs)
    return s, list(s.blocks())


def data(blocks: list[Any]) -> list[bytes]:
    return [d for b in blocks for d in b.column("data").to_pylist()]


def test_reads_to_the_tip_in_blocks_of_bounded_size() -> None:
    kinesis = FakeShard(arrivals=[T0 + i for i in range(23)], max_per_call=5, lag_ms=1000)
    _s, blocks = scan(kinesis, T0 + 100, max_records_per_block=4)
    assert data(blocks) == [f"r{i}".encode() for i in range(1, 24)]
    assert [b.num_rows for b in blocks] == [4, 4, 4, 4, 4, 3]
    assert all(b.schema.equals(RECORD_SCHEMA) for b in blocks)
    # 23 records at 5 per call, and one more call that sees the tip (empty, MillisBehindLatest 0)
    assert len(kinesis.calls) == 6


def test_stops_at_the_first_record_after_the_bound_without_reaching_the_tip() -> None:
    kinesis = FakeShard(arrivals=[T0 + i for i in range(100)], max_per_call=10, lag_ms=5000)
    _s, blocks = scan(kinesis, T0 + 14.0)
    assert data(blocks) == [f"r{i}".encode() for i in range(1, 16)]  # arrivals T0..T0+14
    assert len(kinesis.calls) == 2


def test_empty_answers_behind_the_tip_do_not_end_the_read() -> None:
    kinesis = FakeShard(arrivals=[T0, T0 + 1], max_per_call=1, lag_ms=100)
    real = kinesis.get_records
    answers = iter([{"Records": [], "NextShardIterator": "0", "MillisBehindLatest": 5000}])

    def sparse(**kw: Any) -> dict[str, Any]:
        return next(answers, None) or real(**kw)

    kinesis.get_records = sparse  # type: ignore[method-assign]
    _, blocks = scan(kinesis, T0 + 10)
    assert data(blocks) == [b"r1", b"r2"]


def test_throttling_is_retried_and_an_expired_iterator_resumes_after_the_last_record() -> None:
    kinesis = FakeShard(arrivals=[T0 + i for i in range(12)], max_per_call=5, lag_ms=1)
    kinesis.faults = ["ProvisionedThroughputExceededException", "ProvisionedThroughputExceededException"]
    real = kinesis.get_records
    state = {"n": 0}

    def expire_once(**kw: Any) -> dict[str, Any]:
        state["n"] += 1
        if state["n"] == 4:  # after 2 throttles and one good page
            raise client_error("ExpiredIteratorException")
        return real(**kw)

    kinesis.get_records = expire_once  # type: ignore[method-assign]
    _, blocks = scan(kinesis, T0 + 100)
    assert data(blocks) == [f"r{i}".encode() for i in range(1, 13)]
    assert kinesis.iterator_requests[-1] == {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": "5"}


def test_a_closed_shard_ends_at_its_ending_sequence_number() -> None:
    kinesis = FakeShard(arrivals=[T0 + i for i in range(6)], max_per_call=3, lag_ms=10)
    s = ShardScan(kinesis, "s", ShardInfo("shardId-000000000000", ending_sequence_number="6"),
                  StartAt.trim_horizon(), T0 + 100, sleep=lambda _s: None)
    assert len(data(list(s.blocks()))) == 6
    assert len(kinesis.calls) == 2  # no extra call once the ending sequence number was read


def test_other_errors_are_translated() -> None:
    from kinesis_actors.errors import StreamError

    kinesis = FakeShard(arrivals=[T0])
    kinesis.faults = ["ResourceNotFoundException"]
    with pytest.raises(StreamError):
        scan(kinesis, T0 + 1)


def test_records_to_table_keeps_kpl_sub_sequence_numbers() -> None:
    when = dt.datetime.fromtimestamp(T0, dt.timezone.utc)
    table = records_to_table([Record(b"a", "k", "7", None, when, "sh", "s"), Record(b"b", "k", "8", 3, when, "sh", "s")])
    assert table.schema.equals(RECORD_SCHEMA)
    assert table.column("sub_sequence_number").to_pylist() == [None, 3]
    assert table.column("approximate_arrival_timestamp").to_pylist()[0] == when
