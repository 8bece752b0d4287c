"""IcebergSink and DeltaSink without Ray: what subscribe refuses (before any AWS call), a table and
namespace created by several processes at once, positions, and the read loop's per-lease link."""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, MemoryLeaseStore, StartAt
from kinesis_actors.errors import InvalidError, SinkError
from kinesis_actors.sinks import DeltaSink, IcebergSink
from kinesis_actors.sinks.tables import ShardKey, ShardTableLink, TableCommitter, TablePosition, check_table_sink
from kinesis_actors.sinks.tables.positions import decode_positions, encode_positions, later, resume_after
from tests.unit.table_fixtures import STREAM, iceberg_catalog, make_backend, records, rows_of, scan, seq

DURABLE = DynamoLeaseStore("app-leases", endpoint="http://127.0.0.1:9", region="us-east-1", test_credentials=True)


class _Publisher:
    def put_many(self, items: Any) -> None:
        raise AssertionError("not called")


@pytest.mark.parametrize("options, named", [
    ({"parallelization_factor": 2}, "parallelization_factor"),
    ({"bisect_on_error": True}, "bisect_on_error"),
    ({"dead_letter": _Publisher()}, "dead_letter"),
    ({"dead_letter": _Publisher(), "max_record_age_s": 60.0}, "dead_letter"),
])
def test_options_a_table_sink_refuses(options: dict[str, Any], named: str, tmp_path: Path) -> None:
    sink = IcebergSink("ka.events", catalog=iceberg_catalog(tmp_path))
    with pytest.raises(InvalidError, match=named):
        check_table_sink(KinesisStream(STREAM, **options), sink, DURABLE)


def test_max_record_age_is_refused_on_its_own_name(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "t"))
    stream = KinesisStream(STREAM, dead_letter=_Publisher(), max_record_age_s=60.0)
    object.__setattr__(stream, "dead_letter", None)  # the stream's own check wants a dead letter first
    with pytest.raises(InvalidError, match="max_record_age_s"):
        check_table_sink(stream, sink, DURABLE)


def test_a_memory_lease_store_is_refused_by_subscribe_before_any_aws_call(tmp_path: Path) -> None:
    broker = KinesisBroker(endpoint="http://127.0.0.1:9", region="us-east-1", test_credentials=True,
                           lease_store=MemoryLeaseStore())  # port 9: any AWS call would fail otherwise
    sink = IcebergSink("ka.events", catalog=iceberg_catalog(tmp_path))
    with broker.connect() as conn, pytest.raises(InvalidError, match="durable lease store"):
        conn.subscribe(KinesisStream(STREAM), sink=sink)
    assert sink.actor is None  # no committer started


def test_a_catalog_that_cannot_be_loaded_is_named(tmp_path: Path) -> None:
    missing_dir = tmp_path / "no" / "such" / "dir"
    sink = IcebergSink("ka.events", catalog={"type": "sql", "uri": f"sqlite:///{missing_dir}/c.db"})
    with pytest.raises(InvalidError, match=r"cannot load the Iceberg catalog 'default'.*unable to open"):
        check_table_sink(KinesisStream(STREAM), sink, DURABLE)
    with pytest.raises(InvalidError, match="type=nosuch"):
        IcebergSink("ka.events", catalog={"type": "nosuch"}).validate()


def test_a_missing_table_with_create_if_missing_false_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidError, match="does not exist"):
        DeltaSink(str(tmp_path / "absent"), create_if_missing=False).validate()
    with pytest.raises(InvalidError, match="does not exist"):
        IcebergSink("ka.absent", catalog=iceberg_catalog(tmp_path), create_if_missing=False).validate()


