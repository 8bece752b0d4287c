"""The planted bugs of :mod:`kinesis_actors.mutation` are wired: each scenario checks one
guarantee, which holds with nothing planted and breaks with its mutant planted. That proves
the switch reaches the line that holds the guarantee; the simulator must find each one on
its own. Fake clock, blocking calls inline, no Ray."""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from kinesis_actors import SinkError, StartAt, mutation
from kinesis_actors.leases.protocol import SHARD_END
from kinesis_actors.leases.rows import LocalRows, Row
from kinesis_actors.reader import ConsumerState, ReaderSpec
from kinesis_actors.reader.lease import LeaseKeeper
from kinesis_actors.testing import FakeClock, FakeKinesis, FakeShard, InlineIo, InProcessLeaseStore

from .delivery_fakes import Sink
from .test_hostile import coordinator, poll, shard
from .test_hostile import finish as end_shard
from .test_read_loop import make
from .test_reader_core import SHARD, STREAM, Recorder, clock_of, finish, make_reader, run_until, until

MODULES = ("kinesis_actors.kinesis", "kinesis_actors.delivery", "kinesis_actors.reader", "kinesis_actors.leases",
           "kinesis_actors.coordinator")
"""The modules that hold the mutated lines (each registers its mutants at import)."""


def both(scenario: Callable[[], Any], name: str) -> tuple[Any, Any]:
    """``scenario()`` with nothing planted, then with mutant ``name`` planted."""
    assert not mutation.ACTIVE
    clean = scenario()
    with mutation.planted(name):
        broken = scenario()
    assert not mutation.ACTIVE
    return clean, broken


