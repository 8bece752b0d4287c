"""The simulated world of one seed: instances (a real ``CoordinatorCore`` each, with real
``ShardReaderCore`` readers), the lease table, the stream, the sinks, the producers and the faults.

Each simulated process (a Coordinator, a reader) reaches the table and Kinesis through its own
:class:`~.table.SimIo`; every task a process starts is tagged with its instance (a task factory
reads :data:`PROC`), so a crash cancels exactly that instance's tasks after marking its I/O and
sinks dead: a dead process writes nothing more, and its ``finally`` blocks reach nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import random
from collections.abc import Coroutine, Iterable
from typing import Any

from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator import CoordinatorCore
from kinesis_actors.leases.memory import InProcessLeaseStore
from kinesis_actors.reader import ShardReaderCore
from kinesis_actors.records import StartAt
from kinesis_actors.testing import LocalReader

from .faults import Faults
from .history import History
from .kinesis import SimKinesis
from .simtable import TABLE_CONTROLS, SimCommitter, SimTable, SimTableSink, TableMix, chosen
from .sinks import SimDeadLetters, SimSink, SinkMix
from .table import SimIo, SimRows

__all__ = ["Config", "World", "Instance", "PROC", "in_order"]

PROC: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_proc", default=None)
"""The instance (owner id) whose process runs the current task; None: the simulator itself."""

WALL0 = 1_790_000_000.0  # the virtual epoch at the start of every run (2026-09), seconds


def in_order(tasks: Iterable[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    """``tasks`` in creation order (``sim_order``, set by the run's task factory). A set of tasks
    iterates in the order of their ids, i.e. memory addresses, which depend on what the process
    ran before: cancelling in that order would make a seed's history depend on the seeds run
    before it in the same process."""
    return sorted(tasks, key=lambda t: getattr(t, "sim_order", -1))


def _keep_even(record: Any) -> bool:
    """The record filter of runs that filter: rejects partition key ``k0``."""
    return bool(record.partition_key != "k0")


@dataclasses.dataclass
class Config:
    """One run's shape, drawn from its seed (see :meth:`draw`)."""

    shards: int = 2
    instances: int = 2
    lease_s: float = 6.0
    renew_s: float = 2.0
    poll_s: float = 1.5
    rate: float = 2.0  # records per second per open shard
    fault_s: float = 60.0
    latest: bool = False
    controls: dict[str, Any] = dataclasses.field(default_factory=dict)
    per_reader: int = 2
    skew_s: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)
    sink_retries: int = 1000

    @classmethod
    def draw(cls, rng: random.Random, *, fault_s: float) -> Config:
        """A random run shape (delivery controls included)."""
        controls: dict[str, Any] = {
            "max_batch_records": rng.choice((None, 3, 20)), "batch_window_s": rng.choice((0.0, 0.0, 0.5)),
            "bisect_on_error": rng.random() < 0.3, "parallelization_factor": rng.choice((1, 1, 2, 3)),
            "min_checkpoint_interval_s": rng.choice((None, 0.0, 1.0)),
            "record_filter": _keep_even if rng.random() < 0.2 else None,
            "max_record_age_s": rng.choice((None, None, 20.0))}
        return cls(shards=rng.randint(1, 4), instances=rng.randint(1, 3), poll_s=rng.choice((1.0, 2.0)),
                   rate=rng.choice((0.5, 2.0, 5.0)), fault_s=fault_s, latest=rng.random() < 0.2, controls=controls,
                   per_reader=rng.randint(1, 3), skew_s=tuple(rng.uniform(-3.0, 3.0) for _ in range(4)),
                   sink_retries=rng.choice((1000, 1000, 1000, 2)))


@dataclasses.dataclass
class Reader:
    """One simulated reader process: its handle (``LocalReader``), I/O and sink."""

    who: str
    handle: LocalReader
    io: SimIo
    sink: SimSink


