"""ShardPipeline and AckTracker: N batches in flight per shard, order per key, the safe checkpoint."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

import pytest

from kinesis_actors import SinkError
from kinesis_actors.delivery import AckTracker, DeliveryOptions, OneLane, ShardPipeline
from kinesis_actors.records import Record
from kinesis_actors.testing import FakeClock

from .delivery_fakes import drain, rec


def test_the_tracker_checkpoints_only_below_the_first_unacknowledged_record() -> None:
    t = AckTracker()
    records = [rec(i) for i in range(5)]
    t.add(records)
    t.ack([records[1], records[3]])
    assert t.advance() is None
    t.ack([records[0]])
    last = t.advance()
    assert last is records[1] and t.pending == 3
    t.ack([records[2], records[4]])
    assert t.advance() is records[4] and t.pending == 0


def test_the_tracker_orders_kpl_user_records_by_sub_sequence() -> None:
    t = AckTracker()
    users = [rec(1, sub=i) for i in range(3)]  # one aggregate: one sequence number
    t.add(users)
    t.ack([users[0], users[2]])
    last = t.advance()
    assert last is users[0] and last.sub_sequence_number == 0  # the checkpoint falls inside the aggregate
    t.ack([users[1]])
    assert t.advance() is users[2]


def test_the_tracker_knows_records_by_identity_so_an_unregistered_copy_moves_nothing() -> None:
    t = AckTracker()
    records = [rec(i) for i in range(3)]
    t.add(records)
    t.ack([rec(0)])  # equal position, not the registered object: the checkpoint stays behind record 0
    assert t.advance() is None and t.pending == 3
    t.ack(records[:1])
    assert t.advance() is records[0] and t.pending == 2


class SlowSink:
    """Each batch waits until released; records every batch and the most in flight."""

    def __init__(self) -> None:
        self.batches: list[list[Record]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.gate = asyncio.Event()
        self.fail_key: str | None = None

    async def deliver(self, batch: Sequence[Record], on_ack: Any) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            if self.fail_key and any(r.partition_key == self.fail_key for r in batch):
                raise SinkError("refused")
            self.batches.append(list(batch))
        finally:
            self.in_flight -= 1


def keyed(n: int, keys: int) -> list[Record]:
    return [rec(i, key=f"key-{i % keys}") for i in range(n)]


async def pump(pipeline: ShardPipeline, records: list[Record], chunk: int) -> None:
    """A consumer loop in miniature: add a fetched chunk when allowed, dispatch, wait."""
    pos = 0
    while pos < len(records):
        if pipeline.can_fetch():
            pipeline.add(records[pos:pos + chunk])
            pos += chunk
        pipeline.dispatch()
        await pipeline.wait(0.01)
    await drain(pipeline)


def test_n_lanes_deliver_in_parallel_keep_key_order_and_checkpoint_the_safe_prefix() -> None:
    sink, checkpoints = SlowSink(), []
    released: list[Record] = []

    async def checkpoint(r: Record) -> None:
        checkpoints.append(r.position)

    async def main() -> ShardPipeline:
        p = ShardPipeline(DeliveryOptions(parallelization_factor=4, max_batch_records=10), sink.deliver, checkpoint,
                          max_records=1000, clock=FakeClock(), acked=released.extend)
        records = keyed(400, 32)
        loop = asyncio.create_task(pump(p, records, 100))
        for _ in range(200):  # let the lanes fill, then release them
            await asyncio.sleep(0)
        sink.gate.set()
        await asyncio.wait_for(loop, 10)
        return p

    p = asyncio.run(main())
    assert sink.max_in_flight == 4 and p.stats["max_batches_in_flight"] == 4 and p.stats["batches_in_flight"] == 0
    assert all(len(b) <= 10 for b in sink.batches)
    delivered = [r for b in sink.batches for r in b]
    assert sorted(int(r.sequence_number) for r in delivered) == list(range(1000, 1400))
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for r in delivered:
        per_key[r.partition_key].append(int(r.sequence_number))
    assert all(seqs == sorted(seqs) for seqs in per_key.values())  # order kept per partition key
    assert checkpoints == sorted(checkpoints) and checkpoints[-1] == rec(399).position
    assert p.tracker.pending == 0 and sorted(r.position for r in released) == sorted(r.position for r in delivered)
    assert p.stats["batches"] == len(sink.batches)


def test_a_busy_lane_fetches_ahead_until_one_response_is_gathered() -> None:
    sink = SlowSink()

    async def checkpoint(r: Record) -> None:
        pass

    async def main() -> None:
        p = ShardPipeline(DeliveryOptions(parallelization_factor=1, max_batch_records=5), sink.deliver, checkpoint,
                          max_records=8, clock=FakeClock())
        p.add(keyed(5, 1))
        assert p.dispatch() == 1 and p.can_fetch()  # the lane is busy, nothing waits
        p.add(keyed(3, 1))
        assert p.can_fetch()  # a ready batch waits, but 3 < 8 (the Limit): the next response is fetched ahead
        p.add(keyed(5, 1))
        assert p.can_fetch() is False  # 8 gathered, one response's worth, and the lane is busy
        sink.gate.set()
        await drain(p)

    asyncio.run(main())


def test_shard_end_drain_waits_for_every_lane_and_delivers_the_window_early() -> None:
    sink, checkpoints = SlowSink(), []

    async def checkpoint(r: Record) -> None:
        checkpoints.append(int(r.sequence_number))

    async def main() -> None:
        p = ShardPipeline(DeliveryOptions(parallelization_factor=3, batch_window_s=60.0), sink.deliver, checkpoint,
                          max_records=1000, clock=FakeClock())
        p.add(keyed(30, 9))
        assert p.dispatch() == 0 and p.due_in() == pytest.approx(60.0)  # the window holds them
        drained = asyncio.create_task(drain(p))
        await asyncio.sleep(0.05)
        assert not drained.done() and sink.in_flight == 3  # SHARD_END must wait for all 3
        sink.gate.set()
        await asyncio.wait_for(drained, 5)
        assert p.idle and p.tracker.pending == 0

    asyncio.run(main())
    assert checkpoints[-1] == 1029


def test_a_failing_lane_parks_its_error_and_the_checkpoint_stays_before_its_records() -> None:
    sink, checkpoints = SlowSink(), []
    sink.fail_key = "key-1"

    async def checkpoint(r: Record) -> None:
        checkpoints.append(int(r.sequence_number))

    async def main() -> None:
        p = ShardPipeline(DeliveryOptions(parallelization_factor=2), sink.deliver, checkpoint, max_records=1000,
                          clock=FakeClock())
        p.add(keyed(10, 2))
        p.dispatch()
        sink.gate.set()
        with pytest.raises(SinkError):
            await drain(p)

    asyncio.run(main())
    assert not checkpoints or checkpoints[-1] < 1001  # record 1001 (key-1) was never acknowledged


class PerKeySink:
    """Holds the batches holding ``slow_key`` until released; acknowledges every other batch at once."""

    def __init__(self, slow_key: str) -> None:
        self.slow_key = slow_key
        self.release = asyncio.Event()
        self.batches: list[list[Record]] = []

    async def deliver(self, batch: Sequence[Record], on_ack: Any) -> None:
        if any(r.partition_key == self.slow_key for r in batch):
            await self.release.wait()
        self.batches.append(list(batch))


def test_a_fast_lane_waits_for_the_checkpoint_so_a_failure_redelivers_at_most_n_batches() -> None:
    """One lane's batch is held; the other lanes acknowledge theirs at once. Without a bound they
    would run ahead, and everything they acknowledged past the held batch (the checkpoint
    cannot pass it) would be delivered again after a failure. The next round starts only
    once the last one is acknowledged: at most N batches past the checkpoint, ever."""
    lanes = 4
    sink, checkpoints = PerKeySink(slow_key="key-0"), []

    async def checkpoint(r: Record) -> None:
        checkpoints.append(r.position)

    async def main() -> ShardPipeline:
        p = ShardPipeline(DeliveryOptions(parallelization_factor=lanes, max_batch_records=5), sink.deliver,
                          checkpoint, max_records=1000, clock=FakeClock())
        records = keyed(400, 32)
        loop = asyncio.create_task(pump(p, records, 40))
        for _ in range(300):
            await asyncio.sleep(0)
        past = [b for b in sink.batches if b[-1].position > (checkpoints[-1] if checkpoints else (0, 0))]
        assert len(sink.batches) <= lanes - 1, f"fast lanes ran ahead of the held one: {len(sink.batches)} batches"
        assert len(past) <= lanes
        sink.release.set()
        await asyncio.wait_for(loop, 10)
        return p

    p = asyncio.run(main())
    delivered = sorted(int(r.sequence_number) for b in sink.batches for r in b)
    assert delivered == list(range(1000, 1400)) and p.tracker.pending == 0
    assert checkpoints == sorted(checkpoints) and checkpoints[-1] == rec(399).position


def test_a_backlog_goes_out_in_full_rounds_of_n_batches() -> None:
    """64 keys, 50 records per batch, 4 lanes: every round is 4 full batches at once (keys
    spread evenly over the lanes, each round a contiguous run of the shard), so a backlog
    of 800 records takes 4 rounds. Lanes that gathered by a fixed key hash, each waiting
    for the checkpoint to pass its own last batch, ran mostly one batch at a time."""
    starts: list[int] = []
    sizes: list[int] = []
    written: list[tuple[int, int]] = []
    in_flight = 0

    async def deliver(batch: Sequence[Record], on_ack: Any) -> None:
        nonlocal in_flight
        in_flight += 1
        starts.append(in_flight)
        sizes.append(len(batch))
        for _ in range(5):
            await asyncio.sleep(0)
        in_flight -= 1

    async def checkpoint(r: Record) -> None:
        written.append(r.position)

    async def main() -> None:
        p = ShardPipeline(DeliveryOptions(parallelization_factor=4, max_batch_records=50), deliver, checkpoint,
                          max_records=1000, clock=FakeClock())
        await pump(p, keyed(800, 64), 200)

    asyncio.run(main())
    assert sizes == [50] * 16
    assert starts == [1, 2, 3, 4] * 4  # four rounds, each of four batches in flight together
    # one lease-table write per round, at its end (a batch done while others of its round
    # are in flight moves the prefix without a write)
    assert written == [rec(i).position for i in (199, 399, 599, 799)]


def test_a_partial_ack_mid_round_is_checkpointed_at_once() -> None:
    """PartialBatchError's contract: the acknowledged records are checkpointed, round or not."""
    written: list[tuple[int, int]] = []
    release = asyncio.Event()

    async def deliver(batch: Sequence[Record], on_ack: Any) -> None:
        if batch[0].partition_key == "a":
            await on_ack(2)  # the first two records of the round, then hold the rest
        await release.wait()

    async def checkpoint(r: Record) -> None:
        written.append(r.position)

    async def main() -> None:
        p = ShardPipeline(DeliveryOptions(parallelization_factor=2, max_batch_records=10), deliver, checkpoint,
                          max_records=1000, clock=FakeClock())
        p.add([rec(0, key="a"), rec(1, key="a"), rec(2, key="b"), rec(3, key="a")])
        assert p.dispatch() == 2
        for _ in range(20):
            await asyncio.sleep(0)
        assert written == [rec(1).position]
        release.set()
        await drain(p)
        assert written == [rec(1).position, rec(3).position]

    asyncio.run(main())


