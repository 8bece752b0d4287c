"""Helpers for integration tests: deadline waits, collecting sinks, stream setup."""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import boto3
import ray


def wait_until(predicate: Callable[[], Any], *, timeout_s: float, interval_s: float = 0.1, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


_SIGINT_IGNORED_AND_BLOCKED = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                               "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); os.execv(sys.argv[1], sys.argv[1:])")


def as_background_job(command: list[str]) -> list[str]:
    """``command`` (its first item a path) started the way a script's background job (``cmd &``)
    starts: SIGINT ignored, and here blocked too; exec keeps both. Whatever the test process
    inherited, a command that runs until Ctrl-C is then tested in the worst case."""
    return [sys.executable, "-c", _SIGINT_IGNORED_AND_BLOCKED, *command]


def kinesis_client(endpoint: str) -> Any:
    return boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def dynamodb_client(endpoint: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def create_stream(endpoint: str, name: str, shards: int) -> None:
    client = kinesis_client(endpoint)
    client.create_stream(StreamName=name, ShardCount=shards)
    client.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100})


@ray.remote(num_cpus=0)
class Collector:
    """A push-mode sink that remembers every record; can fail its first ``fail_first`` calls
    or every call, and notes (shard, last sequence number) of each acknowledged batch."""

    def __init__(self, fail_first: int = 0, always_fail: bool = False) -> None:
        self.records: list[tuple[str, str, bytes]] = []
        self.acked: list[tuple[str, str]] = []
        self.calls = 0
        self.fail_first = fail_first
        self.always_fail = always_fail

    def process_batch(self, records: list[Any]) -> None:
        self.calls += 1
        if self.always_fail or self.calls <= self.fail_first:
            raise RuntimeError(f"sink failure #{self.calls}")
        self.records.extend((r.shard_id, r.sequence_number, r.data) for r in records)
        self.acked.append((records[0].shard_id, records[-1].sequence_number))

    def payloads(self) -> list[bytes]:
        return [d for _, _, d in self.records]

    def acked_batches(self) -> list[tuple[str, str]]:
        return list(self.acked)

    def call_count(self) -> int:
        return self.calls


def drain(sub: Any, expected: int, *, timeout_s: float = 30.0) -> list[Any]:
    """Pull batches from a pull-mode subscription until ``expected`` distinct payloads arrived."""
    got: list[Any] = []
    seen: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(seen)} of {expected} records arrived in {timeout_s} s")
        batch = sub.next_batch(timeout_s=0.5)
        got.extend(batch)
        seen.update(r.data for r in batch)
    return got


class KeyedPublisher:
    """Publishes to a stream with ``PutRecords`` and remembers every record's (shard id,
    sequence number) as Kinesis answered: :meth:`backlog` at once, :meth:`start` a thread
    that keeps ``per_tick`` records arriving every ``interval_s`` until :meth:`stop`."""

    def __init__(self, endpoint: str, stream: str, *, per_tick: int = 5, interval_s: float = 0.1) -> None:
        self._client = kinesis_client(endpoint)
        self._stream = stream
        self._per_tick = per_tick
        self._interval_s = interval_s
        self._n = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.keys: set[tuple[str, int]] = set()
        self.error: BaseException | None = None

    def put(self, n: int) -> None:
        for start in range(0, n, 500):
            with self._lock:
                first, self._n = self._n, self._n + min(500, n - start)
            entries = [{"Data": f"rec-{i}".encode(), "PartitionKey": f"k{i}"} for i in range(first, self._n)]
            answer = self._client.put_records(StreamName=self._stream, Records=entries)
            assert answer["FailedRecordCount"] == 0, answer
            with self._lock:
                self.keys.update((r["ShardId"], int(r["SequenceNumber"])) for r in answer["Records"])

    def backlog(self, n: int) -> KeyedPublisher:
        self.put(n)
        return self

    def start(self) -> KeyedPublisher:
        def run() -> None:
            try:
                while not self._stop.wait(self._interval_s):
                    self.put(self._per_tick)
            except BaseException as e:  # noted, and raised by stop()
                self.error = e

        self._thread = threading.Thread(target=run, name="keyed-publisher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> set[tuple[str, int]]:
        """Stop the thread; every key published. Raises what the thread hit."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.error is not None:
            raise self.error
        with self._lock:
            return set(self.keys)


def parquet_keys(path: Any) -> list[tuple[str, int]]:
    """(shard id, sequence number) of every row of every complete Parquet file under ``path``
    (a file still being written, without its footer yet, is skipped)."""
    import pathlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    keys: list[tuple[str, int]] = []
    folder = pathlib.Path(path)
    for f in sorted(folder.glob("*.parquet")) if folder.exists() else []:
        try:
            t = pq.read_table(f, columns=["shard_id", "sequence_number"])
        except (pa.ArrowInvalid, OSError):
            continue
        keys += [(sid, int(seq)) for sid, seq in zip(t.column("shard_id").to_pylist(),
                                                      t.column("sequence_number").to_pylist())]
    return keys


def newest_by_shard(keys: list[tuple[str, int]]) -> dict[str, int]:
    """The highest sequence number of each shard among ``keys`` ((shard id, sequence number))."""
    newest: dict[str, int] = {}
    for sid, seq in keys:
        newest[sid] = max(newest.get(sid, 0), seq)
    return newest


def exactly_once(published: set[tuple[str, int]], written: list[tuple[str, int]]) -> dict[str, Any]:
    """How ``written`` compares with ``published``: duplicates (a key written more than once,
    counted beyond its first), lost (published, never written), unknown (written, never published)."""
    counts = collections.Counter(written)
    return {"published": len(published), "written": len(written),
            "duplicates": sum(c - 1 for c in counts.values() if c > 1),
            "lost": len(published - set(counts)), "unknown": len(set(counts) - published)}
