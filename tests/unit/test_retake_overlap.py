"""A re-take under the same owner id while the old read loop still runs.

A restarted Coordinator re-takes the rows its owner id holds at once (the counter rises),
but the old Coordinator's readers die only when Ray's fate sharing reaches them: under
load a CI run saw them outlive the fault by 4 s. Until its next lease write the old loop
may deliver one more batch (it is fenced at that write); the new loop reads from the
checkpoint it took. These tests run both loops on one fake clock over a grid of take
times and pin what a downstream can see: every record delivered, and every record
delivered twice lies in the ONE batch the old loop delivered past the checkpoint the take
read. That one batch can repeat records the new loop delivered first and be repeated by
the new loop's next batch, so the duplicates can come from two acknowledged calls (one
of each loop): ``tests/chaos/test_chaos.py`` allows that when its old readers outlived
the replacement. The loops write a checkpoint per acknowledged batch
(``min_checkpoint_interval_s=0``), the mode whose bound is one batch."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

import pytest

from kinesis_actors import StartAt
from kinesis_actors.leases.protocol import Lease
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.testing import FakeClock, FakeShard, InProcessLeaseStore
from tests.chaos.checker import Delivered, Published, check

from .test_reader_core import SHARD, STREAM, consumer

LEASE_S, RENEW_S = 3.0, 1.0


@dataclasses.dataclass
class Overlap:
    """What one run saw: each sink call as (loop, fake time, sequence numbers), the old
    consumer, and the re-take (its lease and when it happened, fake seconds)."""

    calls: list[tuple[str, float, list[int]]]
    old: ShardConsumer
    taken: Lease | None = None
    took_at: float = 0.0


def _spec() -> ReaderSpec:
    return ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=LEASE_S, renew_interval_s=RENEW_S, max_records=1000, idle_wait_s=0.2,
                      max_sink_retries=2, min_checkpoint_interval_s=0.0)


def _overlap(take_after_s: float, new_starts_after_s: float, spread: float = 0.5) -> Overlap:
    """Records arrive 3 per 50 ms; the old loop reads; ``take_after_s`` after it started the
    row is re-taken for the same owner and a new loop starts ``new_starts_after_s`` later;
    the run ends 4 s after the take. ``spread`` is both loops' ``rng`` (the first renewal's
    spread, backoff jitter), so a run is the same every time."""
    clock = FakeClock()
    shard, store = FakeShard(0), InProcessLeaseStore(clock=clock)
    calls: list[tuple[str, float, list[int]]] = []

    def loop(name: str, lease: Lease | None) -> ShardConsumer:
        async def process(records: list[Any]) -> None:
            calls.append((name, clock(), [int(r.sequence_number) for r in records]))
        return consumer(_spec(), lease, store, process, shard, clock, rng=lambda: spread)

    out = Overlap(calls, loop("old", store.take(STREAM, SHARD, owner="me", duration_s=LEASE_S)))

    async def new_loop() -> None:
        await clock.sleep(new_starts_after_s)
        await loop("new", out.taken).run()

    async def scenario() -> None:
        tasks = [asyncio.create_task(out.old.run())]
        start = clock()
        while clock() < start + take_after_s + 4.0:
            shard.add(3)
            await clock.run_for(0.05)
            if out.taken is None and clock() >= start + take_after_s:
                out.taken, out.took_at = store.take(STREAM, SHARD, owner="me", duration_s=LEASE_S), clock()
                tasks.append(asyncio.create_task(new_loop()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
    return out


@pytest.mark.parametrize("take_after_s", [1.0 + 0.037 * i for i in range(8)])
@pytest.mark.parametrize("new_starts_after_s", [0.0, 0.1, 0.6])
@pytest.mark.parametrize("spread", [0.0, 0.5, 0.99])
def test_the_old_loop_delivers_one_batch_past_the_taken_checkpoint_and_it_holds_every_duplicate(
        take_after_s: float, new_starts_after_s: float, spread: float) -> None:
    out = _overlap(take_after_s, new_starts_after_s, spread)
    assert out.taken is not None and out.old.state is ConsumerState.LOST  # fenced by the take
    counts = Counter(n for _, _, seqs in out.calls for n in seqs)
    assert sorted(counts) == list(range(1, len(counts) + 1)) and len(counts) > 100  # nothing lost
    checkpoint = int(out.taken.checkpoint or 0)
    past = [c for c in out.calls if c[0] == "old" and max(c[2]) > checkpoint]
    assert len(past) <= 1, f"the old loop delivered {len(past)} batches past the taken checkpoint {checkpoint}"
    assert all(t <= out.took_at + RENEW_S for _, t, _ in past)  # within one renewal of the take
    assert {n for n, c in counts.items() if c > 1} <= {n for c in past for n in c[2]}


def test_the_chaos_checker_counts_one_overlap_as_two_redelivered_calls() -> None:
    """The shape chaos scenario 3a met, through its own checker: the old loop's last batch
    repeats the head of the new loop's first batch and its own tail is repeated by the new
    loop's next one (one overlap, two acknowledged calls delivered again)."""
    out = _overlap(1.037, 0.0)
    published = [Published(n, SHARD, str(n), 0.0) for n in sorted({n for _, _, s in out.calls for n in s})]
    delivered = [Delivered(n, SHARD, str(n), t, via=loop) for loop, t, seqs in out.calls for n in seqs]
    verdict = check("overlap", published, delivered)
    assert verdict.ok and verdict.batches_redelivered_by_shard == {SHARD: 2}
