"""Hostile service behaviour without Ray or network: the fault injector, stream identity on
lease rows, the Coordinator's resharding rules, a stuck or throttled reader, control-plane
throttling, KPL records that do not verify."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import pickle
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from kinesis_actors import control_plane
from kinesis_actors import kinesis as kinesis_module
from kinesis_actors.aws import AwsSettings
from kinesis_actors.backoff import Backoff
from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator import CoordinatorCore
from kinesis_actors.errors import InvalidError, KinesisError
from kinesis_actors.kinesis import list_shards
from kinesis_actors.leases.protocol import SHARD_END
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardConsumer, ShardEvent
from kinesis_actors.records import KPL_MAGIC, StartAt, records_from_response
from kinesis_actors.testing import FakeClock, FakeKinesis, FakeShard, Fault, FaultInjector, InlineIo, InProcessLeaseStore, client_error

STREAM = "s"
NOWHERE = "http://127.0.0.1:9"  # nothing listens: an injected fault never reaches the network


# ----------------------------------------------------------------------------- fault injector
def test_fault_injector_answers_chosen_operations_and_shards(tmp_path: Path) -> None:
    faults = FaultInjector.create(tmp_path)
    kinesis = AwsSettings(endpoint=NOWHERE, test_credentials=True, faults=faults).client("kinesis", max_attempts=0)
    faults.set(Fault("GetShardIterator", error="LimitExceededException", shards=("shardId-1",)),
               Fault("ListShards", error="InternalFailure", times=2))
    with pytest.raises(ClientError) as e:
        kinesis.get_shard_iterator(StreamName=STREAM, ShardId="shardId-1", ShardIteratorType="LATEST")
    assert e.value.response["Error"]["Code"] == "LimitExceededException"
    with pytest.raises(Exception) as other:  # another shard: passes through to the (absent) network
        kinesis.get_shard_iterator(StreamName=STREAM, ShardId="shardId-2", ShardIteratorType="LATEST")
    assert not isinstance(other.value, ClientError)
    # `times` is shared by every copy of the injector (every process): two hits in all.
    twin = pickle.loads(pickle.dumps(AwsSettings(endpoint=NOWHERE, test_credentials=True, faults=faults)))
    clients = [kinesis, twin.client("kinesis", max_attempts=0)]
    codes = []
    for client in clients * 2:
        try:
            client.list_shards(StreamName=STREAM)
        except ClientError as err:
            codes.append((err.response["Error"]["Code"], err.response["ResponseMetadata"]["HTTPStatusCode"]))
        except Exception:
            codes.append(("passed through", None))
    assert codes == [("InternalFailure", 500)] * 2 + [("passed through", None)] * 2
    logged = [(c.operation, c.shard, c.fault) for c in faults.calls()]
    assert logged[:2] == [("GetShardIterator", "shardId-1", "LimitExceededException"),
                          ("GetShardIterator", "shardId-2", None)]


def test_fault_injector_hang_and_botocore_retries(tmp_path: Path) -> None:
    faults = FaultInjector.create(tmp_path)
    settings = AwsSettings(endpoint=NOWHERE, test_credentials=True, faults=faults)
    faults.set(Fault("DescribeStreamSummary", hang=True))
    with pytest.raises(ReadTimeoutError):  # a real socket read timeout (0.3 s), no retry
        settings.client("kinesis", read_timeout_s=0.3, max_attempts=0).describe_stream_summary(StreamName=STREAM)
    assert len(faults.calls("DescribeStreamSummary")) == 1, "max_attempts=0: the hung call is not retried"
    faults.set(Fault("ListShards", error="ProvisionedThroughputExceededException"))
    with pytest.raises(ClientError):
        settings.client("kinesis", max_attempts=2).list_shards(StreamName=STREAM)
    assert len(faults.calls("ListShards")) == 3, "a throttle is retried by botocore like a real one"


def test_refuse_is_an_endpoint_that_is_down_and_reaches_the_lease_store(tmp_path: Path) -> None:
    from botocore.exceptions import EndpointConnectionError

    from kinesis_actors import DynamoLeaseStore, KinesisBroker, LeaseStoreError, MemoryLeaseStore
    from kinesis_actors.testing import with_faults

    faults = FaultInjector.create(tmp_path)
    faults.set(Fault("*", service="dynamodb", refuse=True))
    dynamodb = AwsSettings(endpoint=NOWHERE, test_credentials=True, faults=faults).client("dynamodb", max_attempts=0)
    with pytest.raises(EndpointConnectionError):
        dynamodb.list_tables()
    assert [(c.service, c.operation, c.fault) for c in faults.calls()] == [("dynamodb", "ListTables", "refuse")]
    # with_faults(lease_store=True): the store's own client (in any process) carries the hooks
    broker = with_faults(KinesisBroker(endpoint=NOWHERE, test_credentials=True,
                                       lease_store=DynamoLeaseStore("leases")), faults, lease_store=True)
    store = pickle.loads(pickle.dumps(broker._lease_store.bind(broker._aws)))
    with pytest.raises(LeaseStoreError):
        store.get("s", "shardId-0")
    store_calls = [(c.service, c.operation, c.fault) for c in faults.calls()][1:]
    # one attempt: the lease table's retries live in one layer above botocore (the lease keeper, the poll)
    assert store_calls == [("dynamodb", "DescribeTable", "refuse")]
    with pytest.raises(ValueError):
        with_faults(KinesisBroker(lease_store=MemoryLeaseStore()), faults, lease_store=True)


def test_clients_without_an_injector_carry_no_hook(tmp_path: Path) -> None:
    plain = AwsSettings(endpoint=NOWHERE, test_credentials=True).client("kinesis")
    hooked = AwsSettings(endpoint=NOWHERE, test_credentials=True, faults=FaultInjector.create(tmp_path)).client("kinesis")

    def ours(client: Any) -> list[str]:
        return [k for k in client.meta.events._emitter._unique_id_handlers if str(k).startswith("ka-faults")]

    assert ours(plain) == [] and len(ours(hooked)) == 3
    assert AwsSettings(faults=None) == AwsSettings(faults=FaultInjector.create(tmp_path / "x"))  # not part of equality


# ----------------------------------------------------------------------------- stream identity on rows
def test_a_row_of_another_stream_incarnation_is_restarted_by_take() -> None:
    store = InProcessLeaseStore()
    old, new = ("arn:aws:kinesis:us-east-1:0:stream/s", 1_000), ("arn:aws:kinesis:us-east-1:0:stream/s", 9_000)
    lease = store.take(STREAM, "shardId-1", owner="a", duration_s=5, stream_identity=old, parent_shard_ids=("shardId-0",))
    assert lease.stream_identity == old
    lease = store.set_start_position(lease, "LATEST")
    store.release(store.checkpoint(lease, "123", sub_sequence=3))
    same = store.take(STREAM, "shardId-1", owner="b", duration_s=5, stream_identity=old)
    assert (same.checkpoint, same.checkpoint_sub_sequence, same.start_position) == ("123", 3, "LATEST")
    store.release(same)
    again = store.take(STREAM, "shardId-1", owner="b", duration_s=5, stream_identity=new)
    assert again.stream_identity == new
    assert (again.checkpoint, again.checkpoint_sub_sequence, again.start_position, again.parent_shard_ids) == (None, None, None, ())
    # a row written without an identity is stamped, its checkpoint kept
    legacy = store.take(STREAM, "shardId-2", owner="a", duration_s=5)
    store.release(store.checkpoint(legacy, "7"))
    stamped = store.take(STREAM, "shardId-2", owner="a", duration_s=5, stream_identity=new)
    assert stamped.checkpoint == "7" and stamped.stream_identity == new
    with pytest.raises(InvalidError):
        store.take(STREAM, "shardId-3", owner="a", duration_s=5, stream_identity=("arn", "not-ms"))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- coordinator: resharding rules
def shard(shard_id: str, *parents: str, closed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"ShardId": shard_id, "SequenceNumberRange": {"StartingSequenceNumber": "1"}}
    if closed:
        out["SequenceNumberRange"]["EndingSequenceNumber"] = "100"
    if parents:
        out["ParentShardId"] = parents[0]
    if len(parents) > 1:
        out["AdjacentParentShardId"] = parents[1]
    return out


class FakeReader:
    """A ReaderHandle whose consumers hold their lease until the test ends them (no Ray, no reading)."""

    def __init__(self, launched: dict[str, tuple[FakeReader, ReaderSpec, Any]]) -> None:
        self.launched = launched
        self.pending: list[ShardEvent] = []
        self.changed = asyncio.Event()

    async def ping(self) -> None: ...

    async def add(self, spec: ReaderSpec, lease: Any, *, lease_age_s: float | None = None) -> ShardEvent:
        self.launched[spec.shard_id] = (self, spec, lease)
        return ShardEvent(spec.shard_id, ConsumerState.PROCESSING.value)

    def end(self, shard_id: str, state: ConsumerState) -> None:
        self.pending.append(ShardEvent(shard_id, state.value))
        self.changed.set()

    async def events(self, timeout_s: float) -> list[ShardEvent]:
        if not self.pending:
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        out, self.pending = self.pending, []
        return out

    async def stop(self, shard_id: str | None, release: bool = True, grace_s: float = 5.0) -> None: ...
    async def seek(self, shard_id: str, position: StartAt) -> bool:
        return True

    async def stats(self) -> dict[str, Any]:
        return {"shards": {}, "reader": {}}

    async def request_handoff(self, shard_id: str, asker: str) -> bool:
        return False

    def kill(self) -> None: ...


def coordinator(kinesis: FakeKinesis, store: InProcessLeaseStore,
                launched: dict[str, tuple[FakeReader, ReaderSpec, Any]]) -> CoordinatorCore:
    return CoordinatorCore(KinesisStream(STREAM, start_at=StartAt.latest()), aws=AwsSettings(), store=store,
                           owner_id="me", lease_duration_s=5.0, renew_interval_s=1.0,
                           launcher=lambda _: FakeReader(launched), kinesis=kinesis)


async def poll(core: CoordinatorCore) -> None:
    """One lease poll that waits for its opens (as the first pass does)."""
    await core.poll_leases(deadline=time.monotonic() + 5)


async def finish(launched: dict[str, tuple[FakeReader, ReaderSpec, Any]], store: InProcessLeaseStore,
                 shard_id: str) -> None:
    """The shard's consumer read it to its end: SHARD_END written and released, reported."""
    reader, _, lease = launched[shard_id]
    store.release(store.checkpoint(store.renew(lease), SHARD_END))
    reader.end(shard_id, ConsumerState.SHARD_ENDED)
    await asyncio.sleep(0.05)


