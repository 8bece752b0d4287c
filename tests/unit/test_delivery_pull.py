"""Pull mode's partial acknowledgement: PullQueueCore.ack(upto=i) with a DeliveryEngine as the reader (no Ray)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kinesis_actors import InvalidError
from kinesis_actors.delivery import DeliveryEngine, DeliveryOptions
from kinesis_actors.records import Record
from kinesis_actors.sinks.pull import PullQueueCore

from .delivery_fakes import SHARD, T0, Sleeps, rec


def other_shard(i: int) -> Record:
    r = rec(i)
    return Record(r.data, r.partition_key, r.sequence_number, None, r.approximate_arrival_timestamp,
                  "shardId-000000000099", "s")


def reader(queue: PullQueueCore, acks: list[int], **options: Any) -> Any:
    engine = DeliveryEngine(DeliveryOptions(**options), queue.process_batch, dead_letters=None, shard_id=SHARD,
                            sleep=Sleeps(), wall_clock=lambda: T0)

    async def on_ack(n: int) -> None:
        acks.append(n)

    return engine, on_ack


def test_ack_upto_checkpoints_the_prefix_and_the_next_batch_is_the_rest_first() -> None:
    async def main() -> tuple[list[int], list[list[str]]]:
        queue, acks = PullQueueCore(), []
        engine, on_ack = reader(queue, acks)
        batch = [rec(i) for i in range(5)]
        delivering = asyncio.create_task(engine.deliver(batch, on_ack))
        seen = [await queue.next(1.0)]
        other = asyncio.create_task(queue.process_batch([other_shard(50)]))  # another shard's batch waits
        await asyncio.sleep(0)
        assert queue.ack(upto=2)
        seen.append(await queue.next(1.0, False))  # the rest comes before the other shard's batch
        await asyncio.sleep(0.01)
        assert acks == [2] and not delivering.done()
        seen.append(await queue.next(1.0))  # acknowledges the rest
        await asyncio.wait_for(delivering, 2)
        queue.ack()
        await asyncio.wait_for(other, 2)
        return acks, [[r.sequence_number for r in b or []] for b in seen]

    acks, seen = asyncio.run(main())
    assert seen == [["1000", "1001", "1002", "1003", "1004"], ["1002", "1003", "1004"], ["1050"]]
    assert acks == [2, 5]


def test_partial_acks_across_retries_each_move_the_checkpoint() -> None:
    async def main() -> list[int]:
        queue, acks = PullQueueCore(), []
        engine, on_ack = reader(queue, acks, max_sink_retries=5)
        delivering = asyncio.create_task(engine.deliver([rec(i) for i in range(6)], on_ack))
        for upto in (1, 2, 2):
            got = await queue.next(1.0)
            assert got
            queue.ack(upto=upto)
        got = await queue.next(1.0)
        assert [r.sequence_number for r in got or []] == ["1005"]
        queue.ack()
        await asyncio.wait_for(delivering, 2)
        return acks

    assert asyncio.run(main()) == [1, 3, 5, 6]


def test_ack_upto_zero_puts_the_batch_back_and_bad_values_are_refused() -> None:
    async def main() -> None:
        queue = PullQueueCore()
        waiting = asyncio.create_task(queue.process_batch([rec(0), rec(1)]))
        first = await queue.next(1.0)
        with pytest.raises(InvalidError, match=r"0\.\.2"):
            queue.ack(upto=3)
        assert queue.ack(upto=0)
        again = await queue.next(1.0, False)
        assert again == first and not waiting.done()
        assert queue.ack(upto=2)
        await asyncio.wait_for(waiting, 1)
        assert queue.ack(upto=1) is False  # holds nothing now

    asyncio.run(main())


def test_the_rest_of_a_stopped_reader_is_skipped() -> None:
    async def main() -> None:
        queue = PullQueueCore()
        call = asyncio.create_task(queue.process_batch([rec(0), rec(1), rec(2)]))
        await queue.next(1.0)
        queue.ack(upto=1)
        with pytest.raises(Exception, match="acknowledged 1 of 3"):
            await call
        again = asyncio.create_task(queue.process_batch([rec(1), rec(2)]))  # the reader's retry attaches
        await asyncio.sleep(0)
        again.cancel()  # then the reader stops
        await asyncio.gather(again, return_exceptions=True)
        assert await queue.next(0.05) is None  # its rest is not handed out

    asyncio.run(main())
