"""DatasetSinkCore's windows without Ray: when windows close, and that a batch returns only after fn."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from typing import Any

import pyarrow as pa
import pytest

from kinesis_actors.errors import InvalidError
from kinesis_actors.records import Record
from kinesis_actors.sinks.dataset import DatasetSink, DatasetSinkCore

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
