"""The table-sink model: the REAL table committer over a simulated table with compare-and-swap commits.

What runs real: :class:`~kinesis_actors.sinks.tables.committer.TableCommitter` (its rounds,
retries, staging bounds), :class:`~kinesis_actors.sinks.tables.rounds.RoundRunner` (the walk of
the table's history, the fence rule, finding an attempt whose outcome was unknown),
:mod:`~kinesis_actors.sinks.tables.positions`, :class:`~kinesis_actors.sinks.tables.link.ShardTableLink`
(the read loop's hook: fence at open, resume after the table's position, checkpoint only what
is committed) and :class:`~kinesis_actors.sinks.tables.handle.TableSink`'s readers' calls
(rows made with ``to_rows``, i.e. ``records_to_table``).

What is modelled:

* the table (:class:`SimTable`): an in-memory list of commits, each with its rows' (shard,
  sequence number) pairs and its properties (positions, lease counters, commit id). A commit
  lands only if the version it was built on is still the head (Iceberg's optimistic commit on
  a SQL catalog), else :class:`~kinesis_actors.sinks.tables.backend.CommitConflict`;
* the catalog's answers (:class:`SimTableBackend`): each attempt takes a seeded latency, and
  the state it reads is the head as it was up to that latency earlier (the time between the
  load and the commit of a real attempt, during which another committer may commit); a
  commit may fail unlanded, or land and answer an error (a lost answer);
* the committer's Ray actor (:class:`SimCommitter`): each call runs as a task of the
  instance's process (a Ray call outlives the reader that made it; it dies with its
  instance), behind ``asyncio.shield`` so that a reader's cancellation does not cancel it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from kinesis_actors.sinks.tables.backend import CommitConflict, CommitRecord
from kinesis_actors.sinks.tables.committer import TableCommitter
from kinesis_actors.sinks.tables.handle import TableSink
from kinesis_actors.sinks.tables.positions import ShardKey, TablePosition, decode_positions

__all__ = ["TableMix", "SimTable", "SimTableBackend", "SimCommitter", "SimTableSink", "chosen"]

TABLE_SHARE = 4
"""One seed in this many runs a table sink (chosen by the seed, without drawing from the run's generator)."""

TABLE_SALT = 0x7AB1E
"""Mixed into the seed to choose the table seeds (see :func:`chosen`), so that the choice does not
follow the run's own first draws: an arbitrary constant (hex for "table"), not tuned to any seed."""

TABLE_CONTROLS = {"parallelization_factor": 1, "bisect_on_error": False, "max_record_age_s": None}
"""The delivery controls of a table seed: those ``check_table_sink`` refuses (lanes, bisect,
dead letters) are off; the rest stay as the seed drew them."""


def chosen(seed: int) -> bool:
    """True when seed ``seed`` runs a table sink instead of the plain sinks."""
    import random

    return random.Random(seed ^ TABLE_SALT).randrange(TABLE_SHARE) == 0


class TableMix:
    """How a run's table behaves: latency of an attempt (seconds), chances per commit."""

    def __init__(self, rng: Any) -> None:
        self.latency_s = rng.choice((0.01, 0.1, 0.5))
        self.slow = rng.choice((0.0, 0.02, 0.1))  # a commit that takes slow_s instead
        self.slow_s = rng.choice((3.0, 8.0))
        self.fail = rng.choice((0.0, 0.05, 0.2))
        self.lost_answer = rng.choice((0.0, 0.05, 0.2))
        self.commit_interval_s = rng.choice((0.5, 1.0, 3.0))

    def __repr__(self) -> str:
        return (f"TableMix(latency={self.latency_s}s, slow={self.slow}/{self.slow_s}s, fail={self.fail}, "
                f"lost_answer={self.lost_answer}, interval={self.commit_interval_s}s)")


@dataclasses.dataclass(frozen=True)
class Commit:
    """One landed commit: when, by whom, its rows (shard id, sequence number) and properties."""

    at: float
    who: str
    rows: tuple[tuple[str, int], ...]
    properties: Mapping[str, str]


class SimTable:
    """The one table every instance's committer writes (see the module docstring)."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.created_at: float | None = None
        self.commits: list[Commit] = []

    def version_at(self, t: float) -> int:
        """How many commits had landed by virtual time ``t``."""
        n = len(self.commits)
        while n and self.commits[n - 1].at > t:
            n -= 1
        return n


class SimTableBackend:
    """One committer's view of :class:`SimTable` (a :class:`~kinesis_actors.sinks.tables.backend.TableBackend`).

    A state is the number of commits it sees (its head is the last of them). Blocking calls
    take no virtual time: :meth:`run` (the committer's ``blocking``) waits the latency first.

    Args:
        world: the run's world. table: the table. who: the committer's name in the history.
        dead: True once the committer's process is gone (its instance crashed or closed).
    """

    name = "sim.events"

    def __init__(self, world: Any, table: SimTable, who: str, dead: Callable[[], bool]) -> None:
        self.world, self.table, self.who, self.dead = world, table, who, dead
        self._lag = 0.0
        self.never: asyncio.Future[Any] = world.loop.create_future()
        """What a dead process's calls wait for, forever (held here: a task waiting on an
        unreferenced future would be garbage-collected while pending)."""

    async def run(self, fn: Any, *args: Any) -> Any:
        """One attempt: the latency, then ``fn(*args)`` (its reads see the table up to the latency ago)."""
        w, mix = self.world, self.world.table_mix
        lag = mix.slow_s if w.chance(mix.slow) else mix.latency_s * (0.5 + w.rng.random())
        lag = min(lag, max(mix.latency_s, w.fault_end - w.now()))  # a slow catalog ends with the faults
        await w.sleep(lag)
        if self.dead():
            await asyncio.shield(self.never)  # a dead process calls nothing (never returns)
        self._lag = lag * w.rng.random()
        return fn(*args)

    def load(self) -> Any:
        """The head as it was up to the attempt's latency ago (None: no table yet)."""
        if self.table.created_at is None:
            return None
        return self.table.version_at(self.world.now() - self._lag)

    def head(self, state: Any) -> Any:
        """The version's last commit (its index), None before any."""
        return state - 1 if state else None

    def commits(self, state: Any, stop_at: Any = None) -> Iterator[CommitRecord]:
        """Commits of the version, newest first, down to ``stop_at`` (an index) excluded."""
        low = -1 if stop_at is None else stop_at
        for i in range(state - 1, low, -1):
            yield CommitRecord(i, self.table.commits[i].properties)

    def create(self, schema: Any) -> None:
        """Create the table (already there: nothing)."""
        if self.table.created_at is None:
            self.table.created_at = self.world.now()

    def commit(self, state: Any, rows: Any, properties: Mapping[str, str], counters: Mapping[ShardKey, int]) -> None:
        """Land a commit on ``state`` if it is still the head (see the module docstring for the faults).

        Raises:
            CommitConflict: another commit landed since ``state``. RuntimeError: a simulated
            failure (unlanded) or lost answer (landed).
        """
        w, mix = self.world, self.world.table_mix
        if w.chance(mix.fail):
            raise RuntimeError("simulated catalog failure (the commit did not land)")
        if state != len(self.table.commits):
            raise CommitConflict(f"head moved: {len(self.table.commits)} != {state}")
        pairs: tuple[tuple[str, int], ...] = ()
        if rows is not None:
            data = rows.to_pydict()
            pairs = tuple(zip(data["shard_id"], (int(s) for s in data["sequence_number"])))
        self.table.commits.append(Commit(w.now(), self.who, pairs, dict(properties)))
        positions = {k.shard_id: (p.lease_counter, p.sequence_number)
                     for k, p in decode_positions(properties).items()}
        w.history.add("tcommit", who=self.who, version=len(self.table.commits), positions=positions,
                      rows=len(pairs))
        if w.chance(mix.lost_answer):
            raise RuntimeError("simulated lost answer (the commit landed)")


class SimCommitter:
    """The committer actor of one instance incarnation: the real :class:`TableCommitter`, each
    call a task of the instance's process (the shape of ``TableCommitterActor``'s methods)."""

    def __init__(self, world: Any, table: SimTable, owner: str, tag: str, dead: Callable[[], bool]) -> None:
        self.world, self.owner, self.dead = world, owner, dead
        self.backend = SimTableBackend(world, table, f"{tag}/committer", dead)
        self.core = TableCommitter(self.backend, commit_interval_s=world.table_mix.commit_interval_s,  # type: ignore[arg-type]
                                   clock=world.now, sleep=world.sleep, rng=world.rng.random,
                                   blocking=self.backend.run, max_staged_bytes=1 << 20, stage_timeout_s=30.0)
        for name in ("open_shard", "stage", "flush_shard", "release_shard"):
            setattr(self, name, _Remote(self, getattr(self, "_" + name)))

    async def _open_shard(self, key: ShardKey, counter: int, timeout_s: float) -> TablePosition | None:
        return await self.core.open_shard(key, counter, timeout_s=timeout_s)

    async def _stage(self, key: ShardKey, counter: int, rows: Any, last: Any) -> TablePosition | None:
        return await self.core.stage(key, counter, rows, last)

    async def _flush_shard(self, key: ShardKey, counter: int, timeout_s: float) -> TablePosition | None:
        return await self.core.flush_shard(key, counter, timeout_s=timeout_s)

    async def _release_shard(self, key: ShardKey, counter: int) -> int:
        return self.core.release_shard(key, counter)


class _Remote:
    """``method.remote(*args)``: the call as a task of the committer's process, shielded from the caller."""

    def __init__(self, committer: SimCommitter, fn: Any) -> None:
        self.committer, self.fn = committer, fn

    def remote(self, *args: Any) -> Any:
        c = self.committer
        if c.dead():
            return asyncio.shield(c.backend.never)  # a dead actor answers nothing
        return asyncio.shield(c.world.spawn(self.fn(*args), proc=c.owner))


class SimTableSink(TableSink):
    """A reader process's handle on its instance's committer (the real :class:`TableSink` calls),
    recording each staging in the history as the plain sinks record a delivery (``deliver``,
    then ``ack``: staging is the acknowledgement, or ``nack``). ``process``: the reader
    process's plain sink, whose ``dead`` says the process was killed."""

    def __init__(self, world: Any, committer: SimCommitter, who: str, process: Any) -> None:
        super().__init__(commit_interval_s=world.table_mix.commit_interval_s, transform=None, create_if_missing=True)
        self.world, self.who, self.process = world, who, process
        self._actor = committer
        self.stream = "sim"

    def _committer(self) -> Any:
        """The committer, as this reader process reaches it (a killed process reaches nothing:
        its ``finally`` blocks end here, as the plain sink's do)."""
        if self.process.dead:
            raise asyncio.CancelledError(f"{self.who} is dead")
        return super()._committer()

    async def stage(self, records: Sequence[Any], lease_counter: int) -> TablePosition | None:
        """See :meth:`TableSink.stage`; recorded in the history."""
        if not records:
            return None
        h, shard = self.world.history, records[0].shard_id
        seqs = [int(r.sequence_number) for r in records]
        h.add("deliver", who=self.who, shard=shard, seqs=seqs, keys=[r.partition_key for r in records])
        try:
            position = await super().stage(records, lease_counter)
        except asyncio.CancelledError:
            h.add("nack", who=self.who, shard=shard, seqs=[], cancelled=True)
            raise
        except Exception:
            h.add("nack", who=self.who, shard=shard, seqs=seqs[:1])
            raise
        h.add("ack", who=self.who, shard=shard, seqs=seqs)
        return position
