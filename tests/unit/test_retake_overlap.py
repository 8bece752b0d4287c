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
the replacement."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kinesis_actors import StartAt
from kinesis_actors.reader import ConsumerState, ReaderSpec
from kinesis_actors.testing import FakeClock, FakeShard, InProcessLeaseStore

from .test_reader_core import SHARD, STREAM, consumer

RENEW_S = 1.0


def _spec() -> ReaderSpec:
    return ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                      lease_duration_s=3.0, renew_interval_s=RENEW_S, max_records=1000, idle_wait_s=0.2,
                      max_sink_retries=2)


def _overlap(take_after_s: float, new_starts_after_s: float, spread: float = 0.5) -> dict[str, Any]:
    """Records arrive 3 per 50 ms; the old loop reads; at ``take_after_s`` the row is re-taken
    for the same owner and a new loop starts ``new_starts_after_s`` later; 4 s later, what
    each loop delivered (``calls``: (loop, fake time, sequence numbers)) and the take's row.
    ``spread`` replaces the keepers' random draws (the first renewal's spread, backoff
    jitter), so a run is the same every time."""
    clock = FakeClock()
    shard, store = FakeShard(0), InProcessLeaseStore(clock=clock)
    calls: list[tuple[str, float, list[int]]] = []

    def sink(loop: str) -> Any:
        async def process(records: list[Any]) -> None:
            calls.append((loop, clock(), [int(r.sequence_number) for r in records]))
        return process

    lease = store.take(STREAM, SHARD, owner="me", duration_s=3.0)
    old = consumer(_spec(), lease, store, sink("old"), shard, clock)
    old.keeper._rng = lambda: spread
    out: dict[str, Any] = {"calls": calls, "old": old}

    async def new_loop() -> None:
        await clock.sleep(new_starts_after_s)
        new = consumer(_spec(), out["taken"], store, sink("new"), shard, clock)
        new.keeper._rng = lambda: spread
        await new.run()

    async def scenario() -> None:
        tasks = [asyncio.create_task(old.run())]
        end, took = clock() + take_after_s + 4.0, False
        while clock() < end:
            shard.add(3)
            await clock.run_for(0.05)
            if not took and clock() >= 1000.0 + take_after_s:
                out["taken"] = store.take(STREAM, SHARD, owner="me", duration_s=3.0)
                out["took_at"], took = clock(), True
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
    calls, taken = out["calls"], out["taken"]
    assert taken is not None and out["old"].state is ConsumerState.LOST  # fenced by the take
    delivered = sorted({n for _, _, seqs in calls for n in seqs})
    assert delivered == list(range(1, delivered[-1] + 1)) and delivered[-1] > 100  # nothing lost
    checkpoint = int(taken.checkpoint or 0)
    past = [c for c in calls if c[0] == "old" and max(c[2]) > checkpoint]
    assert len(past) <= 1, f"the old loop delivered {len(past)} batches past the taken checkpoint {checkpoint}"
    assert all(t <= out["took_at"] + RENEW_S for _, t, _ in past)  # within one renewal of the take
    seen: set[int] = set()
    twice = {n for _, _, seqs in calls for n in seqs if n in seen or seen.add(n)}  # type: ignore[func-returns-value]
    assert twice <= {n for c in past for n in c[2]}


def test_the_duplicates_of_one_overlap_can_come_from_two_acknowledged_calls() -> None:
    """The shape the chaos checker met: the old loop's last batch repeats the head of the new
    loop's first batch and its own tail is repeated by the new loop's next one."""
    calls = _overlap(1.037, 0.0)["calls"]
    first: dict[int, tuple[str, float]] = {}
    originals = set()
    for loop, t, seqs in calls:
        for n in seqs:
            if n in first:
                originals.add(first[n])
            else:
                first[n] = (loop, t)
    assert sorted(loop for loop, _ in originals) == ["new", "old"]
