"""CoordinatorCore's lease poll without Ray: fake readers over an in-process lease table."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kinesis_actors.aws import AwsSettings
from kinesis_actors.config import KinesisStream
from kinesis_actors.coordinator import CoordinatorCore
from kinesis_actors.errors import LeaseStoreError
from kinesis_actors.reader import ConsumerState, ReaderSpec, ShardEvent
from kinesis_actors.records import StartAt
from kinesis_actors.testing import FakeClock, FakeKinesis, InProcessLeaseStore

STREAM = "s"


class OpenReader:
    """A ReaderHandle whose consumers open at once and hold their lease until closed."""

    def __init__(self, opened: dict[str, Any]) -> None:
        self.opened = opened

    async def ping(self) -> None: ...

    async def add(self, spec: ReaderSpec, lease: Any, *, lease_age_s: float | None = None) -> ShardEvent:
        self.opened[spec.shard_id] = (lease, lease_age_s)
        return ShardEvent(spec.shard_id, ConsumerState.PROCESSING.value)

    async def events(self, timeout_s: float) -> list[ShardEvent]:
        await asyncio.sleep(timeout_s)
        return []

    async def stop(self, shard_id: str | None, release: bool = True, grace_s: float = 5.0) -> None: ...

    async def seek(self, shard_id: str, position: StartAt) -> bool:
        return True

    async def stats(self) -> dict[str, Any]:
        return {"shards": {}, "reader": {}}

    async def request_handoff(self, shard_id: str, asker: str) -> bool:
        return False

    def kill(self) -> None: ...


class OneTakeFails(InProcessLeaseStore):
    """The first take of ``shard`` raises (a throttled conditional write)."""

    def __init__(self, shard: str) -> None:
        super().__init__()
        self.failing = shard

    def take(self, stream: str, shard_id: str, **kw: Any) -> Any:
        if shard_id == self.failing:
            self.failing = ""
            raise LeaseStoreError("the lease table throttled this write")
        return super().take(stream, shard_id, **kw)


async def until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def core_over(store: InProcessLeaseStore, kinesis: FakeKinesis, opened: dict[str, Any],
              **kw: Any) -> CoordinatorCore:
    return CoordinatorCore(KinesisStream(STREAM, start_at=StartAt.trim_horizon()), aws=AwsSettings(), store=store,
                           owner_id="me", lease_duration_s=5.0, renew_interval_s=1.0,
                           launcher=lambda _: OpenReader(opened), kinesis=kinesis, **kw)


def test_one_failed_take_costs_no_other_lease_of_the_poll() -> None:
    kinesis, opened = FakeKinesis(4), {}
    failing = sorted(kinesis.shards)[1]
    store = OneTakeFails(failing)

    async def scenario() -> None:
        core = core_over(store, kinesis, opened)
        await core.sync_shards()
        await core.poll_leases(deadline=asyncio.get_running_loop().time() + 5)
        others = sorted(s for s in kinesis.shards if s != failing)
        assert sorted(core.held()) == others, "the leases taken in that poll are tracked"
        assert sorted(opened) == others, "and opened"
        assert store.get(STREAM, failing) is None or store.get(STREAM, failing).owner is None
        await core.poll_leases(deadline=asyncio.get_running_loop().time() + 5)
        assert sorted(core.held()) == sorted(kinesis.shards), "the failed one is taken at the next poll"
        await core.close()

    asyncio.run(scenario())


class HandoffsFail(InProcessLeaseStore):
    """Every forced takeover raises (a throttled conditional write); takes fail while ``takes_fail``."""

    takes_fail = True

    def take(self, stream: str, shard_id: str, **kw: Any) -> Any:
        if self.takes_fail and kw.get("owner") == "me":
            raise LeaseStoreError("the lease table throttled this write")
        return super().take(stream, shard_id, **kw)

    def force_handoff(self, *args: Any, **kw: Any) -> Any:
        raise LeaseStoreError("the lease table throttled this write")


def test_a_failed_forced_takeover_costs_no_lease_taken_in_the_same_poll() -> None:
    kinesis, opened, clock = FakeKinesis(4), {}, FakeClock(follow_real=True)
    store = HandoffsFail()
    shards = sorted(kinesis.shards)
    store.heartbeat(STREAM, "other", duration_s=600.0)
    for sid in shards[:2]:
        store.take(STREAM, sid, owner="other", duration_s=600.0)
    store.request_handoff(STREAM, shards[0], owner="me", expect_counter=store.get(STREAM, shards[0]).counter)

    async def scenario() -> None:
        core = core_over(store, kinesis, opened, clock=clock)
        await core.sync_shards()
        await core.poll_leases(deadline=clock() + 5)  # notes the request; every take fails
        assert core.held() == []
        store.takes_fail = False
        clock.advance(60.0)  # past the handoff timeout: this poll forces the request, which fails
        await core.poll_leases(deadline=clock() + 5)
        assert sorted(core.held()) == shards[2:], "the free leases are taken, tracked and opened"
        assert sorted(opened) == shards[2:]
        await core.close()

    asyncio.run(scenario())


class RecordingReader(OpenReader):
    """An OpenReader that records the handoff requests passed on to it."""

    def __init__(self, opened: dict[str, Any], asked: list[tuple[str, str]]) -> None:
        super().__init__(opened)
        self.asked = asked

    async def request_handoff(self, shard_id: str, asker: str) -> bool:
        self.asked.append((shard_id, asker))
        return True


def test_the_owner_passes_a_handoff_request_on_to_the_reader_at_its_next_poll() -> None:
    kinesis, opened, asked = FakeKinesis(2), {}, []
    store = InProcessLeaseStore()
    shards = sorted(kinesis.shards)

    async def scenario() -> None:
        core = CoordinatorCore(KinesisStream(STREAM, start_at=StartAt.trim_horizon()), aws=AwsSettings(),
                               store=store, owner_id="me", lease_duration_s=5.0, renew_interval_s=1.0,
                               launcher=lambda _: RecordingReader(opened, asked), kinesis=kinesis)
        await core.sync_shards()
        await core.poll_leases(deadline=asyncio.get_running_loop().time() + 5)
        assert sorted(opened) == shards
        row = store.get(STREAM, shards[0])
        assert store.request_handoff(STREAM, shards[0], owner="thief", expect_counter=row.counter)
        await core.poll_leases()
        await core.poll_leases()  # told once per request, not at every poll
        await until(lambda: core.counters["handoffs_passed_on"] == 1, 5, "the request passed on")
        assert asked == [(shards[0], "thief")]
        await core.close()

    asyncio.run(scenario())


class HangingStore(InProcessLeaseStore):
    """Once ``hang`` is set, every write blocks until ``heal`` is set (a partitioned lease table)."""

    GATED = frozenset({"take", "release", "remove_presence", "withdraw_handoff", "heartbeat"})

    def __init__(self) -> None:
        super().__init__()
        self.hang, self.heal = threading.Event(), threading.Event()

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name not in HangingStore.GATED:
            return attr
        hang, heal = super().__getattribute__("hang"), super().__getattribute__("heal")

        def gated(*args: Any, **kw: Any) -> Any:
            if hang.is_set():
                heal.wait(120)
            return attr(*args, **kw)

        return gated


class StuckStopReader(OpenReader):
    """An OpenReader whose stop waits for the (hanging) lease table: it never returns."""

    async def stop(self, shard_id: str | None, release: bool = True, grace_s: float = 5.0) -> None:
        await asyncio.Event().wait()


def test_close_keeps_its_deadline_while_the_lease_table_hangs_and_says_what_it_left(
        caplog: pytest.LogCaptureFixture) -> None:
    kinesis, opened = FakeKinesis(4), {}
    store = HangingStore()
    shards = sorted(kinesis.shards)
    store.heartbeat(STREAM, "other", duration_s=600.0)
    for sid in shards[:3]:
        store.take(STREAM, sid, owner="other", duration_s=600.0)

    async def scenario() -> None:
        core = CoordinatorCore(KinesisStream(STREAM, start_at=StartAt.trim_horizon(), max_leases_to_steal=1),
                               aws=AwsSettings(), store=store, owner_id="me", lease_duration_s=5.0,
                               renew_interval_s=1.0, launcher=lambda _: StuckStopReader(opened), kinesis=kinesis)
        await core.start(10)
        await core.poll_leases()  # below the target with nothing free: asks "other" for one
        assert core.held() == shards[3:] and core.counters["handoffs_requested"] == 1
        store.hang.set()
        try:
            await asyncio.wait_for(core.close(timeout_s=0.5), 30)  # returns: it does not wait for the table
        finally:
            store.heal.set()
        assert core.held() == []

    with caplog.at_level(logging.WARNING, logger="kinesis_actors.coordinator"):
        asyncio.run(scenario())
    left = [r.getMessage() for r in caplog.records if "left to expire" in r.getMessage()]
    assert any("presence row" in m for m in left), left
    assert any("withdrawing handoff requests" in m for m in left), left
    assert any("reader" in m for m in left), left


def test_add_gets_the_age_of_the_lease_since_its_take_was_sent() -> None:
    kinesis, opened, clock = FakeKinesis(2), {}, FakeClock()

    class SlowTake(InProcessLeaseStore):
        def take(self, stream: str, shard_id: str, **kw: Any) -> Any:
            lease = super().take(stream, shard_id, **kw)
            clock.advance(7.0)  # the conditional write took 7 s to answer
            return lease

    async def scenario() -> None:
        core = core_over(SlowTake(), kinesis, opened, clock=clock)
        await core.sync_shards()
        await core.poll_leases(deadline=clock() + 1000)
        assert sorted(opened) == sorted(kinesis.shards)
        assert all(age is not None and age >= 7.0 for _, age in opened.values()), opened
        await core.close()

    asyncio.run(scenario())


class HandoffRequestsFail(InProcessLeaseStore):
    """Every handoff request raises (a throttled conditional write)."""

    def request_handoff(self, *args: Any, **kw: Any) -> Any:
        raise LeaseStoreError("the lease table throttled this write")


def test_a_failed_handoff_request_costs_no_lease_taken_in_the_same_poll() -> None:
    kinesis, opened = FakeKinesis(6), {}
    store = HandoffRequestsFail()
    shards = sorted(kinesis.shards)
    store.heartbeat(STREAM, "other", duration_s=600.0)
    for sid in shards[1:]:
        store.take(STREAM, sid, owner="other", duration_s=600.0)
    store.take(STREAM, shards[0], owner="me", duration_s=600.0)  # ours from before a restart

    async def scenario() -> None:
        core = core_over(store, kinesis, opened)
        await core.sync_shards()
        await core.poll_leases(deadline=asyncio.get_running_loop().time() + 5)  # takes our row, asks for more
        assert core.held() == shards[:1] and sorted(opened) == shards[:1], "our row is taken, tracked and opened"
        assert core.counters["store_errors"] >= 1 and core.counters["handoffs_requested"] == 0
        await core.close()

    asyncio.run(scenario())


class NeverReady(OpenReader):
    """An OpenReader whose actor never finishes starting (a loaded node)."""

    async def ping(self) -> None:
        await asyncio.Event().wait()


def test_no_handoff_is_asked_for_while_a_lease_already_ours_waits_for_room() -> None:
    kinesis, opened = FakeKinesis(8), {}
    store = InProcessLeaseStore()
    shards = sorted(kinesis.shards)
    store.heartbeat(STREAM, "other", duration_s=600.0)
    for sid in shards[1:]:
        store.take(STREAM, sid, owner="other", duration_s=600.0)
    store.take(STREAM, shards[0], owner="me", duration_s=600.0)  # handed over to us

    async def scenario() -> None:
        core = CoordinatorCore(KinesisStream(STREAM, start_at=StartAt.trim_horizon()), aws=AwsSettings(),
                               store=store, owner_id="me", lease_duration_s=5.0, renew_interval_s=1.0,
                               launcher=lambda _: NeverReady(opened), kinesis=kinesis)
        await core.sync_shards()
        await core.poll_leases()
        assert core.last_plan is not None and core.last_plan.steal, "the planner would move one more"
        assert core.counters["handoffs_requested"] == 0, "not while our own row has no reader to go to"
        assert core.held() == []
        await core.close(timeout_s=1.0)

    asyncio.run(scenario())


class FirstReadsThrottled(InProcessLeaseStore):
    """The first ``times`` table reads raise a retriable error (a throttled ``Scan``)."""

    def __init__(self, times: int, error: Exception | None = None) -> None:
        super().__init__()
        self.left, self.error = times, error

    def snapshot(self, stream: str) -> Any:
        if self.left:
            self.left -= 1
            raise self.error or LeaseStoreError("the lease table throttled this Scan", retriable=True)
        return super().snapshot(stream)


def test_the_first_pass_retries_a_throttled_table_read_until_its_deadline() -> None:
    kinesis, opened = FakeKinesis(2), {}
    store = FirstReadsThrottled(times=2)

    async def scenario() -> CoordinatorCore:
        core = core_over(store, kinesis, opened)
        await core.start(timeout_s=10.0)
        await core.close()
        return core

    core = asyncio.run(scenario())
    assert core.error() is None and store.left == 0
    assert sorted(opened) == sorted(kinesis.shards), "every shard opened once the read went through"


def test_the_first_pass_does_not_retry_a_store_error_that_is_not_transient() -> None:
    kinesis, opened = FakeKinesis(2), {}
    store = FirstReadsThrottled(times=1, error=LeaseStoreError("lease table 't' does not exist"))

    async def scenario() -> CoordinatorCore:
        core = core_over(store, kinesis, opened)
        await core.start(timeout_s=10.0)
        await core.wait(10.0)
        return core

    core = asyncio.run(scenario())
    assert isinstance(core.error(), LeaseStoreError) and opened == {}
