"""The chaos suite's checker (tests/chaos/checker.py) must fail where it should."""

from __future__ import annotations

from tests.chaos.checker import Delivered, Published, check, checkpoints_monotonic


def stream(n_per_shard: int = 5) -> list[Published]:
    out, n = [], 0
    for shard in ("shardId-0", "shardId-1"):
        for i in range(1, n_per_shard + 1):
            out.append(Published(n, shard, str(i), 100.0 + i))
            n += 1
    return out


def deliver(pub: list[Published], t0: float = 200.0) -> list[Delivered]:
    return [Delivered(p.n, p.shard_id, p.sequence_number, t0 + i * 0.01) for i, p in enumerate(pub)]


def test_everything_delivered_once_is_ok() -> None:
    pub = stream()
    v = check("clean", pub, deliver(pub))
    assert v.ok and v.lost == 0 and v.duplicated == 0 and not v.gaps and v.published == 10


def test_a_lost_record_fails_and_is_named() -> None:
    pub = stream()
    v = check("lost", pub, deliver([p for p in pub if p.n != 7]))
    assert not v.ok and v.lost == 1 and v.lost_sample == [7]


def test_a_skipped_record_delivered_later_is_a_gap_not_a_loss() -> None:
    pub = stream()
    shard0 = [p for p in pub if p.shard_id == "shardId-0"]
    reordered = [shard0[0], shard0[2], shard0[1], shard0[3], shard0[4]]
    v = check("gap", pub, deliver(reordered + [p for p in pub if p.shard_id == "shardId-1"]))
    assert v.lost == 0 and not v.ok
    assert v.gaps == [{"shard_id": "shardId-0", "after": "1", "jumped_to": "3", "skipped": 1, "t": v.gaps[0]["t"], "via": ""}]


def test_a_replay_from_the_checkpoint_is_a_duplicate_not_a_gap() -> None:
    pub = stream()
    shard0 = [p for p in pub if p.shard_id == "shardId-0"]
    replay = shard0[:4] + shard0[2:]  # a new owner resumes after checkpoint "2"
    v = check("replay", pub, deliver(replay + [p for p in pub if p.shard_id == "shardId-1"]))
    assert v.ok and v.duplicated == 2 and not v.gaps


def test_an_unpublished_record_fails() -> None:
    pub = stream()
    v = check("invented", pub, [*deliver(pub), Delivered(999, "shardId-0", "99", 300.0)])
    assert not v.ok and v.unexpected == 1


def test_recovery_is_the_worst_affected_shard_and_ignores_a_batch_in_flight() -> None:
    pub = stream()
    dl = deliver(pub, t0=10.0)
    dl += [Delivered(0, "shardId-0", "1", 20.01), Delivered(0, "shardId-0", "1", 23.0),
           Delivered(5, "shardId-1", "1", 21.5)]
    v = check("recovery", pub, dl, fault_at=20.0)
    assert v.recovery_by_shard_s == {"shardId-0": 3.0, "shardId-1": 1.5} and v.recovery_s == 3.0


def test_a_shard_that_never_recovers_fails() -> None:
    pub = stream()
    v = check("stuck", pub, deliver(pub, t0=10.0), fault_at=20.0, affected=["shardId-1"])
    assert not v.ok and v.recovery_by_shard_s == {"shardId-1": None} and v.recovery_s is None


def test_checkpoint_moving_backwards_is_reported() -> None:
    samples = [(1.0, {"a": None}), (1.1, {"a": "5"}), (1.2, {"a": "9"}), (1.3, {"a": "7"}), (1.4, {"a": None})]
    assert checkpoints_monotonic(samples) == [{"shard_id": "a", "t": 1.3, "from": "9", "to": "7"},
                                              {"shard_id": "a", "t": 1.4, "from": "7", "to": None}]
    assert checkpoints_monotonic([(1.0, {"a": "10"}), (1.1, {"a": "10"}), (1.2, {"a": "11"})]) == []


def test_several_faults_each_get_their_recovery() -> None:
    pub = stream()
    dl = [*deliver(pub, t0=10.0), Delivered(0, "shardId-0", "1", 21.0), Delivered(5, "shardId-1", "1", 32.5)]
    v = check("kills", pub, dl, faults=[(20.0, ["shardId-0"]), (30.0, ["shardId-1"])])
    assert v.recovery_by_shard_s == {"shardId-0@0": 1.0, "shardId-1@1": 2.5} and v.recovery_s == 2.5


def test_a_first_record_never_delivered_is_a_gap_and_a_loss() -> None:
    pub = stream()
    v = check("first", pub, deliver([p for p in pub if p.n != 0]))
    assert v.lost == 1 and v.gaps[0]["after"] is None and v.gaps[0]["skipped"] == 1 and not v.ok


def test_duplicates_are_counted_per_shard_in_batches() -> None:
    pub = stream()
    shard0 = [p for p in pub if p.shard_id == "shardId-0"]
    first = [Delivered(p.n, p.shard_id, p.sequence_number, 10.0) for p in shard0[:3]]  # one batch of 3
    rest = [Delivered(p.n, p.shard_id, p.sequence_number, 11.0) for p in shard0[3:]]
    replay = [Delivered(p.n, p.shard_id, p.sequence_number, 12.0) for p in shard0[2:4]]  # 2 records again
    v = check("dups", [p for p in pub if p.shard_id == "shardId-0"], first + rest + replay)
    assert v.duplicates_by_shard == {"shardId-0": 2} and v.largest_batch_by_shard == {"shardId-0": 3}
    assert abs(v.duplicate_batches("shardId-0") - 2 / 3) < 1e-9
    assert v.batches_redelivered_by_shard == {"shardId-0": 2}  # record 3 came in the first batch, 4 in the second


def test_redelivery_windows_count_how_far_back_the_redelivered_records_were_acknowledged() -> None:
    pub = [Published(i, "shardId-0", str(i + 1), 100.0) for i in range(20)]
    first = [Delivered(p.n, p.shard_id, p.sequence_number, 10.0 + p.n * 0.5) for p in pub]  # 0.5 s apart
    within = check("one renew interval", pub, first + first[14:])  # acknowledged over 2.5 s: one 3 s window
    assert within.redelivery_windows("shardId-0", 3.0) == 1
    assert within.redelivered_acked_at_by_shard["shardId-0"] == [17.0, 17.5, 18.0, 18.5, 19.0, 19.5]
    stale = check("a checkpoint three intervals old", pub, first + first[2:])  # 8.5 s of acknowledgements
    assert stale.redelivery_windows("shardId-0", 3.0) == 3  # fails a bound of one window per failure
    assert check("clean", pub, first).redelivery_windows("shardId-0", 3.0) == 0
