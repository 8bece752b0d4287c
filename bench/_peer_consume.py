"""Consume a stream with async-kinesis (the peer), run by the peer's OWN virtualenv.

Not imported by the benchmark: ``bench/.venv-peer/bin/python bench/_peer_consume.py ...``
prints JSON lines, each with ``ts`` (epoch s): ``start`` (just before the Consumer is made),
``first`` (the first record), ``reached`` (``--expect`` records), ``done``. With ``--hold``
it goes on consuming (polling at the tip) after ``reached`` until its stdin closes, so that
the benchmark can sample its memory; without, it exits at ``reached``. Settings as in
``_peer_drain.py`` (the throughput section's peer run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time


def emit(event: str, **kw: object) -> None:
    sys.stdout.write(json.dumps({"event": event, "ts": time.time(), **kw}) + "\n")
    sys.stdout.flush()


async def consume(a: argparse.Namespace) -> dict:
    from kinesis import Consumer, StringProcessor

    n = nbytes = 0
    emit("start", pid=os.getpid())
    c0 = time.process_time()
    async with Consumer(a.stream, endpoint_url=a.endpoint, region_name="us-east-1", iterator_type="TRIM_HORIZON",
                        processor=StringProcessor(), shard_fetch_rate=5, record_limit=10_000,
                        max_queue_size=20_000, sleep_time_no_records=0.2, idle_timeout=a.timeout) as consumer:
        async for item in consumer:
            n += 1
            nbytes += len(item)
            if n == 1:
                emit("first")
            if n == a.expect:
                emit("reached", count=n, cpu_s=time.process_time() - c0)
                if not a.hold:
                    break
    return {"records": n, "bytes": nbytes, "cpu_s": time.process_time() - c0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--stream", required=True)
    ap.add_argument("--expect", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--hold", action="store_true", help="go on consuming after --expect until stdin closes")
    a = ap.parse_args()
    if a.hold:
        def wait_stdin() -> None:
            sys.stdin.read()
            emit("done", held=True)
            os._exit(0)

        threading.Thread(target=wait_stdin, daemon=True).start()
    out = asyncio.run(consume(a))
    emit("done", **out)
    return 0 if out["records"] >= a.expect else 1


if __name__ == "__main__":
    sys.exit(main())
