"""The read loop's seam for sinks with a part in each lease's life (sinks/hooks.py): the consumer
calls a ShardHook at its transitions, in order; a hook may start the shard past the checkpoint,
hold checkpoints back, and keep SHARD_END from being written. No Ray: a fake shard and an
in-process lease store."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from kinesis_actors import SHARD_END, StartAt
from kinesis_actors.errors import SinkError
from kinesis_actors.leases.protocol import Lease
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.records import Record
from kinesis_actors.sinks.hooks import Point, ShardHook, shard_hooks
from kinesis_actors.testing import FakeClock, FakeShard, InlineIo, InProcessLeaseStore

STREAM, SHARD = "s", "shardId-000000000000"


class Recorder(ShardHook):
    """Records the calls; starts after ``start_after``; allows a checkpoint only at ``finish``."""

    def __init__(self, start_after: str | None = None, finish_fails: bool = False) -> None:
        self.calls: list[str] = []
        self.delivered: list[int] = []
        self.start_after = start_after
        self.finish_fails = finish_fails
        self.last: Point | None = None

    async def open(self, lease: Lease) -> StartAt | None:
        self.calls.append("open")
        return StartAt.after_sequence_number(self.start_after) if self.start_after else None

    async def deliver(self, records: Sequence[Record]) -> None:  # type: ignore[override]
        self.calls.append("deliver")
        self.delivered += [int(r.sequence_number) for r in records]

    def checkpointable(self, last: Record) -> Point | None:
        self.calls.append("checkpointable")
        self.last = (last.sequence_number, last.sub_sequence_number)
        return None  # held back until finish

    async def finish(self, *, shard_end: bool, timeout_s: float) -> Point | None:
        self.calls.append(f"finish(shard_end={shard_end})")
        if self.finish_fails:
            raise SinkError("not finished", retriable=True)
        return self.last

    async def release(self) -> None:
        self.calls.append("release")


def run(shard: FakeShard, store: InProcessLeaseStore, hook: ShardHook) -> ShardConsumer:
    lease = store.take(STREAM, SHARD, owner="a", duration_s=10.0)
    assert lease is not None
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="a", start_at=StartAt.trim_horizon(),
                      lease_duration_s=10.0, renew_interval_s=1.0, max_records=10, idle_wait_s=0.01,
                      max_sink_retries=0, min_checkpoint_interval_s=0.0)
    clock = FakeClock(follow_real=True)
    shard.clock = clock

    async def never(records: Sequence[Record]) -> None:
        raise AssertionError("the hook's deliver replaces the sink's")

    consumer = ShardConsumer(spec, lease, store, never, shard, clock=clock, sleep=clock.sleep, io=InlineIo(clock),
                             hook=hook)

    async def main() -> None:  # a FAILED consumer raises its error from run(): kept in consumer.error
        await asyncio.wait_for(asyncio.gather(consumer.run(), return_exceptions=True), 30.0)

    asyncio.run(main())
    return consumer


def compact(calls: list[str]) -> list[str]:
    out: list[str] = []
    for call in calls:
        if not out or out[-1] != call:
            out.append(call)
    return out


def test_the_consumer_calls_the_hook_in_order_and_checkpoints_only_what_it_allows() -> None:
    shard, store, hook = FakeShard(25, closed=True), InProcessLeaseStore(), Recorder(start_after="5")
    consumer = run(shard, store, hook)
    assert consumer.state is ConsumerState.SHARD_ENDED
    assert hook.delivered == list(range(6, 26))  # opened after the hook's position, not the lease's
    assert compact(hook.calls) == ["open", "deliver", "checkpointable", "deliver", "checkpointable",
                                   "finish(shard_end=True)", "release"]
    row = store.get(STREAM, SHARD)
    assert row is not None and row.checkpoint == SHARD_END


def test_a_hook_that_cannot_finish_keeps_shard_end_from_being_written() -> None:
    shard, store, hook = FakeShard(12, closed=True), InProcessLeaseStore(), Recorder(finish_fails=True)
    consumer = run(shard, store, hook)
    assert consumer.state is ConsumerState.FAILED and isinstance(consumer.error, SinkError)
    assert hook.calls.count("finish(shard_end=True)") == 20 and hook.calls[-1] == "release"
    row = store.get(STREAM, SHARD)
    assert row is not None and row.checkpoint != SHARD_END and row.owner is None
    assert row.checkpoint is None  # the hook allowed no checkpoint: the 12 records are read again


def test_ordinary_sinks_have_no_hooks_and_the_default_hook_checkpoints_each_acknowledgement() -> None:
    class Plain:
        async def deliver(self, records: Sequence[Record]) -> Any:
            return None

    assert shard_hooks(Plain()) is None
    record = Record(data=b"x", partition_key="k", sequence_number="7", sub_sequence_number=None,
                    approximate_arrival_timestamp=None, shard_id=SHARD, stream=STREAM)
    assert ShardHook().checkpointable(record) == ("7", None)
    assert ShardHook.deliver is None