def test_a_lane_that_failed_unseen_is_not_idle_so_shard_end_waits_for_its_error() -> None:
    """The lanes fail while the consumer awaits a fetch; the shard-end response is empty.
    Neither lanes form may look idle (the read loop would write SHARD_END past unacknowledged
    records); the next dispatch raises the lane's error instead."""
    written: list[tuple[int, int]] = []

    async def deliver(batch: Sequence[Record], on_ack: Any) -> None:
        await asyncio.sleep(0)
        raise SinkError("gave up")

    async def checkpoint(r: Record, partial: bool = False) -> None:
        written.append(r.position)

    async def main() -> None:
        clock = FakeClock()
        for lanes in (ShardPipeline(DeliveryOptions(parallelization_factor=2), deliver, checkpoint, max_records=100,
                                    clock=clock),
                      OneLane(deliver, checkpoint, lambda records: None, size=100, refill_below=100,
                              sleep=clock.sleep, stats={})):
            lanes.add([rec(0, key="a"), rec(1, key="b")])
            assert lanes.dispatch() >= 1
            await asyncio.sleep(0.01)
            lanes.add([])
            assert not lanes.idle
            with pytest.raises(SinkError):
                lanes.dispatch(force=True)
            with pytest.raises(SinkError):
                await lanes.wait(0.01)
            await lanes.cancel()

    asyncio.run(main())
    assert written == []


