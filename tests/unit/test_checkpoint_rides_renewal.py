"""Checkpoints that ride the renewals (``min_checkpoint_interval_s=None``, the default).

Shards under load (every poll returns a batch) run on a FakeClock with their blocking calls
inline, over one in-process lease table that counts its writes per shard. Measured: the
lease-table writes per shard per renew interval (the default pays one, as KCL's renewals do;
``min_checkpoint_interval_s=0`` pays one per acknowledged batch), and, sampled all along, how
far the stored checkpoint trails the acknowledged records (what a failure would redeliver:
at most one renew interval of records per shard).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from kinesis_actors import SHARD_END, PartialBatchError, StartAt
from kinesis_actors.leases.rows import LocalRows, Row
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.testing import FakeClock, FakeShard, InProcessLeaseStore

from .test_reader_core import STREAM, consumer, finish

RENEW_S, LEASE_S, POLL_S = 3.0, 10.0, 0.2
RATE_PER_S = 15  # records per shard per second: 3 per poll, so every poll returns a batch
SHARDS, RUN_S = 4, 60.0


class CountingRows(LocalRows):
    """A lease table that counts conditional writes (``UpdateItem``) per lease key."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: collections.Counter[str] = collections.Counter()

    def update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
               remove_fields: Iterable[str] = (), check_owner: bool = True) -> Row | None:
        self.writes[key] += 1
        return super().update(key, expect_owner, expect_counter, set_fields, remove_fields, check_owner)


def _spec(shard_id: str, interval_s: float | None) -> ReaderSpec:
    return ReaderSpec(stream=STREAM, shard_id=shard_id, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, max_records=1000, idle_wait_s=POLL_S,
                      max_idle_wait_s=POLL_S, min_checkpoint_interval_s=interval_s)


def _under_load(interval_s: float | None) -> dict[str, Any]:
    """Run SHARDS loaded shards for RUN_S fake seconds; what the table and the sinks saw."""
    clock, rows = FakeClock(), CountingRows()
    store = InProcessLeaseStore(rows, clock=clock)
    shards = {f"shardId-{i:012d}": FakeShard(0) for i in range(SHARDS)}
    acked: dict[str, int] = dict.fromkeys(shards, 0)
    batches: collections.Counter[str] = collections.Counter()
    trail: dict[str, int] = dict.fromkeys(shards, 0)  # most acknowledged records not yet in the table

    def loop(shard_id: str) -> ShardConsumer:
        async def deliver(records: list[Any]) -> None:
            acked[shard_id] = int(records[-1].sequence_number)
            batches[shard_id] += 1
        lease = store.take(STREAM, shard_id, owner="me", duration_s=LEASE_S)
        return consumer(_spec(shard_id, interval_s), lease, store, deliver, shards[shard_id], clock)

    async def scenario() -> dict[str, int]:
        loops = {sid: loop(sid) for sid in shards}
        for reader in loops.values():
            await finish(clock, reader.open())
        tasks = [asyncio.create_task(reader.run()) for reader in loops.values()]
        await clock.run_for(RENEW_S)  # warm up: every loop polling, every first renewal spread
        start = dict(rows.writes)
        end = clock() + RUN_S
        while clock() < end:
            for shard in shards.values():
                shard.add(3)
            await clock.run_for(POLL_S)
            for sid in shards:
                stored = store.get(STREAM, sid)
                written = int(stored.checkpoint) if stored and stored.checkpoint else 0
                trail[sid] = max(trail[sid], acked[sid] - written)
        written = {sid: rows.writes[f"{STREAM}:{sid}"] - start.get(f"{STREAM}:{sid}", 0) for sid in shards}
        for reader in loops.values():
            await finish(clock, reader.stop(), 30.0)
        await asyncio.gather(*tasks, return_exceptions=True)
        return written

    written = asyncio.run(scenario())
    return {"written": written, "batches": batches, "trail": trail, "acked": acked, "store": store}


