"""Section ``memory`` (issue 9, item 4): USS per ShardReader; the Coordinator pass at scale.

* USS (unique set size, psutil) of each ``ray::ShardReader`` process of a 4-shard
  subscription (the pool: one reader holds the leases, up to ``max_shards_per_reader``,
  plus one to spare; pids from ``stats()["readers"]``): at rest (at the tip of an idle
  stream for a few seconds) and under load (the peak sampled every 0.5 s during the last
  product run of ``throughput``). Anchor: an idle Ray actor that does nothing. Per-shard
  USS at 16..1,000 shards is the ``scale`` section's.
* The steady-state Coordinator pass (``ListShards`` + one lease-table read, plus the
  takes it decides on) over a stream of 1,000 shards whose 1,000 lease rows exist, with
  its leases capped by ``max_leases=4``: :class:`CoordinatorCore` runs in this process
  with the real ``DynamoLeaseStore`` and Kinesis client against the emulator, and a
  launcher whose pool readers are stubs (no actors; ``add`` answers "processing"). The
  first pass is ``poll_leases(deadline=...)``, as ``start()`` runs it. Calls are counted with a botocore
  ``before-call`` event hook.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .common import REGION, Results, client, create_stream, median, pool_pids, psutil_mod, ray_processes, uss_mib


class _StubReader:
    """A ReaderHandle of the pool protocol that holds its leases and reads nothing (no
    actor): ``add`` says the shard is open, ``events`` waits (nothing ever ends), ``stop``
    drops what it holds. One per pool slot (``launcher(n)``)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.shards: set[str] = set()
        self._stopped = asyncio.Event()

    async def ping(self) -> None:
        return None

    async def add(self, spec: Any, lease: Any, *, lease_age_s: float | None = None) -> Any:
        from kinesis_actors.reader import ConsumerState, ShardEvent

        self.shards.add(spec.shard_id)
        return ShardEvent(spec.shard_id, ConsumerState.PROCESSING.value)

    async def events(self, timeout_s: float) -> list[Any]:
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        return []

    async def stop(self, shard_id: str | None, release: bool, grace_s: float) -> None:
        if shard_id is None:
            self.shards.clear()
        else:
            self.shards.discard(shard_id)

    async def seek(self, shard_id: str, position: Any) -> bool:
        return shard_id in self.shards

    async def stats(self) -> dict[str, Any]:
        return {"shards": {sid: {} for sid in self.shards}, "reader": {"stub": self.n}}

    def kill(self) -> None:
        self._stopped.set()


