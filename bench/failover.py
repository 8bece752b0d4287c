"""Section ``failover`` (issue 9, item 3).

Two instances (two brokers, each with its own ``DynamoLeaseStore`` over one shared lease
table and its own sink actor) read a 4-shard stream while a publisher thread puts one
record into every shard every 0.1 s. The victim subscribes first with ``max_leases=2``;
the survivor takes the rest. Measured, each from the moment of the event to the first
batch the survivor's sink receives from one of the victim's shards:

* ``crash``: ``Subscription.abort()`` (Coordinator and readers killed, no release);
* ``close``: the victim's ``close()`` (checkpoint, release);
* ``sigkill``: the victim runs in a child process (its own Ray job in our cluster) and
  is SIGKILLed;
* ``reader_sigkill``: one instance alone (4 shards, default ``max_shards_per_reader``,
  so a pool of 2 readers), a publisher putting one record into every shard every 50 ms;
  ``reader_kills`` times, SIGKILL (``os.kill``) of the pid (from ``stats()["readers"]``)
  of a ShardReader holding at least one shard, once the pool is whole again -> the
  first batch from EVERY shard it held that holds a record published after the kill
  (so fetched by a live reader). The pid that reads each such shard afterwards
  (``stats()["shards"][...]["pid"]``) must be a reader of the pool before the kill: no
  actor start on the path.

Default timings (lease 10 s, renew 3 s, lease poll 2 s) unless ``--quick``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ._instance import await_ready, spawn
from .common import REGION, Results, create_stream, hash_keys, median, psutil_mod, wait_for
from .publisher import Publisher


def _stamped(keys: list[str]) -> Callable[[int], list[dict[str, Any]]]:
    """One record per hash key in ``keys``, payload ``T<epoch s>|<n>|`` (the sinks time delivery from it)."""
    def entries(n: int) -> list[dict[str, Any]]:
        now = time.time()
        return [{"Data": f"T{now:.6f}|{n + i}|".encode(), "PartitionKey": f"k{i}", "ExplicitHashKey": ehk}
                for i, ehk in enumerate(keys)]

    return entries


class _Instance:
    def __init__(self, ctx: Any, table: str, stream: str, owner: str, max_leases: int | None) -> None:
        import ray

        from kinesis_actors import DynamoLeaseStore, KinesisBroker, KinesisStream

        from .actors import TimedSink

        t = ctx.timings
        self.sink = TimedSink.remote()
        ray.get(self.sink.count.remote())
        self.conn = KinesisBroker(endpoint=ctx.endpoint, region=REGION, test_credentials=True,
                                  lease_store=DynamoLeaseStore(table, create_if_missing=True), owner_id=owner,
                                  lease_duration_s=t["lease_duration_s"], renew_interval_s=t["renew_interval_s"]).connect()
        self.sub = self.conn.subscribe(KinesisStream(stream, max_leases=max_leases, lease_poll_interval_s=t["lease_poll_interval_s"]),
                                       sink=self.sink)

    def held(self) -> list[str]:
        return sorted(lease.shard_id for lease in self.sub.leases())

    def first_after(self, t0: float, shards: list[str]) -> float | None:
        import ray

        return ray.get(self.sink.first_after.remote(t0, shards))

    def sink_fresh(self, t0: float, shards: list[str]) -> dict[str, float]:
        import ray

        return ray.get(self.sink.first_fresh_after.remote(t0, shards))

    def flowing(self, t0: float, shards: list[str]) -> bool:
        import ray

        return set(shards) <= set(ray.get(self.sink.shards_since.remote(t0)))

    def close(self) -> None:
        import ray

        try:
            self.sub.close()
        except Exception:
            pass
        self.conn.shutdown()
        ray.kill(self.sink)


def _pair(ctx: Any, tag: str) -> tuple[str, str, list[str], _Instance, _Instance, Publisher]:
    stream, table = f"bench-fo-{tag}-{uuid.uuid4().hex[:6]}", f"bench-fo-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, 4)
    pub = Publisher(ctx.endpoint, stream, _stamped(list(hash_keys(shards).values())), name="failover-publisher")
    pub.__enter__()
    victim = _Instance(ctx, table, stream, f"victim-{tag}", 2)
    survivor = _Instance(ctx, table, stream, f"survivor-{tag}", None)
    return stream, table, [s["ShardId"] for s in shards], victim, survivor, pub


class _RowWatcher:
    """Polls the victim's lease rows every 0.1 s: when each was last written by the victim
    (its counter moved while it owned the row) and when another owner took it."""

    def __init__(self, ctx: Any, table: str, stream: str, shards: list[str], victim: str) -> None:
        from kinesis_actors import DynamoLeaseStore

        self.store = DynamoLeaseStore(table, endpoint=ctx.endpoint, region=REGION, test_credentials=True)
        self.stream, self.shards, self.victim = stream, shards, victim
        self.last_victim_write: dict[str, float] = {}
        self.taken: dict[str, float] = {}
        self._seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="row-watcher")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for sid in self.shards:
                try:
                    row = self.store.get(self.stream, sid)
                except Exception:
                    continue
                if row is None:
                    continue
                now = time.time()
                if row.owner == self.victim and self._seen.get(sid) != row.counter:
                    self.last_victim_write[sid] = now
                elif row.owner not in (None, self.victim) and sid not in self.taken:
                    self.taken[sid] = now
                self._seen[sid] = row.counter

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _await_takeover(ctx: Any, survivor: _Instance, t0: float, shards: list[str]) -> tuple[float | None, float | None]:
    """(seconds to the first batch from one of ``shards``, seconds until every one delivered)."""
    limit = 3 * ctx.timings["lease_duration_s"] + 15
    first = wait_for(lambda: survivor.first_after(t0, shards), timeout_s=limit, interval_s=0.1)
    if not first:
        return None, None
    per = {s: wait_for(lambda s=s: survivor.first_after(t0, [s]), timeout_s=limit, interval_s=0.1) for s in shards}
    return first - t0, (max(per.values()) - t0) if all(per.values()) else None


def _split(res: Results, prefix: str, watcher: _RowWatcher, t0: float) -> None:
    """Where a takeover's time went: the victim's last write after the event, the survivor's take."""
    watcher.stop()
    last = [t - t0 for t in watcher.last_victim_write.values() if t > t0]
    taken = [t - t0 for t in watcher.taken.values()]
    res.add("failover", f"{prefix}_victim_last_write_after_s", max(last) if last else 0.0, "s",
            note="latest lease write (renew/checkpoint) by the victim after the event; 0 = none")
    res.add("failover", f"{prefix}_survivor_take_s", min(taken) if taken else None, "s",
            note="the first victim row taken by the survivor (lease table polled every 0.1 s)")


