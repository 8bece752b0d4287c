"""Placement by load inside one instance (LoadPlacer): pure decisions, injected time, no Ray."""

from __future__ import annotations

import itertools
import random

from kinesis_actors.load import LoadPlacer, ReaderLoad, ShardLoad
from kinesis_actors.load.placement import count_floor

W = 10.0


def placer(target: float | None = 0.6, *, max_readers: int | None = None, cap: int = 128) -> LoadPlacer:
    return LoadPlacer(target_cpu=target, max_readers=max_readers, max_shards_per_reader=cap, load_window_s=W)


def shard(sid: str, records_per_s: float, *, known: bool = True) -> ShardLoad:
    return ShardLoad(sid, bytes_per_s=records_per_s * 100, records_per_s=records_per_s, known=known)


def test_a_saturated_reader_sheds_its_hottest_shard_to_a_reader_that_stays_under_target() -> None:
    p = placer()
    readers = [ReaderLoad(1, 0.95, (shard("hot", 600), shard("warm", 500), shard("cold", 1))),
               ReaderLoad(2, 0.05, (shard("idle", 1),))]
    plan = p.plan(readers, now=100.0)
    assert [(m.shard_id, m.source, m.target, m.why) for m in plan.moves] == [("hot", 1, 2, "load")]
    assert not plan.start_reader and plan.readers == 2


def test_no_reader_fits_asks_for_one_new_reader_then_moves_there_once_it_is_ready() -> None:
    p = placer()
    busy = (shard("hot", 1000), shard("hot2", 1000))
    readers = [ReaderLoad(1, 1.0, busy), ReaderLoad(2, 0.55, (shard("other", 800),))]
    plan = p.plan(readers, now=100.0)
    assert plan.moves == () and plan.start_reader and plan.readers == 3
    assert not p.plan(readers, now=101.0, starting=1).start_reader  # one at a time
    plan = p.plan([*readers, ReaderLoad(3, None)], now=103.0)
    assert [(m.shard_id, m.target) for m in plan.moves] == [("hot2", 3)]  # a tie on CPU: the larger shard id goes
    assert plan.readers == 3


def test_one_move_per_window_and_a_moved_shard_stays_put_for_three_windows() -> None:
    p = placer()
    three = (shard("a", 1000), shard("b", 1000), shard("c", 1000))
    plan = p.plan([ReaderLoad(1, 1.0, three), ReaderLoad(2, 0.0)], now=0.0)
    assert len(plan.moves) == 1
    moved = plan.moves[0].shard_id
    rest = tuple(s for s in three if s.shard_id != moved)
    after = [ReaderLoad(1, 1.0, rest), ReaderLoad(2, 0.0, (shard(moved, 1000, known=False),)), ReaderLoad(3, 0.0)]
    assert p.plan(after, now=W - 1).moves == ()  # reader 1's figure still counts the shard it gave away
    plan = p.plan(after, now=W)
    assert len(plan.moves) == 1 and plan.moves[0].source == 1 and plan.moves[0].target == 3
    # reader 2 now hot with its one moved shard and another: the moved one is not moved again within 3 W
    p2 = placer()
    p2.plan([ReaderLoad(1, 1.0, (shard("a", 1000), shard("b", 900))), ReaderLoad(2, 0.0)], now=0.0)  # a -> 2
    back = [ReaderLoad(1, 0.1, (shard("b", 10),)), ReaderLoad(2, 0.9, (shard("a", 1000), shard("z", 300))),
            ReaderLoad(3, 0.0)]
    plan = p2.plan(back, now=2 * W)
    assert [m.shard_id for m in plan.moves] == ["z"]  # a is still settling: the other one goes


def test_a_single_shard_reader_is_never_split() -> None:
    p = placer()
    for t in range(0, 1000, 2):
        plan = p.plan([ReaderLoad(1, 1.0, (shard("alone", 5000),)), ReaderLoad(2, 0.0)], now=float(t))
        assert plan.moves == () and not plan.start_reader


def test_new_readers_are_capped_by_max_readers_and_by_one_per_window() -> None:
    p = placer(max_readers=2)
    plan = p.plan([ReaderLoad(1, 1.0, (shard("a", 1), shard("b", 1))), ReaderLoad(2, 0.9, (shard("c", 1),
                                                                                           shard("d", 1)))], now=0.0)
    assert not plan.start_reader and plan.readers == 2
    p = placer()
    hot = [ReaderLoad(1, 1.0, (shard("a", 1), shard("b", 1))), ReaderLoad(2, 0.9, (shard("c", 1), shard("d", 1)))]
    assert p.plan(hot, now=0.0).start_reader
    assert not p.plan(hot, now=W - 0.5).start_reader  # the first one never came: still one per window
    assert p.plan(hot, now=W).start_reader


