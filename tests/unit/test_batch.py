"""RecordBatch: one shard's batch as contiguous buffers, a lazy Sequence[Record]; Record's lazy arrival time."""

from __future__ import annotations

import dataclasses
import datetime as dt
import pickle
import random

import pyarrow as pa
import pytest

from kinesis_actors.arrow import RECORD_SCHEMA, records_to_table
from kinesis_actors.batch import RecordBatch, payload_bytes
from kinesis_actors.records import Record
from kinesis_actors.wire import batch_from_json_records

UTC = dt.timezone.utc
T0 = 1_764_633_769.0


def records(n: int, *, kpl: bool = False) -> list[Record]:
    rng = random.Random(n)
    out = []
    for i in range(n):
        arrival = T0 + rng.random() * 1000 if i % 5 else round(T0 + i * 0.001, 3)
        out.append(Record(rng.randbytes(i % 40), f"clé-{i}" if i % 3 == 0 else f"k{i}", str(10**55 + i // 2 if kpl else
                          10**55 + i), i % 2 if kpl else None, arrival, "shardId-000000000001", "orders",
                          f"{i}" if kpl and i % 4 == 0 else None))
    return out


def test_a_batch_is_a_sequence_of_the_records_it_was_built_from() -> None:
    recs = records(30)
    batch = pickle.loads(pickle.dumps(RecordBatch.from_records(recs)))
    assert len(batch) == 30 and batch == recs and list(batch) == recs
    assert batch[0] == recs[0] and batch[-1] == recs[-1] and batch[-30] == recs[0]
    assert batch[3:9] == recs[3:9] and isinstance(batch[3:9], RecordBatch) and batch[::2] == recs[::2]
    assert batch[25:100] == recs[25:] and batch[9:3] == [] and not batch[9:3]
    with pytest.raises(IndexError):
        batch[30]
    assert batch.last_position() == (recs[-1].sequence_number, None)
    assert payload_bytes(batch) == payload_bytes(recs) == sum(len(r.data) for r in recs)
    empty = RecordBatch.empty("s", "x")
    assert empty == [] and not empty and len(pickle.loads(pickle.dumps(empty))) == 0
    assert batch != recs[:-1] and batch != [*recs[:-1], recs[0]]


def test_kpl_user_records_keep_sub_sequence_and_explicit_hash_key() -> None:
    recs = records(12, kpl=True)
    batch = pickle.loads(pickle.dumps(RecordBatch.from_records(recs)))
    assert batch == recs
    assert [r.sub_sequence_number for r in batch] == [r.sub_sequence_number for r in recs]
    assert [r.explicit_hash_key for r in batch] == [r.explicit_hash_key for r in recs]
    assert batch.last_position() == (recs[-1].sequence_number, 1)
    skip = recs[5].position
    assert batch.after(skip) == [r for r in recs if r.position > skip]


def test_the_pickle_is_a_few_buffers_not_one_object_per_record() -> None:
    recs = [Record(bytes(1024), f"k{i}", str(10**55 + i), None, T0 + i, "s", "x") for i in range(1000)]
    blob = pickle.dumps(RecordBatch.from_records(recs), protocol=5)
    assert b"Record\n" not in blob and b"\x8c\x06Record" not in blob
    assert len(blob) < 1000 * 1024 + 1000 * (56 + 5 + 8 + 12) + 500  # payloads, keys, numbers, offsets, arrivals
    assert len(pickle.dumps(recs, protocol=5)) > len(blob)


def test_to_arrow_wraps_the_payload_buffer_and_matches_records_to_table() -> None:
    recs = records(200, kpl=True)
    batch = RecordBatch.from_records(recs)
    arrow = batch.to_arrow()
    assert isinstance(arrow, pa.RecordBatch) and arrow.schema == RECORD_SCHEMA
    table = pa.Table.from_batches([arrow])
    assert table.equals(records_to_table(recs))  # the list path builds datetimes; same milliseconds
    assert arrow.column("data").buffers()[2].address == pa.py_buffer(batch._data).address  # no copy
    assert records_to_table(batch[10:20]).equals(records_to_table(recs[10:20]))


def test_arrival_milliseconds_match_pyarrow_on_datetimes_at_the_rounding_edges() -> None:
    rng = random.Random(7)
    stamps = [T0 + k / 1000 + d for k in range(200) for d in (0.0, 0.0004995, 0.0009995, 0.0009999996)]
    stamps += [T0 + rng.random() * 10**6 for _ in range(2000)]
    recs = [Record(b"", "k", str(i + 1), None, s, "s", "x") for i, s in enumerate(stamps)]
    want = pa.array([r.approximate_arrival_timestamp for r in recs], pa.timestamp("ms", tz="UTC"))
    assert RecordBatch.from_records(recs).to_arrow().column("approximate_arrival_timestamp").equals(want)


def test_a_missing_arrival_time_stays_none() -> None:
    batch = RecordBatch.from_columns("s", "x", [b"a"], ["k"], ["1"], [None])
    assert batch[0].approximate_arrival_timestamp is None and batch.arrival_epoch_s(0) is None
    assert batch.first_arriving_after(0.0) == 1
    assert batch.to_arrow().column("approximate_arrival_timestamp").null_count == 1


def test_json_records_decode_like_botocore_and_aggregates_split() -> None:
    from kinesis_actors.testing import kpl_aggregate

    pk, _ehk, blob = kpl_aggregate([("u1", b"one"), ("u2", b"two")])
    import base64

    raw = [{"SequenceNumber": "7", "ApproximateArrivalTimestamp": 1.764633769123e9, "PartitionKey": "p",
            "Data": base64.b64encode(b"plain").decode()},
           {"SequenceNumber": "8", "ApproximateArrivalTimestamp": 1.764633769124e9, "PartitionKey": pk,
            "Data": base64.b64encode(blob).decode()}]
    batch = batch_from_json_records(raw, shard_id="s", stream="x")
    assert [(r.data, r.partition_key, r.sequence_number, r.sub_sequence_number) for r in batch] == [
        (b"plain", "p", "7", None), (b"one", "u1", "8", 0), (b"two", "u2", "8", 1)]
    assert batch[0].approximate_arrival_timestamp == dt.datetime.fromtimestamp(1.764633769123e9, UTC)


def test_a_record_s_arrival_time_is_built_when_read_and_the_record_is_frozen() -> None:
    lazy = Record(b"d", "k", "1", None, T0 + 0.123, "s", "x")
    eager = Record(b"d", "k", "1", None, dt.datetime.fromtimestamp(T0 + 0.123, UTC), "s", "x")
    naive = Record(b"d", "k", "1", None, dt.datetime.fromtimestamp(T0 + 0.123, UTC).replace(tzinfo=None), "s", "x")
    assert lazy.arrival_epoch_s == T0 + 0.123
    assert lazy == eager == naive and hash(lazy) == hash(eager)
    assert lazy.approximate_arrival_timestamp == eager.approximate_arrival_timestamp
    assert naive.approximate_arrival_timestamp.tzinfo is UTC
    assert pickle.loads(pickle.dumps(lazy)) == eager
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.data = b"x"  # type: ignore[misc]
    assert "approximate_arrival_timestamp=datetime.datetime(" in repr(lazy)
