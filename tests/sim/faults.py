"""Seeded faults: what goes wrong in a simulated run, and when, all drawn from the run's seed.

:class:`Faults` holds the conditions in force (table latency, failure chances and partitions
per instance; Kinesis stalls and throttling per shard) that :class:`~.table.SimIo` and
:class:`~.kinesis.SimKinesis` consult, and :meth:`Faults.chaos` is the task that, until the
faults stop, picks the next fault at random intervals: a reader process killed, a Coordinator
killed and restarted, an instance crashed (restarted later, under its owner id or a new one) or
closed gracefully, a new instance, the table slow, failing or partitioned from one instance,
a shard throttled or stalled, a split or a merge, a seek. Every fault is a ``fault`` event.

:meth:`Faults.aimed` adds, in one seed in two, a fault aimed at a narrow window the faults
above reach rarely: a reader process paused as it sends a checkpoint (it draws from its own
generator, :attr:`Faults.aimed_rng`, so a seed's history is the one it draws without it up to
the first pause). Every reshard also makes the closing shards' last records poison.
"""

from __future__ import annotations

import os
import random
from typing import Any

__all__ = ["Faults", "ACTIONS", "AIMED_SALT"]

ACTIONS = ("kill_reader", "kill_coordinator", "crash_instance", "close_instance", "add_instance",
           "table_slow", "table_failing", "partition", "throttle", "stall", "hang", "reshard", "seek")
"""Every kind of fault :meth:`Faults.chaos` picks from (each run draws the subset it uses)."""

AIMED_SALT = 0xA1
"""Mixed into the seed to seed the aimed faults' generator (:attr:`Faults.aimed_rng`)."""


