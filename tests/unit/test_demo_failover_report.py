"""The --failover story's lines (no Ray): the in-flight line is always printed, "none" when none."""

from __future__ import annotations

import io
import types

from rich.console import Console

from kinesis_actors.demo.run import DemoRun


def report(after: dict[str, list[tuple[float, str, str, int, int]]]) -> str:
    run = object.__new__(DemoRun)
    buf = io.StringIO()
    run.out = Console(file=buf, width=300)
    run.opts = types.SimpleNamespace(lease_duration_s=3.0, renew_interval_s=1.0, lease_poll_interval_s=1.0)
    run.failover_note = "failover:"
    run.crash = {"at": 100.0, "owned_at": 104.0, "new_owners": ["b"], "shards": ["shardId-0", "shardId-1"]}
    run._report_failover(after)
    return buf.getvalue()


def test_the_in_flight_line_says_none_when_no_batch_of_the_crashed_instance_arrived_late() -> None:
    text = report({"shardId-0": [(104.5, "10", "20", 11, 0)], "shardId-1": [(104.6, "5", "9", 5, 0)]})
    assert "in flight:     none" in text
    assert "first record:" in text and "duplicates:    none" in text


def test_the_in_flight_line_counts_the_batches_sent_before_the_takeover() -> None:
    text = report({"shardId-0": [(100.2, "1", "9", 9, 0), (104.5, "10", "20", 11, 0)]})
    assert "in flight:     1 batch(es)" in text and "in flight:     none" not in text
