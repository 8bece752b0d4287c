"""Running seeds: one run (:func:`run_seed`), a range over worker processes (:func:`run_range`).

One run: a :class:`~.world.World` on a fresh :class:`~.vloop.VirtualLoop`; the initial
instances start staggered, producers put records into every open shard, the faults run for
``fault_s`` virtual seconds, then a quiet tail (faults lifted, crashed instances back, no new
records) of ``2 x (lease + poll) + 15`` seconds lets every shard drain; then the history is
checked (:func:`~.checker.check`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import time
import uuid
from collections.abc import Iterable
from typing import Any

from kinesis_actors import mutation, pacing

from . import vloop
from .checker import Violation, check
from .tablecheck import check_table
from .world import PROC, World, in_order

__all__ = ["Result", "run_seed", "run_range", "tail_s", "FAULT_S"]

FAULT_S = 30.0
"""Simulated seconds of faults per seed by default (then the quiet tail)."""

DRAIN_CAP_S = 60.0
"""After the quiet tail, how long the run goes on while records are still unhandled (a backlog
draining), virtual seconds; what is still unhandled then is ``lost``."""


@dataclasses.dataclass
class Result:
    """What one seed's run gave: its violations, history digest and size, and what it cost."""

    seed: int
    violations: list[Violation]
    digest: str
    events: int
    virtual_s: float
    wall_s: float
    report: list[str] = dataclasses.field(default_factory=list)


def tail_s(world: World) -> float:
    """The quiet tail of ``world``'s run, virtual seconds."""
    return 2 * (world.cfg.lease_s + world.cfg.poll_s) + 15.0


def _tag_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Every new task carries ``sim_proc`` (the instance whose process created it) and ``sim_order``
    (its rank among the loop's tasks, by creation: see :func:`~.world.in_order`)."""
    order = itertools.count()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kw)
        task.sim_proc = PROC.get()  # type: ignore[attr-defined]
        task.sim_order = next(order)  # type: ignore[attr-defined]
        return task

    loop.set_task_factory(factory)


async def _produce(world: World) -> None:
    """Records into every open shard until the faults stop (keys ``k0``-``k3``)."""
    step = 0.5
    while world.now() < world.fault_end:
        for sid in world.kinesis.open_shards():
            n = int(world.cfg.rate * step + world.rng.random())
            for _ in range(n):
                world.kinesis.put(sid, f"k{world.rng.randrange(4)}", b"x" * 100)
        await world.sleep(step)


async def _scenario(world: World) -> None:
    for _ in range(world.cfg.instances):
        await world.start_instance(world.new_owner())
        await world.sleep(world.rng.uniform(0.0, 3.0))
    world.spawn(_produce(world))
    world.spawn(world.faults.aimed(world.fault_end))
    await world.faults.chaos(world.fault_end)
    await world.sleep(max(0.0, world.fault_end - world.now()))
    world.faults.stop()
    world.history.add("quiet")
    await world.sleep(tail_s(world))
    end = world.now() + DRAIN_CAP_S
    while world.now() < end and not _drained(world):  # a backlog takes what it takes, up to the cap
        await world.sleep(1.0)


def _drained(world: World) -> bool:
    """True once every record published so far was acknowledged or dead-lettered at least once
    (a cheap look at the history's last events would not do: records are counted in full)."""
    done: set[int] = set()
    for _, kind, f in world.history.events:
        if kind == "dead" or (kind == "ack" and world.table is None):  # a table's: what it holds
            done.update(f["seqs"])
    if world.table is not None:
        done.update(seq for c in world.table.commits for _, seq in c.rows)
    filtered = world.cfg.controls.get("record_filter") is not None
    return all(int(r["SequenceNumber"]) in done or (filtered and r["PartitionKey"] == "k0")
               for s in world.kinesis.shards.values() for r in s.records)


async def _teardown(world: World) -> None:
    """Crash every instance and cancel every task left (the run is over)."""
    for inst in list(world.instances.values()):
        if not inst.dead:
            world.crash(inst)
    me = asyncio.current_task()
    for _ in range(10):  # a cancelled task may start another on its way out
        rest = [t for t in in_order(asyncio.all_tasks()) if t is not me]
        if not rest:
            return
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


async def _main(seed: int, fault_s: float, **shape: Any) -> tuple[World, list[Violation]]:
    _tag_tasks(asyncio.get_running_loop())
    world = World(seed, fault_s=fault_s, **shape)
    try:
        await _scenario(world)
        found = check(world)
        if world.table is not None and not found:
            found = check_table(world)
    finally:
        await _teardown(world)
    return world, found


def run_seed(seed: int, *, fault_s: float = FAULT_S, mutants: Iterable[str] = (), verbose: bool = False,
             table: bool | None = None, aimed: bool = True) -> Result:
    """Run seed ``seed`` (with ``mutants`` planted); its :class:`Result` (``report``: the shortened
    history when a violation was found, the whole one with ``verbose``). ``table``: the sink model
    (True: a table sink, False: the plain sinks, None: as :func:`~.simtable.chosen` says for the seed);
    ``aimed``: False runs it without the aimed faults (:meth:`~.faults.Faults.aimed`)."""
    random.seed(seed)  # library code drawing from the module's generator (backoff jitter) draws the same
    pacing._IDLE_PHASE = random.Random(seed).random()  # the process's idle-poll phase, drawn at import
    counter = random.Random(seed ^ 0x5EED)
    real_uuid4 = uuid.uuid4
    uuid.uuid4 = lambda: uuid.UUID(int=counter.getrandbits(128), version=4)  # type: ignore[assignment]
    logging.getLogger("kinesis_actors").setLevel(logging.DEBUG if verbose else logging.CRITICAL)
    t0 = time.perf_counter()
    try:
        with mutation.planted(*mutants):
            world, found = vloop.run(_main(seed, fault_s, table=table, aimed=aimed))
    finally:
        uuid.uuid4 = real_uuid4  # type: ignore[assignment]
    wall = time.perf_counter() - t0
    h = world.history
    report: list[str] = []
    if verbose:
        report = [f"config: {world.cfg}", f"sink: {world.sink_mix}", f"table: {getattr(world, 'table_mix', None)}",
                  f"faults: {world.faults.actions}",
                  *(h.line(e) for e in h.events)]
    elif found:
        report = [f"config: {world.cfg}", f"sink: {world.sink_mix}", f"table: {getattr(world, 'table_mix', None)}",
                  *h.around(found[0].at + h.t0)]
    return Result(seed, found, h.digest(), len(h.events), world.now() - h.t0, wall, report)


def _one(args: tuple[int, float, tuple[str, ...]]) -> Result:
    seed, fault_s, mutants = args
    result = run_seed(seed, fault_s=fault_s, mutants=mutants)
    if not result.violations:
        result.report = []
    return result


def run_range(seeds: Iterable[int], *, fault_s: float = FAULT_S, mutants: tuple[str, ...] = (), workers: int = 2,
              stop_at_first: bool = False) -> list[Result]:
    """Run every seed of ``seeds`` over ``workers`` processes (1: in this process), in seed order.

    With ``stop_at_first``, stops after the first seed with a violation (the results so far)."""
    jobs = [(s, fault_s, mutants) for s in seeds]
    if workers <= 1:
        out = []
        for job in jobs:
            out.append(_one(job))
            if stop_at_first and out[-1].violations:
                break
        return out
    import multiprocessing

    out = []
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for result in pool.imap(_one, jobs, chunksize=4):
            out.append(result)
            if stop_at_first and result.violations:
                pool.terminate()
                break
    return out
