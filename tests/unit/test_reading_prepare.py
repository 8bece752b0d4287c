"""Reading.fetch(prepare=...): the per-record work after a GetRecords call runs in a pool thread
outside the call limit, so it neither holds the call's slot nor counts as call time for the
stuck-call detection (kinesis_actors.reader.reading, .io). Fake clock, no Ray."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kinesis_actors.batch import RecordBatch
from kinesis_actors.kinesis import Fetched
from kinesis_actors.reader.io import STUCK_CALL_S, ReaderIo
from kinesis_actors.reader.reading import Reading


def test_the_time_prepare_takes_is_not_call_time() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    class Fetcher:
        reserve_bytes, has_iterator, io_kind = None, True, "poll"

        def due_in(self) -> float:
            return 0.0

        def counters(self) -> dict[str, Any]:
            return {}

        def step(self) -> Fetched:
            now[0] += 0.5 * STUCK_CALL_S  # the GetRecords call itself: well within the limit
            batch = RecordBatch.from_columns("sh", "s", [b"x"], ["k"], ["1"], [1.0])
            return Fetched(batch, 0, False, False, batch.nbytes)

    prepared: list[Fetched] = []

    def prepare(got: Fetched) -> None:
        now[0] += 0.6 * STUCK_CALL_S  # building Records, slow under GIL contention
        prepared.append(got)

    async def main() -> set[Any]:
        io = ReaderIo(kinesis_threads=2, store_threads=1, stream_threads=1, clock=clock)
        keeper = SimpleNamespace(call_started=None, alive=lambda: None)
        reading = Reading(SimpleNamespace(shard_id="sh", renew_interval_s=1.0), io, None, keeper, {},  # type: ignore[arg-type]
                          clock=clock, sleep=asyncio.sleep, interrupted=lambda: False, alive=lambda: None,
                          prepare=prepare)
        reading.fetcher = Fetcher()  # type: ignore[assignment]
        got = await reading.next()
        assert got is not None and prepared == [got]
        io.close()
        return set(io.limit.outside_limit)

    assert asyncio.run(main()) == set()  # a 0.5 s call does not put the shard outside the call limit
