"""The shard's throughput rides the lease writes a reader makes anyway: a renewal, a checkpoint
riding that renewal, a checkpoint written at once. Each carries ``throughput_kbps`` (from the
shard's ``bytes_per_s`` once ``load_known``) in its one conditional write; the counter rises by
exactly one per write, so the figure costs no write of its own. Before a full load window the
writes carry nothing and the row keeps its figure."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kinesis_actors import InvalidError
from kinesis_actors.leases.protocol import Lease
from kinesis_actors.reader import CheckpointPacer, LeaseKeeper, ReaderSpec
from kinesis_actors.records import StartAt
from kinesis_actors.testing import InProcessLeaseStore

STREAM, SHARD = "orders", "shardId-000000000000"


class CountingStore(InProcessLeaseStore):
    """Counts the store's writes by kind (every holder write goes through renew or checkpoint here)."""

    def __init__(self, now: list[float]) -> None:
        super().__init__(clock=lambda: now[0], wall_clock=lambda: 1.7e9 + now[0])
        self.writes: list[tuple[str, float | None]] = []

    def renew(self, lease: Lease, *, duration_s: float | None = None, throughput_kbps: float | None = None) -> Lease:
        self.writes.append(("renew", throughput_kbps))
        return super().renew(lease, duration_s=duration_s, throughput_kbps=throughput_kbps)

    def checkpoint(self, lease: Lease, sequence_number: str, *, sub_sequence: int | None = None,
                   throughput_kbps: float | None = None) -> Lease:
        self.writes.append(("checkpoint", throughput_kbps))
        return super().checkpoint(lease, sequence_number, sub_sequence=sub_sequence, throughput_kbps=throughput_kbps)


class DirectIo:
    """The reader's IO seam, inline."""

    async def store(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    def note_renewal(self, latency_s: float, renew_interval_s: float) -> None:
        """No call limit here."""


def _keeper(interval_s: float | None) -> tuple[CountingStore, LeaseKeeper, CheckpointPacer, dict[str, Any]]:
    now = [1000.0]
    store = CountingStore(now)
    lease = store.take(STREAM, SHARD, owner="me", duration_s=10.0)
    assert lease is not None
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=StartAt.latest(),
                      lease_duration_s=10.0, renew_interval_s=3.0)
    stats: dict[str, Any] = {"checkpoints_written": 0}
    keeper = LeaseKeeper(spec, lease, store, DirectIo(), clock=lambda: now[0], stats=stats)  # type: ignore[arg-type]

    async def sleep_alive(seconds: float) -> None:
        now[0] += seconds

    pacer = CheckpointPacer(keeper, interval_s, clock=lambda: now[0], sleep_alive=sleep_alive, stats=stats)
    return store, keeper, pacer, stats


def _row(store: InProcessLeaseStore) -> Lease:
    row = store.get(STREAM, SHARD)
    assert row is not None
    return row


def test_before_a_full_window_a_renewal_carries_no_figure() -> None:
    store, keeper, _, stats = _keeper(None)
    stats.update(bytes_per_s=4096.0, load_known=False)
    asyncio.run(keeper.renew())
    assert store.writes == [("renew", None)] and _row(store).throughput_kbps is None


def test_a_renewal_carries_the_figure_in_its_one_write() -> None:
    store, keeper, _, stats = _keeper(None)
    before = _row(store).counter
    stats.update(bytes_per_s=2048.0, load_known=True)
    asyncio.run(keeper.renew())
    row = _row(store)
    assert store.writes == [("renew", 2.048)]
    assert row.throughput_kbps == 2.048 and row.counter == before + 1
    stats.update(load_known=False)  # a later renewal without a figure keeps the row's
    asyncio.run(keeper.renew())
    assert _row(store).throughput_kbps == 2.048


def test_a_checkpoint_riding_the_renewal_carries_the_figure_in_the_same_write() -> None:
    store, keeper, pacer, stats = _keeper(None)
    before = _row(store).counter
    stats.update(bytes_per_s=512_000.0, load_known=True)
    pacer.acknowledged("42", None)
    asyncio.run(keeper.renew())
    row = _row(store)
    assert store.writes == [("checkpoint", 512.0)]  # the renewal is the checkpoint: one write
    assert row.checkpoint == "42" and row.throughput_kbps == 512.0 and row.counter == before + 1


def test_a_checkpoint_written_at_once_carries_the_figure() -> None:
    store, _, pacer, stats = _keeper(0.0)
    stats.update(bytes_per_s=1000.0, load_known=True)
    pacer.acknowledged("7", None, partial=True)
    asyncio.run(pacer.flush())
    assert store.writes == [("checkpoint", 1.0)] and _row(store).throughput_kbps == 1.0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "12", True])
def test_a_bad_figure_is_refused_before_any_write(bad: Any) -> None:
    store = InProcessLeaseStore()
    lease = store.take(STREAM, SHARD, owner="me", duration_s=10.0)
    assert lease is not None
    with pytest.raises(InvalidError):
        store.renew(lease, throughput_kbps=bad)
    with pytest.raises(InvalidError):
        store.checkpoint(lease, "5", throughput_kbps=bad)
    assert _row(store).counter == lease.counter