def _pool_whole(sub: Any, shards: list[str]) -> dict[str, Any] | None:
    """stats() once the pool is whole: every shard open on a live reader of the pool, as
    many ready readers as ``pool_size`` asks; else None."""
    from kinesis_actors.coordinator import pool_size

    try:
        st = sub.stats()
    except Exception:
        return None
    live = {r["pid"] for r in st["readers"]}
    on_live = all(st["shards"].get(sid, {}).get("pid") in live and st["shards"][sid].get("state") == "processing"
                  for sid in shards)
    wanted = pool_size(st["leases_held"], st["max_shards_per_reader"])
    if st["leases_held"] == len(shards) and len(st["readers"]) >= wanted and on_live \
            and sum(r["shards"] for r in st["readers"]) == len(shards):
        return st
    return None


def _reader_sigkills(ctx: Any, res: Results) -> None:
    """Section (d): SIGKILL of a ShardReader holding shards -> its shards delivering again from live readers."""
    import ray

    from .actors import Idle

    t = ctx.timings
    psutil = psutil_mod()
    kills = ctx.params["reader_kills"]
    period_s = 0.05
    stream, table = f"bench-fo-rk-{uuid.uuid4().hex[:6]}", f"bench-fo-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, 4)
    shard_ids = [s["ShardId"] for s in shards]

    starts = []  # the floor of any replacement: an actor start, measured here, side by side
    for _ in range(3):
        t_a = time.time()
        idle = Idle.remote()
        ray.get(idle.pid.remote())
        starts.append(time.time() - t_a)
        ray.kill(idle)
    actor_start = median(starts)
    res.add("failover", "ray_actor_start_s", actor_start, "s",
            note="create a do-nothing actor and get its first answer (a new worker process): the floor of "
                 "every takeover that waits for an actor; median of 3")

    per_kill: list[dict[str, Any]] = []
    with Publisher(ctx.endpoint, stream, _stamped(list(hash_keys(shards).values())), period_s, "failover-publisher"):
        inst = _Instance(ctx, table, stream, "reader-kill", None)
        try:
            t0 = time.time()
            wait_for(lambda: inst.flowing(t0, shard_ids), timeout_s=30, interval_s=0.2)
            for i in range(kills):
                st = wait_for(lambda: _pool_whole(inst.sub, shard_ids), timeout_s=90, interval_s=0.25)
                if not st:
                    raise RuntimeError(f"reader kill {i + 1}: the pool was not whole again within 90 s")
                time.sleep(0.5)  # every shard at its tip, records flowing
                st = _pool_whole(inst.sub, shard_ids) or st
                before = {r["pid"]: r for r in st["readers"]}
                holders = sorted((r for r in st["readers"] if r["shards"] > 0), key=lambda r: r["reader"])
                victim = holders[i % len(holders)]
                held = sorted(sid for sid in shard_ids if st["shards"][sid]["pid"] == victim["pid"])
                replaced0 = st["readers_replaced"]
                target = psutil.Process(victim["pid"])
                title = (target.cmdline() or [""])[0]
                if not title.startswith("ray::ShardReader"):
                    raise RuntimeError(f"pid {victim['pid']} from stats() is {title!r}, not a ShardReader: not killed")
                t_kill = time.time()
                os.kill(victim["pid"], signal.SIGKILL)
                seen: dict[str, float] = {}

                def every_shard_back(seen: dict[str, float] = seen, t_kill: float = t_kill, held: list[str] = held) -> bool:
                    seen.update(inst.sink_fresh(t_kill, held))
                    return len(seen) == len(held)

                wait_for(every_shard_back, timeout_s=30, interval_s=0.05)
                got = dict(seen)
                after = wait_for(lambda: _pool_whole(inst.sub, shard_ids), timeout_s=90, interval_s=0.25) or {}
                new_pids = [r["pid"] for r in after.get("readers", []) if r["pid"] not in before]
                created = {}
                for pid in new_pids:
                    try:
                        created[pid] = psutil.Process(pid).create_time()
                    except Exception:
                        pass
                last = max(got.values()) if len(got) == len(held) else None
                delivering = {sid: after.get("shards", {}).get(sid, {}).get("pid") for sid in held}
                rec = {
                    "reader": victim["reader"], "pid": victim["pid"], "shards": held,
                    "every_s": None if last is None else last - t_kill,
                    "first_s": min(got.values()) - t_kill if got else None,
                    "delivering_pids": delivering,
                    "by_pool_reader_of_before": all(p in before and p != victim["pid"] for p in delivering.values()),
                    "new_process_before_deliveries": any(c < last for c in created.values()) if last else None,
                    "readers_replaced": after.get("readers_replaced", replaced0) - replaced0,
                }
                per_kill.append(rec)
                ctx.log(f"  reader SIGKILL {i + 1}: reader {victim['reader']} (pid {victim['pid']}, {len(held)} shards): "
                        f"every shard in {rec['every_s']} s, first {rec['first_s']} s; read on by {delivering}; "
                        f"new pids {new_pids}")
        finally:
            inst.close()
    every = [k["every_s"] for k in per_kill if k["every_s"] is not None]
    clean = sum(1 for k in per_kill if k["by_pool_reader_of_before"])
    med = median(every)
    complete = len(every) == kills
    res.add("failover", "reader_sigkill_to_shards_delivering_s", med, "s", anchor="ray_actor_start_s",
            anchor_value=actor_start,
            goal=f"<= 0.5 s median over {kills} kills, no actor start on the path",
            check=lambda v: v <= 0.5 and complete and clean == kills,
            note=f"SIGKILL (os.kill) of a ShardReader's pid from stats() holding >= 1 shard, {kills} kills, each once "
                 f"the pool was whole; kill -> the first batch from EVERY shard it held with a record published after "
                 f"the kill (publisher: every shard every {period_s * 1000:.0f} ms); all: "
                 f"{[None if k['every_s'] is None else round(k['every_s'], 3) for k in per_kill]}; shards per kill "
                 f"{[len(k['shards']) for k in per_kill]}; 4 shards, default max_shards_per_reader, DynamoDB "
                 f"lease table, lease {t['lease_duration_s']:g} s")
    res.add("failover", "reader_sigkill_first_shard_delivering_s", median(k["first_s"] for k in per_kill), "s",
            anchor="ray_actor_start_s", anchor_value=actor_start,
            note=f"kill -> the first of its shards delivering again; all "
                 f"{[None if k['first_s'] is None else round(k['first_s'], 3) for k in per_kill]}")
    res.add("failover", "reader_sigkill_read_on_by_pool_readers", clean, "kills", anchor="kills", anchor_value=kills,
            goal="every kill", check=lambda v: v == kills,
            note="kills after which every shard of the dead reader was read by a reader that was in the pool before "
                 "the kill (stats()['shards'][...]['pid'])")
    res.add("failover", "reader_sigkill_new_process_before_deliveries", sum(1 for k in per_kill if k[
        "new_process_before_deliveries"]), "kills", anchor="kills", anchor_value=kills,
            note="kills where the replacement reader's process was created (psutil create_time) before the last of "
                 "those deliveries: it starts in the background, off the path; informational")


