"""The lease planner (target, takes, steals) as a pure function: no Ray, no network."""

from __future__ import annotations

import random

import pytest

from kinesis_actors.balancing import ShardState, plan_leases, steal_count


def shards(owners: list[str | None]) -> list[ShardState]:
    return [ShardState(f"shardId-{i:012d}", owner) for i, owner in enumerate(owners)]


def held_by(states: list[ShardState], me: str) -> list[str]:
    return [s.shard_id for s in states if s.owner == me]


def test_free_expired_and_own_rows_are_taken_whatever_the_target() -> None:
    states = [
        ShardState("s0", None),
        ShardState("s1", "b", expired=True),
        ShardState("s2", "a"),  # ours in the table, no reader (handed over to us, or a restart)
        ShardState("s3", "b"),
        ShardState("s4", "b"),
    ]
    plan = plan_leases("a", states, held=["s5"], live_instances=["a", "b", "c", "d", "e", "f"])
    assert plan.take == ("s0", "s1", "s2")
    assert plan.steal == ()  # no stealing in a round that takes


def test_target_counts_live_instances_and_lease_owners() -> None:
    states = shards(["b"] * 6 + ["c"] * 6)
    plan = plan_leases("a", states, live_instances=["a", "b"])  # c holds live leases: it is live too
    assert plan.target == 4 and plan.live == ("a", "b", "c")


def test_max_leases_caps_takes_and_target() -> None:
    states = shards([None] * 10)
    plan = plan_leases("a", states, held=[], live_instances=["a"], max_leases=3)
    assert plan.take == tuple(s.shard_id for s in states[:3])
    assert plan.target == 3
    states = shards(["a"] * 3 + ["b"] * 9)
    plan = plan_leases("a", states, held=held_by(states, "a"), live_instances=["a", "b"], max_leases=3)
    assert plan.steal == ()


@pytest.mark.parametrize(
    ("mine", "victim", "target", "limit", "expected"),
    [
        (0, 12, 6, 1, 1),
        (0, 12, 6, 3, 3),
        (5, 7, 6, 5, 1),
        (3, 4, 4, 5, 0),  # one short of a target the victim sits at: balanced
        (2, 4, 4, 5, 1),  # two short: take one even from an instance at the target
        (4, 5, 4, 5, 0),  # at target: never steal
        (0, 3, 4, 5, 0),  # the victim is below target
        (0, 9, 4, 0, 0),  # stealing disabled
    ],
)
def test_steal_count(mine: int, victim: int, target: int, limit: int, expected: int) -> None:
    assert steal_count(mine, victim, target, limit) == expected


def test_steal_from_the_most_loaded_with_a_deterministic_choice() -> None:
    states = shards(["b"] * 5 + ["c"] * 7)
    plan = plan_leases("a", states, live_instances=["a", "b", "c"], max_leases_to_steal=2)
    assert plan.target == 4
    assert [victim for _, victim in plan.steal] == ["c", "c"]
    assert plan.counts == {"a": 2, "b": 5, "c": 5}
    again = plan_leases("a", list(reversed(states)), live_instances=["c", "b", "a"], max_leases_to_steal=2)
    assert again.steal == plan.steal, "the same table gives the same plan"
    # Ties between victims go to the smallest owner id.
    tie = plan_leases("a", shards(["c"] * 6 + ["b"] * 6), live_instances=["a", "b", "c"])
    assert [victim for _, victim in tie.steal] == ["b"]


def test_two_thieves_pick_different_shards_of_one_victim() -> None:
    states = shards(["a"] * 12)
    b = plan_leases("b", states, live_instances=["a", "b", "c"], max_leases_to_steal=1)
    c = plan_leases("c", states, live_instances=["a", "b", "c"], max_leases_to_steal=1)
    assert b.steal and c.steal and b.steal[0][0] != c.steal[0][0]


