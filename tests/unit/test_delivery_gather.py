"""BatchGatherer: batch size, bytes and window, on a fake clock."""

from __future__ import annotations

import pytest

from kinesis_actors import InvalidError
from kinesis_actors.delivery import BatchGatherer, record_size
from kinesis_actors.testing import FakeClock

from .delivery_fakes import rec, recs


def test_without_a_window_what_is_gathered_goes_at_once_within_the_limit() -> None:
    g = BatchGatherer(max_records=50, clock=FakeClock())
    g.add(recs(120))
    sizes = [len(b) for b in iter(g.take, None)]
    assert sizes == [50, 50, 20] and len(g) == 0 and g.held_bytes == 0


def test_a_window_waits_until_the_limit_or_the_window_end() -> None:
    clock = FakeClock()
    g = BatchGatherer(max_records=10, window_s=2.0, clock=clock)
    g.add(recs(4))
    assert g.take() is None and g.due_in() == pytest.approx(2.0)
    clock.advance(1.5)
    g.add([rec(i) for i in range(4, 8)])
    assert g.take() is None and g.due_in() == pytest.approx(0.5)  # counted from the oldest record
    clock.advance(0.5)
    assert g.ready()
    assert [r.sequence_number for r in g.take() or []] == [str(1000 + i) for i in range(8)]
    assert g.due_in() is None


def test_a_full_batch_goes_before_the_window_ends_and_the_rest_keeps_its_own_time() -> None:
    clock = FakeClock()
    g = BatchGatherer(max_records=5, window_s=10.0, clock=clock)
    g.add(recs(7))
    assert len(g.take() or []) == 5
    assert g.take() is None and g.due_in() == pytest.approx(10.0)
    clock.advance(10.0)
    assert len(g.take() or []) == 2


def test_the_byte_limit_counts_payload_and_key_and_a_large_record_goes_alone() -> None:
    clock = FakeClock()
    small = [rec(i, key="k", data=b"x" * 9) for i in range(5)]  # 10 bytes each
    big = rec(9, key="k", data=b"y" * 99)
    assert record_size(small[0]) == 10
    g = BatchGatherer(max_records=100, max_bytes=30, window_s=5.0, clock=clock)
    g.add(small[:2])
    assert g.take() is None  # 20 of 30 bytes
    g.add(small[2:3])
    assert [r.sequence_number for r in g.take() or []] == ["1000", "1001", "1002"]  # exactly 30
    g.add([small[3], big, small[4]])
    assert [len(b) for b in iter(g.take, None)] == [1, 1]  # r3 alone (big does not fit), then big alone
    assert g.take() is None and len(g) == 1
    assert [len(b) for b in g.take_round(force=True) or []] == [1] and g.take(force=True) is None


def test_held_bytes_follow_what_is_gathered() -> None:
    g = BatchGatherer(max_records=3, window_s=1.0, clock=FakeClock())
    g.add(recs(5))
    total = sum(record_size(r) for r in recs(5))
    assert g.held_bytes == total
    batch = g.take() or []
    assert g.held_bytes == total - sum(record_size(r) for r in batch)
    assert len(g.drop()) == 2 and g.held_bytes == 0


def test_bad_limits_are_refused() -> None:
    with pytest.raises(InvalidError):
        BatchGatherer(max_records=0, clock=FakeClock())
    with pytest.raises(InvalidError):
        BatchGatherer(max_records=1, window_s=-1, clock=FakeClock())


def test_a_round_cuts_a_contiguous_run_into_one_batch_per_lane_by_key() -> None:
    """Every record of a key lands in one lane; new keys go to the emptiest lane, so 8 keys
    fill 4 lanes evenly; the round ends before a record whose lane is full."""
    g = BatchGatherer(max_records=4, clock=FakeClock(), lanes=4)
    records = [rec(i, key=f"k{i % 8}") for i in range(20)]
    g.add(records)
    parts = g.take_round()
    assert parts is not None and [len(p) for p in parts] == [4, 4, 4, 4]
    taken = sorted((r for p in parts for r in p), key=lambda r: r.position)
    assert taken == records[:16]  # contiguous, from the front
    for part in parts:
        assert len({r.partition_key for r in part}) == 2
        assert part == sorted(part, key=lambda r: r.position)
    assert g.take_round() is not None and len(g) == 0  # window 0: the rest goes as it is


def test_a_round_with_a_hot_key_ends_at_the_hot_keys_limit() -> None:
    g = BatchGatherer(max_records=3, window_s=5.0, clock=FakeClock(), lanes=2)
    g.add([rec(0, key="hot"), rec(1, key="hot"), rec(2, key="cold"), rec(3, key="hot")])
    assert not g.ready()  # the hot lane is full but the cold one is not: the round may still grow
    g.add([rec(4, key="hot")])
    assert g.ready()  # a fourth hot record cannot join: the round ends before it
    parts = g.take_round()
    assert parts is not None and sorted(len(p) for p in parts) == [1, 3] and len(g) == 1


def test_a_round_keeps_the_byte_limit_per_lane() -> None:
    g = BatchGatherer(max_records=100, max_bytes=30, clock=FakeClock(), lanes=2, window_s=1.0)
    g.add([rec(i, key=f"k{i % 2}", data=b"x" * 8) for i in range(7)])  # 10 bytes each
    parts = g.take_round()
    assert parts is not None and [len(p) for p in parts] == [3, 3] and len(g) == 1


def test_the_window_counts_from_arrival_never_longer_than_from_gathering() -> None:
    """With a wall clock the window starts at a record's ApproximateArrivalTimestamp (the idle
    wait before the fetch is part of it), clamped to [gathered - window, gathered]."""
    clock, wall = FakeClock(), FakeClock(start=1_000.0)
    g = BatchGatherer(max_records=10, window_s=1.0, clock=clock, wall_clock=wall)
    g.add([rec(0, arrival=999.3)])  # arrived 0.7 s before it was gathered
    assert g.due_in() == pytest.approx(0.3)
    g.drop()
    g.add([rec(1, arrival=990.0)])  # long ago: due at once
    assert g.ready()
    g.drop()
    g.add([rec(2, arrival=1_005.0)])  # a clock ahead of ours: the plain window, never longer
    assert g.due_in() == pytest.approx(1.0)
    g.drop()
    g.add([rec(3, arrival=None)])
    assert g.due_in() == pytest.approx(1.0)
    plain = BatchGatherer(max_records=10, window_s=1.0, clock=clock)
    plain.add([rec(4, arrival=999.3)])
    assert plain.due_in() == pytest.approx(1.0)  # without a wall clock: from gathering


def test_a_new_key_joins_a_lane_with_room_for_its_bytes() -> None:
    g = BatchGatherer(max_records=100, max_bytes=30, window_s=1.0, clock=FakeClock(), lanes=2)
    g.add([rec(0, key="a", data=b"x" * 24), rec(1, key="b", data=b"x" * 4), rec(2, key="b", data=b"x" * 4),
           rec(3, key="c", data=b"x" * 9)])  # c (10 bytes) does not fit a's lane (25 bytes) but fits b's
    assert not g.ready()  # the round is not closed early
    parts = g.take_round(force=True)
    assert parts is not None and [[r.partition_key for r in p] for p in parts] == [["a"], ["b", "b", "c"]]
    with pytest.raises(InvalidError):
        g.take()  # a round is one batch per lane
