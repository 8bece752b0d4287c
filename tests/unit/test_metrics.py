"""Metrics hooks without Ray: deltas, rate limit, checkpoint age, and that the reader and the
Coordinator call them (a recording sink stands in for ray.util.metrics)."""

from __future__ import annotations

import asyncio
import datetime as dt
import types
from typing import Any

import pytest

from kinesis_actors import StartAt, metrics
from kinesis_actors.reader import ReaderSpec, ShardConsumer
from kinesis_actors.testing import FakeClock, FakeShard, InlineIo, InProcessLeaseStore

from .metrics_recorder import RecordingSink

STREAM, SHARD = "s", "shardId-000000000000"


SPEC = types.SimpleNamespace(stream=STREAM, shard_id=SHARD, owner_id="me")
TAGS = {"stream": STREAM, "shard_id": SHARD, "owner_id": "me"}


def test_reader_tick_exports_deltas_at_most_every_interval(metrics_sink: RecordingSink) -> None:
    stats: dict[str, Any] = {"records": 10, "bytes": 100, "get_records_calls": 2, "throttles": 0,
                             "millis_behind_latest": 1500, "checkpoint": "5"}
    metrics.reader_tick(SPEC, stats, now=100.0)
    assert metrics_sink.counter("records_delivered", **TAGS) == 10 and metrics_sink.counter("bytes_delivered", **TAGS) == 100
    assert metrics_sink.gauge("millis_behind_latest", **TAGS) == 1500
    stats.update(records=25, bytes=250, get_records_calls=3)
    metrics.reader_tick(SPEC, stats, now=100.1)  # within EXPORT_INTERVAL_S: nothing exported
    assert metrics_sink.counter("records_delivered", **TAGS) == 10
    metrics.reader_tick(SPEC, stats, now=100.1 + metrics.EXPORT_INTERVAL_S)
    assert metrics_sink.counter("records_delivered", **TAGS) == 25 and metrics_sink.counter("get_records_calls", **TAGS) == 3
    calls = metrics_sink.calls
    metrics.reader_tick(SPEC, stats, now=200.0)  # nothing changed: only the gauges are set again
    assert metrics_sink.calls - calls == 2
    assert metrics_sink.counter("throttles", **TAGS) == 0


def test_checkpoint_age_is_noted_in_stats_and_exported(metrics_sink: RecordingSink) -> None:
    stats: dict[str, Any] = {"records": 0, "checkpoint": "4"}
    metrics.reader_tick(SPEC, stats, now=50.0)
    assert stats["checkpoint_age_s"] == 0
    later = 50.0 + metrics.EXPORT_INTERVAL_S + 3.0
    metrics.reader_tick(SPEC, stats, now=later)
    age = later - 50.0
    assert stats["checkpoint_age_s"] == age and metrics_sink.gauge("checkpoint_age_s", **TAGS) == age
    stats["checkpoint"] = "9"
    metrics.reader_tick(SPEC, stats, now=later + 1.0)
    assert stats["checkpoint_age_s"] == 0
    metrics.reader_tick(SPEC, stats, now=later + 2.5)  # within the interval: noted in stats, not exported
    assert stats["checkpoint_age_s"] == 1.5 and metrics_sink.gauge("checkpoint_age_s", **TAGS) == age


def test_a_shard_with_no_checkpoint_has_no_age_and_exports_none(metrics_sink: RecordingSink) -> None:
    stats: dict[str, Any] = {"records": 0, "checkpoint": None}
    metrics.reader_tick(SPEC, stats, now=10.0)
    metrics.reader_tick(SPEC, stats, now=19.9, force=True)
    assert stats["checkpoint_age_s"] is None, "an idle shard with no checkpoint must not look 9.9 s old"
    assert metrics_sink.gauge("checkpoint_age_s", **TAGS) is None
    stats["checkpoint"] = "1"
    metrics.reader_tick(SPEC, stats, now=21.0, force=True)
    assert stats["checkpoint_age_s"] == 0 and metrics_sink.gauge("checkpoint_age_s", **TAGS) == 0


def test_restarted_figures_count_from_zero(metrics_sink: RecordingSink) -> None:
    metrics.reader_tick(SPEC, {"records": 40}, now=1.0)
    metrics.reader_tick(SPEC, {"records": 5}, now=2.0 + metrics.EXPORT_INTERVAL_S)  # a new reader for the shard here
    assert metrics_sink.counter("records_delivered", **TAGS) == 45


