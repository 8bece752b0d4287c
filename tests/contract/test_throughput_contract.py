"""Every store carries a shard's throughput in its row, written with the renewal (no write of its
own): ``renew(lease, throughput_kbps=...)``; a renewal without it keeps the row's figure. In a KCL
table the figure is KCL 3.x's ``throughputKBps``."""

from __future__ import annotations

from kinesis_actors.leases.kcl_update import kcl_update
from kinesis_actors.leases.rows import COUNTER, THROUGHPUT

from .test_lease_store_contract import DURATION_S, SHARD, MakeStore, kind, make_store  # noqa: F401  (fixtures)


def test_renew_carries_the_throughput_and_a_plain_renew_keeps_it(make_store: MakeStore, unique: str) -> None:
    store = make_store()
    stream = f"tp-{unique}"
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    assert lease is not None and lease.throughput_kbps is None
    lease = store.renew(lease, throughput_kbps=512.25)
    assert lease.throughput_kbps == 512.25
    row = store.get(stream, SHARD)
    assert row is not None and row.throughput_kbps == 512.25 and row.counter == lease.counter
    lease = store.renew(lease)
    assert store.get(stream, SHARD).throughput_kbps == 512.25
    assert [r.throughput_kbps for r in store.snapshot(stream).leases] == [512.25]


def test_checkpoint_carries_the_throughput_in_its_one_write(make_store: MakeStore, unique: str) -> None:
    store = make_store()
    stream = f"tpc-{unique}"
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    assert lease is not None
    new = store.checkpoint(lease, "42", throughput_kbps=0.125)
    row = store.get(stream, SHARD)
    assert row is not None and row.checkpoint == "42" and row.throughput_kbps == 0.125
    assert new.counter == row.counter == lease.counter + 1
    store.checkpoint(new, "43")
    assert store.get(stream, SHARD).throughput_kbps == 0.125


def test_the_kcl_update_writes_throughput_kbps() -> None:
    update = kcl_update("a", 3, {COUNTER: 4, THROUGHPUT: 12.5}, (), check_owner=True,
                        to_attr=lambda v: {"N": str(v)} if isinstance(v, (int, float)) else {"S": str(v)})
    assert "throughputKBps" in update.names.values() and {"N": "12.5"} in update.values.values()
