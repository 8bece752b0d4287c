"""ShardFetcher, the one read path of a shard (used by the read loops and by read_kinesis): no Ray, no network."""

from __future__ import annotations

import pytest

from kinesis_actors import pacing
from kinesis_actors.backoff import THROTTLE_BACKOFF
from kinesis_actors.errors import InvalidError, StreamError
from kinesis_actors.kinesis import MIN_CALL_SPACING_S, ShardFetcher, backoff_s, idle_due
from kinesis_actors.records import StartAt
from kinesis_actors.testing import FakeClock, FakeShard, kpl_aggregate


def fetcher(shard: FakeShard, clock: FakeClock, **kw: object) -> ShardFetcher:
    return ShardFetcher(shard, "s", "shardId-0", kw.pop("start", StartAt.trim_horizon()),  # type: ignore[arg-type]
                        clock=clock, rng=kw.pop("rng", lambda: 0.0), **kw)  # type: ignore[arg-type]


def drive(f: ShardFetcher, clock: FakeClock, steps: int) -> list[object]:
    """Step ``steps`` times, moving the fake clock by whatever the fetcher asks to wait."""
    out = []
    for _ in range(steps):
        clock.advance(f.due_in())
        out.append(f.step())
    return out


def test_each_step_is_one_call_and_calls_are_never_closer_than_the_aws_limit() -> None:
    shard, clock = FakeShard(30), FakeClock()
    f = fetcher(shard, clock, max_records=10)
    assert f.step() is None and f.has_iterator, "the first step opens the iterator"
    got = [f.step() for _ in range(3) if not f.due_in()]
    assert len(got) == 1, "a second GetRecords must wait"
    assert f.due_in() == pytest.approx(MIN_CALL_SPACING_S)
    results = drive(f, clock, 3)
    assert [len(r.records) for r in [got[0], *results]] == [10, 10, 10, 0]  # type: ignore[union-attr]
    assert f.get_records_calls == 4


def test_at_the_tip_the_wait_doubles_up_to_the_cap_and_records_reset_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "_IDLE_PHASE", 0.75)  # the idle grid (0.1 s): ... 1000.375, 1000.475 ...
    shard, clock = FakeShard(1), FakeClock()
    f = fetcher(shard, clock, idle_wait_s=0.25, max_idle_wait_s=1.0)
    drive(f, clock, 2)  # open, read the one record
    waits = []
    for _ in range(5):
        clock.advance(f.due_in())
        got = f.step()
        assert got is not None and got.at_tip and not got.records
        waits.append(round(f.due_in(), 3))
    # at 1000.2: + 0.25 -> 1000.375 on the grid, but the AWS spacing (1000.4) is later;
    # 1000.4 + 0.5 -> 1000.875; then on the grid, max_idle_wait_s apart
    assert waits == [0.2, 0.475, 1.0, 1.0, 1.0]
    clock.advance(f.due_in())
    shard.add(2)
    got = f.step()
    assert got is not None and len(got.records) == 2 and not got.at_tip
    assert f.due_in() == pytest.approx(MIN_CALL_SPACING_S), "records: poll again as soon as allowed"


@pytest.mark.parametrize("now", [1000.0, 1000.03, 1000.099, 1234.5678])
@pytest.mark.parametrize("phase", [0.0, 0.37])
def test_an_idle_poll_is_due_at_the_latest_point_of_the_grid_before_its_wait_ends(now: float, phase: float) -> None:
    slot = 1.0
    due = idle_due(now, slot, slot, phase)
    assert now < due <= now + slot
    points = (due - phase * slot) / slot
    assert points == pytest.approx(round(points), abs=1e-6), "on the grid"
    short = idle_due(now, 0.01, slot, phase)
    assert now < short <= now + 0.01, "never later than the wait, never at or before now"


def test_idle_shards_that_reached_the_tip_at_different_moments_poll_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "_IDLE_PHASE", 0.0)  # the grid (0.1 s): ... 1001.0, 1001.1 ...
    clock = FakeClock(1000.0)
    fetchers = [fetcher(FakeShard(0), clock, idle_wait_s=1.0, max_idle_wait_s=1.0) for _ in range(3)]
    dues = []
    for f in fetchers:  # each shard reaches the tip 0.03 s after the one before, within one slot
        f.step()
        clock.advance(0.03)
        assert f.step() is not None
        dues.append(round(clock() + f.due_in(), 6))
    assert dues == [1001.0] * 3  # 1001.03, 1001.06 and 1001.09 rounded down to the grid
    for f in fetchers:  # once on the grid, once per max_idle_wait_s
        clock.advance(f.due_in())
        f.step()
        assert f.due_in() == pytest.approx(1.0)