def test_coordinator_tick_exports_lease_figures(metrics_sink: RecordingSink) -> None:
    core = types.SimpleNamespace(stream=types.SimpleNamespace(name=STREAM), owner_id="me",
                                 counters={"leases_taken": 3, "leases_lost": 1, "readers_replaced": 0},
                                 held=lambda: ["a", "b"])
    metrics.coordinator_tick(core)
    core.counters["leases_taken"] = 4
    metrics.coordinator_tick(core)
    tags = {"stream": STREAM, "owner_id": "me"}
    assert metrics_sink.counter("leases_taken", **tags) == 4 and metrics_sink.counter("leases_lost", **tags) == 1
    assert metrics_sink.gauge("leases_held", **tags) == 2


def test_a_failing_sink_never_reaches_the_caller() -> None:
    class Broken:
        def inc(self, *a: Any) -> None:
            raise RuntimeError("exporter down")

        set = inc

    metrics.set_sink(Broken())
    try:
        stats: dict[str, Any] = {"records": 1}
        metrics.reader_tick(SPEC, stats, now=1.0)
        assert "checkpoint_age_s" in stats
    finally:
        metrics.set_sink(None)


def test_without_ray_nothing_is_exported_but_stats_get_the_age() -> None:
    metrics.set_sink(None)
    stats: dict[str, Any] = {"records": 1, "checkpoint": "7"}
    metrics.reader_tick(types.SimpleNamespace(stream="x", shard_id="y", owner_id="z"), stats)
    assert stats["checkpoint_age_s"] >= 0


def test_the_reader_calls_the_hook_and_stats_carry_the_exported_figures(metrics_sink: RecordingSink,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "EXPORT_INTERVAL_S", 0.5)
    clock = FakeClock()  # the reader's clock, sleep and export interval; its calls inline
    store = InProcessLeaseStore(clock=clock)
    lease = store.take(STREAM, SHARD, owner="me", duration_s=2.0)
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=2.0, renew_interval_s=0.2, max_records=7, idle_wait_s=0.01)
    delivered: list[Any] = []

    async def deliver(records: list[Any]) -> None:
        delivered.extend(records)

    reader = ShardConsumer(spec, lease, store, deliver, FakeShard(30), clock=clock, sleep=clock.sleep,
                           io=InlineIo(clock))  # type: ignore[arg-type]

    finish = clock.finish

    async def main() -> None:
        await finish(reader.open())
        task = asyncio.create_task(reader.run())
        for _ in range(500):
            if reader.stats["records"] == 30:
                break
            await clock.run_for(0.01)
        await clock.run_for(metrics.EXPORT_INTERVAL_S + 0.3)  # at least one export after the last batch
        await finish(reader.stop())
        await finish(task)

    asyncio.run(main())
    assert len(delivered) == 30
    assert metrics_sink.counter("records_delivered", **TAGS) == reader.stats["records"] == 30
    assert metrics_sink.counter("bytes_delivered", **TAGS) == reader.stats["bytes"]
    # idle calls continue at the tip: the exported count trails by at most one export interval
    assert 4 <= metrics_sink.counter("get_records_calls", **TAGS) <= reader.stats["get_records_calls"]
    assert "checkpoint_age_s" in reader.stats


def test_the_coordinator_calls_the_hook_on_each_lease_poll(metrics_sink: RecordingSink, monkeypatch: pytest.MonkeyPatch) -> None:
    import kinesis_actors.coordinator as coordinator

    seen: list[Any] = []
    monkeypatch.setattr(metrics, "coordinator_tick", lambda core: seen.append(core))
    from kinesis_actors.config import KinesisStream

    core = coordinator.CoordinatorCore(KinesisStream(STREAM), aws=None, store=InProcessLeaseStore(), owner_id="me",  # type: ignore[arg-type]
                                       lease_duration_s=2.0, renew_interval_s=0.5, launcher=None,  # type: ignore[arg-type]
                                       kinesis=None)
    asyncio.run(core.poll_leases())
    assert seen == [core]


def test_checkpoint_lag_from_a_lease_row() -> None:
    behind = FakeShard(41)
    behind.add(1, arrival=dt.datetime.fromtimestamp(1_000.0, dt.timezone.utc))  # the first record after "41"
    assert metrics.checkpoint_lag_ms(behind, "s", SHARD, "41", now_s=1_002.5) == 2500
    assert behind.iterator_requests[0] == {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": "41"}
    assert metrics.checkpoint_lag_ms(FakeShard(41), "s", SHARD, "41") == 0, "nothing after the checkpoint"
    fresh = FakeShard(1, max_per_call=0, lag_ms=700)  # an empty answer behind the tip, as AWS gives them
    assert metrics.checkpoint_lag_ms(fresh, "s", SHARD, None) == 700
    assert fresh.iterator_requests[0]["ShardIteratorType"] == "TRIM_HORIZON"
    assert metrics.checkpoint_lag_ms(fresh, "s", SHARD, "SHARD_END") is None
