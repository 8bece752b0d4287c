"""``python -m bench.emulator_concurrency [--per-shard N] [--reps R]``: the emulator's CPU per record
by how many ``GetRecords`` it serves at once.

One fresh embedded emulator (moto), 4 shards x N x 1 KiB. The library's own ``GetRecords`` path
(:class:`kinesis_actors.wire.WireGetRecords`, so the client's CPU stays small) drains every shard
from ``TRIM_HORIZON`` four ways, ``--reps`` times each: one shard after another; 4 threads at
once; 2 threads at a time; 4 threads that sleep 0.2 s after each call (kcl-rs matched's idle
wait). Printed: the emulator process's CPU seconds per record (psutil, 10 ms ticks) and the rate.

The question it answers (README, "Beside kcl-rs"): whether an emulator bound to one interpreter
spends more CPU per record when several calls are in flight, as ours keeps them. Figures only.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

from .common import client, create_stream, prefill

MODES = ("one at a time", "4 threads", "2 threads at a time", "4 threads, 0.2 s pause")


def _drain(endpoint: str, stream: str, shard_id: str, per_shard: int, pause_s: float) -> None:
    from kinesis_actors import wire
    from kinesis_actors.aws import AwsSettings

    fast = wire.WireGetRecords(AwsSettings(endpoint=endpoint, test_credentials=True).client("kinesis", max_attempts=0))
    it = client(endpoint, "kinesis").get_shard_iterator(StreamName=stream, ShardId=shard_id,
                                                        ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    n = 0
    while n < per_shard:
        answer = fast.call(it, 10_000, shard_id=shard_id, stream=stream)
        n += len(answer["Records"])
        it = answer["NextShardIterator"]
        if pause_s:
            time.sleep(pause_s)
    fast.close()


def _run(endpoint: str, stream: str, shard_ids: list[str], per_shard: int, mode: str) -> None:
    if mode == "one at a time":
        for sid in shard_ids:
            _drain(endpoint, stream, sid, per_shard, 0.0)
        return
    groups = [shard_ids] if mode.startswith("4") else [shard_ids[:2], shard_ids[2:]]
    pause = 0.2 if "pause" in mode else 0.0
    for group in groups:
        threads = [threading.Thread(target=_drain, args=(endpoint, stream, sid, per_shard, pause)) for sid in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def main(argv: list[str] | None = None) -> int:
    import psutil

    from kinesis_actors.emulator import Emulator

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-shard", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args(argv)
    with Emulator() as emu:
        proc = psutil.Process(emu.pid)

        def cpu() -> float:
            t = proc.cpu_times()
            return float(t.user + t.system)

        stream = f"bench-cc-{uuid.uuid4().hex[:6]}"
        shards = create_stream(emu.endpoint, stream, 4)
        prefill(emu.endpoint, stream, shards, a.per_shard, 1024)
        shard_ids = [s["ShardId"] for s in shards]
        total = 4 * a.per_shard
        for _ in range(a.reps):
            for mode in MODES:
                c0, t0 = cpu(), time.time()
                _run(emu.endpoint, stream, shard_ids, a.per_shard, mode)
                used, wall = cpu() - c0, time.time() - t0
                print(f"{mode:24s} emulator {used:.2f} CPU s = {used / total * 1e6:.2f} us/record; "
                      f"{wall:.2f} s, {total / wall:,.0f} rec/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
