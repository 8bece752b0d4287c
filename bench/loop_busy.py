"""The cost of timing an event loop's waits (kinesis_actors.load.busy), per loop iteration.

An asyncio loop runs ``--iterations`` iterations of one ``call_soon`` each, with its selector
plain and wrapped by ``TimedSelector``, ``--reps`` times each, alternating; printed: the median
seconds per iteration of each and the difference. Each iteration calls ``select`` once: with a
callback ready asyncio polls with timeout 0 (not timed); then again with each iteration waiting
on a 1 us timer, so each ``select`` is timed (the case that costs two clock reads).
Run: ``python -m bench.loop_busy``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from kinesis_actors.load.busy import LoopBusyMeter


def _one(iterations: int, wrapped: bool, waiting: bool) -> float:
    loop = asyncio.new_event_loop()
    try:
        if wrapped and not LoopBusyMeter(10.0).attach(loop):
            raise RuntimeError(f"{type(loop).__name__} has no selector to time: nothing to compare")
        done = loop.create_future()
        left = [iterations]

        def step() -> None:
            left[0] -= 1
            if left[0] <= 0:
                done.set_result(None)
            elif waiting:
                loop.call_later(1e-6, step)
            else:
                loop.call_soon(step)

        t = time.perf_counter()
        loop.call_soon(step)
        loop.run_until_complete(done)
        return (time.perf_counter() - t) / iterations
    finally:
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    for waiting in (False, True):
        plain, timed = [], []
        for _ in range(a.reps):
            plain.append(_one(a.iterations, False, waiting))
            timed.append(_one(a.iterations, True, waiting))
        p, t = statistics.median(plain), statistics.median(timed)
        what = "every select waits on a 1 us timer (timed)" if waiting else "callbacks ready: select(0) (not timed)"
        print(f"{what}: plain {p * 1e6:.2f} us/iteration, wrapped {t * 1e6:.2f} us/iteration, "
              f"difference {(t - p) * 1e6:+.2f} us")


if __name__ == "__main__":
    main()