def _uss(ctx: Any, res: Results) -> None:
    import ray

    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream

    from .actors import Idle, TimedSink

    idle = Idle.remote()
    pid = ray.get(idle.pid.remote())
    stream = f"bench-mem-{uuid.uuid4().hex[:8]}"
    create_stream(ctx.endpoint, stream, 4)
    conn = KinesisBroker(endpoint=ctx.endpoint, region=REGION, test_credentials=True,
                         lease_store=DynamoLeaseStore(f"bench-mem-{uuid.uuid4().hex[:8]}", create_if_missing=True)).connect()
    sub = conn.subscribe(KinesisStream(stream), sink=TimedSink.remote())  # nothing is published: never called
    time.sleep(ctx.params["rest_seconds"])
    readers, coordinator_pid = pool_pids(sub.stats())
    psutil = psutil_mod()
    reader_mem = [m for m in (uss_mib(psutil.Process(p)) for p in readers) if m]
    coord = uss_mib(psutil.Process(coordinator_pid)) if coordinator_pid else None
    coord_mem = [coord] if coord else []
    idle_proc = [p for p in ray_processes("ray::Idle", [ctx.emulator_pid]) if p.pid == pid]
    idle_mem = uss_mib(idle_proc[0]) if idle_proc else None
    sub.close()
    conn.shutdown()
    ray.kill(idle)
    anchor = idle_mem[0] if idle_mem else None
    layout = ", ".join(f"{n} shards" for n in sorted(readers.values(), reverse=True))
    res.add("memory", "idle_actor_uss_mib", anchor, "MiB", note="a Ray actor that does nothing (the floor of any actor)")
    res.add("memory", "reader_uss_at_rest_mib", max((m[0] for m in reader_mem), default=None), "MiB",
            anchor="idle_actor_uss_mib", anchor_value=anchor, goal="<= 60 MiB", check=lambda v: v <= 60,
            note=f"max of the pool's {len(reader_mem)} ShardReader processes ({layout}; pids from stats()) at the tip "
                 f"of an idle 4-shard stream after {ctx.params['rest_seconds']} s; "
                 f"RSS {max((m[1] for m in reader_mem), default=0):.0f} MiB")
    res.add("memory", "readers_uss_at_rest_total_mib", sum(m[0] for m in reader_mem) if reader_mem else None, "MiB",
            anchor="idle_actor_uss_mib", anchor_value=anchor,
            note=f"all {len(reader_mem)} ShardReader processes of the 4-shard subscription (one reader to spare)")
    res.add("memory", "coordinator_uss_at_rest_mib", max((m[0] for m in coord_mem), default=None), "MiB",
            anchor="idle_actor_uss_mib", anchor_value=anchor)
    raw = getattr(ctx, "raw_uss", None)
    if raw:
        res.add("memory", "raw_drain_process_uss_peak_mib", raw[0], "MiB",
                note=f"a plain boto3 process draining one shard (GetRecords Limit 10000, 1 KB records); {raw[1]:.0f} MiB at the end")
    if getattr(ctx, "uss_under_load", None):
        res.add("memory", "reader_uss_under_load_mib", max(ctx.uss_under_load), "MiB",
                anchor="raw_drain_process_uss_peak_mib" if raw else "idle_actor_uss_mib",
                anchor_value=raw[0] if raw else anchor, goal="<= 60 MiB", check=lambda v: v <= 60,
                note=f"peak over the pool's ShardReader processes ({getattr(ctx, 'reader_layout', '') or '?'}), "
                     "sampled every 0.5 s during the last product throughput run (4 shards, GetRecords of up to "
                     "10,000 x 1 KB records)")
        if getattr(ctx, "uss_small_batches", None):
            res.add("memory", "reader_uss_under_load_max_records_1000_mib", ctx.uss_small_batches, "MiB",
                    anchor="reader_uss_under_load_mib", anchor_value=max(ctx.uss_under_load), goal="<= 60 MiB",
                    check=lambda v: v <= 60, note="the same with KinesisStream(max_records=1000)")
    else:
        res.add("memory", "reader_uss_under_load_mib", None, "MiB", note="needs the throughput section")