def test_children_wait_for_every_listed_parent_and_open_at_trim_horizon() -> None:
    created = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    kinesis = FakeKinesis(listing=[shard("P", closed=True), shard("Q", closed=True), shard("C", "P", "Q"),
                           shard("T", "gone")], created=created)
    store, launched = InProcessLeaseStore(), {}
    orphan = store.take(STREAM, "old", owner="x", duration_s=5)  # a row ListShards no longer lists
    store.release(store.checkpoint(orphan, "5"))

    async def scenario() -> None:
        core = coordinator(kinesis, store, launched)
        await core.sync_shards()
        await poll(core)
        # parents without rows are not finished: C waits; T's parent is not listed: T reads
        assert sorted(launched) == ["P", "Q", "T"]
        await finish(launched, store, "P")  # P ends; Q not yet
        await poll(core)
        assert "C" not in launched, "one parent of a merge is not enough"
        await finish(launched, store, "Q")
        await poll(core)
        assert "C" in launched and launched["C"][1].start_at == StartAt.trim_horizon(), "children at TRIM_HORIZON"
        assert "old" not in launched, "a row of an unlisted shard never starts a reader"
        row = store.get(STREAM, "C")
        assert row.parent_shard_ids == ("P", "Q")
        assert row.stream_identity == ("arn:aws:kinesis:us-east-1:0:stream/s", int(created.timestamp() * 1000))
        await core.close()

    asyncio.run(scenario())