class Instance:
    """One instance (a Coordinator and its readers) under owner id ``owner``."""

    def __init__(self, world: World, owner: str) -> None:
        self.world, self.owner = world, owner
        self.readers: list[Reader] = []
        world.starts += 1
        self.tag = f"{owner}.{world.starts}"  # this incarnation's name in the history (owner ids recur)
        self.io = SimIo(world, owner, f"{self.tag}/coord")
        skew = world.cfg.skew_s[world.owner_index(owner) % len(world.cfg.skew_s)]
        self.wall = lambda: world.wall() + skew
        self.store = InProcessLeaseStore(world.rows, clock=world.now, wall_clock=self.wall)
        self.core = CoordinatorCore(world.stream, aws=None, store=self.store, owner_id=owner,  # type: ignore[arg-type]
                                    lease_duration_s=world.cfg.lease_s, renew_interval_s=world.cfg.renew_s,
                                    launcher=self._launch, kinesis=world.kinesis, call_timeout_s=5.0,
                                    reader_start_timeout_s=10.0, clock=world.now, sleep=world.sleep, io=self.io,
                                    on_fatal=lambda error: world.fatal(self, error))
        self.committer = SimCommitter(world, world.table, owner, self.tag, lambda: self.dead) if world.table is not None else None
        self.dead = False

    def _launch(self, n: int) -> LocalReader:
        w = self.world
        who = f"{self.tag}/r{n}"
        io, sink = SimIo(w, self.owner, who), SimSink(w, who, self.owner)
        hooks = SimTableSink(w, self.committer, who, sink).shard_hook if self.committer is not None else None
        core = ShardReaderCore(hooks=hooks, store=self.store.peer(clock=w.now, wall_clock=self.wall), deliver=sink,
                               kinesis=w.kinesis, io=io, clock=w.now, sleep=w.sleep,  # type: ignore[arg-type]
                               cpu_time=lambda: 0.0, wall_clock=self.wall, rng=w.rng.random)
        handle = LocalReader(core, start_delay_s=w.rng.uniform(0.05, 1.0), sleep=w.sleep)
        self.readers.append(Reader(who, handle, io, sink))
        return handle

    def kill_reader(self, reader: Reader) -> None:
        """SIGKILL one reader process."""
        reader.sink.dead = True
        reader.io.dead = True
        reader.handle.kill()

    async def seek(self, shard: str) -> None:
        """Seek ``shard`` back to ``TRIM_HORIZON`` (a failure is recorded, not raised)."""
        if self.world.table is not None:  # seek on a shard written to a table is not supported (SPEC)
            self.world.history.add("sought", owner=self.owner, shard=shard, error="table sink")
            return
        try:
            done = await self.core.seek(StartAt.trim_horizon(), shard)
            self.world.history.add("sought", owner=self.owner, shard=shard, done=done)
        except Exception as e:  # a reader gone meanwhile: the seek did not happen
            self.world.history.add("sought", owner=self.owner, shard=shard, error=type(e).__name__)


