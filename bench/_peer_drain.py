"""Drain a stream with async-kinesis (the peer), run by the peer's OWN virtualenv.

Not imported by the benchmark: ``bench/.venv-peer/bin/python bench/_peer_drain.py ...``
prints one JSON line: records, bytes, t0 (epoch s, just before the Consumer is made),
events [(epoch s, records)], cpu_s (process CPU while reading).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time


async def drain(endpoint: str, stream: str, expect: int, timeout_s: float) -> dict:
    from kinesis import Consumer, StringProcessor

    n = nbytes = 0
    events: list[tuple[float, int]] = []
    pending = 0
    t0, c0 = time.time(), time.process_time()
    deadline = time.monotonic() + timeout_s
    async with Consumer(stream, endpoint_url=endpoint, region_name="us-east-1", iterator_type="TRIM_HORIZON",
                        processor=StringProcessor(), shard_fetch_rate=5, record_limit=10_000,
                        max_queue_size=20_000, sleep_time_no_records=0.2, idle_timeout=timeout_s) as consumer:
        async for item in consumer:
            n += 1
            pending += 1
            nbytes += len(item)
            if pending >= 500 or n >= expect:
                events.append((time.time(), pending))
                pending = 0
            if n >= expect or time.monotonic() > deadline:
                break
        cpu = time.process_time() - c0
    return {"records": n, "bytes": nbytes, "t0": t0, "events": events, "cpu_s": cpu}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--expect", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    out = asyncio.run(drain(a.endpoint, a.stream, a.expect, a.timeout))
    print(json.dumps(out))
    return 0 if out["records"] >= a.expect else 1


if __name__ == "__main__":
    sys.exit(main())
