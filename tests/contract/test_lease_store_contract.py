"""One behaviour suite for every lease store: here in-process and DynamoDB (the embedded emulator).

The contract tier starts no Ray: MemoryLeaseStore (rows in a Ray actor) runs this same
suite in tests/integration/test_memory_store_contract.py, with the Ray-task checks.
Each test gets a fresh table (a new in-process dict, or a new DynamoDB table on the
session's emulator) and unique stream names. Expiry is driven by an
injectable monotonic clock (:class:`FakeClock`), so no test sleeps for a lease to lapse.
"""

from __future__ import annotations

import math
import pickle
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kinesis_actors.aws import AwsSettings
from kinesis_actors.errors import InvalidError, LeaseLostError, LeaseStoreError
from kinesis_actors.leases import SHARD_END, DynamoLeaseStore, KclLeaseStore, Lease, LeaseStore
from kinesis_actors.testing import FakeClock, FlakyLeaseStore, InProcessLeaseStore
from tests.kcl_tables import create_kcl_table

SHARD = "shardId-000000000000"
DURATION_S = 10.0
SEQ_56 = "49590338271490256608559692538361571095921575989136588898"
assert len(SEQ_56) == 56

KINDS = ["in_process", "dynamodb", "kcl"]  # "memory": tests/integration/test_memory_store_contract.py
KCL_ONE_STREAM = "a single-stream KCL table holds one stream (tests/unit/test_kcl_rows.py covers multi-stream keys)"


MakeStore = Callable[..., Any]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_store(request: pytest.FixtureRequest, kind: str, unique: str) -> Iterator[MakeStore]:
    """``make_store(clock=None, **dynamo_kwargs)``: a store of this kind that has seen nothing.

    In-process and DynamoDB: a new, empty table each call. Memory (the integration
    module): a fresh copy over its ``memory_table`` actor (the test's unique streams are
    empty there). Use ``store.peer()`` for
    a second "host" over the same rows.
    """
    counter = iter(range(1000))

    def make(clock: Callable[[], float] | None = None, **extra: Any) -> Any:
        kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
        if kind == "in_process":
            return InProcessLeaseStore(**kwargs)
        if kind == "memory":
            return request.getfixturevalue("memory_table").peer(**kwargs)
        if kind == "kcl":  # an existing KCL application's table (KclLeaseStore never creates it)
            url = extra.get("endpoint") or request.getfixturevalue("endpoint")
            name = f"kcl-app-{unique}-{next(counter)}"
            create_kcl_table(AwsSettings(endpoint=url, region="us-east-1", test_credentials=True).client("dynamodb"),
                             name)
            return KclLeaseStore(name, endpoint=url, region="us-east-1", test_credentials=True, **kwargs).open()
        kwargs.update(create_if_missing=True, region="us-east-1", test_credentials=True)
        kwargs.update(extra)
        kwargs.setdefault("endpoint", request.getfixturevalue("endpoint"))
        return DynamoLeaseStore(f"leases-{unique}-{next(counter)}", **kwargs)

    yield make


@pytest.fixture(scope="module")
def atomic_dynamo_endpoint() -> Iterator[str]:
    """A moto server in this process whose DynamoDB operations are serialised by one lock.

    moto's threaded server applies a conditional UpdateItem without a lock: with 8
    concurrent writers about one round in ten lets two conditional writes with the same
    condition both succeed (measured on moto 5.2.5). DynamoDB itself evaluates a
    condition and writes atomically, so the race test runs against this server, which
    restores that property; the rest of the suite uses the session's emulator.
    """
    import moto.dynamodb.models as models
    from moto.server import ThreadedMotoServer

    lock = threading.RLock()
    backend = models.DynamoDBBackend
    names = ("get_item", "scan", "query", "put_item", "update_item", "delete_item",
             "transact_write_items", "batch_write_item", "create_table")
    originals = {name: backend.__dict__[name] for name in names if name in backend.__dict__}

    def serialised(func: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return func(*args, **kwargs)
        return call

    for name, func in originals.items():
        setattr(backend, name, serialised(func))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for name, func in originals.items():
            setattr(backend, name, func)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(make_store: MakeStore, clock: FakeClock) -> Any:
    return make_store(clock=clock)


@pytest.fixture
def stream() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}"


