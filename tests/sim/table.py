"""The simulated lease table and the I/O seams through which each simulated process reaches it.

:class:`SimRows` is a :class:`~kinesis_actors.leases.rows.LocalRows` (DynamoDB's conditional-write
semantics: each primitive atomic, ``update`` applied only when owner and counter match) that
records every accepted write in the history, with the simulated process that made it.

:class:`SimIo` is one simulated process's I/O: the reader's ``io`` seam (``kinesis``, ``store``,
``stream``) and the Coordinator's ``io`` callable. Each call runs inline on the virtual loop
(no thread); lease-table calls wait half their latency before and half after the primitive (a
write that lands while its caller dies), and fail (before: nothing written; after: written, the
response lost) or are refused while the process's instance is partitioned from the table, as
the faults decide; a reader's checkpoint write may first wait out a pause of its process
(:meth:`~.faults.Faults.take_pause`). Kinesis calls wait their latency (longer while a stall lasts).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kinesis_actors.errors import LeaseStoreError
from kinesis_actors.leases.rows import CHECKPOINT, COUNTER, NEXT_OWNER, OWNER, START_POSITION, LocalRows, Row, is_shard_row
from kinesis_actors.reader.spec import kinesis_call_timeout_s

__all__ = ["SimRows", "SimIo"]


class SimRows(LocalRows):
    """A lease table in this process that records each accepted shard-row write.

    Args:
        record: ``record(kind, **fields)`` (the history's ``add``).
    """

    def __init__(self, record: Callable[..., None]) -> None:
        super().__init__()
        self._record = record
        self.writer = "?"  # the simulated process whose call runs now (set by SimIo)
        self.race: Callable[[str, Row], None] | None = None  # see World.race
        self.op = ""  # the lease-store call running now (set by SimIo)

    def read(self, key: str) -> Row | None:
        """See ``LocalRows.read``; during a take, the holder's renewal may land just after it."""
        row = super().read(key)
        if self.op == "take" and row is not None and self.race is not None:
            self.op = ""  # once per take: between its judging read and its conditional write
            self.race(key, row)
        return row

    def late_renewal(self, key: str, row: Row, who: str) -> None:
        """The holder's renewal of ``row`` lands now (counter +1), written by ``who``."""
        writer, self.writer = self.writer, who
        try:
            LocalRows.update(self, key, row.get(OWNER), int(row[COUNTER]), {COUNTER: int(row[COUNTER]) + 1})
            after = self.read(key)
            if after is not None:
                self._write(row, after, late=True)
        finally:
            self.writer = writer

    def put_new(self, row: Mapping[str, Any]) -> bool:
        """See ``LocalRows.put_new``; a created shard row is recorded."""
        done = super().put_new(row)
        if done and is_shard_row(row):
            self._write(None, dict(row))
        return done

    def update(self, key: str, expect_owner: str | None, expect_counter: int, set_fields: Mapping[str, Any],
               remove_fields: Iterable[str] = (), check_owner: bool = True) -> Row | None:
        """See ``LocalRows.update``; an accepted change of a shard row is recorded."""
        before = self.read(key)
        new = super().update(key, expect_owner, expect_counter, set_fields, remove_fields, check_owner)
        if new is not None and before is not None and is_shard_row(new):
            self._write(before, new, expect_owner=expect_owner, expect_counter=expect_counter,
                        check_owner=check_owner)
        return new

    def _write(self, before: Row | None, after: Row, **how: Any) -> None:
        b = before or {}
        self._record("write", who=self.writer, shard=after.get("shard_id"), owner=after.get(OWNER),
                     counter=after.get(COUNTER), checkpoint=after.get(CHECKPOINT), next=after.get(NEXT_OWNER),
                     was_owner=b.get(OWNER), was_counter=b.get(COUNTER), was_checkpoint=b.get(CHECKPOINT),
                     was_next=b.get(NEXT_OWNER), start=after.get(START_POSITION), **how)


class SimIo:
    """The I/O of one simulated process (a reader or a Coordinator) of instance ``instance``.

    Args:
        world: the :class:`~.world.World` (its faults, rows and random source).
        instance: the instance (owner id) this process belongs to.
        who: this process's name in the history (``"a/r1"``, ``"a/coord"``).
    """

    def __init__(self, world: Any, instance: str, who: str) -> None:
        self.world, self.instance, self.who = world, instance, who
        self.dead = False  # a killed process: every later call of it ends its task (nothing reaches the world)

    def _alive(self) -> None:
        if self.dead:
            raise asyncio.CancelledError(f"{self.who} is dead")

    async def _table(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        self._alive()
        w = self.world
        latency = w.faults.table_latency_s(self.instance)
        pause = w.faults.take_pause(self.who, fn)
        if pause:  # the process stops as the call leaves (see Faults.take_pause)
            w.history.add("paused", who=self.who, for_s=round(pause, 3))
            await w.sleep(pause)
            self._alive()
        await w.sleep(latency / 2)
        if w.faults.partitioned(self.instance) or w.chance(w.faults.table_fail_before):
            raise LeaseStoreError(f"simulated: table unreachable from {self.instance}", retriable=True)
        self._alive()
        w.rows.writer, w.rows.op = self.who, getattr(fn, "__name__", "")
        try:
            result = fn(*args, **kwargs)
        finally:
            w.rows.writer, w.rows.op = "?", ""
        await w.sleep(latency / 2)
        if w.chance(w.faults.table_fail_after):
            raise LeaseStoreError("simulated: the table's response was lost", retriable=True)
        return result

    async def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The Coordinator's ``io``: lease-store calls as :meth:`store`, the rest (``ListShards``) inline."""
        if getattr(getattr(fn, "__self__", None), "rows", None) is not None:
            return await self._table(fn, args, kwargs)
        self._alive()
        await self.world.sleep(0.005)
        self._alive()
        return fn(*args, **kwargs)

    async def store(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A lease-store call (see the module docstring)."""
        return await self._table(fn, args, {})

    async def kinesis(self, fn: Callable[..., Any], *args: Any, limited: bool = True, shard: str | None = None) -> Any:
        """A Kinesis call: waits its latency (until a stall of ``shard`` ends; a call of this process
        on a hung connection waits until the client's read timeout fails it), then runs."""
        self._alive()
        if shard is None and self.who in self.world.faults.stuck and getattr(fn, "__name__", "") != "put_many":
            # a pool thread stuck for good in a batch's preparation (no timeout applies; a dead-letter
            # publish is an AWS call that ends within the publisher's timeouts and attempts)
            self.world.faults.stuck.discard(self.who)
            self.world.history.add("stuck", who=self.who)
            await asyncio.get_running_loop().create_future()
        hang = self.world.faults.hangs.pop((self.who, shard), None)
        if hang is not None:  # the client's read timeout ends the wait (botocore's ReadTimeoutError)
            timeout = kinesis_call_timeout_s(self.world.cfg.lease_s)
            self.world.history.add("hung", who=self.who, shard=shard)
            await self.world.sleep(min(hang, timeout))
            if hang > timeout and shard is not None:
                self.world.kinesis.timeouts.add(shard)  # the call inside fails, as botocore's would
        await self.world.sleep(self.world.faults.kinesis_delay_s(shard))
        self._alive()
        return fn(*args)

    async def stream(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking call of a stream (enhanced fan-out: not simulated), inline."""
        return fn(*args)

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        """No call limit in the simulation."""
