"""min_checkpoint_interval_s on real Ray actors and the emulator's DynamoDB: fewer checkpoint writes
while reading, the last acknowledged record checkpointed on close, nothing lost or repeated after;
by default the checkpoint is written with a lease renewal while reading."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt

from .helpers import drain, wait_until
from .test_consume import POLL, make_broker  # noqa: F401 - the fixture: connected brokers, shut down afterwards

pytestmark = pytest.mark.usefixtures("ray_session")


def test_min_checkpoint_interval_writes_fewer_checkpoints_and_loses_nothing(
        make_broker: Callable[..., KinesisBroker], unique: str) -> None:
    stream, table = f"ckint-{unique}", f"ckint-{unique}-leases"
    conn = make_broker(lease_store=DynamoLeaseStore(table, create_if_missing=True), owner_id="a")
    sub = conn.subscribe(KinesisStream(stream, create_if_missing=1, start_at=StartAt.trim_horizon(),
                                       min_checkpoint_interval_s=600.0, **POLL))
    delivered: list[Any] = []
    for chunk in range(5):  # five separate batches
        conn.publisher(stream).put_many([(f"first-{chunk}-{i}".encode(), "k") for i in range(10)])
        delivered += drain(sub, 10)
    sub.ack()
    shard = delivered[-1].shard_id
    wait_until(lambda: sub.stats()["shards"][shard]["batches"] >= 5, timeout_s=30, what="five acknowledged batches")
    figures = sub.stats()["shards"][shard]
    assert figures["checkpoints_written"] == 1, f"one write within the interval, not one per batch: {figures}"
    stored = conn.lease_store.get(stream, shard)
    first_ten = [r.sequence_number for r in delivered[:10]]
    assert stored is not None and stored.checkpoint in first_ten, "only the first batch was checkpointed"
    sub.close()
    closed = conn.lease_store.get(stream, shard)
    assert closed is not None and closed.owner is None
    assert closed.checkpoint == delivered[-1].sequence_number, "close writes the last acknowledged record"
    conn.shutdown()

    again = make_broker(lease_store=DynamoLeaseStore(table), owner_id="b")
    again.publisher(stream).put_many([(f"second-{i}".encode(), "k") for i in range(7)])
    sub2 = again.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), **POLL))
    got = drain(sub2, 7)
    assert [r.data for r in got] == [f"second-{i}".encode() for i in range(7)], "resumed after the last one"
    assert sub2.next_batch(timeout_s=1.0) == []
    # the default (min_checkpoint_interval_s=None): the acknowledged position rides the next
    # renewal (renew_interval_s=0.5 here), written while the subscription runs, before any close
    sub2.ack()
    last = got[-1]
    store = again.lease_store

    def stored() -> str | None:
        row = store.get(stream, last.shard_id)
        return None if row is None else row.checkpoint

    wait_until(lambda: stored() == last.sequence_number, timeout_s=10, what="the checkpoint written with a renewal")
    sub2.close()
