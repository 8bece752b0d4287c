"""Instances share a stream fairly: balancing, graceful handoff and presence, on Ray and the emulator.

Every instance is a broker with its own owner id over one DynamoDB lease table. A
feeder thread publishes numbered records to every shard (explicit hash keys) the whole
time, into one Collector sink, so each test can check that no record was delivered
twice (a planned move is a handoff after a checkpoint) and none is missing.

Timings are short: leases of 4 s renewed every 0.5 s, the table read every 0.3 s. (2 s
leases are too tight on a loaded 2-core machine: Ray workers run niced, and a reader
starved for 2 s loses its lease to an expiry, which is correct but is not a handoff.)

The join test uses ``KA_BALANCING_SHARDS`` shards (default 6, so that it stays under a
minute on 2 shared cores: every move starts a new ShardReader actor, about two at a
time); ``KA_BALANCING_SHARDS=12`` runs the full 12-shard scenario (4 +- 1 each).
``KA_TRACE=1`` prints the lease counts each time the test checks them.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray

from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream, StartAt

from .helpers import Collector, create_stream, kinesis_client, wait_until

pytestmark = pytest.mark.usefixtures("ray_session")

LEASE_S, RENEW_S, POLL_S = 4.0, 0.5, 0.3
JOIN_SHARDS = int(os.environ.get("KA_BALANCING_SHARDS", "6"))
FAST = dict(lease_duration_s=LEASE_S, renew_interval_s=RENEW_S)


def stream_config(name: str, **kwargs: Any) -> KinesisStream:
    options = dict(start_at=StartAt.trim_horizon(), lease_poll_interval_s=POLL_S, shard_sync_interval_s=5.0,
                   idle_wait_s=1.0, max_records=200, **kwargs)
    return KinesisStream(name, **options)


@pytest.fixture
def make_broker(endpoint: str) -> Iterator[Callable[..., KinesisBroker]]:
    """Connected brokers on the emulator with short lease timings; all shut down afterwards."""
    brokers: list[KinesisBroker] = []

    def make(table: str, owner_id: str, **store_kwargs: Any) -> KinesisBroker:
        store = DynamoLeaseStore(table, create_if_missing=True, **store_kwargs)
        broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True, lease_store=store,
                               owner_id=owner_id, **FAST).connect()
        brokers.append(broker)
        return broker

    yield make
    for broker in brokers:
        broker.shutdown()


class Feeder(threading.Thread):
    """Publishes one numbered record to every shard every ``period_s`` until stopped."""

    def __init__(self, broker: KinesisBroker, endpoint: str, stream: str, prefix: str, period_s: float = 0.5) -> None:
        super().__init__(name=f"feeder-{stream}", daemon=True)
        shards = kinesis_client(endpoint).list_shards(StreamName=stream)["Shards"]
        self.hash_keys = [s["HashKeyRange"]["StartingHashKey"] for s in shards]
        self.publisher = broker.publisher(stream)
        self.prefix = prefix
        self.period_s = period_s
        self.sent: list[bytes] = []
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        n = 0
        try:
            while not self._stop_event.is_set():
                batch = [(f"{self.prefix}-{n + i:06d}".encode(), "k", key) for i, key in enumerate(self.hash_keys)]
                self.publisher.put_many(batch)
                self.sent.extend(data for data, _, _ in batch)
                n += len(batch)
                self._stop_event.wait(self.period_s)
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self) -> list[bytes]:
        self._stop_event.set()
        self.join(timeout=10)
        if self.error is not None:
            raise self.error
        return list(self.sent)


def owners(broker: KinesisBroker, stream: str) -> dict[str, str | None]:
    return {lease.shard_id: lease.owner for lease in broker.lease_store.list(stream)}


def counts(broker: KinesisBroker, stream: str, names: list[str]) -> dict[str, int]:
    held = collections.Counter(owners(broker, stream).values())
    return {name: held.get(name, 0) for name in names}


T0 = time.monotonic()


def balanced(broker: KinesisBroker, stream: str, names: list[str], shards: int, subs: dict[str, Any]) -> bool:
    """Settled: lease counts differ by at most one, no handoff is pending, and every instance
    runs a reader for each row it owns."""
    rows = broker.lease_store.list(stream)
    if os.environ.get("KA_TRACE"):
        print(f"{time.monotonic() - T0:7.2f} table={dict(collections.Counter(r.owner for r in rows))} "
              f"pending={sum(1 for r in rows if r.next_owner)} held={ {n: len(subs[n]._call('held')) for n in names} }")
    if any(row.next_owner for row in rows):
        return False
    held = collections.Counter(row.owner for row in rows)
    table = {name: held.get(name, 0) for name in names}
    if sum(table.values()) != shards or max(table.values()) - min(table.values()) > 1:
        return False
    return all(len(subs[name]._call("held")) == table[name] for name in names)


def delivered(sink: Any) -> list[bytes]:
    return ray.get(sink.payloads.remote())


def assert_exactly_once(sink: Any, sent: list[bytes], *, timeout_s: float = 20.0) -> None:
    wait_until(lambda: set(delivered(sink)) >= set(sent), timeout_s=timeout_s, what="every published record")
    got = collections.Counter(delivered(sink))
    dups = {d: n for d, n in got.items() if n > 1}
    assert not dups, f"{len(dups)} records delivered more than once, e.g. {sorted(dups)[:5]}"


def watch_takeover(broker: KinesisBroker, stream: str, shards: set[str], victim: str,
                   killed: float) -> tuple[float, dict[str, float]]:
    """Wait until every shard of ``victim`` (just killed) is taken by another instance.

    Returns the seconds from the kill to the last take, and per shard the seconds from the
    victim's last write (its readers die with its Coordinator a moment after the kill)
    to the take: what lease expiry governs."""
    last_write: dict[str, tuple[int, float]] = {}
    taken_at: dict[str, float] = {}

    def all_taken() -> bool:
        now = time.monotonic()
        for lease in broker.lease_store.list(stream):
            sid = lease.shard_id
            if sid not in shards or sid in taken_at:
                continue
            if lease.owner == victim:
                if last_write.get(sid, (None, 0.0))[0] != lease.counter:
                    last_write[sid] = (lease.counter, now)
            else:
                taken_at[sid] = now
        return len(taken_at) == len(shards)

    wait_until(all_taken, timeout_s=20, interval_s=0.05, what=f"{victim}'s shards taken")
    idle = {sid: taken_at[sid] - last_write.get(sid, (None, killed))[1] for sid in shards}
    return max(taken_at.values()) - killed, idle


def handoff_counters(subs: dict[str, Any]) -> dict[str, dict[str, int]]:
    keys = ("handoffs_requested", "handoffs_received", "handoffs_forced", "leases_handed_over", "leases_lost",
            "leases_taken")
    out = {}
    for name, sub in subs.items():
        stats = sub.stats()
        out[name] = {k: stats[k] for k in keys}
    return out


# ----------------------------------------------------------------------------- join, settle, close
def test_instances_join_converge_by_handoff_and_stay_put(
    make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str
) -> None:
    """N shards (12: A alone, then B: 6/6, then C: 4/4/4), each move a handoff; stable; C closes."""
    stream, table, n_shards = f"bal-{unique}", f"leases-{unique}", JOIN_SHARDS
    create_stream(endpoint, stream, n_shards)
    sink = Collector.remote()
    t0 = time.monotonic()
    a = make_broker(table, "a")
    subs = {"a": a.subscribe(stream_config(stream, max_leases_to_steal=2), sink=sink)}
    assert len(subs["a"]._call("held")) == n_shards
    timings: dict[str, float] = {"a_alone_s": time.monotonic() - t0}
    feeder = Feeder(a, endpoint, stream, "r")
    feeder.start()

    for name, names in (("b", ["a", "b"]), ("c", ["a", "b", "c"])):
        broker = make_broker(table, name)
        started = time.monotonic()
        subs[name] = broker.subscribe(stream_config(stream, max_leases_to_steal=2), sink=sink)
        wait_until(lambda names=names: balanced(a, stream, names, n_shards, subs), timeout_s=20, interval_s=0.1,
                   what=f"{'/'.join(names)} balanced")
        timings[f"join_{name}_s"] = time.monotonic() - started

    # Balanced: nothing moves during the next 10 lease-poll intervals.
    settled = owners(a, stream)
    before = handoff_counters(subs)
    deadline = time.monotonic() + 10 * POLL_S
    while time.monotonic() < deadline:
        assert owners(a, stream) == settled, "a lease moved although nothing changed"
        time.sleep(POLL_S / 3)
    assert handoff_counters(subs) == before

    assert_exactly_once(sink, list(feeder.sent))
    moves = handoff_counters(subs)
    requested = sum(c["handoffs_requested"] for c in moves.values())
    handed = sum(c["leases_handed_over"] for c in moves.values())
    received = sum(c["handoffs_received"] for c in moves.values())
    assert handed == received == requested, moves
    assert all(c["handoffs_forced"] == 0 and c["leases_lost"] == 0 for c in moves.values()), moves
    fewest = n_shards // 2 + n_shards // 3  # a -> b, then (a, b) -> c: 10 moves for 12 shards
    assert fewest <= handed <= fewest + 2, f"{handed} moves; {fewest} at best: {moves}"

    # C closes: its shards go to A and B at once (released), then A and B even out by handoff.
    started = time.monotonic()
    subs.pop("c").close()
    wait_until(lambda: balanced(a, stream, ["a", "b"], n_shards, subs), timeout_s=20, what="a/b balanced after c closed")
    timings["close_c_s"] = time.monotonic() - started
    sent = feeder.stop()
    assert_exactly_once(sink, sent)
    after = handoff_counters(subs)
    assert all(c["handoffs_forced"] == 0 and c["leases_lost"] == 0 for c in after.values()), after
    assert [i.owner for i in a.lease_store.instances(stream)] == ["a", "b"], "c deleted its presence row"
    timings["total_s"] = time.monotonic() - t0
    print(f"\nbalancing {n_shards} shards: timings {({k: round(v, 1) for k, v in timings.items()})}; "
          f"join moves {handed} (fewest {fewest}); after c closed: "
          f"{ {k: (v['handoffs_received'], v['leases_taken']) for k, v in after.items()} } (handoffs received, takes); "
          f"records {len(sent)}, duplicates 0")
    for sub in subs.values():
        sub.close()


# ----------------------------------------------------------------------------- crash
def test_killed_instance_shards_are_taken_after_expiry(
    make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str
) -> None:
    """6 shards: C holds 2, A 3 and B 1; C crashes: A and B take its shards once they expire.

    (No stealing here, to keep it short: C, then A, take free leases up to their
    ``max_leases``; B takes the rest. Balancing by handoff is the join test's subject.)"""
    stream, table, n_shards = f"kill-{unique}", f"leases-{unique}", 6
    create_stream(endpoint, stream, n_shards)
    sink = Collector.remote()
    brokers = {name: make_broker(table, name) for name in ("c", "a", "b")}
    subs = {}
    for name, limit in (("c", 2), ("a", 3), ("b", None)):
        subs[name] = brokers[name].subscribe(stream_config(stream, max_leases=limit, max_leases_to_steal=0), sink=sink)
    table_of = brokers["a"]
    wait_until(lambda: all(o in ("a", "b", "c") for o in owners(table_of, stream).values())
               and sum(len(s._call("held")) for s in subs.values()) == n_shards, timeout_s=20, what="every shard read")
    feeder = Feeder(table_of, endpoint, stream, "kill")
    feeder.start()
    wait_until(lambda: len(delivered(sink)) >= 2 * n_shards, timeout_s=10, what="records flowing")
    c_shards = {sid for sid, owner in owners(table_of, stream).items() if owner == "c"}
    assert len(c_shards) == 2
    killed = time.monotonic()
    subs.pop("c").abort()
    taken_after, idle = watch_takeover(table_of, stream, c_shards, "c", killed)
    for sid, seconds in idle.items():
        assert seconds >= LEASE_S * 0.9, f"{sid} taken {seconds:.2f} s after c's last write: before the lease expired"
        assert seconds <= LEASE_S + 4 * POLL_S + 3.0, f"{sid} taken only {seconds:.2f} s after c's last write"
    sent = feeder.stop()
    # At-least-once: c's unacknowledged batches may come again; nothing is lost.
    wait_until(lambda: set(delivered(sink)) >= set(sent), timeout_s=20, what="every published record")
    print(f"\nkilled c: its {len(c_shards)} shards taken {taken_after:.2f} s after the kill, "
          f"{min(idle.values()):.2f}-{max(idle.values()):.2f} s after c's last write")
    for sub in subs.values():
        sub.close()


# ----------------------------------------------------------------------------- clock skew
def test_skewed_wall_clocks_never_take_a_live_lease_and_take_a_dead_one(
    make_broker: Callable[..., KinesisBroker], endpoint: str, unique: str
) -> None:
    """B's wall clock is 2 x lease_duration_s ahead, C's behind: expiry never reads a wall clock."""
    stream, table, n_shards = f"skew-{unique}", f"leases-{unique}", 2
    create_stream(endpoint, stream, n_shards)
    sink = Collector.remote()
    a = make_broker(table, "a")
    sub_a = a.subscribe(stream_config(stream), sink=sink)
    assert len(sub_a._call("held")) == n_shards
    skew = 2 * LEASE_S
    b = make_broker(table, "b", wall_clock=lambda: time.time() + skew)
    c = make_broker(table, "c", wall_clock=lambda: time.time() - skew)
    # No stealing: B and C could only take A's leases by judging them expired.
    sub_b = b.subscribe(stream_config(stream, max_leases_to_steal=0), sink=sink)
    sub_c = c.subscribe(stream_config(stream, max_leases_to_steal=0), sink=sink)
    deadline = time.monotonic() + 1.5 * LEASE_S  # a wall-clock judge would have taken them at once
    while time.monotonic() < deadline:
        assert set(owners(a, stream).values()) == {"a"}, "a live lease was taken"
        time.sleep(POLL_S)
    killed = time.monotonic()
    sub_a.abort()
    _, idle = watch_takeover(a, stream, set(owners(a, stream)), "a", killed)
    for sid, seconds in idle.items():  # in time, judged on the takers' own clocks
        assert LEASE_S * 0.9 <= seconds <= LEASE_S + 4 * POLL_S + 3.0, (sid, seconds)
    rows = a.lease_store.list(stream)
    skewed = {r.owner: r.expiry_ms for r in rows}
    now_ms = time.time() * 1000
    for owner, sign in (("b", 1), ("c", -1)):
        if owner in skewed:  # the informational lease_expiry carries the taker's wall clock
            assert abs(skewed[owner] - (now_ms + sign * skew * 1000)) < 3 * LEASE_S * 1000
    sub_b.close()
    sub_c.close()
