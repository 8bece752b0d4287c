"""Load figures end to end without Ray: a reader's stats carry cpu and per-shard bytes/s, the
metrics hooks export them, and the Coordinator's stats show id, cpu and node_id per reader
(the last known cpu while a reader does not answer)."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from kinesis_actors import metrics
from kinesis_actors.coordinator.handles import ReaderUnreachable
from kinesis_actors.coordinator.pool import PooledReader, ReaderState
from kinesis_actors.coordinator.presence import collect_stats
from kinesis_actors.reader import ShardReaderCore
from kinesis_actors.testing import FakeClock, InProcessLeaseStore

from .metrics_recorder import RecordingSink


def fake_consumer(shard_id: str) -> Any:
    spec = types.SimpleNamespace(stream="s", shard_id=shard_id, owner_id="me")
    return types.SimpleNamespace(spec=spec, stats={"bytes": 0, "records": 0})


def test_reader_stats_carry_cpu_and_bytes_per_s_and_export_them(metrics_sink: RecordingSink) -> None:
    clock, used = FakeClock(), [0.0]
    core = ShardReaderCore(store=InProcessLeaseStore(clock=clock), deliver=None, kinesis=None,  # type: ignore[arg-type]
                           clock=clock, load_window_s=4.0, cpu_time=lambda: used[0])
    core.info.update(pid=4242, node_id="n1")
    hot, cold = fake_consumer("hot"), fake_consumer("cold")
    core._consumers = {"hot": hot, "cold": cold}  # type: ignore[dict-item]  # the figures only read stats and spec
    first = core.stats()
    assert first["reader"]["cpu"] == 0.0 and first["shards"]["hot"]["bytes_per_s"] == 0.0  # before a full window
    for _ in range(8):
        clock.advance(1.0)
        used[0] += 0.8
        hot.stats["bytes"] += 50_000
        hot.stats["records"] += 500
        cold.stats["bytes"] += 10
        cold.stats["records"] += 1
        asyncio.run(core.events(timeout_s=0.0))  # the Coordinator's watch samples the figures too
    got = core.stats()
    assert got["reader"]["cpu"] == pytest.approx(0.8) and got["reader"]["pid"] == 4242
    assert got["shards"]["hot"]["bytes_per_s"] == 50_000.0 and got["shards"]["hot"]["records_per_s"] == 500.0
    assert got["shards"]["cold"]["bytes_per_s"] == 10.0
    assert metrics_sink.gauge("reader_cpu", stream="s", owner_id="me", pid="4242") == pytest.approx(0.8)
    metrics.reader_tick(hot.spec, hot.stats, now=clock(), force=True)  # the read loop's own export
    assert metrics_sink.gauge("shard_bytes_per_s", stream="s", shard_id="hot", owner_id="me") == 50_000.0


class Handle:
    def __init__(self, figures: dict[str, Any]) -> None:
        self.figures: dict[str, Any] | None = figures

    async def stats(self) -> dict[str, Any]:
        if self.figures is None:
            raise ReaderUnreachable("maybe back")
        return self.figures


def test_coordinator_stats_show_id_cpu_and_node_and_keep_the_last_cpu_of_a_silent_reader() -> None:
    handle = Handle({"reader": {"pid": 7, "node_id": "n1", "cpu": 0.55, "shards": 1},
                     "shards": {"s0": {"records": 3, "bytes_per_s": 120.0}}})
    reader = PooledReader(3, handle=handle, state=ReaderState.READY)  # type: ignore[arg-type]
    last: dict[str, dict[str, Any]] = {}
    readers = asyncio.run(collect_stats([reader], {3: 1}, last, {"s0"}))
    assert readers[0]["id"] == 3 and readers[0]["cpu"] == 0.55 and readers[0]["node_id"] == "n1"
    assert last["s0"]["bytes_per_s"] == 120.0 and last["s0"]["reader"] == 3
    handle.figures = None
    readers = asyncio.run(collect_stats([reader], {3: 1}, last, {"s0"}))
    assert readers[0]["unreachable"] and readers[0]["cpu"] == 0.55 and readers[0]["pid"] == 7
    assert readers[0]["id"] == 3 and readers[0]["shards"] == 1
