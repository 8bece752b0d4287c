"""TableCommitter on real tables (pyiceberg's SQL catalog on SQLite, deltalake on local files),
without Ray: positions in every commit, fencing, creation, transforms, failing catalogs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from kinesis_actors.errors import LeaseLostError, SinkError
from kinesis_actors.sinks.tables import ShardKey, TableCommitter, TablePosition
from tests.unit.table_fixtures import STREAM, FaultyBackend, commit_positions, make_backend, records, rows_of, scan, seq, until

KINDS = ["iceberg", "delta"]
S0, S1 = ShardKey(STREAM, "shardId-000000000000"), ShardKey(STREAM, "shardId-000000000001")


async def _no_wait(seconds: float) -> None:
    await asyncio.sleep(0)


def committer(backend: Any, **kw: Any) -> TableCommitter:
    """A committer that commits only when asked (a long interval), retrying without waiting."""
    kw.setdefault("commit_interval_s", 3600.0)
    return TableCommitter(backend, sleep=_no_wait, **kw)


async def stage(c: TableCommitter, key: ShardKey, counter: int, first: int, n: int) -> TablePosition | None:
    rows, last = rows_of(records(key.shard_id, first, n))
    return await c.stage(key, counter, rows, last)


def numbers(table: Any, shard: str | None = None) -> list[int]:
    """The record numbers in the table (from the payloads), sorted; duplicates kept."""
    out = []
    for row in table.to_pylist():
        doc = json.loads(row["data"])
        if shard is None or doc["shard"] == shard:
            out.append(doc["n"])
    return sorted(out)


@pytest.mark.parametrize("kind", KINDS)
def test_first_batch_creates_the_table_and_every_commit_holds_every_shards_position(kind: str, tmp_path: Path) -> None:
    backend = make_backend(kind, tmp_path)

    async def main() -> None:
        c = committer(backend)
        assert await c.open_shard(S0, 5) is None  # no table yet: nothing to fence, nothing ahead
        assert await c.open_shard(S1, 7) is None
        assert backend.load() is None
        assert await stage(c, S0, 5, 0, 10) is None  # staged = acknowledged; nothing committed yet
        await stage(c, S1, 7, 100, 3)
        done = await c.flush_shard(S0, 5)
        assert done == TablePosition(5, seq(9), None)
        await stage(c, S0, 5, 10, 5)  # S1 quiet: its position is carried in the next commit
        assert await c.flush_shard(S0, 5) == TablePosition(5, seq(14), None)
        await c.close()

    asyncio.run(main())
    table = scan(backend)
    assert numbers(table, S0.shard_id) == list(range(15))
    assert numbers(table, S1.shard_id) == [100, 101, 102]
    assert table.column_names == ["data", "partition_key", "sequence_number", "sub_sequence_number",
                                  "approximate_arrival_timestamp", "shard_id", "stream"]
    commits = commit_positions(backend)
    assert len(commits) == 2
    assert commits[0] == {S0: TablePosition(5, seq(14)), S1: TablePosition(7, seq(102))}
    assert commits[1] == {S0: TablePosition(5, seq(9)), S1: TablePosition(7, seq(102))}


@pytest.mark.parametrize("kind", KINDS)
def test_a_new_owner_fences_the_shard_and_the_old_owners_late_commit_is_refused(kind: str, tmp_path: Path) -> None:
    backend = make_backend(kind, tmp_path)

    async def main() -> None:
        old, new = committer(backend), committer(make_backend(kind, tmp_path))
        await old.open_shard(S0, 3)
        await old.open_shard(S1, 3)
        await stage(old, S0, 3, 0, 10)
        await stage(old, S1, 3, 0, 4)
        await old.flush_shard(S0, 3)  # creates the table: S0 0..9, S1 0..3
        await stage(old, S0, 3, 10, 10)  # staged, acknowledged, not committed: the old owner freezes here
        # The new owner takes S0 (a higher lease counter) and fences it before reading.
        ahead = await new.open_shard(S0, 4)
        assert ahead == TablePosition(4, seq(9), None)  # resume after 9, whatever the lease table says
        await stage(new, S0, 4, 10, 10)
        await new.flush_shard(S0, 4)
        # The old owner thaws and commits: S0 is refused, S1 (still its own) goes through.
        await stage(old, S1, 3, 4, 2)
        with pytest.raises(LeaseLostError):
            await old.flush_shard(S0, 3)
        with pytest.raises(LeaseLostError):
            await stage(old, S0, 3, 20, 1)
        assert old.committed(S1, 3) == TablePosition(3, seq(5))
        assert old.stats()["shards_refused"] == 1

    asyncio.run(main())
    table = scan(backend)
    assert numbers(table, S0.shard_id) == list(range(20))  # each once: the old owner's 10..19 stayed invisible
    assert numbers(table, S1.shard_id) == list(range(6))
    assert commit_positions(backend)[0][S1] == TablePosition(3, seq(5))
    assert S0 not in commit_positions(backend)[0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_fence_landing_between_read_and_commit_makes_the_table_refuse_the_stale_commit(kind: str,
                                                                                        tmp_path: Path) -> None:
    """The table's own optimistic check, not a lock of ours: the old owner's commit was built on
    the state before the fence, and the catalog (or the Delta log) refuses it; its retry re-reads
    the positions and drops the shard."""
    inner = make_backend(kind, tmp_path)
    faulty = FaultyBackend(inner)

    async def main() -> None:
        old = committer(faulty)
        await old.open_shard(S0, 1)
        await stage(old, S0, 1, 0, 5)
        await old.flush_shard(S0, 1)  # table created, S0 at 4
        await stage(old, S0, 1, 5, 5)
        new = committer(make_backend(kind, tmp_path))
        fenced: list[Any] = []

        def fence_now() -> None:  # runs inside the old owner's commit, after it read the table
            fenced.append(asyncio.run(new.open_shard(S0, 2)))

        faulty.before_commit = fence_now
        with pytest.raises(LeaseLostError):
            await old.flush_shard(S0, 1)
        assert fenced == [TablePosition(2, seq(4))]
        assert old.stats()["conflicts"] >= 1  # refused by the table, then dropped on the re-read

    asyncio.run(main())
    assert numbers(scan(inner)) == list(range(5))


@pytest.mark.parametrize("kind", KINDS)
def test_a_catalog_that_refuses_commits_for_a_while_loses_nothing_and_writes_nothing_twice(kind: str,
                                                                                          tmp_path: Path) -> None:
    inner = make_backend(kind, tmp_path)
    faulty = FaultyBackend(inner)

    async def main() -> None:
        c = committer(faulty)
        await c.open_shard(S0, 1)
        await stage(c, S0, 1, 0, 5)
        faulty.fail_commits = 4
        assert await c.flush_shard(S0, 1) == TablePosition(1, seq(4))
        faulty.land_then_fail = 1  # lands, but the answer is lost: found again by its commit id
        await stage(c, S0, 1, 5, 5)
        assert await c.flush_shard(S0, 1) == TablePosition(1, seq(9))
        await stage(c, S0, 1, 10, 5)
        faulty.fail_commits = 2
        assert await c.flush_shard(S0, 1) == TablePosition(1, seq(14))
        stats = c.stats()
        assert stats["commit_failures"] == 7 and "injected" in stats["last_error"]
        assert stats["rows_committed"] == 15

    asyncio.run(main())
    assert numbers(scan(inner)) == list(range(15))


@pytest.mark.parametrize("kind", KINDS)
def test_a_transform_that_changes_the_schema(kind: str, tmp_path: Path) -> None:
    backend = make_backend(kind, tmp_path)

    def parse(table: pa.Table) -> pa.Table:
        docs = [json.loads(b) for b in table.column("data").to_pylist()]
        return pa.table({"n": pa.array([d["n"] for d in docs], pa.int64()),
                         "shard": pa.array([d["shard"] for d in docs], pa.string()),
                         "seq": table.column("sequence_number")})

    async def main() -> None:
        c = committer(backend)
        await c.open_shard(S0, 1)
        batch = records(S0.shard_id, 0, 6)
        await c.stage(S0, 1, *rows_of(batch, parse))
        await c.flush_shard(S0, 1)
        with pytest.raises(SinkError, match="do not fit"):  # another shape than the rows before
            await c.stage(S0, 1, pa.table({"other": [1]}), (seq(6), None))

    asyncio.run(main())
    table = scan(backend)
    assert sorted(table.column_names) == ["n", "seq", "shard"]
    assert sorted(table.column("n").to_pylist()) == list(range(6))


@pytest.mark.parametrize("kind", KINDS)
def test_an_old_owner_creating_the_table_after_a_new_owner_opened_is_caught(kind: str, tmp_path: Path) -> None:
    """The table was missing when the new owner opened (nothing to fence): if the previous owner
    then commits the shard, the new owner's start is unsafe, and its rows are refused."""
    backend = make_backend(kind, tmp_path)

    async def main() -> None:
        old, new = committer(backend), committer(make_backend(kind, tmp_path))
        await old.open_shard(S0, 1)
        await stage(old, S0, 1, 0, 5)
        assert await new.open_shard(S0, 2) is None  # no table: unfenced
        await stage(new, S0, 2, 0, 5)  # the new owner read from the lease checkpoint (nothing)
        await old.flush_shard(S0, 1)  # creates the table with 0..4 under counter 1
        with pytest.raises(LeaseLostError, match="moved"):
            await new.flush_shard(S0, 2)

    asyncio.run(main())
    assert numbers(scan(backend)) == list(range(5))


