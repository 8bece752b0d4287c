"""ShardReaderCore: the shard consumers of one reader process (plain asyncio, no Ray), and
the :class:`ShardEvent` it reports for each."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from ..clock import cpu_s, monotonic_s, wall_s
from ..errors import InvalidError
from ..leases.protocol import Lease, LeaseStore
from ..load.busy import LoopBusyMeter
from ..load.meter import LoadFigures
from ..metrics import reader_load_tick
from ..records import StartAt
from ..sinks.hooks import ShardHook
from .consumer import STOP_SLACK_S, ShardConsumer
from .io import ReaderIo
from .reading import ByteBudget
from .spec import DEFAULT_MAX_BUFFERED_BYTES, Deliver, ReaderSpec, Rng, Sleep
from .states import ConsumerState
from .timers import wait_all, wait_event

__all__ = ["ShardReaderCore", "ShardEvent"]

log = logging.getLogger("kinesis_actors.reader")


@dataclasses.dataclass(frozen=True)
class ShardEvent:
    """What a reader reports of one consumer: how it ended, or (from ``add``) how far it got.

    Attributes:
        shard_id: the shard.
        state: a :class:`ConsumerState` (``PROCESSING`` from ``add`` when it opened); a
            value string given here is turned into its member.
        error: the fatal error of a ``FAILED`` consumer, else None.
        checkpoint: the consumer's last checkpoint (a sequence number, ``SHARD_END``) or None.
    """

    shard_id: str
    state: ConsumerState
    error: BaseException | None = None
    checkpoint: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.state, ConsumerState):
            object.__setattr__(self, "state", ConsumerState(self.state))


class ShardReaderCore:
    """The shard consumers of one reader process (plain asyncio; :class:`ShardReader` is its Ray shell).

    Every consumer reports its terminal state exactly once, through :meth:`events`;
    :meth:`add` also says how far a new consumer got (``"processing"``: its first
    iterator is held).

    Per-shard cost in this process: two asyncio tasks (the loop and its renew task), and
    while records flow one more per fetch ahead and per batch in flight; one
    :class:`~kinesis_actors.kinesis.ShardFetcher` and its stats; no thread and no
    connection of its own (the :class:`ReaderIo` pools are per process), at most one
    unacknowledged batch (``parallelization_factor`` with lanes), and bytes counted in the
    process's :class:`ByteBudget`.

    Args:
        store: the lease store (blocking calls).
        deliver: ``async deliver(records)`` shared by every consumer; returning acknowledges.
        kinesis: a boto3 Kinesis client shared by every consumer (thread-safe; its HTTP
            pool sized like ``io``'s Kinesis pool).
        max_buffered_bytes: the byte budget of this process, bytes.
        io: the thread pools (default :class:`ReaderIo` with :data:`DEFAULT_THREADS` each).
        clock: monotonic seconds. sleep: ``async sleep`` on that clock (every timer of the
            reader and its consumers).
        hooks: ``hooks(stream, shard_id, lease_counter)``, the sink's
            :class:`~kinesis_actors.sinks.hooks.ShardHook` of each lease (a table sink's), or
            None (no hooks: :func:`~kinesis_actors.sinks.hooks.shard_hooks`).
        load_window_s: the window of the load figures (process CPU, each shard's bytes/s
            and records/s), seconds; they are sampled at every :meth:`events` and
            :meth:`stats` call (the Coordinator's watch calls ``events`` every few seconds).
        cpu_time: CPU seconds used by this process so far (default :func:`~kinesis_actors.clock.cpu_s`).
        wall_clock: epoch seconds (record ages, ``AT_TIMESTAMP``; default :func:`~kinesis_actors.clock.wall_s`).
        rng: uniform draws in [0, 1) for every consumer's renewal spread and backoff jitter
            (default ``random.random``).
        loop_busy: the meter of the event loop this core runs on (its figure ``loop_busy``), or None
            (not measured: several in-process cores sharing one loop, as tests run them, would
            each report the whole loop's). The reader process passes one.

    Raises:
        InvalidError: ``max_buffered_bytes`` is not a positive int.
    """

    def __init__(self, *, store: LeaseStore, deliver: Deliver, kinesis: Any,
                 max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES, io: ReaderIo | None = None,
                 clock: Callable[[], float] = monotonic_s, sleep: Sleep = asyncio.sleep,
                 hooks: Callable[[str, str, int], ShardHook] | None = None,
                 load_window_s: float = 10.0, cpu_time: Callable[[], float] = cpu_s,
                 wall_clock: Callable[[], float] = wall_s, rng: Rng | None = None,
                 loop_busy: LoopBusyMeter | None = None) -> None:
        self._wall_clock, self._rng = wall_clock, rng
        self._store = store
        self._hooks = hooks
        self._deliver = deliver
        self._kinesis = kinesis
        self._io = io if io is not None else ReaderIo(clock=clock, sleep=sleep)
        self._clock = clock
        self._sleep = sleep
        self.budget = ByteBudget(max_buffered_bytes, sleep=sleep)
        self._consumers: dict[str, ShardConsumer] = {}
        self._tasks: dict[str, asyncio.Task[ConsumerState]] = {}
        self._events: list[ShardEvent] = []
        self._events_changed: asyncio.Event | None = None
        self._ended: dict[str, dict[str, Any]] = {}  # last stats of consumers that ended (bounded below)
        self.info: dict[str, Any] = {}
        self.load = LoadFigures(load_window_s, cpu_time=cpu_time, clock=clock, busy=loop_busy)
        self._load_figures: dict[str, Any] = {"cpu": 0.0}

    def _changed(self) -> asyncio.Event:
        if self._events_changed is None:
            self._events_changed = asyncio.Event()
        return self._events_changed

    def shard_ids(self) -> list[str]:
        """The shards with a live consumer here."""
        return sorted(self._consumers)

    async def add(self, spec: ReaderSpec, lease: Lease, *, lease_age_s: float | None = None) -> ShardEvent:
        """Start a consumer for ``lease`` and wait until it holds its first iterator.

        ``lease_age_s``: seconds since the write that produced ``lease`` was sent (the
        Coordinator's take; a lower bound on its age). A lease older than the renew
        deadline is renewed before the first delivery, so a lease another instance took
        meanwhile delivers nothing. None: at most one renew interval old.

        Returns:
            ``ShardEvent(state="processing")`` once the shard is open, or the consumer's
            terminal state if it ended first (``lost``, ``failed`` with its error,
            ``shard_ended``); the terminal state is reported by :meth:`events` as well.

        Raises:
            InvalidError: this reader already reads ``spec.shard_id``.
        """
        shard_id = spec.shard_id
        if shard_id in self._consumers:
            raise InvalidError(f"shard {shard_id} is already read by this reader")
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_open() -> None:
            if not opened.done():
                opened.set_result(None)

        hook = self._hooks(spec.stream, shard_id, lease.counter) if self._hooks is not None else None
        consumer = ShardConsumer(spec, lease, self._store, self._deliver, self._kinesis, io=self._io,
                                 budget=self.budget, clock=self._clock, on_open=on_open, lease_age_s=lease_age_s,
                                 sleep=self._sleep, hook=hook, wall_clock=self._wall_clock, rng=self._rng)
        self._consumers[shard_id] = consumer
        # The consumer's run() is the task itself (no wrapper coroutine resumed at every step);
        # what the process keeps of it is settled by a callback once it ends.
        task: asyncio.Task[ConsumerState] = asyncio.create_task(consumer.run(), name=f"shard-{shard_id}")
        task.add_done_callback(lambda done: self._ended_run(consumer, done))
        self._tasks[shard_id] = task
        either: list[asyncio.Future[Any]] = [task, opened]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if opened.done():
            return ShardEvent(shard_id, ConsumerState.PROCESSING, checkpoint=consumer.lease.checkpoint)
        return self._event_of(consumer)

    @staticmethod
    def _event_of(consumer: ShardConsumer) -> ShardEvent:
        return ShardEvent(consumer.spec.shard_id, consumer.state, consumer.error, consumer.lease.checkpoint)

    def _ended_run(self, consumer: ShardConsumer, task: asyncio.Task[ConsumerState]) -> None:
        """A consumer's run ended (a terminal state, a failure, or cancelled): report it once,
        keep its last stats (bounded), forget it. Runs before anyone awaiting the task resumes
        (the first of its done callbacks)."""
        shard_id = consumer.spec.shard_id
        if not task.cancelled() and task.exception() is not None:  # FAILED: the consumer kept the error
            log.error("shard %s: read loop failed: %r", shard_id, task.exception())
        self._consumers.pop(shard_id, None)
        self._tasks.pop(shard_id, None)
        self._ended[shard_id] = dict(consumer.stats)
        while len(self._ended) > 4 * max(1, len(self._consumers)) + 64:
            self._ended.pop(next(iter(self._ended)))
        self._events.append(self._event_of(consumer))
        self._changed().set()

    async def events(self, timeout_s: float) -> list[ShardEvent]:
        """The terminal states reported since the last call; waits up to ``timeout_s``
        seconds for the first one. Returns ``[]`` on timeout."""
        if not self._events:
            event = self._changed()
            event.clear()
            await wait_event(event, timeout_s, self._sleep)
        out, self._events = self._events, []
        self.sample_load()
        return out

    def sample_load(self) -> dict[str, Any]:
        """Sample the load figures now: the process's ``cpu`` (cores) and ``loop_busy`` are returned, and each
        consumer's ``stats`` gains ``bytes_per_s``, ``records_per_s`` and ``load_known``
        (exported as metrics with the shard's other figures); the CPU and loop_busy are exported too."""
        self.load.annotate(self._load_figures, {sid: c.stats for sid, c in self._consumers.items()})
        spec = next((c.spec for c in self._consumers.values()), None)
        if spec is not None:
            reader_load_tick(spec.stream, spec.owner_id, str(self.info.get("pid", "")), self._load_figures,
                             now=self._clock())
        return self._load_figures

    async def stop(self, shard_id: str | None = None, *, release: bool = True, grace_s: float = 5.0) -> None:
        """Stop one consumer (or every one, ``shard_id=None``) as :meth:`ShardConsumer.stop`
        does, all at once; returns within ``grace_s`` plus
        :data:`~kinesis_actors.reader.consumer.STOP_SLACK_S` seconds and a little, even while
        the lease table hangs: a lease write still hanging then is not awaited (it lands, or
        the lease expires; the shards left so are logged)."""
        targets = [c for sid, c in list(self._consumers.items()) if shard_id is None or sid == shard_id]
        await asyncio.gather(*(c.stop(release=release, grace_s=grace_s) for c in targets), return_exceptions=True)
        tasks = {sid: t for sid, t in list(self._tasks.items()) if shard_id is None or sid == shard_id}
        if tasks:
            await wait_all(set(tasks.values()), STOP_SLACK_S, self._sleep)
            left = sorted(sid for sid, t in tasks.items() if not t.done())
            if left:
                log.warning("stop: %d shard(s) not stopped by the deadline, their leases left to expire: %s",
                            len(left), ", ".join(left[:20]))

    def request_handoff(self, shard_id: str, asker: str) -> bool:
        """Hand ``shard_id`` to the instance ``asker`` (its owner id) after the batch in flight:
        the same as a store write returning ``lease_next_owner=asker`` (checkpoint, then one
        fenced ``hand_over``), without waiting for the next renewal. False if the shard is not
        read here (or its consumer is ending)."""
        consumer = self._consumers.get(shard_id)
        return consumer is not None and consumer.request_handoff(asker)

    async def seek(self, shard_id: str, position: StartAt) -> bool:
        """Reopen ``shard_id`` at ``position`` (see :meth:`ShardConsumer.seek`); False if not read here."""
        consumer = self._consumers.get(shard_id)
        if consumer is None:
            return False
        await consumer.seek(position)
        return True

    def stats(self) -> dict[str, Any]:
        """``{"shards": {shard id: figures}, "reader": figures of this process}``.

        Shard figures: records, bytes, batches, get_records_calls, throttles,
        expired_iterators, sink_failures, millis_behind_latest (ms), checkpoint,
        checkpoint_age_s (None without a checkpoint), checkpoints_written, dead_letter_records,
        lease_counter, state; with enhanced fan-out also retrieval
        ("fanout"), subscriptions (accepted), subscription_renewals, subscription_drops
        and budget_drops. Reader figures: shards, buffered_bytes,
        peak_buffered_bytes, max_buffered_bytes, budget_waits, kinesis_call_limit and
        kinesis_call_limit_cuts (:class:`CallLimit`), ``cpu`` (cores over the last
        ``load_window_s``, 0.0 before a full window), ``loop_busy`` (fraction of wall time
        the event loop was busy over that window, 0.0 while not known), ``load_known``,
        ``loop_busy_known`` and ``load_window_s``, and :attr:`info`
        (the shell adds node_id and pid). Each shard's figures also carry ``bytes_per_s``,
        ``records_per_s`` and ``load_known`` (:meth:`sample_load`).
        """
        budget, limit = self.budget, getattr(self._io, "limit", None)  # an IO without a call limit: 0
        load = self.sample_load()
        shards = {sid: dict(c.stats) for sid, c in self._consumers.items()}
        return {"shards": shards, "ended": dict(self._ended),
                "reader": {**self.info, **load, "shards": len(shards), "buffered_bytes": budget.used,
                           "peak_buffered_bytes": budget.peak, "max_buffered_bytes": budget.limit,
                           "budget_waits": budget.waits, "kinesis_call_limit": int(limit.limit) if limit else 0,
                           "kinesis_call_limit_cuts": limit.cuts if limit else 0}}

    def abort(self) -> None:
        """Cancel every consumer where it stands, writing nothing more (a store write
        already sent still lands): what a SIGKILL of the process does, for tests."""
        for task in list(self._tasks.values()):
            task.cancel()

    async def close(self, *, release: bool = True, grace_s: float = 5.0) -> None:
        """Stop every consumer, then the thread pools."""
        await self.stop(None, release=release, grace_s=grace_s)
        close = getattr(self._io, "close", None)
        if callable(close):
            close()
