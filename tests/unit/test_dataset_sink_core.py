"""DatasetSinkCore's windows without Ray: when windows close, and that a batch returns only after fn."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from typing import Any

import pyarrow as pa
import pytest

from kinesis_actors.errors import InvalidError, SinkError
from kinesis_actors.records import Record
from kinesis_actors.sinks import ActorSink, GatheringSink, Sink
from kinesis_actors.sinks.dataset import DatasetSink, DatasetSinkCore
from kinesis_actors.sinks.protocol import gathering_sink

WHEN = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def batch(shard: str, first: int, n: int) -> list[Record]:
    return [Record(f"{shard}-{i}".encode(), "k", str(i), None, WHEN, shard, "s") for i in range(first, first + n)]


class Recorder:
    """``fn``: remembers each window's rows; can be gated or made to fail."""

    def __init__(self) -> None:
        self.windows: list[pa.Table] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next = 0

    def __call__(self, table: pa.Table) -> None:
        assert self.gate.wait(5)
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("disk full")
        self.windows.append(table)


def core(fn: Recorder, **kwargs: Any) -> DatasetSinkCore:
    options = {"window_s": 0.2, "window_records": 1000, "window_bytes": 1 << 30, **kwargs}
    return DatasetSinkCore(fn, to_dataset=pa.concat_tables, **options)


