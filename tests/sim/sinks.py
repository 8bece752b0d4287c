"""Simulated downstreams: each reader process's ``deliver`` and the dead-letter publisher.

A call of ``deliver(records)`` waits a latency, then (as the seeded source decides) acknowledges
the batch, fails it (``SinkError``; always while it holds a poison record, see
:meth:`~.faults.Faults.reshard`), acknowledges a prefix (``PartialBatchError``) or stalls a
long while first. Every call and its outcome go into the history (``deliver``, ``ack``), which
is how the checker knows what the downstream acknowledged and when. A dead process's
``deliver`` never returns (its task is cancelled by the kill).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from kinesis_actors.errors import PartialBatchError, SinkError
from kinesis_actors.records import Record

__all__ = ["SimSink", "SimDeadLetters", "SinkMix"]


class SinkMix:
    """How a run's sink behaves: chances per call (the rest acknowledge) and latencies, seconds."""

    def __init__(self, rng: Any) -> None:
        self.fail = rng.choice((0.0, 0.0, 0.05, 0.15))
        self.partial = rng.choice((0.0, 0.05, 0.15))
        self.stall = rng.choice((0.0, 0.0, 0.01, 0.03))
        self.stall_s = rng.choice((3.0, 8.0, 15.0))
        self.latency_s = rng.choice((0.001, 0.02, 0.1))

    def __repr__(self) -> str:
        return (f"SinkMix(fail={self.fail}, partial={self.partial}, stall={self.stall}/{self.stall_s}s, "
                f"latency={self.latency_s}s)")


class SimSink:
    """The downstream of one reader process ``who`` (see the module docstring).

    Args:
        world: the :class:`~.world.World` (random source, sleep, history).
        who: the reader process's name. instance: its instance (dead instances deliver nothing).
    """

    def __init__(self, world: Any, who: str, instance: str) -> None:
        self.world, self.who, self.instance = world, who, instance
        self.dead = False

    async def __call__(self, records: Sequence[Record]) -> None:
        w = self.world
        if self.dead:
            raise asyncio.CancelledError(f"{self.who} is dead")
        if not records:
            return None
        shard = records[0].shard_id
        seqs = [int(r.sequence_number) for r in records]
        w.history.add("deliver", who=self.who, shard=shard, seqs=seqs, keys=[r.partition_key for r in records])
        try:
            await self._answer(records, shard, seqs)
        except asyncio.CancelledError:  # the reader gave the call up (a seek, a lost lease, a kill)
            w.history.add("nack", who=self.who, shard=shard, seqs=[], cancelled=True)
            raise

    async def _answer(self, records: Sequence[Record], shard: str, seqs: list[int]) -> None:
        w, mix = self.world, self.world.sink_mix
        if w.chance(mix.stall):
            await w.sleep(min(mix.stall_s, max(0.0, w.fault_end - w.now())))  # a stall ends with the faults
        await w.sleep(mix.latency_s * (0.5 + w.rng.random()))
        if self.dead:
            await asyncio.get_running_loop().create_future()  # a dead process answers nothing
        roll = w.rng.random()
        if roll < mix.fail or not w.faults.poison.isdisjoint(seqs):
            w.history.add("nack", who=self.who, shard=shard, seqs=seqs[:1])
            raise SinkError("simulated sink failure", retriable=True)
        if roll < mix.fail + mix.partial and len(records) > 1:
            cut = w.rng.randrange(0, len(records))
            w.history.add("ack", who=self.who, shard=shard, seqs=seqs[:cut], partial=True)
            raise PartialBatchError("simulated partial acknowledgement", failed_from=cut)
        w.history.add("ack", who=self.who, shard=shard, seqs=seqs)


class SimDeadLetters:
    """The dead-letter publisher (``put_many``): each letter's record counts as handled."""

    def __init__(self, world: Any) -> None:
        self.world = world

    def put_many(self, items: list[tuple[bytes, str]]) -> None:
        """Record each dead letter (``dead`` event: shard, sequence number, reason)."""
        for data, _ in items:
            doc = json.loads(data)
            self.world.history.add("dead", shard=doc["shard_id"], seqs=[int(doc["sequence_number"])],
                                   reason=doc["reason"])
