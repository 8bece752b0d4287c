"""The read loop with a table sink's hook (ShardConsumer + ShardTableLink) without Ray: a fake
shard, an in-process lease store, and a real Delta table behind an in-process committer. Shard
end commits before SHARD_END; a new owner resumes after the table when it is ahead of the
checkpoint; checkpoints never pass what the table holds."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kinesis_actors import SHARD_END, StartAt
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.sinks.hooks import shard_hooks
from kinesis_actors.sinks.tables import ShardKey, ShardTableLink, TableCommitter, TableSink
from kinesis_actors.sinks.tables.delta import DeltaBackend
from kinesis_actors.sinks.tables.sink import to_rows
from kinesis_actors.testing import FakeClock, FakeShard, InlineIo, InProcessLeaseStore

from .table_fixtures import until

STREAM, SHARD = "s", "shardId-000000000000"


class LocalTableSink(TableSink):
    """A table sink whose per-lease calls go to an in-process committer (no Ray)."""

    def __init__(self, path: Path, commit_interval_s: float = 0.2) -> None:
        super().__init__(commit_interval_s=commit_interval_s, transform=None, create_if_missing=True)
        self.path = path
        self.committer = TableCommitter(DeltaBackend(str(path)), commit_interval_s=commit_interval_s)

    def backend(self) -> DeltaBackend:
        return DeltaBackend(str(self.path))

    async def open_shard(self, stream: str, shard_id: str, lease_counter: int, *, timeout_s: float = 60.0) -> Any:
        return await self.committer.open_shard(ShardKey(stream, shard_id), lease_counter, timeout_s=timeout_s)

    async def stage(self, records: Any, lease_counter: int) -> Any:
        last = records[-1]
        return await self.committer.stage(ShardKey(last.stream, last.shard_id), lease_counter,
                                          to_rows(records, None), (last.sequence_number, last.sub_sequence_number))

    async def flush_shard(self, stream: str, shard_id: str, lease_counter: int, *, timeout_s: float = 10.0) -> Any:
        return await self.committer.flush_shard(ShardKey(stream, shard_id), lease_counter, timeout_s=timeout_s)

    async def release_shard(self, stream: str, shard_id: str, lease_counter: int) -> int:
        return self.committer.release_shard(ShardKey(stream, shard_id), lease_counter)

    def sequence_numbers(self) -> list[int]:
        state = self.backend().load()
        return sorted(int(s) for s in state.to_pyarrow_table().column("sequence_number").to_pylist())


def reader(shard: FakeShard, store: InProcessLeaseStore, sink: LocalTableSink, owner: str,
           min_checkpoint_interval_s: float | None = 0.0) -> ShardConsumer:
    lease = store.take(STREAM, SHARD, owner=owner, duration_s=10.0)
    assert lease is not None
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id=owner, start_at=StartAt.trim_horizon(),
                      lease_duration_s=10.0, renew_interval_s=1.0, max_records=10, idle_wait_s=0.01,
                      max_sink_retries=2, min_checkpoint_interval_s=min_checkpoint_interval_s)
    clock = FakeClock(follow_real=True)
    shard.clock = clock
    hooks = shard_hooks(sink)  # what the reader process does with its sink
    assert hooks is not None
    hook = hooks(STREAM, SHARD, lease.counter)
    assert isinstance(hook, ShardTableLink)
    return ShardConsumer(spec, lease, store, sink.deliver, shard, clock=clock, sleep=clock.sleep, io=InlineIo(clock),
                         hook=hook)


async def run_until(consumer: ShardConsumer, cond: Any, timeout_s: float = 30.0) -> ConsumerState:
    task = asyncio.create_task(consumer.run())
    await until(lambda: cond() or task.done(), within_s=timeout_s)
    if not task.done():
        await consumer.stop(grace_s=10.0)
    return await task


def test_shard_end_is_written_only_after_every_record_is_committed(tmp_path: Path) -> None:
    shard, store, sink = FakeShard(35, closed=True), InProcessLeaseStore(), LocalTableSink(tmp_path / "t")
    outcome = asyncio.run(run_until(reader(shard, store, sink, "a"), lambda: False))
    assert outcome == ConsumerState.SHARD_ENDED
    assert sink.sequence_numbers() == list(range(1, 36))
    row = store.get(STREAM, SHARD)
    assert row is not None and row.checkpoint == SHARD_END and row.owner is None


def test_a_new_owner_resumes_after_the_table_when_it_is_ahead_of_the_checkpoint(tmp_path: Path) -> None:
    shard, store, sink = FakeShard(40), InProcessLeaseStore(), LocalTableSink(tmp_path / "t")

    async def scenario() -> None:
        first = reader(shard, store, sink, "a", min_checkpoint_interval_s=600.0)  # few checkpoint writes
        task = asyncio.create_task(first.run())
        await until(lambda: sink.committer.stats()["rows_committed"] >= 40, what="40 rows committed")
        task.cancel()  # dies where it stands, as a SIGKILL: the lease table lags the table
        await asyncio.gather(task, return_exceptions=True)
        row = store.get(STREAM, SHARD)
        assert row is not None and (row.checkpoint is None or int(row.checkpoint) < 40), row
        shard.add(10)
        second = reader(shard, store, sink, "a")  # re-taken: a higher lease counter
        await run_until(second, lambda: sink.committer.stats()["rows_committed"] >= 50)

    asyncio.run(scenario())
    assert sink.sequence_numbers() == list(range(1, 51))  # what the table held was not read again
    row = store.get(STREAM, SHARD)
    assert row is not None and row.checkpoint == "50"


def test_checkpoints_follow_the_commits_not_the_acknowledgements_and_a_close_commits_first(tmp_path: Path) -> None:
    """Batches are acknowledged once staged, but with no commit yet nothing is checkpointed, not
    even by the renewals that carry checkpoints; the close commits, then checkpoints what it committed."""
    shard, store, sink = FakeShard(40), InProcessLeaseStore(), LocalTableSink(tmp_path / "t", commit_interval_s=3600.0)

    renewals, renew = [0], store.renew

    def counting_renew(lease: Any, **kw: Any) -> Any:
        renewals[0] += 1
        return renew(lease, **kw)

    store.renew = counting_renew  # type: ignore[method-assign]

    async def scenario() -> tuple[str | None, ConsumerState]:
        consumer = reader(shard, store, sink, "a", min_checkpoint_interval_s=None)  # checkpoints ride renewals
        task = asyncio.create_task(consumer.run())
        await until(lambda: consumer.stats["records"] >= 40, what="40 records delivered")
        seen = renewals[0]  # two renewals more, each of which would carry a pending checkpoint
        await until(lambda: renewals[0] >= seen + 2, within_s=10.0, what="two renewals after the last batch")
        row = store.get(STREAM, SHARD)
        assert row is not None
        before = row.checkpoint
        await consumer.stop(grace_s=10.0)
        return before, await task

    before, outcome = asyncio.run(scenario())
    assert before is None  # 40 records acknowledged (staged), none committed: none checkpointed
    assert outcome == ConsumerState.CLOSED
    assert sink.sequence_numbers() == list(range(1, 41))  # the close committed them
    row = store.get(STREAM, SHARD)
    assert row is not None and row.checkpoint == "40" and row.owner is None
