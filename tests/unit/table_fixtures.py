"""Real tables for the table-sink tests: pyiceberg's SQL catalog on SQLite with a local file
warehouse, and deltalake on the local filesystem; records and a fault-injecting backend."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kinesis_actors.records import Record
from kinesis_actors.sinks.tables.backend import CommitConflict, CommitRecord, TableBackend
from kinesis_actors.sinks.tables.delta import DeltaBackend
from kinesis_actors.sinks.tables.iceberg import IcebergBackend
from kinesis_actors.sinks.tables.positions import ShardKey, decode_positions
from kinesis_actors.sinks.tables.sink import to_rows

STREAM = "orders"
T0 = dt.datetime(2026, 12, 6, tzinfo=dt.timezone.utc)


def iceberg_catalog(tmp: Path) -> dict[str, str]:
    """SQL catalog properties on SQLite with a local file warehouse under ``tmp``."""
    (tmp / "warehouse").mkdir(exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db", "warehouse": f"file://{tmp}/warehouse"}


def make_backend(kind: str, tmp: Path) -> TableBackend:
    """A fresh backend of ``kind`` ("iceberg" or "delta") over a table that does not exist yet."""
    if kind == "iceberg":
        return IcebergBackend("ka.events", iceberg_catalog(tmp))
    return DeltaBackend(str(tmp / "delta-events"))


def records(shard: str, first: int, n: int, *, stream: str = STREAM) -> list[Record]:
    """``n`` records of ``shard`` with sequence numbers ``first``.. (long decimal strings, as Kinesis's), payload = its number."""
    return [Record(f'{{"n": {i}, "shard": "{shard}"}}'.encode(), f"k{i % 7}", seq(i), None,
                   T0 + dt.timedelta(seconds=i), shard, stream) for i in range(first, first + n)]


def seq(i: int) -> str:
    """The sequence number of record ``i`` (50 digits)."""
    return str(49_590_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000 + i)


def rows_of(batch: list[Record], transform: Callable[[Any], Any] | None = None) -> tuple[Any, tuple[str, None]]:
    """(rows, last point) of a batch, as a reader makes them."""
    return to_rows(batch, transform), (batch[-1].sequence_number, batch[-1].sub_sequence_number)


def scan(backend: TableBackend) -> Any:
    """Every row of the table, as a pyarrow Table (None: no table)."""
    state = backend.load()
    if state is None:
        return None
    if isinstance(backend, IcebergBackend):
        return state.scan().to_arrow()
    return state.to_pyarrow_table()


def commit_positions(backend: TableBackend) -> list[dict[ShardKey, Any]]:
    """The positions recorded by each commit, newest first (commits without any skipped)."""
    state = backend.load()
    out = []
    for record in backend.commits(state):
        positions = decode_positions(record.properties)
        if positions:
            out.append(positions)
    return out


async def until(cond: Callable[[], Any], *, within_s: float = 30.0, what: str = "the condition") -> None:
    """Poll ``cond()`` on the event loop (real time: the committers commit in threads).

    Raises:
        AssertionError: ``within_s`` seconds passed first (naming ``what``).
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while not cond():
        assert loop.time() < end, f"not within {within_s} s: {what}"
        await asyncio.sleep(0.01)


class FaultyBackend:
    """Wraps a backend: ``fail_commits`` failures of ``commit`` (an OSError, before it reaches the
    table), ``land_then_fail`` commits that land and then raise (outcome unknown to the caller),
    and ``before_commit`` run once before the next commit (to land a concurrent commit)."""

    def __init__(self, inner: TableBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.fail_commits = 0
        self.land_then_fail = 0
        self.before_commit: Callable[[], None] | None = None
        self.calls = 0
        self.lock = threading.Lock()

    def load(self) -> Any:
        return self.inner.load()

    def head(self, state: Any) -> Any:
        return self.inner.head(state)

    def commits(self, state: Any, stop_at: Any = None) -> Iterator[CommitRecord]:
        return self.inner.commits(state, stop_at)

    def create(self, schema: Any) -> None:
        self.inner.create(schema)

    def commit(self, state: Any, rows: Any, properties: Mapping[str, str], counters: Mapping[ShardKey, int]) -> None:
        with self.lock:
            self.calls += 1
            hook, self.before_commit = self.before_commit, None
            if self.fail_commits > 0:
                self.fail_commits -= 1
                raise OSError("catalog unreachable (injected)")
        if hook is not None:
            hook()
        self.inner.commit(state, rows, properties, counters)
        with self.lock:
            if self.land_then_fail > 0:
                self.land_then_fail -= 1
                raise TimeoutError("the commit's answer was lost (injected)")


__all__ = ["STREAM", "iceberg_catalog", "make_backend", "records", "seq", "rows_of", "scan", "commit_positions",
           "FaultyBackend", "CommitConflict"]
