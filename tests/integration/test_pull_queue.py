"""Pull mode's queue actor across Ray: a batch whose reader gave up never reaches the driver.

A reader that loses its lease (or stops) cancels its wait on the delivery; the batch must
then leave the queue actor too, or the driver would be handed a batch of a shard now read
elsewhere: one more duplicate (invariant 10 counts it). Real Ray actors; no emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt

import pytest
import ray

from kinesis_actors.records import Record
from kinesis_actors.sinks import ActorSink
from kinesis_actors.sinks.pull import make_pull_queue

from .helpers import wait_until

pytestmark = pytest.mark.usefixtures("ray_session")


def batch(tag: str) -> list[Record]:
    return [Record(data=tag.encode(), partition_key="k", sequence_number="1", sub_sequence_number=None,
                   approximate_arrival_timestamp=dt.datetime.now(dt.timezone.utc), shard_id="shardId-0", stream="s")]


def test_a_delivery_its_reader_cancelled_is_never_handed_to_the_driver() -> None:
    queue = make_pull_queue()
    sink = ActorSink(queue, "process_batch")
    try:
        async def reader_loses_its_lease() -> None:
            delivery = asyncio.ensure_future(sink.deliver(batch("zombie")))  # as the reader awaits a delivery
            while ray.get(queue.pending.remote(), timeout=30) < 1:  # the batch waits for the driver
                await asyncio.sleep(0.02)
            delivery.cancel()  # the reader's lease is lost: it stops waiting
            with contextlib.suppress(asyncio.CancelledError):
                await delivery

        asyncio.run(asyncio.wait_for(reader_loses_its_lease(), 60))
        wait_until(lambda: ray.get(queue.pending.remote(), timeout=30) == 0, timeout_s=20,
                   what="the cancelled batch leaves the queue")
        assert ray.get(queue.next.remote(0.5, True), timeout=30) is None, "a cancelled batch reached the driver"
        live = ActorSink(queue, "process_batch").deliver(batch("live"))  # the queue still serves live readers
        handed = ray.get(queue.next.remote(10.0, True), timeout=30)
        assert [r.data for r in handed] == [b"live"]
        ray.get(queue.ack.remote(), timeout=30)
        asyncio.run(asyncio.wait_for(_await(live), 30))
    finally:
        ray.kill(queue, no_restart=True)


async def _await(awaitable: object) -> object:
    return await awaitable  # type: ignore[misc]