@pytest.mark.parametrize("kind", KINDS)
def test_staged_rows_wait_for_room_and_a_release_drops_what_is_not_committed(kind: str, tmp_path: Path) -> None:
    backend = make_backend(kind, tmp_path)

    async def main() -> None:
        c = committer(backend, max_staged_bytes=1, stage_timeout_s=30.0, commit_interval_s=0.05)
        await c.open_shard(S0, 1)
        await stage(c, S0, 1, 0, 5)
        # Over the limit: the next stage waits for a commit to make room (reading slows down).
        assert await stage(c, S0, 1, 5, 5) == TablePosition(1, seq(4))
        assert c.release_shard(S0, 2) == 0  # another counter: nothing
        dropped = c.release_shard(S0, 1)
        assert dropped in (0, 5)  # 5..9 dropped unless a round took them already
        await c.close()
        return dropped

    dropped = asyncio.run(main())
    assert numbers(scan(backend)) == list(range(10 - dropped))


def test_open_under_an_older_counter_than_the_one_held_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        c = committer(make_backend("iceberg", tmp_path))
        await c.open_shard(S0, 9)
        with pytest.raises(LeaseLostError):
            await c.open_shard(S0, 8)
        with pytest.raises(LeaseLostError):
            await stage(c, S0, 8, 0, 1)

    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_table_that_may_not_be_created_fails_the_sink_not_retried(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        c = committer(make_backend(kind, tmp_path), create_if_missing=False)
        await c.open_shard(S0, 1)
        await stage(c, S0, 1, 0, 3)
        with pytest.raises(SinkError, match="does not exist") as failed:
            await c.flush_shard(S0, 1)
        assert not failed.value.retriable
        with pytest.raises(SinkError, match="does not exist"):
            await stage(c, S0, 1, 3, 1)

    asyncio.run(main())
    assert scan(make_backend(kind, tmp_path)) is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_flush_during_a_round_in_flight_waits_for_that_rounds_rows(kind: str, tmp_path: Path) -> None:
    import threading

    faulty = FaultyBackend(make_backend(kind, tmp_path))
    gate = threading.Event()

    async def main() -> None:
        c = committer(faulty)
        await c.open_shard(S0, 1)
        await stage(c, S0, 1, 0, 5)
        await c.flush_shard(S0, 1)  # the table exists, the shard is fenced
        faulty.before_commit = lambda: gate.wait(10)  # the next commit hangs in the catalog
        await stage(c, S0, 1, 5, 5)
        c._event("_urgent").set()  # a round starts on its own (the interval elapsed)
        await until(c._in_flight, within_s=10.0, what="a commit round in flight")
        flush = asyncio.ensure_future(c.flush_shard(S0, 1))
        await asyncio.sleep(0.2)
        assert not flush.done()  # its rows are in the round in flight: not committed yet
        gate.set()
        assert await flush == TablePosition(1, seq(9))

    asyncio.run(main())
    assert numbers(scan(faulty.inner)) == list(range(10))


@pytest.mark.parametrize("kind", KINDS)
def test_the_close_commits_what_is_staged_at_its_start_and_drops_what_is_staged_after(kind: str,
                                                                                     tmp_path: Path) -> None:
    """begin_close commits what was staged (acknowledged) before it; a batch staged after it starts a
    round at once; rows still staged when the readers have stopped are dropped unwritten, never committed."""
    backend = make_backend(kind, tmp_path)

    async def main() -> tuple[int, int]:
        c = committer(backend)  # an hour between rounds: only the close commits
        await c.open_shard(S0, 3)
        await c.open_shard(S1, 4)
        await stage(c, S0, 3, 0, 10)
        await stage(c, S1, 4, 100, 5)
        assert await c.begin_close(30.0)
        assert c.committed(S0, 3) == TablePosition(3, seq(9), None)
        await stage(c, S0, 3, 10, 2)  # hurried: a round starts without waiting for the interval
        for _ in range(200):
            if c.committed(S0, 3) == TablePosition(3, seq(11), None):
                break
            await asyncio.sleep(0.05)
        assert c.committed(S0, 3) == TablePosition(3, seq(11), None)
        await stage(c, S1, 4, 105, 7)  # staged by a reader stopped before its last commit:
        dropped = c.drop_staged()  # dropped before the round it asked for could take it (no await between)
        await c.close()
        return dropped, c.stats()["staged_bytes"]

    dropped, staged_bytes = asyncio.run(main())
    assert (dropped, staged_bytes) == (7, 0)
    table = scan(backend)
    assert numbers(table, S0.shard_id) == list(range(12))
    assert numbers(table, S1.shard_id) == list(range(100, 105))  # the 7 dropped rows never became visible



def test_two_processes_committing_one_shard_on_one_delta_version_land_one_commit(tmp_path: Path) -> None:
    """What DeltaSink's fencing rests on, between processes on the local filesystem: two commits
    of one shard's application transaction built on one table version race for the next log
    entry; every round exactly one lands and the other raises CommitConflict (delta-rs's
    conflict check after its atomic create-if-absent of the entry), one log version per round."""
    import multiprocessing

    from deltalake import DeltaTable, write_deltalake

    from tests.unit.delta_race import commit_rounds

    uri, rounds = str(tmp_path / "race"), 8
    write_deltalake(uri, pa.table({"data": ["init"]}), mode="append")
    ctx = multiprocessing.get_context("spawn")  # delta-rs's tokio runtime does not survive a fork
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=commit_rounds, args=(uri, who, rounds, barrier, results)) for who in (1, 2)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=120) for _ in range(2 * rounds))
    for p in procs:
        p.join(timeout=60)
    assert outcomes == sorted([(r, "landed") for r in range(rounds)] + [(r, "refused") for r in range(rounds)])
    assert DeltaTable(uri).version() == rounds


