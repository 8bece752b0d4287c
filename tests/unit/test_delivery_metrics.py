"""Every delivery control has a metric: the engine's and the pipeline's stats keys are exported by reader_tick."""

from __future__ import annotations

import asyncio
import types
from typing import Any

from kinesis_actors import metrics
from kinesis_actors.delivery import DeadLetterWriter, DeliveryEngine, DeliveryOptions, ShardPipeline
from kinesis_actors.testing import FakeClock

from .delivery_fakes import SHARD, T0, Publisher, Sink, Sleeps, drain, rec, recs
from .metrics_recorder import RecordingSink


def test_dead_lettered_filtered_bisected_partial_acks_and_batches_in_flight_are_exported(
        metrics_sink: RecordingSink) -> None:
    stats: dict[str, Any] = {}
    dlq, sleeps = Publisher(fail=1), Sleeps()
    opts = DeliveryOptions(dead_letter=object(), bisect_on_error=True, max_sink_retries=0, max_record_age_s=60.0,
                           record_filter=lambda r: r.partition_key != "drop")
    sink = Sink(poison=[b"r5"], partial={1: 1})
    engine = DeliveryEngine(opts, sink, dead_letters=DeadLetterWriter(dlq.publish, sleep=sleeps, stats=stats),
                            shard_id=SHARD, sleep=sleeps, wall_clock=lambda: T0, stats=stats)

    async def main() -> None:
        pipeline = ShardPipeline(opts, engine.deliver, checkpoint, max_records=100, clock=FakeClock(),
                                 stats=stats)
        pipeline.add([*recs(8), rec(8, key="drop"), rec(9, arrival=T0 - 120)])
        pipeline.dispatch()
        assert stats["batches_in_flight"] == 1
        await drain(pipeline)

    async def checkpoint(r: Any) -> None:
        pass

    asyncio.run(main())
    spec = types.SimpleNamespace(stream="s", shard_id=SHARD, owner_id="me")
    metrics.reader_tick(spec, stats, force=True)
    tags = {"stream": "s", "shard_id": SHARD, "owner_id": "me"}
    assert metrics_sink.counter("records_filtered", **tags) == 1
    assert metrics_sink.counter("dead_letter_records", **tags) == 2  # r9 too old, r5 poison
    assert metrics_sink.counter("dead_letter_failures", **tags) == 1
    assert metrics_sink.counter("partial_acks", **tags) == 1
    assert metrics_sink.counter("batches_bisected", **tags) >= 1
    assert metrics_sink.gauge("batches_in_flight", **tags) == 0
    assert stats["max_batches_in_flight"] == 1
