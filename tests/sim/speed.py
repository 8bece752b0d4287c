"""The issue's speed figures: simulated seconds per wall second of a fault-free world of 16
shards and 3 instances, with 20 records/s into every shard, then with every shard idle."""

from __future__ import annotations

import asyncio
import logging
import time

from . import vloop
from .run import _produce, _tag_tasks, _teardown
from .world import Config, World

__all__ = ["figures", "measure"]


async def _steady(rate: float, simulated_s: float) -> tuple[World, int]:
    _tag_tasks(asyncio.get_running_loop())
    cfg = Config(shards=16, instances=3, rate=rate, fault_s=simulated_s, per_reader=8,
                 controls={"max_record_age_s": None}, skew_s=(0.0,) * 4)
    world = World(0, cfg=cfg)
    world.sink_mix.fail = world.sink_mix.partial = world.sink_mix.stall = 0.0
    world.faults.actions = []
    try:
        for _ in range(cfg.instances):
            await world.start_instance(world.new_owner())
        world.spawn(_produce(world))
        await world.sleep(simulated_s)
        acked = sum(len(f["seqs"]) for _, kind, f in world.history.events if kind == "ack")
    finally:
        await _teardown(world)
    return world, acked


def measure(rate: float, simulated_s: float = 120.0) -> tuple[float, float, int]:
    """(simulated s, wall s, records acknowledged) of the 16-shard world at ``rate`` records/s per shard."""
    logging.getLogger("kinesis_actors").setLevel(logging.CRITICAL)
    t0 = time.perf_counter()
    world, acked = vloop.run(_steady(rate, simulated_s))
    return world.now() - world.history.t0, time.perf_counter() - t0, acked


def figures() -> list[str]:
    """The figures as lines of text (measured now, on this machine)."""
    out = []
    for label, rate in (("20 records/s per shard", 20.0), ("idle shards", 0.0)):
        simulated, wall, acked = measure(rate)
        out.append(f"speed, 16 shards, 3 instances, {label}: {simulated:.0f} simulated s in {wall:.2f} s wall "
                   f"= {simulated / wall:.0f}x ({acked} records acknowledged)")
    return out