class World:
    """Everything of one seed's run (see the module docstring).

    Args:
        seed: the run's seed (every random choice comes from it).
        fault_s: how long faults are injected, virtual seconds (then the quiet tail).
        cfg: the run's shape (None: drawn from the seed).
        table: True for a table sink, False for the plain sinks, None: as :func:`~.simtable.chosen` says.
        aimed: False: without the aimed faults (:meth:`~.faults.Faults.aimed`).
    """

    def __init__(self, seed: int, *, fault_s: float = 30.0, cfg: Config | None = None,
                 table: bool | None = None, aimed: bool = True) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.history = History(self.loop.time)
        self.cfg = cfg or Config.draw(self.rng, fault_s=fault_s)
        self.sink_mix = SinkMix(self.rng)
        if self.cfg.sink_retries < 5:  # a sink that gives up: often enough that lanes fail (and instances restart)
            self.sink_mix.fail = max(self.sink_mix.fail, 0.3)
        self.table: SimTable | None = None  # a run with a table sink (one seed in simtable.TABLE_SHARE)
        if chosen(seed) if table is None else table:
            self.table, self.table_mix = SimTable(self), TableMix(self.rng)
            self.cfg.instances = max(2, self.cfg.instances)
            self.cfg.controls.update(TABLE_CONTROLS)  # what check_table_sink refuses, off
        self.rows = SimRows(self.history.add)
        self.rows.race = self.race
        self.kinesis = SimKinesis(self.cfg.shards, clock=self.now, wall=self.wall, chance=self.chance)
        self.kinesis.on_read = lambda sid, pos, n: self.history.add("read", shard=sid, pos=pos, n=n)
        self.kinesis.on_iterator = lambda sid, kind, pos: self.history.add("iterator", shard=sid, type=kind, pos=pos)
        self.stream = KinesisStream(
            "sim", start_at=StartAt.latest() if self.cfg.latest else StartAt.trim_horizon(),
            lease_poll_interval_s=self.cfg.poll_s, shard_sync_interval_s=3.0, idle_wait_s=0.2,
            max_idle_wait_s=1.0, max_shards_per_reader=self.cfg.per_reader, max_sink_retries=self.cfg.sink_retries,
            dead_letter=SimDeadLetters(self) if self.cfg.controls.get("max_record_age_s") else None,
            balance_by="count", reader_target_cpu=None, **self.cfg.controls)
        self.instances: dict[str, Instance] = {}
        self._owners: list[str] = []
        self.starts = 0
        self.faults = Faults(self, aimed=aimed)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.fault_end = self.now() + self.cfg.fault_s

    # ------------------------------------------------------------------ time and chance
    def now(self) -> float:
        """Virtual monotonic seconds."""
        return self.loop.time()

    def wall(self) -> float:
        """Virtual epoch seconds (before any instance's skew)."""
        return WALL0 + self.loop.time() - self.t0

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep`` on the virtual loop (a dead process's sleeps never end: see SimIo)."""
        await asyncio.sleep(seconds)

    def chance(self, p: float) -> bool:
        """True with probability ``p`` (no draw when ``p`` is 0, so a run without that fault draws less)."""
        return p > 0 and self.rng.random() < p

    # ------------------------------------------------------------------ instances
    def owner_index(self, owner: str) -> int:
        """The position of ``owner`` among every owner id this run has used."""
        if owner not in self._owners:
            self._owners.append(owner)
        return self._owners.index(owner)

    def new_owner(self) -> str:
        """An owner id never used in this run."""
        owner = f"i{len(self._owners)}"
        self.owner_index(owner)
        return owner

    def owners(self) -> list[str]:
        """Every owner id used so far."""
        return list(self._owners)

    def live(self) -> list[Instance]:
        """The instances running now, by owner id."""
        return [self.instances[o] for o in sorted(self.instances) if not self.instances[o].dead]

    def spawn(self, coro: Coroutine[Any, Any, Any], proc: str | None = None) -> asyncio.Task[Any]:
        """Start ``coro`` as a task of process ``proc`` (None: the simulator's own)."""
        token = PROC.set(proc)
        try:
            task = self.loop.create_task(coro)
        finally:
            PROC.reset(token)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start_instance(self, owner: str) -> None:
        """Start an instance under ``owner`` (its first pass runs in its own tasks)."""
        inst = Instance(self, owner)
        self.instances[owner] = inst
        self.history.add("start", owner=owner)
        self.spawn(self._first_pass(inst), proc=owner)

    async def _first_pass(self, inst: Instance) -> None:
        try:
            await inst.core.start(timeout_s=30.0)
        except Exception as e:  # a StartError with faults about: what the subscription's Supervisor does
            self.history.add("start_failed", owner=inst.owner, error=type(e).__name__)
            # it closes that Coordinator (releasing what it took), kills it, and starts another at its next check
            await inst.core.close(release=True, grace_s=1.0, timeout_s=10.0)
            self.crash(inst)
            self.spawn(self.restart_later(inst.owner, self.rng.uniform(1.0, 5.0)))

    def crash(self, inst: Instance) -> None:
        """The instance's processes die at once: nothing of theirs runs or writes again."""
        inst.dead = True
        inst.io.dead = True
        for reader in inst.readers:
            inst.kill_reader(reader)
        for task in in_order(self.loop_tasks()):
            if getattr(task, "sim_proc", None) == inst.owner and task is not asyncio.current_task():
                task.cancel()
        self.history.add("crashed", owner=inst.owner)

    def loop_tasks(self) -> set[asyncio.Task[Any]]:
        """Every unfinished task of the loop."""
        return asyncio.all_tasks(self.loop)

    async def restart_later(self, owner: str, after_s: float) -> None:
        """Start an instance under ``owner`` after ``after_s`` seconds (at once once faults stop)."""
        await self.sleep(min(after_s, max(0.0, self.fault_end - self.now())))
        if owner not in self.instances or self.instances[owner].dead:
            await self.start_instance(owner)

    def race(self, key: str, row: dict[str, Any]) -> None:
        """A take has just read ``row``: the holder's renewal, sent before, may land before the
        take's write (when the holder runs and reaches the table: a slow table's renewals land late)."""
        inst = self.instances.get(str(row.get("lease_owner")))
        if inst is None or inst.dead or self.rows.writer.split(".")[0] == inst.owner:
            return
        if not self.faults.partitioned(inst.owner) and self.chance(0.3):
            self.rows.late_renewal(key, row, f"{inst.tag}/late")

    def fatal(self, inst: Instance, error: BaseException) -> None:
        """``inst``'s subscription failed: recorded; it closes itself, and is started again (its user restarts it)."""
        self.history.add("fatal", owner=inst.owner, error=type(error).__name__, what=str(error)[:200])
        self.spawn(self._revive(inst))

    async def _revive(self, inst: Instance) -> None:
        await inst.core.wait(30.0)
        inst.dead = True
        await self.restart_later(inst.owner, self.rng.uniform(1.0, 5.0))

    async def close_and_return(self, inst: Instance, after_s: float) -> None:
        """Close ``inst`` gracefully (releasing its leases), then start it again after ``after_s``."""
        token = PROC.set(inst.owner)
        try:
            await inst.core.close(release=True, grace_s=2.0, timeout_s=10.0)
        finally:
            PROC.reset(token)
        inst.dead = True
        self.history.add("closed", owner=inst.owner)
        await self.restart_later(inst.owner, after_s)
