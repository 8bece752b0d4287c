"""Lease-balancing primitives of every lease store: presence rows, graceful handoff, clock skew.

Runs against the in-process store and DynamoDB (the emulator; MemoryLeaseStore in tests/integration),
with the fixtures of the main contract suite. Expiry and staleness are driven by a
:class:`FakeClock`; wall clocks are skewed to show that no decision reads them.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from kinesis_actors.errors import InvalidError, LeaseLostError
from kinesis_actors.leases import Instance

from .test_lease_store_contract import (  # noqa: F401  (fixtures)
    DURATION_S,
    SHARD,
    FakeClock,
    atomic_dynamo_endpoint,
    clock,
    kind,
    make_store,
    store,
    stream,
)

# --------------------------------------------------------------------------- presence

NO_PRESENCE = "a KCL table has no presence rows: KclLeaseStore writes none (tests/unit/test_kcl_rows.py)"



def test_heartbeat_creates_and_refreshes_a_presence_row(kind: str, store: Any, stream: str) -> None:
    if kind == "kcl":
        pytest.skip(NO_PRESENCE)
    first = store.heartbeat(stream, "a", duration_s=DURATION_S)
    assert isinstance(first, Instance)
    assert (first.stream, first.owner, first.counter, first.duration_ms) == (stream, "a", 1, 10_000)
    assert first.key == f"{stream}#instance#a"
    second = store.heartbeat(stream, "a", duration_s=DURATION_S)
    assert second.counter == 2
    fresh = store.peer().heartbeat(stream, "a", duration_s=DURATION_S)  # a restarted Coordinator
    assert fresh.counter == 3
    assert store.list(stream) == [], "presence rows are never shard rows"
    assert [i.owner for i in store.instances(stream)] == ["a"]


def test_presence_goes_stale_by_observation_not_wall_clock(kind: str, store: Any, clock: FakeClock, stream: str) -> None:
    if kind == "kcl":
        pytest.skip(NO_PRESENCE)
    store.heartbeat(stream, "a", duration_s=DURATION_S)
    observer = store.peer(clock=clock, wall_clock=lambda: time.time() + 10 * DURATION_S)
    assert [i.owner for i in observer.instances(stream)] == ["a"], "first sight: fresh for a full duration"
    clock.advance(DURATION_S * 0.6)
    store.heartbeat(stream, "a", duration_s=DURATION_S)  # the counter moves
    clock.advance(DURATION_S * 0.6)
    assert [i.owner for i in observer.instances(stream)] == ["a"]  # first sight of counter 2
    clock.advance(DURATION_S * 0.9)
    assert [i.owner for i in observer.instances(stream)] == ["a"]
    clock.advance(DURATION_S * 0.11)  # 1.01 durations since the observer first saw counter 2
    assert observer.instances(stream) == []
    stale = observer.instances(stream, include_stale=True)
    assert [i.owner for i in stale] == ["a"] and observer.is_expired(stale[0])


def test_remove_presence_and_snapshot(kind: str, store: Any, stream: str) -> None:
    if kind == "kcl":
        pytest.skip(NO_PRESENCE)
    store.heartbeat(stream, "a", duration_s=DURATION_S)
    store.heartbeat(stream, "b", duration_s=DURATION_S)
    store.heartbeat(stream + "x", "c", duration_s=DURATION_S)  # a stream sharing the prefix
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    snap = store.snapshot(stream)
    assert snap.leases == [lease]
    assert [i.owner for i in snap.instances] == ["a", "b"]
    store.remove_presence(stream, "a")
    store.remove_presence(stream, "a")  # idempotent
    assert [i.owner for i in store.instances(stream, include_stale=True)] == ["b"]
    assert store.list(stream) == [lease]


# --------------------------------------------------------------------------- handoff


def test_graceful_handoff_goes_to_the_thief_and_nobody_else(store: Any, clock: FakeClock, stream: str) -> None:
    holder = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    holder = store.checkpoint(holder, "42")
    thief, third = store.peer(clock=clock), store.peer(clock=clock)
    row = thief.get(stream, SHARD)
    assert thief.request_handoff(stream, SHARD, owner="b", expect_counter=row.counter)
    holder = store.renew(holder)
    assert holder.next_owner == "b", "the holder learns of the request at its next renewal"
    handed = store.hand_over(holder)
    assert (handed.owner, handed.counter, handed.checkpoint, handed.next_owner) == ("b", holder.counter + 1, "42", None)
    with pytest.raises(LeaseLostError):
        store.checkpoint(holder, "43")  # the old holder is fenced
    assert third.take(stream, SHARD, owner="c", duration_s=DURATION_S) is None, "never free in between"
    taken = thief.take(stream, SHARD, owner="b", duration_s=DURATION_S)  # its own row: at once
    assert taken is not None and taken.owner == "b" and taken.checkpoint == "42"


def test_hand_over_needs_the_holder_and_a_receiver(store: Any, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    with pytest.raises(InvalidError):
        store.hand_over(lease)  # nobody asked
    with pytest.raises(InvalidError):
        store.hand_over(lease, to="a")
    newer = store.renew(lease)
    with pytest.raises(LeaseLostError):
        store.hand_over(lease, to="b")  # stale counter
    assert store.hand_over(newer, to="b").owner == "b"


def test_force_handoff_only_for_the_requester(store: Any, clock: FakeClock, stream: str) -> None:
    holder = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    thief = store.peer(clock=clock)
    assert thief.force_handoff(stream, SHARD, owner="b", duration_s=DURATION_S) is None  # no request
    assert thief.request_handoff(stream, SHARD, owner="b", expect_counter=holder.counter)
    assert thief.force_handoff(stream, SHARD, owner="c", duration_s=DURATION_S) is None  # not c's request
    holder = store.renew(holder)  # the holder is alive but does not hand over
    forced = thief.force_handoff(stream, SHARD, owner="b", duration_s=DURATION_S)
    assert forced is not None and forced.owner == "b" and forced.counter == holder.counter + 1
    assert forced.next_owner is None
    with pytest.raises(LeaseLostError):
        store.renew(holder)


# --------------------------------------------------------------------------- clock skew


@pytest.mark.parametrize("skew", [2.0, -2.0], ids=["ahead", "behind"])
def test_skewed_wall_clock_never_takes_a_live_lease_and_takes_a_dead_one(
    kind: str, make_store: Any, stream: str, skew: float
) -> None:
    """An instance whose wall clock is 2 x lease_duration_s off: expiry ignores wall clocks."""
    presence = kind != "kcl"  # a KCL table has no presence rows: the lease half still applies
    holder_clock, skewed_clock = FakeClock(), FakeClock(start=50_000.0)  # monotonic clocks differ too
    holder = make_store(clock=holder_clock)
    skewed = holder.peer(clock=skewed_clock, wall_clock=lambda: time.time() + skew * DURATION_S)
    lease = holder.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    holder.heartbeat(stream, "a", duration_s=DURATION_S)
    for _ in range(6):  # the holder renews every 0.4 durations: live for 2.4 durations
        assert skewed.take(stream, SHARD, owner="b", duration_s=DURATION_S) is None
        assert [i.owner for i in skewed.instances(stream)] == (["a"] if presence else [])
        skewed_clock.advance(DURATION_S * 0.4)
        holder_clock.advance(DURATION_S * 0.4)
        lease = holder.renew(lease)
        holder.heartbeat(stream, "a", duration_s=DURATION_S)
    # The holder dies: one full duration later (on the skewed store's own clock) it is dead.
    assert skewed.take(stream, SHARD, owner="b", duration_s=DURATION_S) is None
    assert [i.owner for i in skewed.instances(stream)] == (["a"] if presence else [])
    skewed_clock.advance(DURATION_S * 0.9)
    assert skewed.take(stream, SHARD, owner="b", duration_s=DURATION_S) is None
    skewed_clock.advance(DURATION_S * 0.11)
    assert skewed.instances(stream) == []
    taken = skewed.take(stream, SHARD, owner="b", duration_s=DURATION_S)
    assert taken is not None and taken.owner == "b"


def test_withdraw_handoff_clears_only_ones_own_request(store: Any, clock: FakeClock, stream: str) -> None:
    holder = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    thief = store.peer(clock=clock)
    assert thief.withdraw_handoff(stream, SHARD, owner="b")  # nothing to withdraw
    assert thief.request_handoff(stream, SHARD, owner="b", expect_counter=holder.counter)
    assert thief.withdraw_handoff(stream, SHARD, owner="c")  # not c's: untouched
    assert store.get(stream, SHARD).next_owner == "b"
    assert thief.withdraw_handoff(stream, SHARD, owner="b")
    row = store.get(stream, SHARD)
    assert row.next_owner is None and row.counter == holder.counter and row.owner == "a"
    assert store.renew(holder).next_owner is None, "the holder is not fenced by a withdrawal"


def test_a_release_after_the_asker_withdrew_frees_the_row(store: Any, clock: FakeClock, stream: str) -> None:
    """The holder learnt of a request at its last write; the asker withdrew since (the
    counter does not move). Releasing that Lease frees the row: it does not go to the asker."""
    holder = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    thief = store.peer(clock=clock)
    assert thief.request_handoff(stream, SHARD, owner="b", expect_counter=holder.counter)
    holder = store.renew(holder)
    assert holder.next_owner == "b"
    assert thief.withdraw_handoff(stream, SHARD, owner="b")
    released = store.release(holder)
    assert released.owner is None and store.get(stream, SHARD).owner is None


def test_a_kcl_release_during_a_request_goes_to_the_asker_the_row_names_now(kind: str, store: Any, clock: FakeClock,
                                                                             stream: str) -> None:
    if kind != "kcl":
        pytest.skip("only KCL's evict gives a requested row to the asker; other stores free it")
    holder = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    thief = store.peer(clock=clock)
    assert thief.request_handoff(stream, SHARD, owner="b", expect_counter=holder.counter)
    holder = store.renew(holder)
    assert thief.withdraw_handoff(stream, SHARD, owner="b")
    assert thief.request_handoff(stream, SHARD, owner="c", expect_counter=holder.counter)  # after a's last write
    released = store.release(holder)
    assert released.owner == "c" and store.get(stream, SHARD).owner == "c"
