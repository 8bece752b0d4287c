"""Parts every chaos scenario shares: the numbered publisher, the recording sink, the
lease-table sampler, process lookups and signals, and deadline waits.

Everything here talks to real processes: the emulator over HTTP, Ray actors of the
multi-node cluster, and the OS (psutil, signals). Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import boto3
import psutil
import ray

from .checker import Delivered, Published

REGION = "us-east-1"


def aws_client(endpoint: str, service: str) -> Any:
    """A plain boto3 client on the emulator (the checker's own view, independent of the library)."""
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


# ---------------------------------------------------------------------------- publisher
class NumberedPublisher:
    """Puts numbered events (payload ``b"<n>"``, partition key ``"<n>"``) at a steady rate
    with plain boto3 ``PutRecords``, from a thread, and keeps what was accepted.

    A failed entry is put again with the same number; a call that raised (the outcome
    unknown) puts its events again too, so an event may be in the stream twice: the
    checker counts events by number, so that is a duplicate, never a loss.
    """

    def __init__(self, endpoint: str, stream: str, *, rate_per_s: float = 200.0, tick_s: float = 0.05) -> None:
        self._client = aws_client(endpoint, "kinesis")
        self.stream = stream
        self._per_tick = max(1, round(rate_per_s * tick_s))
        self._tick_s = tick_s
        self._next = 0
        self._retry: list[int] = []
        self._published: list[Published] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-publisher-{stream}", daemon=True)
        self.errors = 0

    def start(self) -> NumberedPublisher:
        self._thread.start()
        return self

    def stop(self) -> list[Published]:
        """Stop publishing; returns every accepted event."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
            assert not self._thread.is_alive(), "the publisher did not stop (a PutRecords call hangs)"
        with self._lock:
            return list(self._published)

    def published(self) -> list[Published]:
        with self._lock:
            return list(self._published)

    def count(self) -> int:
        with self._lock:
            return len(self._published)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            numbers, self._retry = self._retry, []
            while len(numbers) < self._per_tick:
                numbers.append(self._next)
                self._next += 1
            try:
                out = self._client.put_records(StreamName=self.stream, Records=[
                    {"Data": str(n).encode(), "PartitionKey": str(n)} for n in numbers])
            except Exception:
                self.errors += 1
                self._retry = numbers
            else:
                now = time.time()
                with self._lock:
                    for n, entry in zip(numbers, out["Records"]):
                        if "SequenceNumber" in entry:
                            self._published.append(Published(n, entry["ShardId"], entry["SequenceNumber"], now))
                        else:
                            self._retry.append(n)
            self._stop.wait(max(0.0, t0 + self._tick_s - time.monotonic()))


# ---------------------------------------------------------------------------- sink
@ray.remote(num_cpus=0)
class RecordingSink:
    """The downstream of a chaos run (an async Ray actor): notes ``(n, shard, sequence
    number, epoch time)`` of every record it acknowledges. ``stall(until, then_delay_s)``
    makes it stop acknowledging until an epoch time, then acknowledge each batch only
    after ``then_delay_s`` (a slow downstream); control calls answer during a stall."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, str, float]] = []
        self.stall_until = 0.0
        self.delay_s = 0.0
        self.delay_until = 0.0
        self.calls = 0
        self.in_flight = 0  # batches handed to us and not yet acknowledged
        self.max_in_flight = 0

    async def process_batch(self, records: list[Any]) -> None:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            while time.time() < self.stall_until:
                await asyncio.sleep(0.05)
            if self.delay_s and time.time() < self.delay_until:
                await asyncio.sleep(self.delay_s)
            now = time.time()
            self.rows.extend((int(r.data), r.shard_id, r.sequence_number, now) for r in records)
        finally:
            self.in_flight -= 1

    def in_flight_figures(self) -> tuple[int, int]:
        """(batches unacknowledged now, most ever at once)."""
        return self.in_flight, self.max_in_flight

    def stall(self, until: float, then_delay_s: float = 0.0, delay_for_s: float = 0.0) -> None:
        self.stall_until = until
        self.delay_s = then_delay_s
        self.delay_until = until + delay_for_s

    def rows_from(self, start: int) -> list[tuple[int, str, str, float]]:
        return self.rows[start:]

    def pid(self) -> int:
        return os.getpid()


class SinkReader:
    """The driver's incremental copy of one RecordingSink's rows."""

    def __init__(self, sink: Any, via: str = "") -> None:
        self.sink, self.via = sink, via
        self.rows: list[Delivered] = []

    def refresh(self) -> list[Delivered]:
        new = ray.get(self.sink.rows_from.remote(len(self.rows)), timeout=60)
        self.rows.extend(Delivered(n, s, q, t, self.via) for n, s, q, t in new)
        return self.rows

    def numbers(self) -> set[int]:
        return {d.n for d in self.rows}


def file_rows(path: str, via: str) -> list[Delivered]:
    """Rows an instance's FileSink wrote (``n shard seq t`` per line); a torn last line is skipped."""
    out: list[Delivered] = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4 and line.endswith("\n"):
                out.append(Delivered(int(parts[0]), parts[1], parts[2], float(parts[3]), via))
    return out


def wait_all_delivered(publisher: NumberedPublisher, delivered: Callable[[], set[int]], *,
                       timeout_s: float = 60.0) -> None:
    """Wait until every event accepted so far was delivered at least once (no assertion on
    timeout: the checker then reports what is missing)."""
    target = {p.n for p in publisher.published()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if target <= delivered():
            return
        time.sleep(0.25)


# ---------------------------------------------------------------------------- lease table
class LeaseSampler:
    """Samples the lease rows of one stream every ``period_s`` (a consistent ``Scan`` with
    plain boto3), optionally with the ShardReader processes alive at that moment.

    ``samples``: ``(epoch s, {shard id: (owner, counter, checkpoint)}, reader pids or None)``.
    """

    def __init__(self, endpoint: str, table: str, stream: str, *, period_s: float = 0.1,
                 with_processes: bool = False) -> None:
        self.errors = 0
        self.started = False
        self._client = aws_client(endpoint, "dynamodb")
        self.table, self.stream, self.period_s = table, stream, period_s
        self.with_processes = with_processes
        self.samples: list[tuple[float, dict[str, tuple[str | None, int, str | None]], list[int] | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-sampler-{stream}", daemon=True)

    def __enter__(self) -> LeaseSampler:
        self._thread.start()
        self.started = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.started:
            self._thread.join(timeout=10)

    def read(self) -> dict[str, tuple[str | None, int, str | None]]:
        prefix = f"{self.stream}:"
        rows: dict[str, tuple[str | None, int, str | None]] = {}
        for page in self._client.get_paginator("scan").paginate(TableName=self.table, ConsistentRead=True):
            for item in page["Items"]:
                key = item["lease_key"]["S"]
                if not key.startswith(prefix) or "#" in key:
                    continue
                rows[key[len(prefix):]] = (item.get("lease_owner", {}).get("S"),
                                           int(item.get("lease_counter", {}).get("N", "0")),
                                           item.get("checkpoint", {}).get("S"))
        return rows

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                rows = self.read()
                pids = reader_pids() if self.with_processes else None
                self.samples.append((time.time(), rows, pids))
            except Exception:  # e.g. the table not created yet: counted, and tests assert enough samples
                self.errors += 1
            self._stop.wait(max(0.0, t0 + self.period_s - time.monotonic()))

    def checkpoints(self) -> list[tuple[float, dict[str, Any]]]:
        return [(t, {s: row[2] for s, row in rows.items()}) for t, rows, _ in self.samples]

    def owners_over_time(self, shard: str) -> list[tuple[float, str | None]]:
        return [(t, rows[shard][0]) for t, rows, _ in self.samples if shard in rows]

    def first_time(self, predicate: Callable[[dict[str, tuple[str | None, int, str | None]]], bool],
                   after: float = 0.0) -> float | None:
        for t, rows, _ in self.samples:
            if t >= after and predicate(rows):
                return t
        return None


# ---------------------------------------------------------------------------- processes
def _title(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
        return cmd[0] if cmd else ""
    except psutil.Error:
        return ""


def processes_titled(prefix: str, within: Iterable[psutil.Process] | None = None) -> list[psutil.Process]:
    """Live processes whose title (Ray sets ``ray::<ActorClass>``) starts with ``prefix``,
    among ``within`` (default: this process's descendants, i.e. the suite's own cluster,
    never another job's Ray on the same machine)."""
    candidates = within if within is not None else tree(os.getpid())[1:]
    out = []
    for p in candidates:
        try:
            if p.status() != psutil.STATUS_ZOMBIE and _title(p).startswith(prefix):
                out.append(p)
        except psutil.Error:
            continue
    return out


def reader_pids(within: Iterable[psutil.Process] | None = None) -> list[int]:
    return sorted(p.pid for p in processes_titled("ray::ShardReader", within))


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants (a driver, the local Ray it started, Ray's workers)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def signal_tree(pid: int, sig: int) -> list[int]:
    """Send ``sig`` to ``pid``'s whole process tree, repeating until no new process shows up
    (a process may be forked meanwhile). Returns the pids signalled."""
    done: set[int] = set()
    for _ in range(10):
        fresh = [p for p in tree(pid) if p.pid not in done]
        if not fresh:
            break
        for p in fresh:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
            done.add(p.pid)
    return sorted(done)


def gone(pids: Iterable[int]) -> bool:
    """True when none of ``pids`` is a live (non-zombie) process."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            continue
    return True


def rss_mib(pids: Iterable[int]) -> float:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def sigkill(pid: int, title: str) -> None:
    """SIGKILL ``pid`` only if it is still the process titled ``title...`` (pids are reused)."""
    try:
        process = psutil.Process(pid)
        if not _title(process).startswith(title):
            raise AssertionError(f"pid {pid} is no longer a {title} process")
        process.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass


def write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