def run(ctx: Any, res: Results) -> None:
    import ray

    t = ctx.timings
    bound = t["lease_duration_s"] + 2.0
    timing_note = (f"lease {t['lease_duration_s']:g} s, renew {t['renew_interval_s']:g} s, "
                   f"lease poll {t['lease_poll_interval_s']:g} s")

    # (a) crash in the driver: Subscription.abort()
    stream, table, _, victim, survivor, pub = _pair(ctx, "crash")
    try:
        lost = victim.held()
        t0 = time.time()
        wait_for(lambda: victim.flowing(t0, lost) and survivor.flowing(t0, survivor.held()), timeout_s=20, interval_s=0.2)
        time.sleep(1.0)
        watcher = _RowWatcher(ctx, table, stream, lost, "victim-crash")
        time.sleep(0.5)
        t_kill = time.time()
        victim.sub.abort()
        first, every = _await_takeover(ctx, survivor, t_kill, lost)
        _split(res, "crash", watcher, t_kill)
        ctx.log(f"  crash: first {first} s, every shard {every} s ({lost})")
        res.add("failover", "crash_to_survivor_first_record_s", first, "s", anchor="lease_duration_s + 2", anchor_value=bound,
                goal=f"<= {bound:g} s", check=lambda v: v <= bound,
                note=f"Subscription.abort() of the instance holding {len(lost)} shards; {timing_note}")
        res.add("failover", "crash_to_survivor_every_shard_s", every, "s", anchor="lease_duration_s + 2", anchor_value=bound)
    finally:
        pub.__exit__()
        survivor.close()
        victim.conn.shutdown()

    # (b) clean close -> the other instance reading
    stream, table, _, victim, survivor, pub = _pair(ctx, "close")
    try:
        lost = victim.held()
        t0 = time.time()
        wait_for(lambda: victim.flowing(t0, lost), timeout_s=20, interval_s=0.2)
        time.sleep(1.0)
        watcher = _RowWatcher(ctx, table, stream, lost, "victim-close")
        time.sleep(0.5)
        t_close = time.time()
        victim.close()
        closed_s = time.time() - t_close
        first, every = _await_takeover(ctx, survivor, t_close, lost)
        _split(res, "close", watcher, t_close)
        ctx.log(f"  close: close() {closed_s:.2f} s, first {first} s, every shard {every} s")
        res.add("failover", "close_to_other_reading_s", first, "s", anchor="goal", anchor_value=3.0, goal="<= 3 s",
                check=lambda v: v <= 3.0, note=f"from the victim's close() call; close() itself took {closed_s:.2f} s; {timing_note}")
        res.add("failover", "close_to_other_every_shard_s", every, "s", anchor="goal", anchor_value=3.0)
    finally:
        pub.__exit__()
        survivor.close()

    # (c) the victim in a child process, SIGKILLed
    stream, table = f"bench-fo-sigkill-{uuid.uuid4().hex[:6]}", f"bench-fo-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, 4)
    t_spawn = time.time()
    child = spawn(ray.get_runtime_context().gcs_address, ctx.endpoint, table, stream, "victim-proc", 2, t)
    ctx.children.append(child)
    survivor = None
    with Publisher(ctx.endpoint, stream, _stamped(list(hash_keys(shards).values())), name="failover-publisher"):
        try:
            lost = await_ready(child)
            ctx.log(f"  child instance ready in {time.time() - t_spawn:.1f} s holding {lost}")
            survivor = _Instance(ctx, table, stream, "survivor-proc", None)
            t0 = time.time()
            wait_for(lambda: survivor.flowing(t0, sorted(set(s["ShardId"] for s in shards) - set(lost))), timeout_s=20,
                     interval_s=0.2)
            time.sleep(1.0)
            watcher = _RowWatcher(ctx, table, stream, lost, "victim-proc")
            time.sleep(0.5)
            t_kill = time.time()
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            first, every = _await_takeover(ctx, survivor, t_kill, lost)
            _split(res, "sigkill", watcher, t_kill)
            ctx.log(f"  sigkill: first {first} s, every shard {every} s")
            res.add("failover", "sigkill_to_survivor_first_record_s", first, "s", anchor="lease_duration_s + 2",
                    anchor_value=bound, goal=f"<= {bound:g} s", check=lambda v: v <= bound,
                    note=f"victim = its own Ray job in a child process, SIGKILL of its driver; {timing_note}")
            res.add("failover", "sigkill_to_survivor_every_shard_s", every, "s", anchor="lease_duration_s + 2", anchor_value=bound)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            if survivor is not None:
                survivor.close()

    # (d) SIGKILL of one reader of an instance -> its shards delivering again from live readers
    _reader_sigkills(ctx, res)
