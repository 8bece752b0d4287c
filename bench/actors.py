"""Sink actors of the benchmarks (push mode: ``process_batch(records)``)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import ray
from ray import cloudpickle

# Workers may not have bench/ on their path: ship these classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
class CountingSink:
    """Counts records and bytes; logs (arrival time, records) per batch. Does nothing else
    (with a :class:`~kinesis_actors.batch.RecordBatch` it builds no Record)."""

    def __init__(self) -> None:
        self.n = 0
        self.bytes = 0
        self.log: list[tuple[float, int]] = []

    def process_batch(self, records: list[Any]) -> None:
        now = time.time()
        self.n += len(records)
        # a compact RecordBatch knows its payload bytes without building Records
        counted = getattr(records, "payload_bytes", None)
        self.bytes += counted if isinstance(counted, int) else sum(len(r.data) for r in records)
        self.log.append((now, len(records)))

    def count(self) -> int:
        return self.n

    def summary(self) -> dict[str, Any]:
        return {"n": self.n, "bytes": self.bytes, "log": list(self.log)}

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class TimedSink:
    """Records publish -> delivery latency of payloads ``T<epoch seconds>|...`` and, per
    batch, (arrival time, shard id, records, latest publish stamp in it or 0)."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.batches: list[tuple[float, str, int, float]] = []
        self.n = 0

    def process_batch(self, records: list[Any]) -> None:
        now = time.time()
        self.n += len(records)
        newest = 0.0
        for r in records:
            data = r.data
            if data[:1] == b"T":
                try:
                    stamp = float(data[1:data.index(b"|")])
                except ValueError:
                    continue
                self.latencies.append(now - stamp)
                newest = max(newest, stamp)
        self.batches.append((now, records[0].shard_id, len(records), newest))

    def count(self) -> int:
        return self.n

    def latencies_since(self, t0: float) -> list[float]:
        return list(self.latencies)

    def first_after(self, t0: float, shards: list[str]) -> float | None:
        """Arrival time of the first batch after ``t0`` from one of ``shards``, or None."""
        times = [t for t, sid, *_ in self.batches if t > t0 and sid in shards]
        return min(times) if times else None

    def first_fresh_after(self, t0: float, shards: list[str]) -> dict[str, float]:
        """shard id -> arrival time of its first batch holding a record published after
        ``t0`` (so fetched after ``t0``: a reader killed at ``t0`` never saw it)."""
        out: dict[str, float] = {}
        for t, sid, _, newest in self.batches:
            if newest > t0 and sid in shards and (sid not in out or t < out[sid]):
                out[sid] = t
        return out

    def shards_since(self, t0: float) -> list[str]:
        return sorted({sid for t, sid, *_ in self.batches if t > t0})

    def reset(self) -> None:
        self.latencies.clear()
        self.batches.clear()


@ray.remote(num_cpus=0)
class Idle:
    """An actor that does nothing: the USS anchor of a Ray worker."""

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class DistinctSink:
    """Counts distinct records (shard id, sequence number) per shard against what each
    shard holds; notes when the last shard got its last record (arrival time)."""

    def __init__(self, per_shard: int, shards: int) -> None:
        self.per_shard, self.shards = per_shard, shards
        self.seen: set[tuple[str, str]] = set()
        self.per: dict[str, int] = {}
        self.deliveries = 0
        self.complete = 0
        self.t_first: float | None = None
        self.t_all: float | None = None

    def process_batch(self, records: list[Any]) -> None:
        now = time.time()
        if self.t_first is None:
            self.t_first = now
        self.deliveries += len(records)
        for r in records:
            key = (r.shard_id, r.sequence_number)
            if key in self.seen:
                continue
            self.seen.add(key)
            n = self.per[r.shard_id] = self.per.get(r.shard_id, 0) + 1
            if n == self.per_shard:
                self.complete += 1
        if self.t_all is None and self.complete >= self.shards:
            self.t_all = now

    def progress(self) -> dict[str, Any]:
        return {"distinct": len(self.seen), "deliveries": self.deliveries, "shards_complete": self.complete,
                "shards_seen": len(self.per), "t_first": self.t_first, "t_all": self.t_all}


@ray.remote(num_cpus=0)
class LogSink:
    """Logs (arrival epoch s, shard id, sequence number) of every record delivered to it."""

    def __init__(self) -> None:
        self.log: list[tuple[float, str, str]] = []

    def process_batch(self, records: list[Any]) -> None:
        now = time.time()
        self.log.extend((now, r.shard_id, r.sequence_number) for r in records)

    def since(self, i: int) -> list[tuple[float, str, str]]:
        return self.log[i:]