def test_rows_of_another_incarnation_finish_no_parent_and_are_restarted() -> None:
    created = dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)
    kinesis = FakeKinesis(listing=[shard("P", closed=True), shard("C", "P")], created=created)
    store, launched = InProcessLeaseStore(), {}
    before = ("arn:aws:kinesis:us-east-1:0:stream/s", 1_000)
    for shard_id, checkpoint in (("P", SHARD_END), ("C", "4242")):
        lease = store.take(STREAM, shard_id, owner="old", duration_s=5, stream_identity=before)
        store.release(store.checkpoint(lease, checkpoint))

    async def scenario() -> None:
        core = coordinator(kinesis, store, launched)
        await core.sync_shards()
        await poll(core)
        assert sorted(launched) == ["P"], "the old SHARD_END finishes nothing; C waits for the new P"
        row = store.get(STREAM, "P")
        assert row.checkpoint is None and row.stream_identity[1] == int(created.timestamp() * 1000)
        await core.close()

    asyncio.run(scenario())


# ----------------------------------------------------------------------------- reader: stuck, throttled
def reader(fake: FakeShard, store: InProcessLeaseStore, *, lease_s: float, renew_s: float,
           start_at: StartAt | None = None, clock: FakeClock | None) -> ShardConsumer:
    """A consumer on ``clock`` (its clock and sleep; ``fake.calls`` on it too), its calls inline;
    ``clock=None``: the wall clock and real threads."""
    lease = store.take(STREAM, "shardId-0", owner="me", duration_s=lease_s)
    spec = ReaderSpec(stream=STREAM, shard_id="shardId-0", owner_id="me", start_at=start_at or StartAt.trim_horizon(),
                      lease_duration_s=lease_s, renew_interval_s=renew_s, idle_wait_s=0.01)

    async def deliver(records: list[Any]) -> None: ...

    if clock is None:
        return ShardConsumer(spec, lease, store, deliver, fake)
    fake.clock = clock
    return ShardConsumer(spec, lease, store, deliver, fake, clock=clock, sleep=clock.sleep,
                         io=InlineIo(clock))  # type: ignore[arg-type]