def test_cancel_drops_a_parked_error_so_the_lanes_deliver_again_after_it() -> None:
    """cancel() (a seek, the loop's end) forgets everything the lanes hold, the error of a
    failed batch included: records added after it are delivered, not refused with the error
    of a batch that was dropped."""
    delivered: list[str] = []

    async def deliver(batch: Sequence[Record], on_ack: Any) -> None:
        if any(r.partition_key == "bad" for r in batch):
            raise SinkError("gave up")
        delivered.extend(r.sequence_number for r in batch)
        await on_ack(len(batch))

    async def checkpoint(r: Record, partial: bool = False) -> None: ...

    async def main() -> None:
        clock = FakeClock()
        for lanes in (ShardPipeline(DeliveryOptions(parallelization_factor=2), deliver, checkpoint, max_records=100,
                                    clock=clock),
                      OneLane(deliver, checkpoint, lambda records: None, size=100, refill_below=100,
                              sleep=clock.sleep, stats={})):
            delivered.clear()
            lanes.add([rec(0, key="bad")])
            with pytest.raises(SinkError):
                await drain(lanes)  # the error is parked and raised
            await lanes.cancel()
            lanes.add([rec(1, key="good")])
            await drain(lanes)
            assert delivered == ["1001"] and lanes.idle, type(lanes).__name__

    asyncio.run(main())