def test_readers_merge_when_load_falls_and_never_below_the_count_floor() -> None:
    p = placer()
    readers = {rid: [f"s{rid}"] for rid in range(1, 6)}  # 5 readers, one shard each, added for load
    for step in range(200):
        now = 100.0 + 2 * step
        view = [ReaderLoad(rid, 0.02 * len(sids), tuple(shard(s, 10) for s in sids))
                for rid, sids in readers.items()]
        plan = p.plan(view, now=now)
        for m in plan.moves:
            readers[m.source].remove(m.shard_id)
            readers[m.target].append(m.shard_id)
        for rid in [r for r, sids in readers.items() if not sids and len(readers) > plan.readers]:
            del readers[rid]  # the pool stops empty readers beyond what the plan keeps
        assert len(readers) >= count_floor(5, 128) == 2
    assert len(readers) == 2 and sorted(s for sids in readers.values() for s in sids) == [f"s{i}" for i in range(1, 6)]
    assert p.plan([ReaderLoad(1, 0.0, (shard("a", 1),)), ReaderLoad(2, 0.0, (shard("b", 1),))], now=1e6).moves == ()


def test_merging_respects_the_floor_with_one_shard_per_reader() -> None:
    p = placer(cap=1)
    view = [ReaderLoad(i, 0.0, (shard(f"s{i}", 1),)) for i in range(1, 5)] + [ReaderLoad(5, 0.0)]
    for t in range(0, 200, 2):
        plan = p.plan(view, now=float(t))
        assert plan.moves == () and plan.readers == count_floor(4, 1) == 5


def test_a_hot_pool_does_not_merge() -> None:
    p = placer()
    view = [ReaderLoad(i, 0.35, (shard(f"s{i}", 100),)) for i in range(1, 5)]  # 1.4 cores: 5 at 0.3 each
    assert all(p.plan(view, now=float(t)).moves == () for t in range(0, 100, 2))


def test_after_a_reader_death_the_pool_is_respread_by_count_once_the_replacement_is_ready() -> None:
    p = placer(None)
    p.plan([ReaderLoad(1, 0.0, (shard("a", 0), shard("b", 0))), ReaderLoad(2, 0.0, (shard("c", 0), shard("d", 0)))],
           now=0.0)
    p.reader_died([1], now=1.0)
    piled = ReaderLoad(1, 0.0, tuple(shard(s, 0) for s in "abcd"))
    assert p.plan([piled], now=2.0, starting=1).moves == ()  # the replacement is starting
    plan = p.plan([piled, ReaderLoad(3, None)], now=4.0)
    assert len(plan.moves) == 2
    assert {(m.source, m.target, m.why) for m in plan.moves} == {(1, 3, "respread")}
    assert p.plan([piled, ReaderLoad(3, None)], now=6.0).moves == ()  # once


def test_respread_by_load_moves_the_hot_shards_apart() -> None:
    p = placer()
    p.plan([ReaderLoad(1, 0.9, (shard("hot1", 1000), shard("c1", 10))),
            ReaderLoad(2, 0.9, (shard("hot2", 1000), shard("c2", 10)))], now=0.0)
    p.reader_died([1], now=1.0)
    piled = ReaderLoad(1, None, tuple(shard(s, 0, known=False) for s in ("hot1", "c1", "hot2", "c2")))
    plan = p.plan([piled, ReaderLoad(3, None)], now=3.0)
    assert [m.shard_id for m in plan.moves if m.shard_id.startswith("hot")] in (["hot1"], ["hot2"])
    assert all(m.target == 3 for m in plan.moves)


def test_respread_happens_without_a_replacement_after_three_windows() -> None:
    p = placer(None)
    p.reader_died([1, 2], now=0.0)
    view = [ReaderLoad(1, 0.0, tuple(shard(s, 0) for s in "abcd")), ReaderLoad(2, 0.0)]
    assert p.plan(view, now=3 * W - 1).moves == ()
    assert len(p.plan(view, now=3 * W).moves) == 2


def test_with_target_none_hot_readers_stay_as_they_are() -> None:
    p = placer(None)
    view = [ReaderLoad(1, 1.0, (shard("a", 1000), shard("b", 1000))), ReaderLoad(2, 0.0)]
    for t in range(0, 200, 2):
        plan = p.plan(view, now=float(t))
        assert plan.moves == () and not plan.start_reader and plan.readers == 2