def test_a_round_interrupted_in_flight_stops_the_sink_instead_of_committing_past_its_rows(tmp_path: Path) -> None:
    """A round cancelled with rows 5..9 taken: no later round may record a position past them
    (before, the loop restarted and the next round committed 10..14 at position 14)."""
    backend = make_backend("iceberg", tmp_path)
    hang = False

    async def blocking(fn: Any, *args: Any) -> Any:
        if hang:
            await asyncio.Event().wait()  # an attempt that never returns
        return await asyncio.to_thread(fn, *args)

    async def main() -> None:
        nonlocal hang
        c = committer(backend, blocking=blocking)
        await c.open_shard(S0, 1)
        await stage(c, S0, 1, 0, 5)
        assert await c.flush_shard(S0, 1) == TablePosition(1, seq(4))
        hang = True
        await stage(c, S0, 1, 5, 5)
        c._event("_urgent").set()
        await until(c._in_flight, within_s=10.0, what="a commit round in flight")
        await stage(c, S0, 1, 10, 5)  # staged while 5..9 are in the round
        assert c._task is not None
        c._task.cancel()
        await until(c._task.done, within_s=10.0, what="the cancelled round's end")
        hang = False
        with pytest.raises(SinkError, match="interrupted") as stopped:
            await c.flush_shard(S0, 1)
        assert not stopped.value.retriable
        with pytest.raises(SinkError, match="interrupted"):
            await stage(c, S0, 1, 15, 1)
        with pytest.raises(SinkError, match="interrupted"):
            await c.open_shard(S1, 1)
        assert c.committed(S0, 1) == TablePosition(1, seq(4))
        await c.close(1.0)

    asyncio.run(main())
    assert numbers(scan(backend)) == list(range(5))
    assert commit_positions(backend)[0][S0].sequence_number == seq(4)