def test_a_shard_idle_for_hours_keeps_polling_once_per_max_idle_wait() -> None:
    shard, clock = FakeShard(0), FakeClock()
    f = fetcher(shard, clock, idle_wait_s=0.25, max_idle_wait_s=1.0)
    drive(f, clock, 1)
    for _ in range(1100):  # past 2 ** 1024, which as a float overflows
        clock.advance(f.due_in())
        assert f.step() is not None
    assert 0 < f.due_in() <= 1.0
    assert idle_due(5.0, 0.5, 0.0) == 5.5, "no grid when the cap is 0"


def test_an_expired_iterator_reopens_after_the_last_record_returned() -> None:
    shard, clock = FakeShard(5), FakeClock()
    f = fetcher(shard, clock)
    drive(f, clock, 2)
    shard.faults.append("ExpiredIteratorException")
    shard.add(3)
    assert drive(f, clock, 2) == [None, None] and f.expired_iterators == 1
    assert shard.iterator_requests[-1] == {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": "5"}
    got = drive(f, clock, 1)[0]
    assert [r.sequence_number for r in got.records] == ["6", "7", "8"]  # type: ignore[union-attr]


def test_an_iterator_expiring_before_any_record_reopens_at_restart_at_not_at_a_later_tip() -> None:
    shard, clock = FakeShard(2), FakeClock()
    pinned = StartAt.at_timestamp(1_700_000_000.0)
    f = fetcher(shard, clock, start=StartAt.latest(), restart_at=pinned)
    drive(f, clock, 1)
    shard.faults.append("ExpiredIteratorException")
    drive(f, clock, 2)
    assert shard.iterator_requests[0]["ShardIteratorType"] == "LATEST"
    assert shard.iterator_requests[1]["ShardIteratorType"] == "AT_TIMESTAMP"


def test_throttling_backs_off_exponentially_on_both_calls_and_resets_after_a_success() -> None:
    shard, clock = FakeShard(3), FakeClock()
    shard.iterator_faults.append("LimitExceededException")
    shard.faults += ["ProvisionedThroughputExceededException"] * 2
    f = fetcher(shard, clock, rng=lambda: 0.5)
    waits = []
    for _ in range(5):
        clock.advance(f.due_in())
        f.step()
        waits.append(round(f.due_in(), 3))
    # GetShardIterator throttled (backoff 1), opened (no wait), GetRecords throttled twice
    # (backoff 1, backoff 2), then records (the 0.2 s spacing only); rng 0.5: mid-range waits
    assert waits == [0.3, 0.0, 0.3, 0.5, 0.2], waits
    assert f.throttles == 3 and f.throttled_in_a_row == 0
    assert [backoff_s(n, rng=lambda: 0.0) for n in (1, 2, 10)] == [0.2, 0.2, 0.2], "never below the 0.2 s floor"
    assert [backoff_s(n, rng=lambda: 1.0) for n in (1, 2, 3, 10)] == [0.4, 0.8, 1.6, 5.0], "doubling, capped"
    assert [backoff_s(n, rng=lambda: 0.3) for n in (1, 4)] == [THROTTLE_BACKOFF.delay_s(n, rng=lambda: 0.3) for n in (1, 4)]


def test_shard_end_by_a_null_iterator_or_by_the_ending_sequence_number() -> None:
    clock = FakeClock()
    closed = FakeShard(3, closed=True)
    got = drive(fetcher(closed, clock), clock, 2)[1]
    assert got.shard_end and len(got.records) == 3  # type: ignore[union-attr]
    never_null = FakeShard(3)  # moto: NextShardIterator is never null on a closed shard
    f = fetcher(never_null, clock, ending_sequence_number="3", max_records=2)
    first, second = drive(f, clock, 3)[1:]
    assert not first.shard_end and second.shard_end  # type: ignore[union-attr]


def test_resuming_inside_a_kpl_aggregate_drops_the_user_records_already_returned() -> None:
    _, _, blob = kpl_aggregate([(f"pk{i}", f"user-{i}".encode()) for i in range(4)])
    shard, clock = FakeShard(), FakeClock()
    shard.add(1, data=blob)
    f = fetcher(shard, clock, start=StartAt.after_sequence_number("1", 1))
    got = drive(f, clock, 2)[1]
    assert shard.iterator_requests[0]["ShardIteratorType"] == "AT_SEQUENCE_NUMBER"
    assert [r.data for r in got.records] == [b"user-2", b"user-3"]  # type: ignore[union-attr]


def test_errors_that_are_not_transient_are_translated() -> None:
    clock = FakeClock()
    gone = FakeShard(1)
    gone.iterator_faults.append("ResourceNotFoundException")
    with pytest.raises(StreamError, match="does not exist"):
        fetcher(gone, clock).step()
    bad = FakeShard(1)
    f = fetcher(bad, clock)
    f.step()
    bad.faults.append("ValidationException")
    clock.advance(1)
    with pytest.raises(InvalidError):
        f.step()