def test_by_default_a_loaded_shard_costs_one_write_per_renew_interval_and_trails_at_most_one_interval() -> None:
    out = _under_load(None)
    intervals = RUN_S / RENEW_S
    for sid, writes in out["written"].items():
        assert out["batches"][sid] >= RUN_S / POLL_S * 0.9, "every poll returned a batch"
        assert writes / intervals <= 1.1, f"{sid}: {writes} writes in {intervals:.0f} renew intervals"
        assert writes / intervals >= 0.8, f"{sid}: the lease was not renewed ({writes} writes)"
        # what a failure would redeliver: the records acknowledged since the last write,
        # at most one renew interval of them (plus the renewal grid's slot and one poll)
        assert out["trail"][sid] <= RATE_PER_S * (RENEW_S + 0.25 + POLL_S), out["trail"]
        assert out["trail"][sid] >= RATE_PER_S * RENEW_S * 0.5, "the checkpoint did ride the renewals"
        # close wrote the last acknowledged record at once
        assert out["store"].get(STREAM, sid).checkpoint == str(out["acked"][sid])


def test_with_interval_zero_every_acknowledged_batch_is_written() -> None:
    out = _under_load(0.0)
    for sid, writes in out["written"].items():
        batches = out["batches"][sid]
        assert batches >= RUN_S / POLL_S * 0.9
        # one write per batch, and no renewal besides: each checkpoint write renews the lease
        assert abs(writes - batches) <= 2, f"{sid}: {writes} writes for {batches} batches"
        assert out["trail"][sid] <= 3, out["trail"]  # the write follows each acknowledgement


def test_shard_end_is_never_overtaken_by_a_checkpoint_riding_a_renewal() -> None:
    clock = FakeClock()
    store = InProcessLeaseStore(clock=clock)
    shard = FakeShard(30, closed=True)
    seen: list[int] = []

    async def deliver(records: list[Any]) -> None:
        seen.extend(int(r.sequence_number) for r in records)
        await clock.sleep(RENEW_S * 2)  # a slow sink: renewals fall due while batches are in flight

    spec = ReaderSpec(stream=STREAM, shard_id="shardId-0", owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, max_records=10, idle_wait_s=POLL_S)
    lease = store.take(STREAM, "shardId-0", owner="me", duration_s=LEASE_S)
    reader = consumer(spec, lease, store, deliver, shard, clock)

    async def scenario() -> ConsumerState:
        await finish(clock, reader.open())
        state: ConsumerState = await finish(clock, reader.run(), 120.0)
        await clock.run_for(RENEW_S * 3)
        return state

    assert asyncio.run(scenario()) is ConsumerState.SHARD_ENDED
    assert seen == list(range(1, 31))
    row = store.get(STREAM, "shardId-0")
    assert row.checkpoint == SHARD_END and row.owner is None


@pytest.mark.parametrize("interval_s", [None, 60.0])
def test_a_partial_acknowledgement_is_written_at_once(interval_s: float | None) -> None:
    clock = FakeClock()
    store = InProcessLeaseStore(clock=clock)
    shard = FakeShard(10)
    calls: list[int] = []
    written: list[str | None] = []

    async def deliver(records: list[Any]) -> None:
        calls.append(len(records))
        if len(calls) == 1:
            raise PartialBatchError("the first 4 only", failed_from=4)
        written.append(store.get(STREAM, "shardId-0").checkpoint)  # before the retry: already stored

    spec = ReaderSpec(stream=STREAM, shard_id="shardId-0", owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, max_records=10, idle_wait_s=POLL_S,
                      min_checkpoint_interval_s=interval_s)
    lease = store.take(STREAM, "shardId-0", owner="me", duration_s=LEASE_S)
    reader = consumer(spec, lease, store, deliver, shard, clock)

    async def scenario() -> None:
        await finish(clock, reader.open())
        task = asyncio.create_task(reader.run())
        await clock.until(lambda: len(calls) >= 2, within_s=5.0, what="the retry of the rest")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert calls[:2] == [10, 6]
    assert written[0] == "4", "the acknowledged prefix was checkpointed before the rest was retried"