class Faults:
    """The fault conditions of one run and the task that changes them.

    Args:
        world: the :class:`~.world.World`.
        aimed: False: none of the aimed faults (no pause, no poison), as seeds found before them ran.
    """

    def __init__(self, world: Any, *, aimed: bool = True) -> None:
        self.world = world
        rng = world.rng
        self.actions = sorted(rng.sample(ACTIONS, rng.randint(3, len(ACTIONS))))
        self.mean_gap_s = rng.choice((2.0, 5.0, 10.0))
        self.base_table_s = rng.choice((0.002, 0.01, 0.05))
        self.table_fail_before = 0.0
        self.table_fail_after = 0.0
        self.slow: dict[str, tuple[float, float]] = {}  # instance -> (latency s, until)
        self.cut: dict[str, float] = {}  # instance -> partitioned until
        self.stalls: dict[str, float] = {}  # shard -> stalled until
        self.hangs: dict[tuple[str, str | None], float] = {}  # (reader process, shard) -> next call hangs this long
        self.stuck: set[str] = set()  # reader processes whose next call without a shard (a batch's preparation) never returns
        self.aimed_rng = random.Random(world.seed ^ AIMED_SALT)
        self.pausing = aimed and self.aimed_rng.random() < 0.5  # this seed pauses reader processes (see aimed)
        self.poisoning = aimed  # reshards make the closing shards' last records poison (see reshard)
        self.pauses: dict[str, float] = {}  # reader process -> its next checkpoint write waits this long first, s
        self.poison: set[int] = set()  # sequence numbers every plain sink refuses while the faults last
        self.active = True

    def table_latency_s(self, instance: str) -> float:
        """Latency of one lease-table call from ``instance`` now, seconds."""
        latency, until = self.slow.get(instance, (0.0, 0.0))
        extra = min(latency, max(0.0, self.world.fault_end - self.world.now())) if self.world.now() < until else 0.0
        return self.base_table_s * (0.5 + self.world.rng.random()) + extra

    def partitioned(self, instance: str) -> bool:
        """True while ``instance`` cannot reach the table."""
        return self.world.now() < self.cut.get(instance, 0.0)

    def kinesis_delay_s(self, shard: str | None) -> float:
        """How long a Kinesis call on ``shard`` takes now (to the end of a stall), seconds."""
        stalled = self.stalls.get(shard or "", 0.0) - self.world.now()
        return max(stalled, 0.0) + 0.005 + 0.02 * self.world.rng.random()

    def stop(self) -> None:
        """The quiet tail: no new fault, every condition lifted (stalls, partitions, throttles, hung
        calls to come, a failing or stalling sink; a call hung already stays hung)."""
        self.active = False
        self.slow.clear()
        self.cut.clear()
        self.stalls.clear()
        self.table_fail_before = self.table_fail_after = 0.0
        self.world.kinesis.throttle.clear()
        self.world.kinesis.expire_chance = 0.0
        self.hangs.clear()
        self.stuck.clear()
        self.pauses.clear()
        self.poison.clear()
        self.world.sink_mix.fail = self.world.sink_mix.stall = 0.0

    async def chaos(self, until: float) -> None:
        """Inject faults at random intervals (mean ``mean_gap_s``) until virtual time ``until``."""
        w = self.world
        while self.actions:
            await w.sleep(w.rng.expovariate(1.0 / self.mean_gap_s))
            if w.now() >= until:
                return
            action = w.rng.choice(self.actions)
            await getattr(self, action)()

    async def aimed(self, until: float) -> None:
        """When this seed pauses (one in two), pause a reader process at random intervals (mean
        8 s) until virtual time ``until`` (see :meth:`take_pause`). Draws only from :attr:`aimed_rng`."""
        w, rng = self.world, self.aimed_rng
        while self.pausing:
            await w.sleep(rng.expovariate(1.0 / 8.0))
            if w.now() >= until:
                return
            held = sorted(r.who for i in w.live() for r in i.readers if not r.handle.dead and r.handle.core.shard_ids())
            if held:
                who = rng.choice(held)
                self.pauses[who] = rng.uniform(w.cfg.lease_s + 2 * w.cfg.poll_s, 3 * w.cfg.lease_s)
                self._note("pause", who=who, for_s=round(self.pauses[who], 3))

    def take_pause(self, who: str, call: Any) -> float:
        """Seconds that reader process ``who``'s lease-store call ``call`` waits before it leaves:
        a pause set by :meth:`aimed` (a stop-the-world GC, a VM migration), taken by its next
        checkpoint write only. Meanwhile its renewals queue behind that write (the lease keeper
        serialises writes), so the lease expires and is taken; the checkpoint then reaches a row
        it no longer holds and is refused. 0.0 when none is due. Like every fault, a pause ends
        when the faults stop (the liveness check's window opens then)."""
        if who not in self.pauses or getattr(getattr(call, "func", call), "__name__", "") != "checkpoint":
            return 0.0
        return min(self.pauses.pop(who), max(0.0, self.world.fault_end - self.world.now()))

    def _note(self, action: str, **fields: Any) -> None:
        self.world.history.add("fault", action=action, **fields)

    async def kill_reader(self) -> None:
        """SIGKILL one reader process of a live instance."""
        w = self.world
        readers = [(i, r) for i in w.live() for r in i.readers if not r.handle.dead]
        if readers:
            inst, reader = w.rng.choice(readers)
            self._note("kill_reader", who=reader.who)
            inst.kill_reader(reader)

    async def kill_coordinator(self) -> None:
        """Kill a Coordinator (its readers die with it: Ray fate-shares owned actors); restart it."""
        w = self.world
        if w.live():
            inst = w.rng.choice(w.live())
            self._note("kill_coordinator", owner=inst.owner)
            w.crash(inst)
            w.spawn(w.restart_later(inst.owner, w.rng.uniform(0.5, 3.0)))

    async def crash_instance(self) -> None:
        """Crash an instance; it comes back later (same owner id, or a new one)."""
        w = self.world
        if w.live():
            inst = w.rng.choice(w.live())
            owner = inst.owner if w.rng.random() < 0.5 else w.new_owner()
            self._note("crash_instance", owner=inst.owner, back_as=owner)
            w.crash(inst)
            w.spawn(w.restart_later(owner, w.rng.uniform(2.0, 20.0)))

    async def close_instance(self) -> None:
        """Close an instance gracefully (releasing); it comes back later."""
        w = self.world
        if len(w.live()) > 1:
            inst = w.rng.choice(w.live())
            self._note("close_instance", owner=inst.owner)
            w.spawn(w.close_and_return(inst, w.rng.uniform(1.0, 15.0)))

    async def add_instance(self) -> None:
        """A new instance joins (at most 4 live)."""
        w = self.world
        if len(w.live()) < 4:
            owner = w.new_owner()
            self._note("add_instance", owner=owner)
            w.spawn(w.start_instance(owner))

    async def table_slow(self) -> None:
        """The table answers one instance slowly for a while."""
        w = self.world
        inst, latency = w.rng.choice(w.owners()), w.rng.choice((0.5, 2.0, 5.0))
        self.slow[inst] = (latency, w.now() + w.rng.uniform(2.0, 20.0))
        self._note("table_slow", owner=inst, latency=latency)

    async def table_failing(self) -> None:
        """The table fails a share of calls (some after their write landed) for a while."""
        w = self.world
        self.table_fail_before, self.table_fail_after = w.rng.choice((0.05, 0.2)), w.rng.choice((0.0, 0.05))
        self._note("table_failing", before=self.table_fail_before, after=self.table_fail_after)
        await w.sleep(w.rng.uniform(2.0, 10.0))
        self.table_fail_before = self.table_fail_after = 0.0

    async def partition(self) -> None:
        """One instance cannot reach the table for a while (up to two lease durations)."""
        w = self.world
        inst = w.rng.choice(w.owners())
        self.cut[inst] = max(self.cut.get(inst, 0.0), w.now() + w.rng.uniform(1.0, 2 * w.cfg.lease_s))
        self._note("partition", owner=inst, until=round(self.cut[inst] - w.history.t0, 3))

    async def throttle(self) -> None:
        """``GetRecords`` on one shard is throttled (and iterators expire) for a while."""
        w = self.world
        shard = w.rng.choice(sorted(w.kinesis.shards))
        w.kinesis.throttle[shard] = w.rng.choice((0.3, 0.8))
        w.kinesis.expire_chance = w.rng.choice((0.0, 0.05))
        self._note("throttle", shard=shard, chance=w.kinesis.throttle[shard])
        await w.sleep(w.rng.uniform(2.0, 15.0))
        w.kinesis.throttle.pop(shard, None)
        w.kinesis.expire_chance = 0.0

    async def stall(self) -> None:
        """Kinesis calls on one shard hang for a while."""
        w = self.world
        shard = w.rng.choice(sorted(w.kinesis.shards))
        self.stalls[shard] = min(w.now() + w.rng.uniform(1.0, 15.0), w.fault_end)  # over when the faults stop
        self._note("stall", shard=shard)

    async def hang(self) -> None:
        """The next Kinesis call of one reader process on one of its shards hangs (a connection that
        never answers), until the client's read timeout fails it; or one of the process's pool
        threads gets stuck for good in a batch's preparation (no timeout applies; only with
        ``SIM_STUCK=1``: the library does not yet recover from it, see docs/simulation.md)."""
        w = self.world
        held = [(r.who, sid) for i in w.live() for r in i.readers if not r.handle.dead
                for sid in r.handle.core.shard_ids()]
        if held:
            who, shard = w.rng.choice(held)
            if os.environ.get("SIM_STUCK") == "1" and w.rng.random() < 0.3:
                self.stuck.add(who)
                self._note("stuck", who=who)
                return
            self.hangs[(who, shard)] = w.rng.choice((3 * w.cfg.lease_s, 1e9))
            self._note("hang", who=who, shard=shard, for_s=self.hangs[(who, shard)])

    async def reshard(self) -> None:
        """Split an open shard, or merge two (at most 8 shards in all)."""
        w = self.world
        open_ = w.kinesis.open_shards()
        if len(w.kinesis.shards) >= 8 or not open_:
            return
        if len(open_) >= 2 and w.rng.random() < 0.4:
            closed = w.rng.sample(open_, 2)
            self._note("merge", shards=tuple(closed), child=w.kinesis.merge(*closed))
        else:
            closed = [w.rng.choice(open_)]
            self._note("split", shard=closed[0], children=w.kinesis.split(closed[0]))
        for sid in closed if self.poisoning else ():
            self._poison_end(sid)

    def _poison_end(self, shard_id: str) -> None:
        """The last record of closed shard ``shard_id`` becomes poison: every plain sink refuses a
        batch holding it (``SinkError``) until the faults stop, so a sink that gives up
        (``max_sink_retries``) gives up on the shard's last batch, the one before its end."""
        records = self.world.kinesis.shards[shard_id].records
        if records:
            self.poison.add(int(records[-1]["SequenceNumber"]))
            self._note("poison", shard=shard_id, seq=int(records[-1]["SequenceNumber"]))

    async def seek(self) -> None:
        """Seek one held shard back to ``TRIM_HORIZON`` (records are redelivered, none skipped)."""
        w = self.world
        live = w.live()
        if live:
            inst = w.rng.choice(live)
            held = inst.core.held()
            if held:
                shard = w.rng.choice(held)
                self._note("seek", owner=inst.owner, shard=shard)
                w.spawn(inst.seek(shard))
