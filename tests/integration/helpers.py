"""Helpers for integration tests: deadline waits, collecting sinks, stream setup."""

from __future__ import annotations

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
