"""``skew_balance`` section: the other figures of scaling with load (issue 37's table), ``load_window_s=2``.

* **Two instances, one super-hot shard of 8.** A publisher puts ``sb_hot_records`` records of
  ``sb_hot_bytes`` B every 0.1 s into shard 0 and one record of ``sb_cold_bytes`` B every 0.1 s
  into each of the 7 others. Instance A subscribes alone and takes every shard; instance B joins
  once A holds all 8. Each instance's ``DynamoLeaseStore`` talks to the emulator through the
  counting proxy (:mod:`bench.count_proxy`). Run twice in one run, ``balance_by="load"`` and
  ``"count"``. Settled: the owners in the table unchanged for ``sb_settle_quiet_s`` (at most
  ``sb_settle_timeout_s``). Then ``sb_watch_s`` of steady load: the lease owner changes seen by
  polling the table every 0.5 s (should be 0), and the lease-table writes per shard per second
  (``UpdateItem``/``PutItem``/``DeleteItem`` on the wire). Figures: the hot owner's other leases
  (load: <= 1; count gives 3), the moves in the watch, the writes ratio load / count (<= 1.0x).
* **Reader SIGKILL re-spread.** One instance, 8 shards, one record into each every 0.1 s (default
  ``max_shards_per_reader``: a pool of 2). ``sb_kills`` times, once the pool is whole: SIGKILL the
  pid (from ``stats()``) of the reader holding the most shards, wait until its replacement is
  ready (``readers_replaced`` moved, the pool at its size again), wait ``sb_after_ready_s`` (30 s; 5 s
  with ``--quick``), and take the shards
  per reader: max / min (<= 2; an empty reader makes it infinite, reported as None).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .common import REGION, Results, client, create_stream, hash_keys, wait_for
from .count_proxy import WRITES, CountingProxy
from .failover import _pool_whole
from .publisher import Publisher

S = "skew_balance"


def _skewed(keys: list[str], hot: int, hot_bytes: int, cold_bytes: int) -> Callable[[int], list[dict[str, Any]]]:
    """``hot`` records of ``hot_bytes`` B into ``keys[0]``'s shard and one of ``cold_bytes`` B into each other's."""
    batch = [{"Data": b"h" * hot_bytes, "PartitionKey": f"h{i}", "ExplicitHashKey": keys[0]} for i in range(hot)]
    batch += [{"Data": b"c" * cold_bytes, "PartitionKey": f"c{i}", "ExplicitHashKey": ehk}
              for i, ehk in enumerate(keys[1:])]
    return lambda n: batch


def _subscribe(ctx: Any, stream: str, table: str, owner: str, endpoint: str | None, **options: Any) -> tuple[Any, Any]:
    from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream

    t = ctx.timings
    conn = KinesisBroker(endpoint=ctx.endpoint, region=REGION, test_credentials=True, owner_id=owner,
                         lease_store=DynamoLeaseStore(table, create_if_missing=True, endpoint=endpoint),
                         lease_duration_s=t["lease_duration_s"], renew_interval_s=t["renew_interval_s"]).connect()
    sub = conn.subscribe(KinesisStream(stream, load_window_s=2.0, lease_poll_interval_s=t["lease_poll_interval_s"],
                                       **options))
    return conn, sub


def _drain_forever(sub: Any, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            try:
                sub.next_batch(timeout_s=0.5)
            except Exception:
                return

    th = threading.Thread(target=run, daemon=True, name="skew-drain")
    th.start()
    return th


def _owners(ctx: Any, table: str) -> dict[str, str]:
    rows = client(ctx.endpoint, "dynamodb").scan(TableName=table, ConsistentRead=True).get("Items", [])
    return {r["lease_key"]["S"].rsplit(":", 1)[-1]: r.get("lease_owner", {}).get("S", "") for r in rows
            if ":shardId-" in r.get("lease_key", {}).get("S", "")}


def _two_instances(ctx: Any, balance_by: str) -> dict[str, Any]:
    p = ctx.params
    stream, table = f"bench-sb-{balance_by}-{uuid.uuid4().hex[:6]}", f"bench-sb-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, 8)
    ids = [s["ShardId"] for s in shards]
    keys = hash_keys(shards)
    hot = ids[0]
    stop = threading.Event()
    with CountingProxy(ctx.endpoint) as proxy, Publisher(
            ctx.endpoint, stream, _skewed([keys[s] for s in ids], p["sb_hot_records"], p["sb_hot_bytes"],
                                          p["sb_cold_bytes"]), name="skew-publisher"):
        a = _subscribe(ctx, stream, table, "A", proxy.url, balance_by=balance_by)
        subs = [a]
        try:
            _drain_forever(a[1], stop)
            wait_for(lambda: len(a[1].leases()) == 8, timeout_s=120, interval_s=0.5)
            b = _subscribe(ctx, stream, table, "B", proxy.url, balance_by=balance_by)
            subs.append(b)
            _drain_forever(b[1], stop)
            t_join = time.monotonic()
            owners, quiet_since, settled = _owners(ctx, table), time.monotonic(), False
            while not settled and time.monotonic() - t_join < p["sb_settle_timeout_s"]:
                time.sleep(0.5)
                now = _owners(ctx, table)
                if now != owners:
                    owners, quiet_since = now, time.monotonic()
                settled = time.monotonic() - quiet_since >= p["sb_settle_quiet_s"] and len(set(now.values()) - {""}) == 2
            settle_s = quiet_since - t_join if settled else None
            hot_owner = owners.get(hot)
            others = sum(1 for sid, o in owners.items() if o == hot_owner and sid != hot)
            moves, t0 = 0, time.time()
            end = time.monotonic() + p["sb_watch_s"]
            while time.monotonic() < end:
                time.sleep(0.5)
                now = _owners(ctx, table)
                moves += sum(1 for sid in now if now[sid] != owners.get(sid))
                owners = now
            t1 = time.time()
            writes = sum(1 for c in proxy.calls(t0, t1) if c.op in WRITES) / len(ids) / (t1 - t0)
        finally:
            stop.set()
            for conn, sub in subs:
                sub.close()
                conn.shutdown()
    return {"hot_owner_other_leases": others, "settle_s": settle_s, "moves_in_watch": moves,
            "writes_per_shard_per_s": writes, "owners": sorted(owners.items())}


def _kill_and_respread(ctx: Any) -> list[dict[str, Any]]:
    """Each kill: the shards per reader ``sb_after_ready_s`` (30) after the replacement was ready."""
    from .common import psutil_mod

    psutil = psutil_mod()
    stream, table = f"bench-sb-kill-{uuid.uuid4().hex[:6]}", f"bench-sb-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, 8)
    ids = [s["ShardId"] for s in shards]
    stop = threading.Event()
    out = []
    keys = hash_keys(shards)
    with Publisher(ctx.endpoint, stream, _skewed([keys[s] for s in ids], 1, 100, 100), name="skew-publisher"):
        conn, sub = _subscribe(ctx, stream, table, "K", None)
        try:
            _drain_forever(sub, stop)
            for i in range(ctx.params["sb_kills"]):
                st = wait_for(lambda: _pool_whole(sub, ids), timeout_s=120, interval_s=0.5)
                if not st:
                    raise RuntimeError(f"kill {i + 1}: the pool was not whole within 120 s")
                victim = max(st["readers"], key=lambda r: (r["shards"], r["reader"]))
                if not (psutil.Process(victim["pid"]).cmdline() or [""])[0].startswith("ray::ShardReader"):
                    raise RuntimeError(f"pid {victim['pid']} is not a ShardReader: not killed")
                replaced0 = st["readers_replaced"]
                os.kill(victim["pid"], signal.SIGKILL)

                def replaced(replaced0: int = replaced0, pid: int = victim["pid"]) -> bool:
                    now = _pool_whole(sub, ids)
                    return bool(now) and now["readers_replaced"] > replaced0 and pid not in {
                        r["pid"] for r in now["readers"]}

                ready = wait_for(replaced, timeout_s=120, interval_s=0.25)
                if not ready:
                    raise RuntimeError(f"kill {i + 1}: no replacement ready within 120 s")
                time.sleep(ctx.params["sb_after_ready_s"])  # the figure: 30 s after the replacement is ready
                per_reader = sorted(r["shards"] for r in sub.stats()["readers"])
                out.append({"before": victim["shards"], "per_reader": per_reader,
                            "max_over_min": per_reader[-1] / per_reader[0] if per_reader[0] else None})
                ctx.log(f"  skew_balance kill {i + 1}: reader with {victim['shards']} shards; "
                        f"{ctx.params['sb_after_ready_s']:g} s after the replacement: {per_reader}")
        finally:
            stop.set()
            sub.close()
            conn.shutdown()
    return out


def _settled(got: dict[str, Any], p: dict[str, Any]) -> str:
    """How long after B joined the owners settled, as the figure's note says it."""
    return (f"{got['settle_s']:.1f} s after B joined" if got["settle_s"] is not None else
            f"not within {p['sb_settle_timeout_s']:g} s of B joining (the watch began on unsettled owners)")