def take_expired_for(store: Any, clock: FakeClock, stream: str, shard: str = SHARD) -> None:
    """Make ``store`` see the row, then let a full lease duration pass on its clock."""
    lease = store.get(stream, shard)
    assert lease is not None
    clock.advance(lease.duration_ms / 1000.0 + 0.001)


# --------------------------------------------------------------------------- take


def test_store_satisfies_protocol(store: Any) -> None:
    assert isinstance(store, LeaseStore)


def test_take_creates_missing_row(kind: str, store: Any, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    assert isinstance(lease, Lease)
    assert (lease.stream, lease.shard_id, lease.owner, lease.counter) == (stream, SHARD, "a", 1)
    assert lease.key == f"{stream}:{SHARD}"
    assert lease.duration_ms == 10_000
    assert lease.checkpoint is None and lease.start_position is None and lease.next_owner is None
    if kind != "kcl":  # a KCL row records no expiry (KCL judges it by the counter alone)
        assert abs(lease.expiry_ms - (time.time() * 1000 + 10_000)) < 60_000
    assert store.get(stream, SHARD) == lease


def test_take_free_row_at_once(store: Any, clock: FakeClock, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    free = store.release(lease)
    other = store.peer(clock=clock)  # has never seen the row: a free row needs no wait
    taken = other.take(stream, SHARD, owner="b", duration_s=DURATION_S)
    assert taken is not None and taken.owner == "b" and taken.counter == free.counter + 1


def test_take_own_row_fences_older_lease(store: Any, stream: str) -> None:
    first = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    again = store.peer().take(stream, SHARD, owner="a", duration_s=DURATION_S)  # e.g. a replacement reader
    assert again is not None and again.owner == "a" and again.counter == first.counter + 1
    with pytest.raises(LeaseLostError):
        store.renew(first)
    assert store.get(stream, SHARD) == again


def test_take_refused_while_another_owner_is_live(store: Any, clock: FakeClock, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    b = store.peer(clock=clock)
    assert b.take(stream, SHARD, owner="b", duration_s=DURATION_S) is None
    clock.advance(DURATION_S * 0.6)
    lease = store.renew(lease)  # the holder renews: the counter moves
    clock.advance(DURATION_S * 0.6)  # 1.2 durations since b first saw the row, 0.6 since the renew
    assert b.take(stream, SHARD, owner="b", duration_s=DURATION_S) is None
    assert store.get(stream, SHARD) == lease


def test_take_expired_row(store: Any, clock: FakeClock, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    lease = store.checkpoint(lease, "42")
    b = store.peer(clock=clock)
    assert b.take(stream, SHARD, owner="b", duration_s=5.0) is None  # b notes the counter now
    clock.advance(DURATION_S)
    assert b.is_expired(lease)
    taken = b.take(stream, SHARD, owner="b", duration_s=5.0)
    assert taken is not None
    assert (taken.owner, taken.counter, taken.duration_ms, taken.checkpoint) == ("b", lease.counter + 1, 5000, "42")
    with pytest.raises(LeaseLostError):
        store.renew(lease)


def test_first_sight_waits_a_full_duration(store: Any, clock: FakeClock, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    clock.advance(DURATION_S * 5)  # long expired for the store that wrote it...
    assert store.is_expired(lease)
    newcomer = store.peer(clock=clock)  # ...but a store seeing it for the first time waits
    assert not newcomer.is_expired(newcomer.get(stream, SHARD))
    assert newcomer.take(stream, SHARD, owner="b", duration_s=DURATION_S) is None
    clock.advance(DURATION_S * 0.99)
    assert newcomer.take(stream, SHARD, owner="b", duration_s=DURATION_S) is None
    clock.advance(DURATION_S * 0.02)
    taken = newcomer.take(stream, SHARD, owner="b", duration_s=DURATION_S)
    assert taken is not None and taken.owner == "b"


def test_first_sight_with_real_clock_and_short_lease(make_store: MakeStore, stream: str) -> None:
    """No fake clock: a 0.2 s lease becomes takeable by a newcomer within a deadline."""
    holder = make_store()
    holder.take(stream, SHARD, owner="a", duration_s=0.2)
    newcomer = holder.peer()
    started = time.monotonic()
    assert newcomer.take(stream, SHARD, owner="b", duration_s=0.2) is None
    deadline = started + 5.0
    taken = None
    while taken is None and time.monotonic() < deadline:
        time.sleep(0.02)
        taken = newcomer.take(stream, SHARD, owner="b", duration_s=0.2)
    assert taken is not None and taken.owner == "b"
    assert time.monotonic() - started >= 0.2


def test_take_writes_parents_on_creation_and_clears_next_owner(store: Any, clock: FakeClock, stream: str) -> None:
    child = "shardId-000000000002"
    lease = store.take(
        stream, child, owner="a", duration_s=DURATION_S,
        parent_shard_ids=("shardId-000000000001", "shardId-000000000000"),
    )
    assert lease.parent_shard_ids == ("shardId-000000000000", "shardId-000000000001")
    assert store.request_handoff(stream, child, owner="b", expect_counter=lease.counter)
    seen = store.get(stream, child)
    assert seen.next_owner == "b" and seen.counter == lease.counter and seen.owner == "a"
    assert not store.request_handoff(stream, child, owner="c", expect_counter=lease.counter + 7)
    renewed = store.renew(lease)  # the holder is not fenced by a handoff request, and sees it
    assert renewed.next_owner == "b"
    released = store.release(renewed)
    taken = store.peer(clock=clock).take(stream, child, owner="b", duration_s=DURATION_S)
    assert taken.counter == released.counter + 1 and taken.next_owner is None
    assert taken.parent_shard_ids == lease.parent_shard_ids


# --------------------------------------------------------------------------- holder writes


def test_counter_rises_on_every_write(store: Any, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    counters = [lease.counter]
    lease = store.renew(lease)
    counters.append(lease.counter)
    lease = store.renew(lease, duration_s=2.5)
    assert lease.duration_ms == 2500
    counters.append(lease.counter)
    lease = store.checkpoint(lease, "7")
    counters.append(lease.counter)
    lease = store.set_start_position(lease, "TRIM_HORIZON")
    counters.append(lease.counter)
    lease = store.release(lease)
    counters.append(lease.counter)
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    counters.append(lease.counter)
    assert counters == list(range(1, 8))
    assert store.get(stream, SHARD).counter == 7


def test_checkpoint_and_sub_sequence(store: Any, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    lease = store.checkpoint(lease, "100", sub_sequence=3)
    assert (lease.checkpoint, lease.checkpoint_sub_sequence) == ("100", 3)
    lease = store.checkpoint(lease, "200")
    assert (lease.checkpoint, lease.checkpoint_sub_sequence) == ("200", None)
    lease = store.checkpoint(lease, SHARD_END)
    assert lease.finished
    assert store.get(stream, SHARD) == lease


def test_checkpoint_of_56_digits_round_trips(store: Any, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    lease = store.checkpoint(lease, SEQ_56, sub_sequence=0)
    assert lease.checkpoint == SEQ_56
    for seen in (store.get(stream, SHARD), store.peer().get(stream, SHARD), store.list(stream)[0]):
        assert seen.checkpoint == SEQ_56 and seen.checkpoint_sub_sequence == 0
        assert isinstance(seen.checkpoint, str)


def test_set_start_position_removes_checkpoint(store: Any, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    lease = store.checkpoint(lease, "55", sub_sequence=1)
    lease = store.set_start_position(lease, "AT_TIMESTAMP:1700000000.0")
    assert lease.start_position == "AT_TIMESTAMP:1700000000.0"
    assert lease.checkpoint is None and lease.checkpoint_sub_sequence is None
    assert store.get(stream, SHARD) == lease


def test_release_keeps_checkpoint(store: Any, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    lease = store.set_start_position(lease, "LATEST")
    lease = store.checkpoint(lease, "12345", sub_sequence=2)
    free = store.release(lease)
    assert free.owner is None and free.counter == lease.counter + 1
    assert (free.checkpoint, free.checkpoint_sub_sequence, free.start_position) == ("12345", 2, "LATEST")
    assert store.get(stream, SHARD) == free
    with pytest.raises(LeaseLostError):  # a zombie of the old holder cannot write after release
        store.checkpoint(lease, "99999")


def test_writes_after_losing_the_lease_raise_and_change_nothing(store: Any, clock: FakeClock, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    lease = store.checkpoint(lease, "10")
    take_expired_for(store, clock, stream)
    thief = store.peer(clock=clock)
    take_expired_for(thief, clock, stream)
    stolen = thief.take(stream, SHARD, owner="b", duration_s=DURATION_S)
    assert stolen is not None and stolen.owner == "b"
    before = store.get(stream, SHARD)
    attempts: list[Callable[[], Any]] = [
        lambda: store.renew(lease),
        lambda: store.renew(lease, duration_s=1.0),
        lambda: store.checkpoint(lease, "11"),
        lambda: store.checkpoint(lease, SHARD_END),
        lambda: store.set_start_position(lease, "TRIM_HORIZON"),
        lambda: store.release(lease),
    ]
    for attempt in attempts:
        with pytest.raises(LeaseLostError):
            attempt()
        assert store.get(stream, SHARD) == before
    assert before == stolen and before.checkpoint == "10"


def test_writes_to_a_missing_row_raise_lease_lost(store: Any, stream: str) -> None:
    ghost = Lease(stream=stream, shard_id=SHARD, owner="a", counter=3, duration_ms=1000)
    with pytest.raises(LeaseLostError):
        store.renew(ghost)
    with pytest.raises(LeaseLostError):
        store.release(ghost)
    assert store.get(stream, SHARD) is None


# --------------------------------------------------------------------------- streams, list


def test_same_shard_id_in_two_streams_stays_apart(kind: str, store: Any, stream: str) -> None:
    if kind == "kcl":
        pytest.skip(KCL_ONE_STREAM)
    other = stream + "-b"
    a = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    b = store.take(other, SHARD, owner="b", duration_s=DURATION_S)
    assert a is not None and b is not None and a.key != b.key
    store.checkpoint(a, "1")
    assert store.get(other, SHARD).checkpoint is None
    assert [lease.owner for lease in store.list(stream)] == ["a"]
    assert [lease.owner for lease in store.list(other)] == ["b"]


def test_list_returns_only_that_streams_shard_rows_sorted(kind: str, make_store: MakeStore, stream: str) -> None:
    if kind == "kcl":
        pytest.skip(KCL_ONE_STREAM)
    store = make_store(scan_page_size=3) if kind == "dynamodb" else make_store()
    scans = []
    if kind == "dynamodb":
        store.dynamo.client_now().meta.events.register("after-call.dynamodb.Scan", lambda **_: scans.append(1))
    shards = [f"shardId-{i:012d}" for i in range(14)]
    for shard in random.sample(shards, len(shards)):
        store.take(stream, shard, owner="a", duration_s=DURATION_S)
    for shard in shards[:4]:
        store.take(stream + "x", shard, owner="b", duration_s=DURATION_S)  # a stream sharing the prefix
    # A presence row of a later issue: same stream attribute, a key that is not a shard's.
    assert store.rows.put_new({"lease_key": f"{stream}#instance#a", "stream": stream, "lease_owner": "a",
                           "lease_counter": 1, "lease_duration_ms": 1000})
    listed = store.list(stream)
    assert [lease.shard_id for lease in listed] == shards
    assert all(lease.stream == stream and lease.owner == "a" for lease in listed)
    assert store.list(stream + "x")[0].owner == "b" and len(store.list(stream + "x")) == 4
    assert store.list(stream + "-none") == []
    if kind == "dynamodb":
        assert len(scans) >= 6  # 19 rows in pages of 3: the scan followed LastEvaluatedKey


# --------------------------------------------------------------------------- races


def _race(takers: list[Any], stream: str, owners: list[str]) -> list[Lease]:
    barrier = threading.Barrier(len(takers))
    results: list[Any] = [None] * len(takers)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = takers[i].take(stream, SHARD, owner=owners[i], duration_s=DURATION_S)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(takers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    return [r for r in results if r is not None]


def test_eight_racers_exactly_one_wins_every_round(kind: str, make_store: MakeStore, clock: FakeClock,
                                                   stream: str, request: pytest.FixtureRequest) -> None:
    if kind in ("dynamodb", "kcl"):  # see atomic_dynamo_endpoint: the emulator's moto is not atomic here
        store = make_store(clock=clock, endpoint=request.getfixturevalue("atomic_dynamo_endpoint"))
    else:
        store = make_store(clock=clock)
    racers = [store.peer(clock=clock) for _ in range(8)]
    owners = [f"racer-{i}" for i in range(8)]
    winners = _race(racers, stream, owners)  # round 0: the row does not exist yet
    assert len(winners) == 1 and winners[0].counter == 1
    last = winners[0]
    for _ in range(5):
        for racer in racers:  # every racer sees the current row...
            racer.get(stream, SHARD)
        clock.advance(DURATION_S + 0.001)  # ...and it expires for all of them
        holder = last.owner
        winners = _race(racers, stream, [f"{o}-{uuid.uuid4().hex[:4]}" for o in owners])  # none holds it
        assert len(winners) == 1, winners
        assert winners[0].counter == last.counter + 1 and winners[0].owner != holder
        assert store.get(stream, SHARD) == winners[0]
        last = winners[0]


# --------------------------------------------------------------------------- bad input


BAD_CALLS: list[tuple[str, Callable[[Any, str, Lease], Any]]] = [
    ("empty owner", lambda s, st, lease: s.take(st, SHARD, owner="", duration_s=1.0)),
    ("blank owner", lambda s, st, lease: s.take(st, SHARD, owner="  ", duration_s=1.0)),
    ("empty stream", lambda s, st, lease: s.take("", SHARD, owner="a", duration_s=1.0)),
    ("empty shard", lambda s, st, lease: s.take(st, "", owner="a", duration_s=1.0)),
    ("zero duration", lambda s, st, lease: s.take(st, SHARD, owner="a", duration_s=0)),
    ("negative duration", lambda s, st, lease: s.take(st, SHARD, owner="a", duration_s=-1.0)),
    ("nan duration", lambda s, st, lease: s.take(st, SHARD, owner="a", duration_s=math.nan)),
    ("inf duration", lambda s, st, lease: s.take(st, SHARD, owner="a", duration_s=math.inf)),
    ("string duration", lambda s, st, lease: s.take(st, SHARD, owner="a", duration_s="10")),
    ("renew duration", lambda s, st, lease: s.renew(lease, duration_s=0.0)),
    ("checkpoint text", lambda s, st, lease: s.checkpoint(lease, "abc")),
    ("checkpoint empty", lambda s, st, lease: s.checkpoint(lease, "")),
    ("checkpoint int", lambda s, st, lease: s.checkpoint(lease, 123)),
    ("checkpoint negative", lambda s, st, lease: s.checkpoint(lease, "-5")),
    ("sub_sequence", lambda s, st, lease: s.checkpoint(lease, "5", sub_sequence=-1)),
    ("renew free lease", lambda s, st, lease: s.renew(Lease(st, SHARD, None, lease.counter))),
    ("release free lease", lambda s, st, lease: s.release(Lease(st, SHARD, None, lease.counter))),
    ("empty position", lambda s, st, lease: s.set_start_position(lease, "")),
    ("get empty stream", lambda s, st, lease: s.get("", SHARD)),
    ("list empty stream", lambda s, st, lease: s.list("")),
    ("parents as a string", lambda s, st, lease: s.take(st, "shardId-9", owner="a", duration_s=1.0,
                                                    parent_shard_ids="shardId-1")),
    ("stream with colon", lambda s, st, lease: s.take("a:b", SHARD, owner="a", duration_s=1.0)),
]


@pytest.mark.parametrize("what,call", BAD_CALLS, ids=[w for w, _ in BAD_CALLS])
def test_bad_input_is_invalid(store: Any, stream: str, what: str, call: Callable[..., Any]) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    with pytest.raises(InvalidError):
        call(store, stream, lease)
    assert store.get(stream, SHARD) == lease  # nothing changed


def test_bad_input_is_refused_before_any_io() -> None:
    """A store that cannot reach anything still reports bad input as InvalidError."""
    store = DynamoLeaseStore("leases-unreachable", endpoint="http://127.0.0.1:9", region="us-east-1",
                             test_credentials=True)
    lease = Lease("orders", SHARD, "a", 1, duration_ms=1000)
    for _, call in BAD_CALLS:
        with pytest.raises(InvalidError):
            call(store, "orders", lease)
    assert store.dynamo.client is None  # not even a client was built


# --------------------------------------------------------------------------- pickling


def test_pickle_round_trip(kind: str, store: Any, stream: str) -> None:
    lease = store.take(stream, SHARD, owner="a", duration_s=DURATION_S)
    lease = store.checkpoint(lease, "77")
    copy = pickle.loads(pickle.dumps(store))
    assert type(copy) is type(store)
    assert copy.get(stream, SHARD) == lease
    assert copy.take(stream, SHARD, owner="b", duration_s=DURATION_S) is None  # fresh observations: waits
    if kind == "in_process":
        return  # an in-process store's copy is a snapshot
    lease = copy.renew(lease)  # the copy reaches the same rows
    assert store.get(stream, SHARD) == lease


# --------------------------------------------------------------------------- DynamoDB specifics


def _dynamo(table: str, endpoint: str, **kwargs: Any) -> DynamoLeaseStore:
    return DynamoLeaseStore(table, endpoint=endpoint, region="us-east-1", test_credentials=True, **kwargs)


def test_dynamo_three_stores_create_the_same_table_at_once(endpoint: str, unique: str, stream: str) -> None:
    table = f"leases-{unique}-shared"
    stores = [_dynamo(table, endpoint, create_if_missing=True) for _ in range(3)]
    results: list[Any] = [None] * 3
    barrier = threading.Barrier(3)

    def run(i: int) -> None:
        barrier.wait(timeout=10)
        try:
            results[i] = stores[i].take(stream, f"shardId-{i:012d}", owner=f"o{i}", duration_s=DURATION_S)
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(isinstance(r, Lease) for r in results), results
    assert [lease.owner for lease in stores[0].list(stream)] == ["o0", "o1", "o2"]


def test_dynamo_missing_table_names_it(endpoint: str, unique: str) -> None:
    table = f"leases-{unique}-missing"
    store = _dynamo(table, endpoint)
    with pytest.raises(LeaseStoreError, match=table) as info:
        store.get("orders", SHARD)
    assert info.value.aws_code == "ResourceNotFoundException"
    assert info.value.__cause__ is not None
    with pytest.raises(LeaseStoreError, match=table):
        store.take("orders", SHARD, owner="a", duration_s=1.0)


def test_dynamo_constructor_does_no_io_and_validates_the_name() -> None:
    store = DynamoLeaseStore("app-leases", create_if_missing=True, endpoint="http://127.0.0.1:9",
                             region="us-east-1", test_credentials=True)
    assert store.dynamo.client is None
    assert repr(store) == "DynamoLeaseStore(table='app-leases', endpoint='http://127.0.0.1:9')"
    assert "testing" not in repr(store)
    for bad in ("ab", "", "a" * 256, "bad name", "bad/name", None, 12):
        with pytest.raises(InvalidError):
            DynamoLeaseStore(bad)  # type: ignore[arg-type]
    DynamoLeaseStore("a" * 255)
    DynamoLeaseStore("a-b_c.d")


def test_dynamo_unreachable_endpoint_is_retriable(unique: str) -> None:
    settings = AwsSettings(endpoint="http://127.0.0.1:9", region="us-east-1", test_credentials=True,
                           connect_timeout_s=0.5, read_timeout_s=0.5, max_attempts=1)
    store = DynamoLeaseStore(f"leases-{unique}").bind(settings)
    with pytest.raises(LeaseStoreError) as info:
        store.get("orders", SHARD)
    assert info.value.retriable and info.value.__cause__ is not None


def test_dynamo_bind_inherits_only_unset_settings(endpoint: str, unique: str, stream: str) -> None:
    broker = AwsSettings(endpoint=endpoint, region="us-east-1", test_credentials=True)
    bare = DynamoLeaseStore(f"leases-{unique}", create_if_missing=True)
    bound = bare.bind(broker)
    assert bare.endpoint is None and bound.endpoint == endpoint
    assert bound.settings().test_credentials and bound.settings().region == "us-east-1"
    assert bound.take(stream, SHARD, owner="a", duration_s=1.0) is not None
    explicit = DynamoLeaseStore("other-table", endpoint="http://127.0.0.1:9", region="eu-west-1",
                                test_credentials=False).bind(broker)
    settings = explicit.settings()
    assert (settings.endpoint, settings.region, settings.test_credentials) == (
        "http://127.0.0.1:9", "eu-west-1", False)
    copy = pickle.loads(pickle.dumps(bound))
    assert copy.get(stream, SHARD).owner == "a"


def test_dynamo_with_a_boto3_session(endpoint: str, unique: str, stream: str) -> None:
    import boto3

    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                            region_name="us-east-1")
    store = DynamoLeaseStore(f"leases-{unique}", create_if_missing=True, endpoint=endpoint, session=session)
    assert store.settings().region == "us-east-1" and not store.settings().test_credentials
    assert store.take(stream, SHARD, owner="a", duration_s=1.0) is not None
    copy = pickle.loads(pickle.dumps(store))  # the Session is frozen into plain credentials
    assert copy.get(stream, SHARD).owner == "a"
    assert "testing" not in repr(copy)


# --------------------------------------------------------------------------- testing helpers


def test_flaky_store_fails_the_nth_call() -> None:
    inner = InProcessLeaseStore()
    flaky = FlakyLeaseStore(inner, "renew", nth=2, times=2)
    lease = flaky.take("s", SHARD, owner="a", duration_s=1.0)
    lease = flaky.renew(lease)
    for _ in range(2):
        with pytest.raises(LeaseStoreError) as info:
            flaky.renew(lease)
        assert info.value.retriable
    assert inner.get("s", SHARD) == lease  # "before": nothing reached the store
    assert flaky.renew(lease).counter == lease.counter + 1
    assert (flaky.calls, flaky.failures) == (4, 2)
    after = FlakyLeaseStore(inner, "checkpoint", exception=TimeoutError, when="after")
    current = inner.get("s", SHARD)
    with pytest.raises(TimeoutError):
        after.checkpoint(current, "5")
    assert inner.get("s", SHARD).checkpoint == "5"  # "after": the write happened
    copy = pickle.loads(pickle.dumps(FlakyLeaseStore(inner, "renew", nth=3)))
    assert copy.get("s", SHARD).checkpoint == "5" and copy.calls == 0
