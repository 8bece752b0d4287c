"""Enhanced fan-out without Ray or network: FanOutFetcher and ShardConsumer over a fake event stream
(kinesis_actors.testing: FakeShard.open_subscription, AWS event-stream frames decoded by botocore)."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import pytest
from botocore.eventstream import EventStreamBuffer

from kinesis_actors import SHARD_END, InvalidError, KinesisStream, StartAt, StreamError
from kinesis_actors.fanout import MIN_SUBSCRIBE_SPACING_S, FanOutFetcher, parse_event_payload
from kinesis_actors.kinesis import Fetched
from kinesis_actors.reader import ByteBudget, ConsumerState, ReaderSpec, ShardConsumer
from kinesis_actors.testing import FakeClock, FakeShard, InlineIo, InProcessLeaseStore, encode_event_frame

STREAM, SHARD, ARN = "s", "shardId-000000000000", "arn:aws:kinesis:us-east-1:0:stream/s/consumer/app:1"


def fetcher(shard: FakeShard, clock: FakeClock, **kw: Any) -> FanOutFetcher:
    shard.event_interval_s = 0.0
    return FanOutFetcher(shard, STREAM, SHARD, kw.pop("start", StartAt.trim_horizon()), consumer_arn=ARN,
                         clock=clock, rng=lambda: 0.0, **kw)


def drive(f: FanOutFetcher, clock: FakeClock, steps: int) -> list[Fetched | None]:
    out = []
    for _ in range(steps):
        clock.advance(f.due_in())
        out.append(f.step())
    return out


def seqs(results: list[Fetched | None]) -> list[int]:
    return [int(r.sequence_number) for got in results if got is not None for r in got.records]


def test_fanout_needs_a_consumer_name_before_any_call() -> None:
    with pytest.raises(InvalidError, match="consumer_name"):
        KinesisStream("s", retrieval="fanout")
    with pytest.raises(InvalidError, match="retrieval"):
        KinesisStream("s", retrieval="push")
    with pytest.raises(InvalidError, match="consumer_name"):
        KinesisStream("s", retrieval="fanout", consumer_name="bad name")
    assert KinesisStream("s", retrieval="fanout", consumer_name="app-1").consumer_name == "app-1"


def test_frames_decode_with_botocore_and_payloads_become_records() -> None:
    frame = encode_event_frame({":message-type": "event", ":event-type": "SubscribeToShardEvent"},
                               b'{"Records":[{"Data":"eDA=","PartitionKey":"a","SequenceNumber":"7",'
                               b'"ApproximateArrivalTimestamp":1796125179.633}],"ContinuationSequenceNumber":"7",'
                               b'"MillisBehindLatest":0,"ChildShards":null}')
    buffer = EventStreamBuffer()
    buffer.add_data(frame)
    (message,) = list(buffer)
    event = parse_event_payload(message.payload)
    assert event.records[0].data == b"x0" and event.continuation_sequence_number == "7"
    assert event.child_shards == () and event.records[0].approximate_arrival_timestamp.year == 2026


def test_subscription_is_renewed_before_five_minutes_from_the_last_continuation() -> None:
    shard, clock = FakeShard(3), FakeClock()
    f = fetcher(shard, clock)
    got = drive(f, clock, 3)  # subscribe, confirm (the first frame is an event), that event
    assert seqs(got) == [1, 2, 3] and f.subscriptions == 1
    clock.advance(f.renew_after_s - 1)
    assert drive(f, clock, 1)[0] is not None, "still young: reads"
    clock.advance(2)
    shard.add(2)
    assert f.step() is None and not f.has_iterator and f.renewals == 1, "old: ended at the next step"
    assert f.position == StartAt.after_sequence_number("3")
    got = drive(f, clock, 3)
    assert seqs(got) == [4, 5], "renewed after the last delivered continuation: nothing lost, nothing repeated"
    assert shard.subscriptions[-1] == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "3"}
    assert f.subscriptions == 2 and len(shard.open_subscriptions) == 1


def test_a_service_ended_subscription_is_renewed_the_same_way() -> None:
    shard, clock = FakeShard(2), FakeClock()
    f = fetcher(shard, clock)
    drive(f, clock, 3)
    shard.stream_faults = ["end"]
    shard.add(1)
    assert drive(f, clock, 1) == [None] and not f.has_iterator
    assert seqs(drive(f, clock, 3)) == [3]
    assert shard.subscriptions[-1]["SequenceNumber"] == "2"


def test_resource_in_use_backs_off_then_subscribes() -> None:
    shard, clock = FakeShard(2), FakeClock()
    shard.subscribe_faults = ["ResourceInUseException", "ResourceInUseException", "LimitExceededException"]
    f = fetcher(shard, clock)
    waits = []
    for _ in range(3):
        assert f.step() is None and not f.has_iterator
        waits.append(f.due_in())
        clock.advance(f.due_in())
    assert all(w >= MIN_SUBSCRIBE_SPACING_S for w in waits) and f.throttles == 3
    assert f.step() is None and not f.has_iterator and f.subscribe_calls == 4, "HTTP 200: not yet confirmed"
    assert f.step() is None and f.has_iterator and f.subscriptions == 1, "its first frame was an event"
    assert seqs(drive(f, clock, 1)) == [1, 2]


def test_subscriptions_on_a_shard_are_never_closer_than_one_second() -> None:
    shard, clock = FakeShard(1), FakeClock()
    f = fetcher(shard, clock)
    drive(f, clock, 3)
    shard.stream_faults = ["end"]
    f.step()
    assert f.due_in() == pytest.approx(MIN_SUBSCRIBE_SPACING_S)


def test_a_missing_consumer_or_shard_is_a_stream_error() -> None:
    shard, clock = FakeShard(1), FakeClock()
    shard.subscribe_faults = ["ResourceNotFoundException"]
    with pytest.raises(StreamError):
        fetcher(shard, clock).step()


def test_an_exception_event_inside_the_subscription_resubscribes() -> None:
    shard, clock = FakeShard(2), FakeClock()
    f = fetcher(shard, clock)
    drive(f, clock, 3)
    shard.stream_faults = ["InternalFailure"]
    shard.add(1)
    assert drive(f, clock, 1) == [None] and f.drops == 1
    assert seqs(drive(f, clock, 3)) == [3]


def test_a_connection_dropped_in_the_middle_of_an_event_loses_nothing() -> None:
    shard, clock = FakeShard(2), FakeClock()
    f = fetcher(shard, clock)
    assert seqs(drive(f, clock, 3)) == [1, 2]
    shard.add(3)
    shard.stream_faults = ["drop-mid-event"]
    got = drive(f, clock, 1)
    assert got == [None] and f.drops == 1 and not f.has_iterator, "half a frame is never an event"
    assert f.position == StartAt.after_sequence_number("2")
    assert seqs(drive(f, clock, 3)) == [3, 4, 5]


def test_child_shards_mark_the_shard_end() -> None:
    shard, clock = FakeShard(4, closed=True), FakeClock()
    f = fetcher(shard, clock)
    got = drive(f, clock, 3)[-1]
    assert got is not None and got.shard_end and seqs([got]) == [1, 2, 3, 4]
    assert not f.has_iterator and not shard.open_subscriptions


def test_a_kpl_position_resubscribes_at_the_aggregate_and_skips_what_was_returned() -> None:
    shard, clock = FakeShard(3), FakeClock()
    f = fetcher(shard, clock, start=StartAt.after_sequence_number("2", 0))
    drive(f, clock, 1)
    assert shard.subscriptions[-1] == {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": "2"}


# ------------------------------------------------------------------ the read loop over fan-out
_CLOCKS: weakref.WeakKeyDictionary[ShardConsumer, FakeClock] = weakref.WeakKeyDictionary()


def make_consumer(shard: FakeShard, store: InProcessLeaseStore, deliver: Any, *, start_at: StartAt | None = None,
                  budget: ByteBudget | None = None, lease_duration_s: float = 2.0,
                  clock: FakeClock | None = None) -> ShardConsumer:
    """A fan-out consumer on a FakeClock, its calls inline; each subscription read waits
    ``shard.event_interval_s`` of fake time (the service pushing events over time)."""
    clock = clock or FakeClock()
    interval, shard.event_interval_s = shard.event_interval_s, 0.0
    lease = store.take(STREAM, SHARD, owner="me", duration_s=lease_duration_s)
    assert lease is not None
    spec = ReaderSpec(stream=STREAM, shard_id=SHARD, owner_id="me", start_at=start_at or StartAt.trim_horizon(),
                      lease_duration_s=lease_duration_s, renew_interval_s=0.2, consumer_arn=ARN)
    io = InlineIo(clock, delay_s=lambda pool, args: interval if pool == "stream" else 0.0)
    consumer = ShardConsumer(spec, lease, store, deliver, shard, budget=budget, clock=clock, sleep=clock.sleep,
                             io=io)  # type: ignore[arg-type]
    _CLOCKS[consumer] = clock
    return consumer


class Recorder:
    def __init__(self, hold_s: float = 0.0, sleep: Any = None) -> None:
        self.batches: list[list[Any]] = []
        self.hold_s = hold_s
        self.sleep = sleep

    async def __call__(self, records: list[Any]) -> None:
        if self.hold_s:
            await self.sleep(self.hold_s)
        self.batches.append(records)

    @property
    def seqs(self) -> list[int]:
        return [int(r.sequence_number) for b in self.batches for r in b]


async def until(clock: FakeClock, cond: Any, within_s: float = 5.0) -> None:
    """Drive ``clock`` in 10 ms steps until ``cond()``; AssertionError after ``within_s`` of fake time."""
    await clock.until(cond, within_s=within_s)


async def finish(clock: FakeClock, work: Any, within_s: float = 5.0) -> Any:
    """Drive ``clock`` until ``work`` is done; its result."""
    return await clock.finish(work, within_s=within_s)


async def run_until(consumer: ShardConsumer, cond: Any, timeout_s: float = 5.0) -> ConsumerState:
    clock = _CLOCKS[consumer]
    task = asyncio.create_task(consumer.run())
    await until(clock, lambda: cond() or task.done(), timeout_s)
    if not task.done():
        await finish(clock, consumer.stop())
    state: ConsumerState = await finish(clock, task)
    return state


def test_the_loop_delivers_subscribed_events_and_checkpoints_after_each_ack() -> None:
    shard, store, sink = FakeShard(20), InProcessLeaseStore(), Recorder()
    consumer = make_consumer(shard, store, sink)
    assert asyncio.run(run_until(consumer, lambda: len(sink.seqs) == 20)) == ConsumerState.CLOSED
    assert sink.seqs == list(range(1, 21)) and store.get(STREAM, SHARD).checkpoint == "20"
    assert consumer.stats["subscriptions"] == 1 and not shard.open_subscriptions, "closed on stop"


def test_a_dropped_connection_mid_batch_redelivers_nothing_and_skips_nothing() -> None:
    clock = FakeClock()
    shard, store, sink = FakeShard(5), InProcessLeaseStore(clock=clock), Recorder(hold_s=0.05, sleep=clock.sleep)
    shard.stream_faults = [None, "drop", None, "drop-mid-event"]
    consumer = make_consumer(shard, store, sink, clock=clock)

    async def scenario() -> ConsumerState:
        task = asyncio.create_task(consumer.run())
        await until(clock, lambda: len(sink.seqs) >= 5)
        shard.add(5)  # arrives while the connection drops twice
        await until(clock, lambda: len(sink.seqs) >= 10 and not shard.stream_faults
                    and consumer.stats["subscription_drops"] >= 2, within_s=15)
        await finish(clock, consumer.stop())
        state: ConsumerState = await finish(clock, task)
        return state

    assert asyncio.run(scenario()) == ConsumerState.CLOSED
    assert sink.seqs == list(range(1, 11)), "every record once, in order"
    assert consumer.stats["subscription_drops"] == 2 and store.get(STREAM, SHARD).checkpoint == "10"


def test_child_shards_write_shard_end_only_after_the_last_batch_is_acknowledged() -> None:
    clock = FakeClock()
    shard, store = FakeShard(6, closed=True), InProcessLeaseStore(clock=clock)
    checkpoints: list[str | None] = []

    async def deliver(records: list[Any]) -> None:
        await clock.sleep(0.05)
        checkpoints.append(store.get(STREAM, SHARD).checkpoint)

    consumer = make_consumer(shard, store, deliver, clock=clock)
    assert asyncio.run(run_until(consumer, lambda: False)) == ConsumerState.SHARD_ENDED
    assert checkpoints == [None], "SHARD_END was not written while the last batch was in flight"
    row = store.get(STREAM, SHARD)
    assert row.checkpoint == SHARD_END and row.owner is None


def test_a_lost_lease_ends_the_subscription_at_once_and_writes_nothing_more() -> None:
    shard, store, sink = FakeShard(5), InProcessLeaseStore(), Recorder()
    shard.event_interval_s = 0.05
    consumer = make_consumer(shard, store, sink)
    clock = _CLOCKS[consumer]

    async def scenario() -> ConsumerState:
        task = asyncio.create_task(consumer.run())
        await until(clock, lambda: consumer.lease.checkpoint == "5")
        thief = store.peer()
        row = thief.get(STREAM, SHARD)
        assert thief.rows.update(row.key, row.owner, row.counter,
                             {"lease_owner": "thief", "lease_counter": row.counter + 1}) is not None
        shard.add(5)
        state: ConsumerState = await finish(clock, task, 3.0)
        return state

    assert asyncio.run(scenario()) == ConsumerState.LOST
    assert not shard.open_subscriptions, "the subscription is closed"
    row = store.get(STREAM, SHARD)
    assert row.owner == "thief" and row.checkpoint == "5", "nothing written after the lease was lost"
    assert sink.seqs in ([1, 2, 3, 4, 5], list(range(1, 11))), "at most the batch in flight, never acknowledged"


def test_latest_is_pinned_as_a_timestamp_and_subscribes_at_latest() -> None:
    shard, store, sink = FakeShard(3), InProcessLeaseStore(), Recorder()
    consumer = make_consumer(shard, store, sink, start_at=StartAt.latest())

    async def scenario() -> ConsumerState:
        await finish(_CLOCKS[consumer], consumer.open())
        assert consumer.state is ConsumerState.PROCESSING and shard.subscriptions == [{"Type": "LATEST"}]
        shard.add(2)
        return await run_until(consumer, lambda: len(sink.seqs) == 2)

    assert asyncio.run(scenario()) == ConsumerState.CLOSED
    assert sink.seqs == [4, 5]
    assert store.get(STREAM, SHARD).start_position.startswith("AT_TIMESTAMP:")


def test_a_full_byte_budget_drops_the_subscription_and_resubscribes_after_the_last_ack() -> None:
    clock = FakeClock()
    shard, store, sink = FakeShard(4), InProcessLeaseStore(clock=clock), Recorder()
    budget = ByteBudget(1000, max_response=1000, sleep=clock.sleep)  # waits for room on the fake clock
    consumer = make_consumer(shard, store, sink, budget=budget, clock=clock)

    async def scenario() -> ConsumerState:
        task = asyncio.create_task(consumer.run())
        await until(clock, lambda: len(sink.seqs) >= 4)
        budget.used += 1000  # another shard of this process holds the whole budget
        await until(clock, lambda: consumer.stats["budget_drops"] >= 1 and not shard.open_subscriptions)  # dropped while full
        shard.add(3)
        budget.release(1000)
        await until(clock, lambda: len(sink.seqs) >= 7)
        await finish(clock, consumer.stop())
        state: ConsumerState = await finish(clock, task)
        return state

    assert asyncio.run(scenario()) == ConsumerState.CLOSED
    assert sink.seqs == list(range(1, 8))
    assert shard.subscriptions[-1] == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "4"}
    assert budget.used == 0 and budget.reserved == 0


def test_missing_credentials_are_fatal_not_retried() -> None:
    from botocore.exceptions import NoCredentialsError

    def subscribe(params: dict[str, Any]) -> Any:
        raise NoCredentialsError()

    f = FanOutFetcher(FakeShard(1), STREAM, SHARD, StartAt.trim_horizon(), consumer_arn=ARN, subscribe=subscribe)
    with pytest.raises(StreamError, match="credentials"):
        f.step()


def test_a_refused_connection_is_retried() -> None:
    def subscribe(params: dict[str, Any]) -> Any:
        raise ConnectionRefusedError("refused")

    clock = FakeClock()
    f = FanOutFetcher(FakeShard(1), STREAM, SHARD, StartAt.trim_horizon(), consumer_arn=ARN, subscribe=subscribe,
                      clock=clock, rng=lambda: 0.0)
    assert f.step() is None and f.throttles == 1 and f.due_in() >= MIN_SUBSCRIBE_SPACING_S


def test_a_refusal_in_the_first_frame_is_not_an_open_subscription() -> None:
    shard, clock = FakeShard(2), FakeClock()
    shard.refuse_in_stream = True  # kinesis-mock: HTTP 200, then ResourceInUseException as the first frame
    f = fetcher(shard, clock)
    drive(f, clock, 3)
    other = shard.open_subscriptions[0]  # a second subscriber appears while ours is open
    f.seek(StartAt.trim_horizon())
    shard.open_subscriptions.append(other)
    assert drive(f, clock, 2) == [None, None] and not f.has_iterator and f.throttles == 1
    assert f.due_in() >= MIN_SUBSCRIBE_SPACING_S
    shard.open_subscriptions.clear()
    assert seqs(drive(f, clock, 3)) == [1, 2]
