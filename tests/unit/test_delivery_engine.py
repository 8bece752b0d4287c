"""DeliveryEngine without Ray: retries, partial acknowledgements, bisection, record age, filter, dead letters."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kinesis_actors import PartialBatchError, SinkError
from kinesis_actors.delivery import DeadLetterWriter, DeliveryEngine, DeliveryOptions, partial_failed_from

from .delivery_fakes import SHARD, T0, Publisher, Sink, Sleeps, rec, recs


def make(sink: Any, *, dlq: Publisher | None = None, now: float = T0, stats: dict[str, Any] | None = None,
         **options: Any) -> tuple[DeliveryEngine, Sleeps, dict[str, Any]]:
    sleeps, stats = Sleeps(), stats if stats is not None else {}
    opts = DeliveryOptions(dead_letter=object() if dlq else None, **options)
    writer = DeadLetterWriter(dlq.publish, sleep=sleeps, stats=stats) if dlq else None
    engine = DeliveryEngine(opts, sink, dead_letters=writer, shard_id=SHARD, sleep=sleeps,
                            wall_clock=lambda: now, stats=stats, rng=lambda: 0.5)
    return engine, sleeps, stats


def run(engine: DeliveryEngine, batch: list[Any]) -> tuple[Any, list[int]]:
    acks: list[int] = []

    async def on_ack(n: int) -> None:
        assert not acks or n > acks[-1], "the acknowledged prefix only grows"
        acks.append(n)

    result = asyncio.run(engine.deliver(batch, on_ack))
    return result, acks


def letters(dlq: Publisher) -> list[dict[str, Any]]:
    return [json.loads(doc) for doc, _ in dlq.items]


def test_a_batch_the_sink_takes_is_acknowledged_whole_in_one_call() -> None:
    sink = Sink()
    engine, sleeps, _ = make(sink)
    result, acks = run(engine, recs(5))
    assert acks == [5] and result.acknowledged == 5 and result.delivered == 5 and len(sink.calls) == 1
    assert not sleeps.waits


def test_retries_with_backoff_then_succeeds() -> None:
    sink = Sink(fail_calls=[1, 2])
    engine, sleeps, stats = make(sink, max_sink_retries=2)
    _, acks = run(engine, recs(3))
    assert acks == [3] and len(sink.calls) == 3 and stats["sink_failures"] == 2
    assert len(sleeps.waits) == 2 and sleeps.waits[0] < sleeps.waits[1]  # the ceiling doubles (rng fixed)


def test_without_dead_letters_the_error_names_shard_and_sequence_number() -> None:
    sink = Sink(poison=[b"r2"])
    engine, _, _ = make(sink, max_sink_retries=1)
    acks: list[int] = []

    async def on_ack(n: int) -> None:
        acks.append(n)

    with pytest.raises(SinkError, match=rf"{SHARD} sequence number 1000 .*2 times") as info:
        asyncio.run(engine.deliver(recs(4), on_ack))
    assert isinstance(info.value.__cause__, ValueError)
    assert acks == []  # the poison record is the first one the sink sees: nothing acknowledged


def test_partial_ack_checkpoints_the_prefix_and_retries_the_rest_in_order() -> None:
    sink = Sink(partial={1: 2})
    engine, _, stats = make(sink, max_sink_retries=1)
    batch = recs(5)
    _, acks = run(engine, batch)
    assert acks == [2, 5]
    assert sink.calls == [[r.data for r in batch], [r.data for r in batch[2:]]]
    assert sink.acked == [r.data for r in batch] and stats["partial_acks"] == 1 and stats["sink_failures"] == 1


def test_partial_acks_across_retries_count_against_the_limit() -> None:
    # 3 partial answers in a row, each moving forward; max_sink_retries=2 allows 3 attempts in all.
    sink = Sink(partial={1: 1, 2: 1, 3: 1})
    dlq = Publisher()
    engine, _, stats = make(sink, dlq=dlq, max_sink_retries=2)
    batch = recs(5)
    result, acks = run(engine, batch)
    assert acks == [1, 2, 3, 5]
    assert [len(c) for c in sink.calls] == [5, 4, 3]
    assert [d["sequence_number"] for d in letters(dlq)] == ["1003", "1004"]
    assert [d["attempts"] for d in letters(dlq)] == [3, 3]
    assert result.delivered == 3 and result.dead_lettered == 2 and stats["partial_acks"] == 3


def test_partial_failed_from_zero_and_out_of_range_fail_the_whole_batch() -> None:
    for bad in (0, 9, -1):
        sink = Sink(partial={1: bad})
        engine, _, stats = make(sink, max_sink_retries=1)
        _, acks = run(engine, recs(3))
        assert acks == [3] and [len(c) for c in sink.calls] == [3, 3], bad
        assert "partial_acks" not in stats


def test_partial_failed_from_equal_to_the_length_acknowledges_everything() -> None:
    sink = Sink(partial={1: 3})
    engine, sleeps, stats = make(sink)
    _, acks = run(engine, recs(3))
    assert acks == [3] and len(sink.calls) == 1 and not sleeps.waits and "sink_failures" not in stats


def test_partial_failed_from_is_read_through_a_wrapping_error() -> None:
    class Wrapped(Exception):
        def __init__(self, cause: BaseException) -> None:
            super().__init__("wrapped")
            self.cause = cause  # as Ray's RayTaskError keeps the actor's exception

    assert partial_failed_from(Wrapped(PartialBatchError(failed_from=4))) == 4
    chained = RuntimeError("outer")
    chained.__cause__ = PartialBatchError(failed_from=2)
    assert partial_failed_from(chained) == 2
    assert partial_failed_from(RuntimeError("plain")) is None
    sink = Sink(partial={1: 1}, wrap=Wrapped)
    engine, _, _ = make(sink)
    _, acks = run(engine, recs(3))
    assert acks == [1, 3]


def test_bisect_isolates_several_bad_records_and_acknowledges_the_rest_in_order() -> None:
    batch = recs(16)
    poison = [b"r3", b"r4", b"r11"]
    sink = Sink(poison=poison)
    dlq = Publisher()
    engine, _, stats = make(sink, dlq=dlq, max_sink_retries=2, bisect_on_error=True)
    result, acks = run(engine, batch)
    assert acks[-1] == 16 and result.acknowledged == 16
    assert [d["data"] for d in letters(dlq)] == ["cjM=", "cjQ=", "cjEx"]  # base64 of r3, r4, r11
    assert all(d["reason"] == "sink" and d["attempts"] >= 3 for d in letters(dlq))
    assert all(d["error"].startswith("ValueError: poison") for d in letters(dlq))
    good = [r.data for r in batch if r.data not in poison]
    assert set(good) <= set(sink.acked) and not set(poison) & set(sink.acked)
    assert result.dead_lettered == 3 and stats["dead_letter_records"] == 3 and stats["bisected"] >= 3
    assert all(key == SHARD for _, key in dlq.items)  # dead letters are keyed by the shard id


def test_bisect_gives_each_half_one_try_and_a_single_record_its_full_retries() -> None:
    sink = Sink(poison=[b"r5"])
    dlq = Publisher()
    engine, _, _ = make(sink, dlq=dlq, max_sink_retries=3, bisect_on_error=True)
    run(engine, recs(8))
    lengths = [len(c) for c in sink.calls]
    # 4 tries of 8; then [0..3] ok, [4..7] once; [4,5] once; [4] ok; [5] 4 tries; then [6,7] ok
    assert lengths == [8, 8, 8, 8, 4, 4, 2, 1, 1, 1, 1, 1, 2]
    assert letters(dlq)[0]["attempts"] == 4 + 1 + 1 + 4  # every call that included r5


def test_bisect_without_dead_letters_fails_naming_the_poison_record_after_acking_before_it() -> None:
    sink = Sink(poison=[b"r5"])
    engine, _, _ = make(sink, max_sink_retries=0, bisect_on_error=True)
    acks: list[int] = []

    async def on_ack(n: int) -> None:
        acks.append(n)

    with pytest.raises(SinkError, match="sequence number 1005"):
        asyncio.run(engine.deliver(recs(8), on_ack))
    assert acks[-1] == 5  # records 0..4 acknowledged and checkpointable, nothing at or after the poison


def test_without_bisect_every_failing_record_gets_its_own_dead_letter() -> None:
    sink = Sink(poison=[b"r1"])
    dlq = Publisher()
    engine, _, _ = make(sink, dlq=dlq, max_sink_retries=1)
    result, acks = run(engine, recs(3))
    assert [d["sequence_number"] for d in letters(dlq)] == ["1000", "1001", "1002"]  # the poison failed them all
    assert acks == [3] and result.dead_lettered == 3


def test_old_records_go_to_the_dead_letters_without_delivery() -> None:
    batch = [rec(0, arrival=T0 - 100), rec(1, arrival=T0 - 5), rec(2, arrival=T0 - 100), rec(3, arrival=None)]
    sink, dlq = Sink(), Publisher()
    engine, _, stats = make(sink, dlq=dlq, max_record_age_s=60.0)
    result, acks = run(engine, batch)
    assert sink.calls == [[b"r1", b"r3"]]  # no arrival time: never too old
    docs = letters(dlq)
    assert [d["sequence_number"] for d in docs] == ["1000", "1002"]
    assert all(d["reason"] == "max_record_age" and d["error"] is None and d["attempts"] == 0 for d in docs)
    assert acks == [1, 4] and result.dead_lettered == 2 and stats["dead_letter_records"] == 2


def test_a_record_that_ages_during_retries_is_dead_lettered_before_the_next_attempt() -> None:
    now = [T0]
    sink, dlq, sleeps = Sink(fail_calls=[1]), Publisher(), Sleeps()
    opts = DeliveryOptions(dead_letter=object(), max_record_age_s=60.0)
    engine = DeliveryEngine(opts, sink, dead_letters=DeadLetterWriter(dlq.publish, sleep=sleeps), shard_id=SHARD,
                            sleep=sleeps, wall_clock=lambda: now[0])
    batch = [rec(0, arrival=T0 - 50), rec(1, arrival=T0)]
    original = sink.__call__

    async def aging(records: Any) -> None:
        now[0] += 20  # each attempt takes 20 s
        await original(records)

    engine._deliver = aging
    asyncio.run(engine.deliver(batch))
    assert sink.calls == [[b"r0", b"r1"], [b"r1"]] and [d["sequence_number"] for d in letters(dlq)] == ["1000"]


def test_filter_rejects_are_acknowledged_without_delivery_and_counted() -> None:
    sink = Sink()
    engine, _, stats = make(sink, record_filter=lambda r: int(r.sequence_number) % 2 == 0)
    result, acks = run(engine, recs(6))
    assert sink.calls == [[b"r0", b"r2", b"r4"]] and acks == [6]
    assert result.filtered == 3 and stats["filtered"] == 3


def test_a_batch_wholly_filtered_makes_no_sink_call() -> None:
    sink = Sink()
    engine, _, _ = make(sink, record_filter=lambda r: False)
    _, acks = run(engine, recs(4))
    assert sink.calls == [] and acks == [4]


def test_a_filter_that_raises_fails_with_sink_error_and_acknowledges_nothing() -> None:
    def broken(r: Any) -> bool:
        raise KeyError("field")

    engine, _, _ = make(Sink(), record_filter=broken)
    with pytest.raises(SinkError, match=r"record_filter raised on shard .* sequence number 1000"):
        run(engine, recs(2))


def test_a_failing_dead_letter_publisher_is_retried_never_skipped() -> None:
    sink, dlq = Sink(poison=[b"r0"]), Publisher(fail=4)
    engine, sleeps, stats = make(sink, dlq=dlq, max_sink_retries=0)
    acks: list[int] = []

    async def on_ack(n: int) -> None:
        assert dlq.items, "acknowledged before its dead letter was written"
        acks.append(n)

    asyncio.run(engine.deliver(recs(1), on_ack))
    assert dlq.calls == 5 and len(dlq.items) == 1 and acks == [1]
    assert stats["dead_letter_failures"] == 4 and len(sleeps.waits) == 4


def test_a_dead_letter_the_publisher_refuses_as_invalid_fails_instead_of_skipping() -> None:
    from kinesis_actors import InvalidError

    sink, dlq = Sink(poison=[b"r0"]), Publisher(fail=99, error=InvalidError("record data is too big"))
    engine, _, _ = make(sink, dlq=dlq, max_sink_retries=0)
    with pytest.raises(SinkError, match="cannot be written"):
        run(engine, recs(1))
    assert dlq.calls == 1


def test_cancelling_a_delivery_keeps_what_was_acknowledged() -> None:
    started = asyncio.Event()

    async def hang(records: Any) -> None:
        if len(records) < 3:
            started.set()
            await asyncio.sleep(3600)
        raise PartialBatchError(failed_from=1)

    engine, _, _ = make(hang)
    acks: list[int] = []

    async def on_ack(n: int) -> None:
        acks.append(n)

    async def main() -> None:
        task = asyncio.create_task(engine.deliver(recs(3), on_ack))
        await asyncio.wait_for(started.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert acks == [1]