def _coordinator_pass(ctx: Any, res: Results) -> None:
    from kinesis_actors import DynamoLeaseStore, KinesisStream
    from kinesis_actors.aws import AwsSettings
    from kinesis_actors.coordinator import CoordinatorCore

    rows = ctx.params["scale_rows"]
    cap = 4
    stream = f"bench-scale-{uuid.uuid4().hex[:8]}"
    table = f"bench-scale-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    shards = create_stream(ctx.endpoint, stream, rows)
    create_s = time.perf_counter() - t0
    settings = AwsSettings(endpoint=ctx.endpoint, region=REGION, test_credentials=True)

    def store() -> Any:
        return DynamoLeaseStore(table, create_if_missing=True, endpoint=ctx.endpoint, region=REGION, test_credentials=True)

    # Other instances hold every shard but the first `cap` (live: 1 h leases), so every row exists.
    others = [store() for _ in range(8)]
    others[0].list(stream)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: others[i % 8].take(stream, shards[i]["ShardId"], owner=f"other-{i % 50}", duration_s=3600.0),
                      range(cap, rows)))
    fill_s = time.perf_counter() - t0
    ctx.log(f"scale: stream of {rows} shards in {create_s:.1f} s, {rows - cap} lease rows in {fill_s:.1f} s")

    mine = store()
    kinesis = settings.client("kinesis")
    calls: dict[str, int] = {}

    def count(event_name: str, **_: Any) -> None:
        op = event_name.split(".", 2)[-1]
        calls[op] = calls.get(op, 0) + 1

    mine.dynamo.client_now().meta.events.register("before-call.dynamodb", count)
    kinesis.meta.events.register("before-call.kinesis", count)
    core = CoordinatorCore(KinesisStream(stream, max_leases=cap), aws=settings, store=mine, owner_id="bench-coordinator",
                           lease_duration_s=10.0, renew_interval_s=3.0, launcher=_StubReader,
                           kinesis=kinesis)

    held_after: list[int] = []

    async def passes() -> list[tuple[float, dict[str, int], float]]:
        out = []
        for i in range(ctx.params["scale_passes"] + 1):
            calls.clear()
            t = time.perf_counter()
            await core.sync_shards()
            t_list = time.perf_counter() - t
            if i == 0:  # the first pass as start() runs it: grow the (stub) pool, wait for room, take, open
                await core.poll_leases(deadline=time.monotonic() + 60.0)
            else:
                await core.poll_leases()
            out.append((time.perf_counter() - t, dict(calls), t_list))
            held_after.append(len(core.held()))
        await core.close(release=False)
        return out

    results = asyncio.run(passes())

    # The raw limit of the same pass: one plain boto3 Scan (consistent, same filter) + ListShards.
    ddb, kin = client(ctx.endpoint, "dynamodb"), client(ctx.endpoint, "kinesis")
    raw_times = []
    for _ in range(ctx.params["scale_passes"]):
        t = time.perf_counter()
        kw: dict[str, Any] = {"TableName": table, "ConsistentRead": True,
                              "FilterExpression": "#s = :s AND begins_with(#k, :p)",
                              "ExpressionAttributeNames": {"#s": "stream", "#k": "lease_key"},
                              "ExpressionAttributeValues": {":s": {"S": stream}, ":p": {"S": f"{stream}:"}}}
        while True:
            page = ddb.scan(**kw)
            if not page.get("LastEvaluatedKey"):
                break
            kw["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        resp = kin.list_shards(StreamName=stream)
        while resp.get("NextToken"):
            resp = kin.list_shards(StreamName=stream, NextToken=resp["NextToken"])
        raw_times.append(time.perf_counter() - t)
    raw_pass = median(raw_times)
    res.add("memory", "raw_scan_and_list_shards_s", raw_pass, "s",
            note=f"plain boto3: one consistent Scan of the {rows} rows (same filter) + ListShards; median of {len(raw_times)}")
    first, steady = results[0], results[1:]
    held = held_after[0]
    if held != cap or any(h != cap for h in held_after):
        res.note(f"memory: the Coordinator pass held {held_after} leases after each pass, expected {cap}")
    res.add("memory", "coordinator_first_pass_s", first[0], "s",
            note=f"{rows} shards, {rows - cap} rows held by others, takes {held}: calls {first[1]}")
    t_steady = median(t for t, _, _ in steady)
    t_list = median(t for _, _, t in steady)
    res.add("memory", "coordinator_pass_s", t_steady, "s", anchor="raw_scan_and_list_shards_s", anchor_value=raw_pass,
            goal="<= 1 s",
            check=lambda v: v <= 1.0,
            note=f"steady state, {rows} lease rows, max_leases={cap} (leases capped, pool readers stubbed); median of {len(steady)}; "
                 f"calls per pass {steady[-1][1]}; ListShards {t_list:.2f} s of it, the lease-table read and "
                 f"decisions {t_steady - t_list:.2f} s")
    res.add("memory", "coordinator_pass_dynamodb_calls", sum(v for k, v in steady[-1][1].items() if k in ("Scan", "GetItem",
            "PutItem", "UpdateItem", "DescribeTable")), "calls", note="DynamoDB calls of one steady pass (Scan pages)")
    res.add("memory", "coordinator_pass_kinesis_calls", steady[-1][1].get("ListShards", 0), "calls",
            note="ListShards pages of one steady pass")


def run(ctx: Any, res: Results) -> None:
    _uss(ctx, res)
    _coordinator_pass(ctx, res)
