"""PullQueueCore in one event loop (no Ray): a cancelled delivery leaves the queue."""

from __future__ import annotations

import asyncio
import datetime as dt

from kinesis_actors.records import Record
from kinesis_actors.sinks.pull import PullQueueCore


def batch(tag: str) -> list[Record]:
    return [Record(data=tag.encode(), partition_key="k", sequence_number="1", sub_sequence_number=None,
                   approximate_arrival_timestamp=dt.datetime.now(dt.timezone.utc), shard_id="shardId-0", stream="s")]


def test_a_cancelled_process_batch_leaves_the_queue_and_is_never_handed_out() -> None:
    async def scenario() -> None:
        queue = PullQueueCore()
        zombie = asyncio.create_task(queue.process_batch(batch("zombie")))
        live = asyncio.create_task(queue.process_batch(batch("live")))
        while queue.pending() < 2:
            await asyncio.sleep(0)
        zombie.cancel()
        await asyncio.gather(zombie, return_exceptions=True)
        assert zombie.cancelled() and queue.pending() == 1
        handed = await queue.next(0.0)
        assert handed is not None and [r.data for r in handed] == [b"live"]
        assert await queue.next(0.0) is None  # acknowledges "live"; the zombie's batch is gone
        await asyncio.wait_for(live, 1.0)

    asyncio.run(scenario())
