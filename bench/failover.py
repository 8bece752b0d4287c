"""Section ``failover`` (issue 9, item 3).

Two instances (two brokers, each with its own ``DynamoLeaseStore`` over one shared lease
table and its own sink actor) read a 4-shard stream while a publisher thread puts one
record into every shard every 0.1 s. The victim subscribes first with ``max_leases=2``;
the survivor takes the rest. Measured, each from the moment of the event to the first
batch the survivor's sink receives from one of the victim's shards:

* ``crash``: ``Subscription._kill()`` (Coordinator and readers killed, no release);
* ``close``: the victim's ``close()`` (checkpoint, release);
* ``sigkill``: the victim runs in a child process (its own Ray job in our cluster) and
  is SIGKILLed;
* ``reader_kill``: ``ray.kill`` of one ShardReader of an instance -> its replacement's
  first delivery (same instance).

Default timings (lease 10 s, renew 3 s, lease poll 2 s) unless ``--quick``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from .common import REGION, Results, client, create_stream, hash_keys, median, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))


class _Publisher:
    """Puts one record into every shard every ``period_s`` (payload ``T<epoch s>|...``)."""

    def __init__(self, endpoint: str, stream: str, keys: list[str], period_s: float = 0.1) -> None:
        self.k = client(endpoint, "kinesis")
        self.stream, self.keys, self.period_s = stream, keys, period_s
        self.stop = threading.Event()
        self.n = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name="failover-publisher")

    def _run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            now = time.time()
            entries = [{"Data": f"T{now:.6f}|{self.n + i}|".encode(), "PartitionKey": f"k{i}", "ExplicitHashKey": ehk}
                       for i, ehk in enumerate(self.keys)]
            try:
                self.k.put_records(StreamName=self.stream, Records=entries)
                self.n += len(entries)
            except Exception:  # noqa: BLE001 - keep publishing
                pass
            self.stop.wait(max(0.0, t + self.period_s - time.monotonic()))

    def __enter__(self) -> "_Publisher":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


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

    def flowing(self, t0: float, shards: list[str]) -> bool:
        import ray

        return set(shards) <= set(ray.get(self.sink.shards_since.remote(t0)))

    def close(self) -> None:
        import ray

        try:
            self.sub.close()
        except Exception:  # noqa: BLE001
            pass
        self.conn.shutdown()
        ray.kill(self.sink)


def _pair(ctx: Any, tag: str) -> tuple[str, str, list[str], _Instance, _Instance, _Publisher]:
    stream, table = f"bench-fo-{tag}-{uuid.uuid4().hex[:6]}", f"bench-fo-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, 4)
    pub = _Publisher(ctx.endpoint, stream, list(hash_keys(shards).values())).__enter__()
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
                except Exception:  # noqa: BLE001
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


def run(ctx: Any, res: Results) -> None:
    import ray

    t = ctx.timings
    bound = t["lease_duration_s"] + 2.0
    timing_note = (f"lease {t['lease_duration_s']:g} s, renew {t['renew_interval_s']:g} s, "
                   f"lease poll {t['lease_poll_interval_s']:g} s")

    # (a) crash in the driver: Subscription._kill()
    stream, table, _, victim, survivor, pub = _pair(ctx, "crash")
    try:
        lost = victim.held()
        t0 = time.time()
        wait_for(lambda: victim.flowing(t0, lost) and survivor.flowing(t0, survivor.held()), timeout_s=20, interval_s=0.2)
        time.sleep(1.0)
        watcher = _RowWatcher(ctx, table, stream, lost, "victim-crash")
        time.sleep(0.5)
        t_kill = time.time()
        victim.sub._kill()
        first, every = _await_takeover(ctx, survivor, t_kill, lost)
        _split(res, "crash", watcher, t_kill)
        ctx.log(f"  crash: first {first} s, every shard {every} s ({lost})")
        res.add("failover", "crash_to_survivor_first_record_s", first, "s", anchor="lease_duration_s + 2", anchor_value=bound,
                goal=f"<= {bound:g} s", check=lambda v: v <= bound,
                note=f"Subscription._kill() of the instance holding {len(lost)} shards; {timing_note}")
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

    # (c) the victim in a child process, SIGKILLed; then (d) reader kill in the survivor
    stream, table = f"bench-fo-sigkill-{uuid.uuid4().hex[:6]}", f"bench-fo-{uuid.uuid4().hex[:8]}"
    shards = create_stream(ctx.endpoint, stream, 4)
    address = ray.get_runtime_context().gcs_address
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    t_spawn = time.time()
    child = subprocess.Popen([sys.executable, "-m", "bench._instance", "--address", address, "--endpoint", ctx.endpoint,
                              "--table", table, "--stream", stream, "--owner", "victim-proc", "--max-leases", "2",
                              "--lease-duration", str(t["lease_duration_s"]), "--renew-interval", str(t["renew_interval_s"]),
                              "--poll-interval", str(t["lease_poll_interval_s"])],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=os.path.dirname(HERE))
    ctx.children.append(child)
    survivor = None
    with _Publisher(ctx.endpoint, stream, list(hash_keys(shards).values())):
        try:
            line = ""
            while not line.startswith("READY"):
                line = child.stdout.readline()  # type: ignore[union-attr]
                if not line and child.poll() is not None:
                    raise RuntimeError(f"the child instance exited {child.returncode} before READY")
            lost = json.loads(line.split(" ", 1)[1])
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

            # (d) reader kill -> replacement delivering (same instance)
            times = []
            for i in range(ctx.params["reader_kills"]):
                handles = survivor.sub._call("reader_handles")
                shard = sorted(handles)[i % len(handles)]
                time.sleep(0.5)
                t_kill = time.time()
                ray.kill(handles[shard], no_restart=True)
                # +50 ms: a batch the old reader sent just before it died is not the replacement's
                got = wait_for(lambda: survivor.first_after(t_kill + 0.05, [shard]), timeout_s=30, interval_s=0.05)
                times.append(None if not got else got - t_kill)
                ctx.log(f"  reader kill {shard}: {times[-1]} s")
            ok = [x for x in times if x is not None]
            from .actors import Idle

            starts = []
            for _ in range(3):
                t_a = time.time()
                idle = Idle.remote()
                ray.get(idle.pid.remote())
                starts.append(time.time() - t_a)
                ray.kill(idle)
            res.add("failover", "ray_actor_start_s", median(starts), "s",
                    note="create a do-nothing actor and get its first answer (a new worker process): the floor of "
                         "every takeover and replacement above; median of 3")
            res.add("failover", "reader_kill_to_replacement_delivering_s", median(ok), "s", anchor="goal", anchor_value=2.0,
                    goal="<= 2 s", check=lambda v: v <= 2.0,
                    note=f"ray.kill of one ShardReader; median of {len(ok)} (all: {[round(x, 2) for x in ok]})")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            if survivor is not None:
                survivor.close()