def test_pending_handoffs_count_for_the_thief() -> None:
    states = shards(["b"] * 12)
    pending = [ShardState(s.shard_id, s.owner, next_owner="a" if i < 5 else None) for i, s in enumerate(states)]
    plan = plan_leases("a", pending, live_instances=["a", "b"], max_leases_to_steal=5)
    assert plan.counts["a"] == 6 and len(plan.steal) == 1, "asks only for what it still lacks"
    assert all(sid not in {s.shard_id for s in pending[:5]} for sid, _ in plan.steal)
    # Another thief sees b's pending moves too and does not over-ask.
    other = plan_leases("c", pending, live_instances=["a", "b", "c"], max_leases_to_steal=5)
    assert len(other.steal) == 3 and other.counts == {"a": 5, "b": 4, "c": 3}  # b: 7 -> 4 = target


def test_shard_end_rows_and_waiting_children_are_not_passed_so_do_not_count() -> None:
    # The Coordinator passes only readable shards: 4 of them, 2 live instances.
    plan = plan_leases("a", shards(["b"] * 4), live_instances=["a", "b"])
    assert plan.target == 2 and len(plan.steal) == 1


def test_empty_table() -> None:
    plan = plan_leases("a", [], live_instances=["a", "b"])
    assert plan.target == 0 and plan.take == () and plan.steal == ()


def simulate(n_shards: int, owners: list[str], instances: list[str], *, steal: int, seed: int,
             rounds: int = 60) -> tuple[int, dict[str, int], int]:
    """Every instance plans in a random order each round; handoffs complete at round end.

    Returns (moves, final counts, rounds until nothing changes any more)."""
    rnd = random.Random(seed)
    table = {f"s{i:02d}": owners[i % len(owners)] for i in range(n_shards)}
    moves, history = 0, []
    for _ in range(rounds):
        pending: dict[str, str] = {}
        for me in rnd.sample(instances, len(instances)):
            view = [ShardState(s, o, pending.get(s)) for s, o in sorted(table.items())]
            plan = plan_leases(me, view, held=[s for s, o in table.items() if o == me], live_instances=instances,
                               max_leases_to_steal=steal)
            for s in plan.take:
                table[s] = me
            for s, _ in plan.steal:
                pending[s] = me
        for s, thief in pending.items():
            table[s] = thief
            moves += 1
        history.append({i: sum(1 for o in table.values() if o == i) for i in instances})
    final = history[-1]
    settled = next(i for i in range(len(history)) if all(h == final for h in history[i:]))
    return moves, final, settled


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    ("n_shards", "owners", "instances", "steal"),
    [
        (12, ["a"], ["a", "b"], 1),
        (12, ["a"], ["a", "b", "c"], 1),
        (12, ["a", "b"], ["a", "b", "c"], 2),
        (10, ["a"], ["a", "b", "c"], 1),
        (7, ["a"], ["a", "b", "c", "d", "e"], 1),
        (13, ["a", "b", "c"], ["a", "b", "c", "d", "e"], 3),
        (3, ["a"], ["a", "b", "c", "d", "e"], 1),
    ],
)
def test_converges_within_one_of_fair_and_then_stops(n_shards: int, owners: list[str], instances: list[str],
                                                     steal: int, seed: int) -> None:
    moves, final, settled = simulate(n_shards, owners, instances, steal=steal, seed=seed)
    assert sum(final.values()) == n_shards
    assert max(final.values()) - min(final.values()) <= 1, final
    assert settled < 20, f"still moving after {settled} rounds"
    fair = n_shards // len(instances)
    minimum = sum(max(0, c - (fair + 1)) for c in [sum(1 for i in range(n_shards) if owners[i % len(owners)] == o)
                                                   for o in instances])
    assert moves <= minimum + len(instances), f"{moves} moves for a minimum of about {minimum}"


def test_a_row_handed_over_to_us_does_not_hold_back_the_next_steal() -> None:
    """Taking our own row (a handoff that landed) is not taking a free lease: the steal
    pipeline goes on in the same poll, so planned moves do not wait a poll each."""
    shards = [ShardState("s0", "me")] + [ShardState(f"s{i}", "v") for i in range(1, 8)]
    plan = plan_leases("me", shards, live_instances=["me", "v"], max_leases_to_steal=1)
    assert plan.take == ("s0",) and len(plan.steal) == 1 and plan.steal[0][1] == "v"
    free = [ShardState("s0"), *shards[1:]]
    assert plan_leases("me", free, live_instances=["me", "v"]).steal == (), "a free lease still comes first"
