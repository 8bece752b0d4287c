"""The duplicates figure of the ``tables`` section: what an IcebergSink's table holds after 5
reader SIGKILLs and 1 instance takeover, against a plain push sink under the same faults in
the same run.

For each sink in turn (``iceberg``, then ``plain``: an actor that notes every record it
acknowledges), on a fresh 4-shard stream with its own lease table, while a thread publishes
numbered records (``b"<n>"``, ~200 records/s):

1. the victim instance runs in a child process (``bench._instance``: its own Ray job in our
   cluster) and holds every shard;
2. ``kills`` times, once the 40 records published after the previous kill are held, one of its
   ShardReader processes (``ray::ShardReader`` among this process's descendants: only the
   victim reads then) is SIGKILLed;
3. the survivor subscribes here on the same lease table (another IcebergSink on the same
   table, or the same plain sink), the victim's driver is SIGKILLed (Ray kills its job's
   actors), and the survivor takes every shard once the leases expire;
4. publishing stops; once every record is in (or ``timeout_s``), the figures: records
   published, distinct records held, duplicates (rows or deliveries beyond the first of a
   record) and lost records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from ._instance import await_ready, spawn
from .common import create_stream, ray_processes, wait_for

TIMINGS = {"lease_duration_s": 4.0, "renew_interval_s": 1.0, "lease_poll_interval_s": 1.0}


@ray.remote(num_cpus=0)
class NumberSink:
    """A plain push sink: the number of every record it acknowledges, repeats included."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def process_batch(self, records: list[Any]) -> None:
        self.seen.extend(int(r.data) for r in records)

    def numbers(self) -> list[int]:
        return self.seen


class _Numbers:
    """Puts ``per_tick`` numbered records every ``tick_s`` from a thread; keeps what was accepted."""

    def __init__(self, conn: Any, stream: str, per_tick: int = 20, tick_s: float = 0.1) -> None:
        self.pub, self.per_tick, self.tick_s = conn.publisher(stream), per_tick, tick_s
        self.sent: list[int] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop_event.wait(self.tick_s):
            batch = list(range(n, n + self.per_tick))
            self.pub.put_many([(str(i).encode(), str(i)) for i in batch])  # retries failed entries itself
            self.sent.extend(batch)
            n += self.per_tick

    def stop(self) -> set[int]:
        self.stop_event.set()
        self.thread.join(timeout=30)
        return set(self.sent)


def _reader_pids() -> list[int]:
    return sorted(p.pid for p in ray_processes("ray::ShardReader"))


def _victim(endpoint: str, table: str, stream: str, sink_args: list[str]) -> subprocess.Popen[str]:
    child = spawn(ray.get_runtime_context().gcs_address, endpoint, table, stream, "victim", 4, TIMINGS,
                  ["--trim-horizon", *sink_args])
    await_ready(child)
    return child


def _one(ctx: Any, kind: str, tmp: Path, kills: int, timeout_s: float) -> dict[str, Any]:
    """One sink through the faults; its figures (see the module docstring)."""
    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt

    stream, table = f"bench-tf-{kind}-{uuid.uuid4().hex[:6]}", f"bench-tf-{uuid.uuid4().hex[:8]}"
    create_stream(ctx.endpoint, stream, 4)
    sink, plain, sink_args = _sinks(kind, tmp)
    broker = KinesisBroker(endpoint=ctx.endpoint, region="us-east-1", test_credentials=True, owner_id="survivor",
                           lease_store=DynamoLeaseStore(table, create_if_missing=True),
                           lease_duration_s=TIMINGS["lease_duration_s"], renew_interval_s=TIMINGS["renew_interval_s"])
    conn = broker.connect()
    numbers = _Numbers(conn, stream)
    child = _victim(ctx.endpoint, table, stream, sink_args)
    ctx.children.append(child)
    held = (lambda: _table_numbers(sink)) if plain is None else (lambda: ray.get(plain.numbers.remote()))
    sub = None
    try:
        for i in range(kills):
            wait_for(_caught_up(numbers, held), timeout_s, interval_s=0.2)
            pids = wait_for(_reader_pids, 60, interval_s=0.2)
            if not pids:
                raise TimeoutError("no ShardReader process of the victim to kill")
            os.kill(pids[i % len(pids)], signal.SIGKILL)
            ctx.log(f"  {kind}: reader SIGKILL {i + 1} (pid {pids[i % len(pids)]})")
        sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(),
                                           lease_poll_interval_s=TIMINGS["lease_poll_interval_s"]), sink=sink)
        t_kill = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if not wait_for(lambda: len(sub.leases()) == 4, timeout_s, interval_s=0.2):
            raise TimeoutError(f"the survivor holds {len(sub.leases())} of 4 shards after {timeout_s} s")
        takeover_s = time.monotonic() - t_kill
        ctx.log(f"  {kind}: the survivor holds every shard {takeover_s:.1f} s after the victim's SIGKILL")
        time.sleep(2.0)  # records keep coming after the takeover
        sent = numbers.stop()
        wait_for(lambda: sent <= set(held()), timeout_s, interval_s=0.5)
        got = held()
    finally:
        numbers.stop()
        if child.poll() is None:
            child.kill()
            child.wait()
        if sub is not None:
            sub.close()
        conn.shutdown()
        if plain is None:
            sink.close()
        else:
            ray.kill(plain)
    return {"published": len(sent), "distinct": len(set(got) & sent), "duplicates": len(got) - len(set(got)),
            "lost": len(sent - set(got)), "takeover_s": round(takeover_s, 1)}


def _sinks(kind: str, tmp: Path) -> tuple[Any, Any, list[str]]:
    """(the survivor's sink, the plain sink actor or None, the victim's sink arguments)."""
    from kinesis_actors.sinks import IcebergSink

    if kind == "plain":
        name = f"tf-{uuid.uuid4().hex[:8]}"
        plain = NumberSink.options(name=name, namespace="bench").remote()  # type: ignore[attr-defined]
        return plain, plain, ["--sink-actor", name]
    iceberg = {"table": "bench.faults", "commit_interval_s": 1.0,
               "catalog": {"type": "sql", "uri": f"sqlite:///{tmp}/catalog.db", "warehouse": f"file://{tmp}/wh"}}
    (tmp / "wh").mkdir(exist_ok=True)
    return IcebergSink(**iceberg), None, ["--iceberg", json.dumps(iceberg)]


def _caught_up(numbers: _Numbers, held: Any) -> Any:
    """A condition: the 40 records published after this call are all held by the sink."""
    mark = len(numbers.sent)
    return lambda: len(numbers.sent) > mark + 40 and set(numbers.sent[mark:mark + 40]) <= set(held())


def _table_numbers(sink: Any) -> list[int]:
    table = sink.backend().load()
    if table is None:
        return []
    return [int(b) for b in table.scan(selected_fields=("data",)).to_arrow().column("data").to_pylist()]


def duplicates(ctx: Any, tmp: Path, kills: int = 5, timeout_s: float = 120.0) -> dict[str, dict[str, Any]]:
    """The figures of both sinks, iceberg first (``tmp``: a scratch directory for the table)."""
    out = {}
    for kind in ("iceberg", "plain"):
        (tmp / kind).mkdir(parents=True, exist_ok=True)
        out[kind] = _one(ctx, kind, tmp / kind, kills, timeout_s)
    return out