def test_nothing_is_planted_after_importing_the_library() -> None:
    """In a fresh interpreter: importing the library and every module that holds a mutated
    line declares the mutants and plants none."""
    code = ("import kinesis_actors, importlib\n"
            f"for m in {MODULES!r}: importlib.import_module(m)\n"
            "from kinesis_actors import mutation\n"
            "print(len(mutation.MUTANTS), sorted(mutation.ACTIVE))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    count, active = out.stdout.split(maxsplit=1)
    assert int(count) >= 10 and active.strip() == "[]"


def test_every_mutant_named_in_issue_38_is_declared_and_planting_an_unknown_one_fails() -> None:
    for m in MODULES:
        importlib.import_module(m)
    named = {"checkpoint_before_ack", "renew_without_liveness_check", "shard_end_before_last_ack",
             "take_without_counter_condition", "handoff_release_before_checkpoint", "child_before_parent_end",
             "lane_failure_shard_end", "resume_skips_one", "checkpoint_after_lost_lease",
             "partial_ack_checkpoints_batch", "iterator_expiry_restarts_latest"}
    assert named <= set(mutation.MUTANTS), sorted(named - set(mutation.MUTANTS))
    with pytest.raises(ValueError, match="unknown mutants"), mutation.planted("no_such_mutant"):
        pass
    assert not mutation.ACTIVE


# ----------------------------------------------------------------------------- checkpoints and acknowledgements
def test_checkpoint_before_ack() -> None:
    """A sink that refuses every batch: nothing may be checkpointed (the planted bug
    checkpoints the batch before the sink call)."""
    def scenario() -> str | None:
        shard, store = FakeShard(5), InProcessLeaseStore()
        reader = make_reader(shard, store, Recorder(always=True), max_sink_retries=0, min_checkpoint_interval_s=0)

        async def main() -> None:
            clock = clock_of(reader)
            await finish(clock, reader.open())
            with pytest.raises(SinkError):
                await finish(clock, reader.run(), within_s=10.0)

        asyncio.run(main())
        return store.get(STREAM, SHARD).checkpoint

    assert both(scenario, "checkpoint_before_ack") == (None, "5")


@pytest.mark.parametrize("factor", [1, 2])
def test_partial_ack_checkpoints_batch(factor: int) -> None:
    """The sink acknowledges the first 2 of 5 records, then gives up: the checkpoint stays at
    the second record (the planted bug checkpoints the whole batch)."""
    def scenario() -> str | None:
        shard, clock = FakeShard(5), FakeClock()
        reader, store = make(shard, Sink(partial={1: 2}), clock, factor=factor)

        async def main() -> None:
            await clock.finish(reader.open(), within_s=5.0)
            with pytest.raises(SinkError):
                await clock.finish(reader.run(), within_s=10.0)

        asyncio.run(main())
        return store.get(STREAM, SHARD).checkpoint

    assert both(scenario, "partial_ack_checkpoints_batch") == ("2", "5")


@pytest.mark.parametrize("factor", [1, 2])
def test_shard_end_before_last_ack(factor: int) -> None:
    """A closed shard of 250 records: SHARD_END only once all 250 are delivered (the planted
    bug writes it as soon as the fetch that ends the shard returns)."""
    def scenario() -> tuple[str | None, int]:
        shard, clock = FakeShard(250, closed=True, max_per_call=100), FakeClock()
        got: list[int] = []

        async def sink(records: Any) -> None:
            await clock.sleep(0.05)
            got.extend(int(r.sequence_number) for r in records)

        reader, store = make(shard, sink, clock, factor=factor)
        assert asyncio.run(clock.finish(reader.run(), within_s=20.0)) is ConsumerState.SHARD_ENDED
        return store.get(STREAM, SHARD).checkpoint, len(got)

    clean, broken = both(scenario, "shard_end_before_last_ack")
    assert clean == (SHARD_END, 250)
    assert broken[0] == SHARD_END and broken[1] < 250


@pytest.mark.parametrize("factor", [2, 3])
def test_lane_failure_shard_end(factor: int) -> None:
    """The batch in flight fails while the fetch made meanwhile finds the shard's end with
    no records: the consumer fails and never writes SHARD_END (the planted old bug of the
    ShardPipeline, ``parallelization_factor > 1``, writes it)."""
    def scenario() -> tuple[ConsumerState, str | None]:
        shard, clock = FakeShard(100, max_per_call=100), FakeClock()

        async def sink(records: Any) -> None:
            shard.closed = True  # the next GetRecords: no records, no next iterator
            while len(shard.calls) < 2:  # the shard-end fetch is made while this batch is in flight
                await clock.sleep(0.01)
            raise RuntimeError("the sink gave up")

        reader, store = make(shard, sink, clock, factor=factor)

        async def main() -> None:
            await clock.finish(reader.open(), within_s=5.0)
            try:
                await clock.finish(reader.run(), within_s=10.0)
            except SinkError:
                pass

        asyncio.run(main())
        return reader.state, store.get(STREAM, SHARD).checkpoint

    assert both(scenario, "lane_failure_shard_end") == ((ConsumerState.FAILED, None),
                                                        (ConsumerState.SHARD_ENDED, SHARD_END))


# ----------------------------------------------------------------------------- resuming and reading
def test_resume_skips_one() -> None:
    """A new owner resumes after the stored checkpoint 5 and reads 6..10 (the planted bug skips 6)."""
    def scenario() -> list[int]:
        shard, store, sink = FakeShard(10), InProcessLeaseStore(), Recorder()
        before = store.take(STREAM, SHARD, owner="before", duration_s=2.0)
        assert before is not None
        store.release(store.checkpoint(before, "5"))
        reader = make_reader(shard, store, sink)
        asyncio.run(run_until(reader, lambda: 10 in sink.seqs))
        return sink.seqs

    assert both(scenario, "resume_skips_one") == ([6, 7, 8, 9, 10], [7, 8, 9, 10])


def test_iterator_expiry_restarts_latest() -> None:
    """An iterator expires while 5 records wait: they are read after it reopens (the planted
    bug reopens at LATEST and skips them)."""
    def scenario() -> tuple[list[int], str]:
        shard, store, sink = FakeShard(5), InProcessLeaseStore(), Recorder()
        reader = make_reader(shard, store, sink)
        step = {"expiry": False, "more": False}

        def read_all() -> bool:
            if sink.seqs == [1, 2, 3, 4, 5] and not step["expiry"]:
                step["expiry"] = True
                shard.faults = ["ExpiredIteratorException"]  # the next GetRecords, with 6..10 waiting
                shard.add(5)
            elif len(shard.iterator_requests) == 2 and not step["more"]:
                step["more"] = True
                shard.add(2)  # records after the reopen, wherever it reopened
            return 12 in sink.seqs

        asyncio.run(run_until(reader, read_all))
        assert reader.stats["expired_iterators"] == 1
        return sink.seqs, shard.iterator_requests[1]["ShardIteratorType"]

    clean, broken = both(scenario, "iterator_expiry_restarts_latest")
    assert clean == (list(range(1, 13)), "AFTER_SEQUENCE_NUMBER")
    assert broken == ([1, 2, 3, 4, 5, 11, 12], "LATEST")


def test_child_before_parent_end() -> None:
    """A child of a split is read only once its parent's row is at SHARD_END (the planted bug
    opens it at the first poll)."""
    def scenario() -> tuple[list[str], list[str]]:
        kinesis, store, launched = FakeKinesis(listing=[shard("P", closed=True), shard("C", "P")]), \
            InProcessLeaseStore(), {}  # type: dict[str, Any]

        async def main() -> tuple[list[str], list[str]]:
            core = coordinator(kinesis, store, launched)
            await core.sync_shards()
            await poll(core)
            first = sorted(launched)
            await end_shard(launched, store, "P")
            await poll(core)
            await core.close()
            return first, sorted(launched)

        return asyncio.run(main())

    clean, broken = both(scenario, "child_before_parent_end")
    assert clean == (["P"], ["C", "P"])
    assert broken[0] == ["C", "P"]


# ----------------------------------------------------------------------------- leases
def test_renew_without_liveness_check() -> None:
    """A read loop that shows no sign of life for longer than the lease duration lets its
    lease lapse (the planted bug keeps renewing it)."""
    def scenario() -> tuple[str | None, int]:
        clock = FakeClock()
        store = InProcessLeaseStore(clock=clock)
        lease = store.take(STREAM, SHARD, owner="me", duration_s=2.0)
        assert lease is not None
        spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.trim_horizon(),
                          lease_duration_s=2.0, renew_interval_s=0.2)
        keeper = LeaseKeeper(spec, lease, store, InlineIo(clock), clock=clock, sleep=clock.sleep, lease_age_s=0.0)

        async def main() -> None:
            renewing = asyncio.ensure_future(keeper.renew_loop())
            await clock.run_for(6.0)  # the loop never calls keeper.alive(): it is stuck
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

        asyncio.run(main())
        return keeper.lost, store.get(STREAM, SHARD).counter

    (lost, counter), (lost_planted, counter_planted) = both(scenario, "renew_without_liveness_check")
    assert lost is not None and counter <= 1 + 2.0 / 0.2 + 1, "renewals stop once the loop is silent"
    assert lost_planted is None and counter_planted > 6.0 / 0.2 / 2, "renewed all along"