async def until(condition: Any, within_s: float = 5.0) -> None:
    """Wait for ``condition()`` on the event loop, failing after ``within_s`` seconds."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), within_s)


def test_a_window_closes_on_time_and_holds_every_batch_sent_meanwhile() -> None:
    fn = Recorder()
    sink = core(fn, window_s=0.2)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(sink.process_batch(batch("a", 0, 3)), sink.process_batch(batch("b", 0, 2))), 5)

    asyncio.run(main())
    assert len(fn.windows) == 1 and fn.windows[0].num_rows == 5
    assert sink.stats()["windows_completed"] == 1 and sink.stats()["records_written"] == 5


def test_a_window_closes_on_size_before_its_time() -> None:
    fn = Recorder()
    sink = core(fn, window_s=30.0, window_records=4)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(sink.process_batch(batch("a", 0, 2)), sink.process_batch(batch("b", 0, 2))), 5)
        await asyncio.wait_for(sink.process_batch(batch("c", 0, 5)), 5)

    asyncio.run(main())
    assert [w.num_rows for w in fn.windows] == [4, 5]


def test_a_batch_returns_only_when_fn_returned_for_its_window() -> None:
    fn = Recorder()
    fn.gate.clear()
    sink = core(fn, window_s=0.05)

    async def main() -> None:
        call = asyncio.ensure_future(sink.process_batch(batch("a", 0, 3)))
        await until(lambda: sink.stats()["windows_waiting"] == 1)  # the window closed; fn is blocked on the gate
        assert not call.done()
        fn.gate.set()
        await asyncio.wait_for(call, 5)

    asyncio.run(main())
    assert fn.windows[0].num_rows == 3


def test_fn_failing_fails_every_batch_of_the_window_and_the_retry_lands_later() -> None:
    fn = Recorder()
    fn.fail_next = 1
    sink = core(fn, window_s=0.05)

    async def main() -> None:
        results = await asyncio.gather(sink.process_batch(batch("a", 0, 2)), sink.process_batch(batch("b", 0, 2)),
                                       return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)
        await asyncio.wait_for(sink.process_batch(batch("a", 0, 2)), 5)

    asyncio.run(main())
    assert [w.num_rows for w in fn.windows] == [2]
    assert sink.stats()["windows_failed"] == 1 and "disk full" in sink.stats()["last_error"]


def test_flush_closes_the_open_window() -> None:
    fn = Recorder()
    sink = core(fn, window_s=30.0)

    async def main() -> None:
        call = asyncio.ensure_future(sink.process_batch(batch("a", 0, 3)))
        await until(lambda: sink.stats()["open_window_records"] == 3)
        assert await sink.flush(5)
        await asyncio.wait_for(call, 1)

    asyncio.run(main())
    assert fn.windows[0].num_rows == 3


def test_pyarrow_batches_are_accepted_as_they_are() -> None:
    from kinesis_actors.arrow import records_to_table

    fn = Recorder()
    sink = core(fn, window_s=0.05)
    asyncio.run(sink.process_batch(records_to_table(batch("a", 0, 4))))
    assert fn.windows[0].column("data").to_pylist()[0] == b"a-0"


@pytest.mark.parametrize(("kwargs", "bad"), [({"window_s": 0}, "0"), ({"window_records": -5}, "-5"),
                                             ({"batch_format": "pandas"}, "pandas"), ({"window_bytes": 1.5}, "1.5"),
                                             ({"actor_options": {"num_gpu": 1}}, "num_gpu")])
def test_bad_options_are_refused(kwargs: dict[str, Any], bad: str) -> None:
    with pytest.raises(InvalidError, match=bad):
        DatasetSink(print, **kwargs)


# ---------------------------------------------------------------- closing (the GatheringSink rule)
def test_begin_close_writes_the_open_window_at_once() -> None:
    fn = Recorder()
    sink = core(fn, window_s=30.0)

    async def main() -> None:
        call = asyncio.ensure_future(sink.process_batch(batch("a", 0, 3)))
        await until(lambda: sink.stats()["open_window_records"] == 3)
        assert sink.begin_close(10.0) == 10.0  # the readers may wait for the write
        await asyncio.wait_for(call, 2)  # not the 30 s window
        assert sink.end_close() == 0

    asyncio.run(main())
    assert [w.num_rows for w in fn.windows] == [3]
    assert sink.stats()["windows_dropped"] == 0


def test_while_closing_batches_gather_behind_a_running_write_and_go_next() -> None:
    fn = Recorder()
    sink = core(fn, window_s=30.0)

    async def main() -> None:
        first = asyncio.ensure_future(sink.process_batch(batch("a", 0, 2)))
        await until(lambda: sink.stats()["open_window_records"] == 2)
        fn.gate.clear()
        sink.begin_close(10.0)
        await until(lambda: sink.stats()["windows_waiting"] == 1)  # fn holds the first window
        later = [asyncio.ensure_future(sink.process_batch(batch(s, 0, 1))) for s in ("b", "c")]
        await until(lambda: sink.stats()["open_window_records"] == 2)
        fn.gate.set()
        await asyncio.wait_for(asyncio.gather(first, *later), 2)

    asyncio.run(main())
    assert [w.num_rows for w in fn.windows] == [2, 2]


def test_a_window_that_would_miss_the_close_deadline_is_dropped_and_never_acknowledged() -> None:
    now = [0.0]
    fn = Recorder()
    write_s = 5.0

    def slow_fn(table: pa.Table) -> None:
        now[0] += write_s  # each write takes 5 s on the sink's clock
        fn(table)

    sink = DatasetSinkCore(slow_fn, window_s=0.05, window_records=1000, window_bytes=1 << 30,
                           to_dataset=pa.concat_tables, clock=lambda: now[0])

    async def main() -> None:
        await asyncio.wait_for(sink.process_batch(batch("a", 0, 2)), 2)  # one write seen: 5 s
        sink.window_s = 30.0
        pending = asyncio.ensure_future(sink.process_batch(batch("a", 2, 3)))
        await until(lambda: sink.stats()["open_window_records"] == 3)
        assert sink.begin_close(2.0) == 0.0  # a 5 s write would not end within 2 s: nobody needs to wait
        await until(lambda: sink.stats()["windows_dropped"] == 1)
        await asyncio.sleep(0.1)
        assert not pending.done()  # unanswered: the reader's grace decides, not an error
        assert sink.end_close() == 3
        with pytest.raises(SinkError, match="dropped unwritten"):
            await asyncio.wait_for(pending, 1)

    asyncio.run(main())
    assert [w.num_rows for w in fn.windows] == [2]  # the dropped window never reached fn
    stats = sink.stats()
    assert stats["records_dropped"] == 3 and stats["records_written"] == 2


def test_end_close_drops_what_is_not_written_and_the_sink_then_gathers_as_before() -> None:
    fn = Recorder()
    sink = core(fn, window_s=30.0)

    async def main() -> None:
        pending = asyncio.ensure_future(sink.process_batch(batch("a", 0, 4)))
        await until(lambda: sink.stats()["open_window_records"] == 4)
        assert sink.end_close() == 4  # no begin_close: the readers gave up on it
        with pytest.raises(SinkError):
            await asyncio.wait_for(pending, 1)
        sink.window_s = 0.05
        await asyncio.wait_for(sink.process_batch(batch("b", 0, 1)), 2)

    asyncio.run(main())
    assert [w.column("data").to_pylist() for w in fn.windows] == [[b"b-0"]]


def test_a_write_running_at_end_close_finishes_and_acknowledges() -> None:
    fn = Recorder()
    sink = core(fn, window_s=30.0)

    async def main() -> None:
        call = asyncio.ensure_future(sink.process_batch(batch("a", 0, 2)))
        await until(lambda: sink.stats()["open_window_records"] == 2)
        fn.gate.clear()
        sink.begin_close(10.0)
        await until(lambda: sink.stats()["windows_waiting"] == 1)
        assert sink.end_close() == 0
        fn.gate.set()
        await asyncio.wait_for(call, 2)

    asyncio.run(main())
    assert [w.num_rows for w in fn.windows] == [2]


def test_while_a_write_runs_begin_close_never_tells_the_readers_to_stop_waiting() -> None:
    now = [0.0]
    fn = Recorder()

    def slow_fn(table: pa.Table) -> None:
        fn(table)
        now[0] += 5.0  # every write takes 5 s on the sink's clock

    sink = DatasetSinkCore(slow_fn, window_s=0.05, window_records=1000, window_bytes=1 << 30,
                           to_dataset=pa.concat_tables, clock=lambda: now[0])

    async def main() -> None:
        await asyncio.wait_for(sink.process_batch(batch("a", 0, 1)), 2)  # one write seen: 5 s
        fn.gate.clear()
        running = asyncio.ensure_future(sink.process_batch(batch("a", 1, 1)))
        await until(lambda: sink.stats()["windows_waiting"] == 1 and sink.stats()["open_window_records"] == 0)
        # no later write would fit in 2 s, but the running one's readers must wait for it
        assert sink.begin_close(2.0) == 2.0
        fn.gate.set()
        await asyncio.wait_for(running, 2)
        assert sink.end_close() == 0

    asyncio.run(main())
    assert [w.num_rows for w in fn.windows] == [1, 1]


def test_the_close_asks_only_gathering_sinks() -> None:
    class Plain:
        def deliver(self, records: Any) -> Any: ...

    class Gathering(Plain):
        def begin_close(self, finish_by_s: float) -> float:
            return finish_by_s

        def end_close(self) -> int:
            return 0

    assert issubclass(DatasetSink, GatheringSink)
    assert gathering_sink(None) is None  # pull mode
    assert gathering_sink(Plain()) is None and isinstance(Plain(), Sink)
    assert not issubclass(ActorSink, GatheringSink)  # an actor's call is the whole delivery
    sink = Gathering()
    assert gathering_sink(sink) is sink