@pytest.mark.parametrize("module, make", [
    ("pyiceberg", lambda p: IcebergSink("ka.events", catalog={})),
    ("deltalake", lambda p: DeltaSink(str(p))),
])
def test_a_missing_extra_names_the_install_command(module: str, make: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(InvalidError, match=r'pip install "kinesis-actors\[tables\]"'):
        make(tmp_path)


@pytest.mark.parametrize("bad", [{"table": "no-namespace"}, {"table": "ka."}, {"commit_interval_s": 0},
                                 {"transform": "upper"}, {"catalog_name": ""}])
def test_bad_arguments(bad: dict[str, Any], tmp_path: Path) -> None:
    kw: dict[str, Any] = {"table": "ka.events", "catalog": iceberg_catalog(tmp_path), **bad}
    table = kw.pop("table")
    with pytest.raises(InvalidError):
        IcebergSink(table, **kw)


def test_a_table_sink_is_not_a_plain_sink(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="per lease"):
        DeltaSink(str(tmp_path / "t")).deliver(records("shardId-0", 0, 1))


def _create_and_commit(kind: str, tmp: str, shard: str, barrier: Any, out: Any) -> None:
    async def main() -> None:
        c = TableCommitter(make_backend(kind, Path(tmp)), commit_interval_s=3600.0)
        key = ShardKey(STREAM, shard)
        await c.open_shard(key, 1)
        await c.stage(key, 1, *rows_of(records(shard, 0, 3)))
        barrier.wait(30)  # every process creates the table and commits at once
        await c.flush_shard(key, 1, timeout_s=60.0)
        out.put((shard, c.stats()["rows_committed"]))

    try:
        asyncio.run(main())
    except BaseException as e:
        out.put((shard, repr(e)))


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_several_processes_create_the_missing_table_and_namespace_at_once(kind: str, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_create_and_commit, args=(kind, str(tmp_path), f"shardId-00{i}", barrier, out))
             for i in range(3)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(30)
    assert results == {f"shardId-00{i}": 3 for i in range(3)}
    assert sorted(scan(make_backend(kind, tmp_path)).column("shard_id").to_pylist()) == sorted(
        f"shardId-00{i}" for i in range(3) for _ in range(3))


def test_positions_round_trip_and_order() -> None:
    key = ShardKey("my.stream-1", "shardId-000000000007")
    props = encode_positions({key: TablePosition(12, seq(3), 4)}, "abc")
    assert props["kinesis-actors.commit-id"] == "abc"
    assert decode_positions({**props, "kinesis-actors.position.bad": "{", "other": "x"}) == {
        key: TablePosition(12, seq(3), 4)}
    assert later((seq(3), None), (seq(3), 4))  # the whole aggregate is after its user records
    assert later((seq(10), None), (seq(9), None)) and not later(None, (seq(1), None))
    assert later(("10", None), ("9", None))  # integers, not strings


def test_resume_after_the_table_only_when_it_is_ahead() -> None:
    ahead = TablePosition(4, seq(9))
    assert resume_after(seq(5), None, ahead) == StartAt.after_sequence_number(seq(9), None)
    assert resume_after(None, None, ahead) == StartAt.after_sequence_number(seq(9), None)
    assert resume_after(seq(9), None, ahead) is None
    assert resume_after(seq(12), None, ahead) is None
    assert resume_after("SHARD_END", None, ahead) is None
    assert resume_after(seq(5), None, TablePosition(4)) is None


def _at(checkpoint: str | None) -> Any:
    """A lease as the link reads it (its checkpoint only)."""
    return types.SimpleNamespace(checkpoint=checkpoint, checkpoint_sub_sequence=None)


def test_the_link_hands_out_committed_positions_only(tmp_path: Path) -> None:
    """The read loop's side: the checkpoint follows the table, never the acknowledgement."""
    committer = TableCommitter(make_backend("delta", tmp_path), commit_interval_s=3600.0)

    class _Local:  # the sink's per-lease calls, straight to an in-process committer
        transform = None

        async def open_shard(self, stream: str, shard_id: str, counter: int, *, timeout_s: float) -> Any:
            return await committer.open_shard(ShardKey(stream, shard_id), counter, timeout_s=timeout_s)

        async def stage(self, batch: Any, counter: int) -> Any:
            last = batch[-1]
            return await committer.stage(ShardKey(last.stream, last.shard_id), counter, *rows_of(list(batch)))

        async def flush_shard(self, stream: str, shard_id: str, counter: int, *, timeout_s: float) -> Any:
            return await committer.flush_shard(ShardKey(stream, shard_id), counter, timeout_s=timeout_s)

        async def release_shard(self, stream: str, shard_id: str, counter: int) -> int:
            return committer.release_shard(ShardKey(stream, shard_id), counter)

    async def main() -> None:
        link = ShardTableLink(_Local(), STREAM, "shardId-0", 3)  # type: ignore[arg-type]
        assert await link.open(_at(None)) is None
        await link.deliver(records("shardId-0", 0, 4))
        assert link.checkpointable() is None and not link.all_committed  # acknowledged, not committed
        assert await link.finish(shard_end=True) == (seq(3), None)
        assert link.all_committed and link.checkpointable() is None  # handed out once
        await link.deliver(records("shardId-0", 4, 2))
        await link.release()  # not committed: dropped unwritten
        again = ShardTableLink(_Local(), STREAM, "shardId-0", 4)  # type: ignore[arg-type]
        assert await again.open(_at(seq(1))) == StartAt.after_sequence_number(seq(3), None)  # the table is ahead
        assert again.table_position == TablePosition(4, seq(3))

    asyncio.run(main())
    assert sorted(scan(make_backend("delta", tmp_path)).column("sequence_number").to_pylist()) == [
        seq(i) for i in range(4)]


def test_a_catalog_error_never_shows_a_password() -> None:
    sink = IcebergSink("ka.events", catalog={"type": "sql", "uri": "postgresql+psycopg2://me:s3cret@127.0.0.1:9/db"})
    with pytest.raises(InvalidError) as failed:
        sink.validate()
    assert "s3cret" not in str(failed.value) and "uri=postgresql+psycopg2://127.0.0.1:9/db" in str(failed.value)


def test_seek_on_a_stream_written_to_a_table_is_refused(tmp_path: Path) -> None:
    from kinesis_actors.seek import SeekHandle

    sink = DeltaSink(str(tmp_path / "t"))
    state = types.SimpleNamespace(require=lambda: None,
                                  subscriptions={"orders": types.SimpleNamespace(sink=sink)})  # no _call: never reached
    with pytest.raises(InvalidError, match="not supported yet"):
        SeekHandle("orders", state).seek(StartAt.trim_horizon())  # type: ignore[arg-type]
