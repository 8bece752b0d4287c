"""An IcebergSink and a DeltaSink across resharding on kinesalite (it routes writes to child shards and ends
closed shards): a split, then a merge of a child with its neighbour; the table holds every
record once, each parent's lease ends at SHARD_END, and no lease-table checkpoint is ahead of
the table's position of its shard. The lease table is on moto's DynamoDB."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kinesis_actors.broker import KinesisBroker
from kinesis_actors.config import KinesisStream
from kinesis_actors.leases.protocol import SHARD_END
from kinesis_actors.records import StartAt

from .helpers import wait_until
from .kinesalite_bench import POLL, broker_factory, create_stream, lease_store, merge, publish, split
from .test_table_sinks import check_checkpoints_behind_table, make_sink, payloads

pytestmark = [pytest.mark.kinesalite, pytest.mark.usefixtures("ray_session")]


@pytest.fixture
def make_broker(kinesalite: str, endpoint: str, unique: str) -> Iterator[Callable[..., KinesisBroker]]:
    yield from broker_factory(kinesalite, endpoint, f"leases-{unique}")


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_split_then_a_merge_write_every_record_once(kind: str, make_broker: Callable[..., KinesisBroker],
                                                      kinesalite: str, endpoint: str, unique: str,
                                                      tmp_path: Path) -> None:
    stream = f"tables-reshard-{unique}"
    create_stream(kinesalite, stream, 2)
    conn = make_broker(owner_id="a")
    sink = make_sink(kind, tmp_path, commit_interval_s=0.5)
    sub = conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), max_records=20, **POLL), sink=sink)
    sent: set[str] = set()
    for phase, reshard in (("before", None),
                           ("split", lambda: split(kinesalite, stream, "shardId-000000000000")),
                           ("merge", lambda: merge(kinesalite, stream, "shardId-000000000003", "shardId-000000000001"))):
        if reshard is not None:
            reshard()  # children 2 and 3 of shard 0; then 3 and 1 merged into 4
        sent |= {p.decode() for p in publish(conn, stream, phase, 100)}
        wanted = set(sent)
        wait_until(lambda: set(payloads(sink)) >= wanted, timeout_s=60, what=f"every record {phase}")  # noqa: B023
    got = payloads(sink)
    assert len(got) == len(set(got)) == len(sent) == 300, f"{len(got) - len(set(got))} duplicates"
    store = lease_store(endpoint, f"leases-{unique}")
    ended = {s.shard_id for s in store.list(stream) if s.checkpoint == SHARD_END}
    wait_until(lambda: {s.shard_id for s in store.list(stream) if s.checkpoint == SHARD_END}
               >= {"shardId-000000000000", "shardId-000000000001", "shardId-000000000003"},
               timeout_s=30, what=f"every parent at SHARD_END (now {ended})")
    check_checkpoints_behind_table(conn, stream, sink)
    sub.close()
    assert sink.close()["rows_committed"] == 300