def simulate(costs: dict[str, float], passes: int, *, target: float | None = 0.6,
             seed: int = 7) -> tuple[dict[int, list[str]], list[int]]:
    """Readers as GIL-bound processes: a reader's CPU is the sum of its shards' costs, at most
    one core, seen with 5 % noise once it held its shards for a window. Moves land at once,
    new readers are ready one pass after they are asked for. Returns the final placement
    and the pass of every move."""
    rng = random.Random(seed)
    p = placer(target)
    readers: dict[int, list[str]] = {1: sorted(costs)[::2], 2: sorted(costs)[1::2]}
    since = {1: 0.0, 2: 0.0}
    pending = 0
    moved_at: list[int] = []
    for i in range(passes):
        now = 2.0 * i
        if pending:
            rid = max(readers) + 1
            readers[rid], since[rid], pending = [], now, 0
        view = []
        for rid, sids in sorted(readers.items()):
            cpu = min(1.0, sum(costs[s] for s in sids)) * rng.uniform(0.95, 1.05)
            full = now - since[rid] >= W
            view.append(ReaderLoad(rid, cpu if full else None,
                                   tuple(shard(s, costs[s] * 10_000, known=full) for s in sids)))
        plan = p.plan(view, now=now, starting=pending)
        if plan.start_reader:
            pending = 1
        for m in plan.moves:
            readers[m.source].remove(m.shard_id)
            readers[m.target].append(m.shard_id)
            since[m.source] = since[m.target] = now
            moved_at.append(i)
        for rid in [r for r, sids in readers.items() if not sids and len(readers) > plan.readers]:
            del readers[rid]
    return readers, moved_at


def test_two_hot_shards_on_one_reader_end_on_two_readers_and_stay() -> None:
    costs = {"hot-a": 0.7, "cold-1": 0.01, "hot-b": 0.7, "cold-2": 0.01}  # hot-a, hot-b on reader 1
    readers, moves = simulate(costs, 1000)
    homes = {s: rid for rid, sids in readers.items() for s in sids}
    assert homes["hot-a"] != homes["hot-b"]
    assert moves and max(moves) < 100, moves  # settled within 200 s, then 900 passes without a move


def test_a_mixed_load_settles_without_oscillating() -> None:
    costs = {f"s{i}": c for i, c in enumerate([0.5, 0.45, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01])}
    readers, moves = simulate(costs, 1000, seed=3)
    assert moves and max(moves) < 300, moves
    assert all(min(1.0, sum(costs[s] for s in sids)) <= 0.6 + 1e-9 or len(sids) == 1 for sids in readers.values())


def test_count_placement_with_none_never_moves_in_the_simulation() -> None:
    costs = {"hot-a": 0.7, "cold-1": 0.01, "hot-b": 0.7, "cold-2": 0.01}
    _, moves = simulate(costs, 300, target=None)
    assert moves == []


def test_a_reader_hot_from_one_shard_alone_keeps_it_and_its_cold_companions() -> None:
    p = placer()
    view = [ReaderLoad(1, 0.7, (shard("hot", 2000), shard("cold-1", 0), shard("cold-2", 0))), ReaderLoad(2, 0.0)]
    for t in range(0, 200, 2):
        plan = p.plan(view, now=float(t))
        assert plan.moves == () and not plan.start_reader  # moving any of them cannot cool reader 1


def test_a_reader_hot_from_many_small_shards_sheds_them_one_per_window_until_under_target() -> None:
    p = placer()
    cost = 0.007  # cores per shard: 100 of them make 0.7, each far below any fixed "worth moving" floor
    readers = {1: [f"s{i:03d}" for i in range(100)], 2: ["x"]}
    since = {1: -W, 2: -W}
    moved_at = []
    for i in range(150):
        now = 2.0 * i
        view = [ReaderLoad(rid, cost * len(sids) if now - since[rid] >= W else None,
                           tuple(shard(s, 10) for s in sids)) for rid, sids in sorted(readers.items())]
        for m in p.plan(view, now=now).moves:
            readers[m.source].remove(m.shard_id)
            readers[m.target].append(m.shard_id)
            since[m.source] = since[m.target] = now
            moved_at.append(now)
    assert cost * len(readers[1]) <= 0.6 < cost * (len(readers[1]) + 1), readers  # shed just enough
    assert len(moved_at) == 15 and all(b - a >= W for a, b in itertools.pairwise(moved_at))  # one per window