def run(ctx: Any, res: Results) -> None:
    p = ctx.params
    got = {by: _two_instances(ctx, by) for by in ("load", "count")}
    ctx.log(f"skew_balance two instances: {got}")
    load, count = got["load"], got["count"]
    setting = (f"8 shards, 2 instances; shard 0 gets {p['sb_hot_records']} x {p['sb_hot_bytes']} B per 0.1 s, the "
               f"others 1 x {p['sb_cold_bytes']} B per 0.1 s; load_window_s=2, lease poll "
               f"{ctx.timings['lease_poll_interval_s']} s")
    res.add(S, "sb_hot_owner_other_leases", load["hot_owner_other_leases"], "leases",
            anchor="balance_by='count', same run", anchor_value=count["hot_owner_other_leases"], goal="<= 1 (count: 3)",
            check=lambda v: v <= 1,
            note=f"{setting}; owners unchanged for {p['sb_settle_quiet_s']} s with both instances holding leases: "
                 f"{_settled(load, p)} (count: {_settled(count, p)}); owners {load['owners']}")
    res.add(S, "sb_lease_moves_steady", load["moves_in_watch"], "moves", goal="0",
            check=lambda v: v == 0,
            note=f"{setting}; lease owner changes in {p['sb_watch_s']:.0f} s of steady load after settling "
                 f"(the issue asks 10 min; {p['sb_watch_s']:.0f} s run here); count: {count['moves_in_watch']}")
    res.add(S, "sb_writes_per_shard_per_s_load", load["writes_per_shard_per_s"], "writes/s",
            anchor="balance_by='count', same run", anchor_value=count["writes_per_shard_per_s"], goal="<= 1.0x",
            check=lambda v: v <= count["writes_per_shard_per_s"] * 1.0,
            note=f"{setting}; lease-table writes (UpdateItem/PutItem/DeleteItem on the wire through a counting proxy) "
                 f"per shard per second over the {p['sb_watch_s']:.0f} s watch; includes checkpoints")
    kills = _kill_and_respread(ctx)
    ratios = [k["max_over_min"] for k in kills]
    worst = None if not kills or any(r is None for r in ratios) else max(ratios)
    res.add(S, "sb_reader_sigkill_spread_max_over_min", worst, "x", goal="<= 2",
            check=lambda v: v <= 2,
            note=f"1 instance, 8 shards, 1 record of 100 B per shard per 0.1 s, default max_shards_per_reader; "
                 f"{len(kills)} SIGKILLs of the reader holding most shards; shards per reader "
                 f"{p['sb_after_ready_s']:g} s after the "
                 f"replacement was ready: {[k['per_reader'] for k in kills]} (worst max/min; None: an empty reader)")
