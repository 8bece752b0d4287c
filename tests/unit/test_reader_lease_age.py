"""Lease freshness at add (issue 21, race 2; INTERFACES.md item 5): a reader judges a lease
from when the Coordinator took it (``lease_age_s``), not from when the reader opened it."""

from __future__ import annotations

import asyncio
from typing import Any

from kinesis_actors.reader import ConsumerState, ReaderIo, ReaderSpec, ShardReaderCore
from kinesis_actors.records import Record, StartAt
from kinesis_actors.testing import FakeClock, FakeShard, InProcessLeaseStore

STREAM, SHARD = "s", "shardId-000000000000"
LEASE_S, RENEW_S = 10.0, 1.0


def test_a_lease_taken_over_while_its_shard_was_being_opened_delivers_nothing() -> None:
    # The Coordinator took the lease, then placing it on a reader took 30 s (a reader
    # starting); meanwhile another instance saw it lapse and took it. The reader must
    # count the lease 30 s old, renew it before its first delivery, and be fenced there.
    clock = FakeClock(follow_real=True)
    store = InProcessLeaseStore(clock=clock)
    shard = FakeShard(5)
    lease = store.take(STREAM, SHARD, owner="me", duration_s=LEASE_S)
    assert lease is not None
    lease = store.checkpoint(lease, "2")
    thief = store.peer()
    assert thief.list(STREAM)  # the other instance sees the row...
    clock.advance(30.0)  # ...and, the placement being slow, sees it unchanged for a whole lease
    assert thief.take(STREAM, SHARD, owner="thief", duration_s=LEASE_S) is not None
    delivered: list[Record] = []

    async def deliver(records: list[Record]) -> None:
        delivered.extend(records)

    async def scenario() -> Any:
        core = ShardReaderCore(store=store, deliver=deliver, kinesis=shard, clock=clock,
                               io=ReaderIo(kinesis_threads=2, store_threads=2))
        spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                          lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, idle_wait_s=0.01)
        await core.add(spec, lease, lease_age_s=30.0)
        events = await core.events(timeout_s=5.0)
        await core.close()
        return events

    events = asyncio.run(scenario())
    assert delivered == [], "a fenced zombie delivered a batch"
    assert [e.state for e in events] == [ConsumerState.LOST]
    assert store.get(STREAM, SHARD).owner == "thief"