async def drive(clock: FakeClock, work: Any, within_s: float = 10.0) -> Any:
    """Drive ``clock`` in 10 ms steps until ``work`` is done (AssertionError after ``within_s`` of fake time)."""
    return await clock.finish(work, within_s=within_s)


def test_a_stuck_get_records_stops_renewing_and_the_reader_gives_the_lease_up() -> None:
    """The one reader test on real threads: a GetRecords call stuck inside its thread after
    it started (InlineIo has no thread to be stuck in). Its wait has a deadline; no elapsed
    time is asserted."""
    fake, store = FakeShard(), InProcessLeaseStore()
    core = reader(fake, store, lease_s=0.6, renew_s=0.1, clock=None)
    fake.faults = [None, "hang"]

    async def scenario() -> str:
        await core.open()
        try:
            outcome: str = await asyncio.wait_for(core.run(), 10)
        finally:
            fake.release.set()  # let the stuck worker thread go (the actor would simply be killed)
        return outcome

    assert asyncio.run(scenario()) == ConsumerState.LOST
    row = store.get(STREAM, "shardId-0")
    assert row.owner == "me" and row.counter == core.lease.counter, "nothing written after it went silent"


def test_long_throttling_backoff_keeps_the_lease() -> None:
    clock = FakeClock()
    fake, store = FakeShard(), InProcessLeaseStore(clock=clock)
    core = reader(fake, store, lease_s=0.5, renew_s=0.1, clock=clock)
    fake.faults = ["ProvisionedThroughputExceededException"] * 4  # waits ~0.3 + 0.6 + 1.2 + 2.4 s, > the lease

    async def scenario() -> None:
        await drive(clock, core.open())
        task = asyncio.create_task(core.run())
        end = clock() + 20
        while len(fake.calls) < 6 and not task.done():
            assert clock() < end, "6 GetRecords calls within 20 s of the fake clock"
            await clock.run_for(0.02)
        assert not task.done(), f"the reader stopped: {task.result()}"
        await drive(clock, core.stop())
        assert await drive(clock, task) == ConsumerState.CLOSED

    asyncio.run(scenario())
    gaps = [b - a for a, b in zip(fake.calls, fake.calls[1:])]
    assert gaps[1] >= 0.2 and gaps[4] < gaps[3], "backoff grew, then reset after a success"
    assert core.stats["throttles"] == 4 and store.get(STREAM, "shardId-0").owner is None  # released at stop