class RacingRows(LocalRows):
    """A table whose next ``read`` runs ``between`` after reading: a write by someone else
    lands between a caller's read and its conditional write."""

    between: Callable[[], None] | None = None

    def read(self, key: str) -> Row | None:
        row = super().read(key)
        hook, self.between = self.between, None
        if hook is not None:
            hook()
        return row


def test_take_without_counter_condition() -> None:
    """B judges A's lease expired from a read; A renews before B's write lands: B's take is
    refused (the planted bug overwrites the row: two owners of one counter)."""
    def scenario() -> tuple[Any, Any]:
        rows, clock_a, clock_b = RacingRows(), FakeClock(), FakeClock()
        a = InProcessLeaseStore(rows, clock=clock_a)
        b = a.peer(clock=clock_b)
        held = a.take(STREAM, SHARD, owner="a", duration_s=2.0)
        assert held is not None and b.get(STREAM, SHARD) is not None  # B notes counter 1 ...
        clock_b.advance(3.0)  # ... which has not moved for a lease duration, as B sees it
        renewed: list[Any] = []
        rows.between = lambda: renewed.append(a.renew(held))
        taken = b.take(STREAM, SHARD, owner="b", duration_s=2.0)
        return renewed[0], taken

    (renewed, taken), (renewed_p, taken_p) = both(scenario, "take_without_counter_condition")
    assert taken is None and renewed.owner == "a"
    assert taken_p is not None and taken_p.owner == "b" and renewed_p.owner == "a"
    assert taken_p.counter == renewed_p.counter, "two owners hold the same counter"


