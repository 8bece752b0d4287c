"""The lease poll's plan with balance_by="load" (by the rows' throughput) and "count"."""

from __future__ import annotations

from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator.poll import LeasePoll, TableView
from kinesis_actors.leases.protocol import Lease
from kinesis_actors.testing import FakeClock, InProcessLeaseStore

SHARDS = [f"shardId-{i:012d}" for i in range(8)]


def poll(balance_by: str) -> LeasePoll:
    clock = FakeClock()
    return LeasePoll(stream=KinesisStream("s", balance_by=balance_by, max_leases_to_steal=3),
                     store=InProcessLeaseStore(clock=clock), io=None, kinesis=None,  # type: ignore[arg-type]
                     owner_id="a", lease_duration_s=10.0, clock=clock, counters={})


def view(read_at: float) -> TableView:
    # b holds the super-hot shard 0 and three cold ones; a holds four cold ones
    rows = {sid: Lease("s", sid, "b" if i < 4 else "a", counter=1, throughput_kbps=5000.0 if i == 0 else 50.0)
            for i, sid in enumerate(SHARDS)}
    return TableView(rows=rows, live=["a", "b"], readable=list(SHARDS), read_at=read_at)


def test_by_load_the_cold_leases_of_the_hot_owner_are_stolen_not_the_hot_one() -> None:
    plan = poll("load").plan(view(100.0), held=SHARDS[4:])
    assert sorted(sid for sid, _ in plan.steal) == SHARDS[1:4]


def test_by_count_the_counts_are_already_even() -> None:
    assert poll("count").plan(view(100.0), held=SHARDS[4:]).steal == ()