def test_throttled_get_shard_iterator_is_retried_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    fake, store = FakeShard(), InProcessLeaseStore(clock=clock)
    core = reader(fake, store, lease_s=2.0, renew_s=0.5, clock=clock)
    monkeypatch.setattr(kinesis_module, "backoff_s", lambda attempt, rng=None: 0.01)
    fake.iterator_faults = ["LimitExceededException"] * 12
    asyncio.run(drive(clock, core.open()))
    assert len(fake.iterator_requests) == 13 and core.stats["throttles"] == 12


def test_expired_iterator_before_any_ack_after_latest_reopens_at_the_recorded_timestamp() -> None:
    clock = FakeClock()
    fake, store = FakeShard(), InProcessLeaseStore(clock=clock)
    core = reader(fake, store, lease_s=2.0, renew_s=0.5, start_at=StartAt.latest(), clock=clock)
    fake.faults = ["ExpiredIteratorException"]

    async def scenario() -> None:
        await drive(clock, core.open())
        task = asyncio.create_task(core.run())
        end = clock() + 10
        while len(fake.iterator_requests) < 2:
            assert clock() < end, "the iterator reopened within 10 s of the fake clock"
            await clock.run_for(0.01)
        await drive(clock, core.stop())
        await drive(clock, task)

    asyncio.run(scenario())
    recorded = StartAt.parse(store.get(STREAM, "shardId-0").start_position)
    assert fake.iterator_requests[0]["ShardIteratorType"] == "LATEST"
    assert fake.iterator_requests[1] == recorded.iterator_args()


@pytest.mark.parametrize("lease_s", [0.3, 1.0, 2.0, 10.0, 60.0])
def test_every_call_times_out_within_the_lease(lease_s: float) -> None:
    spec = ReaderSpec(stream=STREAM, shard_id="shardId-0", owner_id="me", start_at=StartAt.latest(),
                      lease_duration_s=lease_s, renew_interval_s=lease_s / 4)
    assert 0 < spec.call_timeout_s < lease_s and spec.call_timeout_s <= 10.0


# ----------------------------------------------------------------------------- control plane, KPL
def test_limit_exceeded_on_list_shards_is_retried_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control_plane, "CONTROL_PLANE_BACKOFF", Backoff(base_s=0.01, cap_s=0.05))

    class Throttled:
        def __init__(self, failures: int) -> None:
            self.failures, self.calls = failures, 0

        def list_shards(self, **_: Any) -> dict[str, Any]:
            self.calls += 1
            if self.calls <= self.failures:
                raise client_error("LimitExceededException", "ListShards")
            return {"Shards": [shard("shardId-0")]}

    clock = FakeClock()  # call_with_retry's clock and sleep, on fake time
    monkeypatch.setattr(control_plane, "monotonic_s", clock)
    monkeypatch.setattr(control_plane, "time", SimpleNamespace(sleep=clock.advance))
    client = Throttled(3)
    assert [s.shard_id for s in list_shards(client, STREAM, deadline_s=10)] == ["shardId-0"] and client.calls == 4
    started = clock()
    with pytest.raises(KinesisError) as e:
        list_shards(Throttled(10_000), STREAM, deadline_s=0.5)
    assert e.value.retriable and e.value.aws_code == "LimitExceededException"
    assert clock() - started < 2.0


def test_kpl_magic_with_a_bad_checksum_or_body_is_one_plain_record() -> None:
    body = b"\x0a\x03pk0\x1a\x06\x08\x00\x1a\x02hi"  # partition key table + one user record
    good = KPL_MAGIC + body + hashlib.md5(body).digest()
    bad_digest = good[:-1] + bytes([good[-1] ^ 1])
    garbage = KPL_MAGIC + b"\xff\xff\xff" + hashlib.md5(b"\xff\xff\xff").digest()
    arrival = dt.datetime.now(dt.timezone.utc)
    raw = [{"Data": d, "PartitionKey": "p", "SequenceNumber": str(i), "ApproximateArrivalTimestamp": arrival}
           for i, d in enumerate((good, bad_digest, garbage), start=1)]
    records = records_from_response(raw, shard_id="shardId-0", stream=STREAM)
    assert [(r.sequence_number, r.sub_sequence_number, r.data, r.partition_key) for r in records] == [
        ("1", 0, b"hi", "pk0"), ("2", None, bad_digest, "p"), ("3", None, garbage, "p")]