def test_checkpoint_after_lost_lease() -> None:
    """A's lease is taken by B (it expired as B saw it); A's next checkpoint is refused and A
    writes nothing more (the planted bug writes it over B's row)."""
    def scenario() -> tuple[ConsumerState, str | None, str | None]:
        clock_b = FakeClock()
        shard, store, sink = FakeShard(5), InProcessLeaseStore(), Recorder()
        reader = make_reader(shard, store, sink, min_checkpoint_interval_s=0)
        thief = store.peer(clock=clock_b)

        async def main() -> ConsumerState:
            clock = clock_of(reader)
            await finish(clock, reader.open())
            run = asyncio.create_task(reader.run())
            await until(clock, lambda: store.get(STREAM, SHARD).checkpoint == "5", what="checkpoint 5")
            thief.get(STREAM, SHARD)
            clock_b.advance(3.0)
            assert thief.take(STREAM, SHARD, owner="thief", duration_s=2.0) is not None
            shard.add(3)
            return await finish(clock, run)

        state = asyncio.run(main())
        row = store.get(STREAM, SHARD)
        return state, row.owner, row.checkpoint

    clean, broken = both(scenario, "checkpoint_after_lost_lease")
    assert clean == (ConsumerState.LOST, "thief", "5")
    assert broken == (ConsumerState.LOST, "thief", "8")


def test_handoff_release_before_checkpoint() -> None:
    """A handoff checkpoints what was acknowledged before the row changes hands (the planted
    bug hands it over at the last checkpoint written, so the receiver reads 6..8 again)."""
    def scenario() -> tuple[ConsumerState, str | None, str | None]:
        shard, store, sink = FakeShard(5), InProcessLeaseStore(), Recorder()
        reader = make_reader(shard, store, sink, min_checkpoint_interval_s=60.0)  # the first write, then 1 a minute

        async def main() -> ConsumerState:
            clock = clock_of(reader)
            await finish(clock, reader.open())
            run = asyncio.create_task(reader.run())
            await until(clock, lambda: store.get(STREAM, SHARD).checkpoint == "5", what="checkpoint 5")
            shard.add(3)
            await until(clock, lambda: 8 in sink.seqs, what="records 6..8 acknowledged")
            row = store.get(STREAM, SHARD)
            assert row.checkpoint == "5", "6..8 are acknowledged, not checkpointed yet"
            assert store.request_handoff(STREAM, SHARD, owner="thief", expect_counter=row.counter)
            assert reader.request_handoff("thief")
            return await finish(clock, run)

        state = asyncio.run(main())
        row = store.get(STREAM, SHARD)
        return state, row.owner, row.checkpoint

    clean, broken = both(scenario, "handoff_release_before_checkpoint")
    assert clean == (ConsumerState.HANDED_OVER, "thief", "8")
    assert broken == (ConsumerState.HANDED_OVER, "thief", "5")
