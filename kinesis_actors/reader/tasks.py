"""The tasks of a consumer's states other than ``PROCESSING`` (compare KCL's ``InitializeTask``
and ``ShutdownTask``), and the seek; :data:`~.states.BEHAVIOURS` says which state runs which.

Each is a function over the consumer's parts (its :class:`~.lease.LeaseKeeper`, its
:class:`~.lease.CheckpointPacer`, its :class:`~.reading.Reading`); every store write is the
keeper's fenced write, so a lease lost meanwhile raises ``LeaseLostError`` and writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .. import mutation
from ..errors import KinesisError, LeaseLostError, SinkError
from ..leases.protocol import SHARD_END, Lease
from ..records import StartAt
from ..sinks.hooks import ShardHook
from .fetcher import new_fetcher
from .io import ReaderIo, ToThreadIo
from .lease import CheckpointPacer, LeaseKeeper
from .reading import Reading
from .spec import ReaderSpec
from .states import Stop, StopReason

__all__ = ["resume_position", "initialize", "finish_sink", "shut_down", "leave_after_failure", "seek"]

log = logging.getLogger("kinesis_actors.reader")

_EARLY_RELEASE = mutation.register("handoff_release_before_checkpoint",
                                   "a handoff or release lets the lease go, then writes its last checkpoint")

T = TypeVar("T")
AwaitAlive = Callable[[Awaitable[T]], Awaitable[T]]
"""Awaits its argument while keeping the consumer alive (its lease renewed)."""

SHARD_END_WAITS = 20
"""How many times a shard end asks its sink to finish (each up to half a lease duration)
before the consumer fails instead of writing ``SHARD_END`` (a sink that cannot finish, a
table whose catalog stays down that long: the next owner reads the shard again)."""


LATEST_CLOCK_MARGIN_S = 5.0
"""How much earlier than this host's wall clock a first open at ``LATEST`` records its
``start_position`` (``AT_TIMESTAMP``), seconds. ``AT_TIMESTAMP`` is judged by AWS against each
record's ``ApproximateArrivalTimestamp`` (the service's clock), so a host clock ahead of the
service's by ``d`` would record a position ``d`` after the ``LATEST`` iterator actually read, and a
replacement opening there before any checkpoint (or this reader, after its first iterator
expired) would skip the records of those ``d`` seconds. Recording earlier costs at most this
many seconds of records before the first open, delivered again by such a replacement
(at-least-once); it covers host clocks up to this far ahead."""


def resume_position(lease: Lease) -> StartAt | None:
    """Where ``lease`` says to open: after its checkpoint, else its recorded start position
    (None: a first open, nothing recorded yet)."""
    if lease.checkpoint and lease.checkpoint != SHARD_END:
        return StartAt.after_sequence_number(lease.checkpoint, lease.checkpoint_sub_sequence)
    if lease.start_position:
        return StartAt.parse(lease.start_position)
    return None


async def initialize(spec: ReaderSpec, kinesis: Any, keeper: LeaseKeeper, reading: Reading, *,
                     clock: Callable[[], float], wall_clock: Callable[[], float],
                     stopping: Callable[[], bool], alive: Callable[[], None], hook: ShardHook | None,
                     checkpoints: CheckpointPacer, await_alive: AwaitAlive[Any]) -> Stop | None:
    """``INITIALIZING``: open the shard on the sink's ``hook`` when it has one (it may move the
    start past the lease's checkpoint, which then catches up through ``checkpoints``; the
    hook's open is awaited through ``await_alive``, so the lease is renewed meanwhile); record
    ``start_position`` on a first open (``LATEST`` resolved once: ``AT_TIMESTAMP`` of this
    moment is recorded, the ``LATEST`` iterator itself is read; a transient store error is
    retried by :meth:`LeaseKeeper.retried`), then fetch the first shard iterator (throttling
    is retried while the lease is held).

    Returns:
        ``Stop(SHARD_END)`` for a row already at ``SHARD_END`` (nothing to read); else None,
        once the first iterator is held or ``stopping()`` (stopped before it ever read).

    Raises:
        LeaseLostError: the lease was taken away meanwhile (or the hook knows of a newer
            owner), or recording ``start_position`` failed until the lease was in doubt.
            StreamError/KinesisError: ``GetShardIterator`` failed and is not transient; the
            hook's open failed.
    """
    if keeper.lease.checkpoint == SHARD_END:  # finished before: nothing to read, let the row go
        return Stop(StopReason.SHARD_END, why="the row is at SHARD_END")
    position = resume_position(keeper.lease)
    if hook is not None:
        after = await await_alive(hook.open(keeper.lease))
        if after is not None and after.sequence_number is not None:
            position = after  # the lease's checkpoint catches up with what the sink holds
            checkpoints.acknowledged(after.sequence_number, after.sub_sequence_number)
    start = position
    if position is None:  # a first open: record where, resolved once
        start = recorded = spec.start_at
        if start.kind == "LATEST":  # earlier by the clock margin: never after the LATEST iterator by AWS's clock
            recorded = StartAt("AT_TIMESTAMP", timestamp_ms=int((wall_clock() - LATEST_CLOCK_MARGIN_S) * 1000))
        at = recorded.to_str()
        await keeper.retried("set_start_position", lambda: keeper.write(
            "set_start_position", keeper.store.set_start_position, at))
        position = recorded
    assert start is not None
    # Opens at `start` (LATEST itself on a first open); an iterator that expires before
    # any record reopens at the recorded position, never at a later tip.
    reading.fetcher = fetcher = new_fetcher(spec, kinesis, start, restart_at=position, clock=clock)
    while not fetcher.has_iterator:
        await reading.pace(stopping)
        if stopping():  # stopped (or asked for) before it ever read: nothing to checkpoint
            return None
        await reading.step()
        alive()
    return None


async def finish_sink(stop: Stop, spec: ReaderSpec, hook: ShardHook, checkpoints: CheckpointPacer,
                      await_alive: AwaitAlive[Any]) -> None:
    """``SHUTTING_DOWN``, before the lease is let go: the sink's ``hook`` finishes what it holds
    for the lease, and what it then allows is checkpointed (by :func:`shut_down`). A shard end
    asks up to :data:`SHARD_END_WAITS` times; a close or handoff once, and goes on to
    checkpoint what was allowed before if the hook fails.

    Raises:
        LeaseLostError: the hook knows of a newer owner. SinkError: a shard end the hook
            could not finish (``SHARD_END`` is not written; retriable).
    """
    if stop.reason not in (StopReason.REQUESTED, StopReason.HANDOFF, StopReason.SHARD_END):
        return
    shard_end = stop.reason is StopReason.SHARD_END
    timeout_s = max(1.0, spec.lease_duration_s / 2)
    error: KinesisError | None = None
    for _ in range(SHARD_END_WAITS if shard_end else 1):
        try:
            point = await await_alive(hook.finish(shard_end=shard_end, timeout_s=timeout_s))
        except LeaseLostError:
            raise
        except KinesisError as e:
            error = e
            continue
        if point is not None:
            checkpoints.acknowledged(*point)
        return
    if shard_end:
        raise SinkError(f"shard {spec.shard_id}: the sink did not finish its last records after "
                        f"{SHARD_END_WAITS} tries ({error})", retriable=True) from error
    log.warning("shard %s: the sink did not finish (%s); checkpointing what it allowed before", spec.shard_id, error)


async def shut_down(stop: Stop, spec: ReaderSpec, keeper: LeaseKeeper, checkpoints: CheckpointPacer,
                    io: ReaderIo | ToThreadIo, stats: dict[str, Any]) -> Stop:
    """``SHUTTING_DOWN``: let the lease go as ``stop`` says.

    * ``SHARD_END``: write the ``SHARD_END`` checkpoint (past every acknowledged record:
      the read loop drained the shard first; a transient store error is retried by
      :meth:`LeaseKeeper.retried`), then release (a store error other than a lost lease is
      logged: the row, at ``SHARD_END``, then expires).
    * ``REQUESTED``/``HANDOFF``: checkpoint what was acknowledged, then hand the lease to
      the asker, or release it (unless asked to keep it). A store error other than a lost
      lease is logged: the lease then expires.

    Returns:
        The stop as it ended: ``stop``, or a ``REQUESTED`` stop when a hand-over became a
        release (the asker withdrew) or did not happen (a store error).

    Raises:
        LeaseLostError: the lease was lost, or ``SHARD_END`` failed until the lease was in
            doubt: nothing more is written.
    """
    store = keeper.store
    if stop.reason is StopReason.SHARD_END:
        await _end_shard(spec, keeper, checkpoints, stats)
        return stop
    late = _EARLY_RELEASE in mutation.ACTIVE
    try:  # close and handoff: the acknowledged records are checkpointed first
        if not late:
            await checkpoints.flush()
    except LeaseLostError:
        raise
    except KinesisError as e:
        log.warning("shard %s: the last checkpoint failed (%s)", spec.shard_id, e)
    if stop.reason is StopReason.REQUESTED and not stop.release:
        return stop
    to = await _current_asker(stop.to, spec, keeper, io) if stop.reason is StopReason.HANDOFF else None
    try:
        if to is not None:
            await keeper.write("hand-over", lambda lease: store.hand_over(lease, to=to))
            log.info("shard %s: handed over to %s at checkpoint %s", spec.shard_id, to, keeper.lease.checkpoint)
            if late:
                await _checkpoint_late(checkpoints)
            return stop
        await keeper.write("release", lambda lease: store.release(lease))
        if late:
            await _checkpoint_late(checkpoints)
    except LeaseLostError:
        raise
    except KinesisError as e:
        log.warning("shard %s: %s failed (%s); the lease will expire", spec.shard_id,
                    "hand-over" if to else "release", e)
    return stop if stop.reason is StopReason.REQUESTED else Stop(StopReason.REQUESTED, why="released, not handed over")


async def _end_shard(spec: ReaderSpec, keeper: LeaseKeeper, checkpoints: CheckpointPacer,
                     stats: dict[str, Any]) -> None:
    """``SHARD_END``'s part of :func:`shut_down`: the ``SHARD_END`` checkpoint (retried), then
    the release (a store error other than a lost lease is logged; the row then expires).

    Raises:
        LeaseLostError: the lease was lost, or the checkpoint failed until the lease was in doubt.
    """
    store = keeper.store
    checkpoints.clear()  # SHARD_END is past every acknowledged record
    if keeper.lease.checkpoint != SHARD_END:
        await keeper.retried("checkpoint SHARD_END", lambda: keeper.write(
            "checkpoint SHARD_END", store.checkpoint, SHARD_END))
    stats["checkpoint"] = SHARD_END
    try:
        await keeper.write("release", lambda lease: store.release(lease))
    except LeaseLostError:
        raise
    except KinesisError as e:  # the row is at SHARD_END already: it only waits to expire
        log.warning("shard %s: SHARD_END written; the release failed (%s), the lease will expire",
                    spec.shard_id, e)
        return
    log.info("shard %s: read to its end; SHARD_END written, lease released", spec.shard_id)


async def _checkpoint_late(checkpoints: CheckpointPacer) -> None:
    """The planted bug ``handoff_release_before_checkpoint``: the last checkpoint, written after
    the lease was handed over or released (with the Lease that write returned: after a hand-over
    it lands unless the receiver wrote first)."""
    try:
        await checkpoints.flush()
    except Exception as e:  # released (no owner), or the receiver wrote first
        log.info("planted late checkpoint refused (%r)", e)


async def _current_asker(asker: str | None, spec: ReaderSpec, keeper: LeaseKeeper,
                         io: ReaderIo | ToThreadIo) -> str | None:
    """Who asks for this lease now: the asker may have withdrawn (it closed) or been
    replaced by another since the write that told us. None: release instead."""
    try:
        row = await io.store(keeper.store.get, spec.stream, spec.shard_id)
    except Exception:  # the store unreadable now: the hand-over write (fenced) will find out
        return asker
    if row is None or row.owner != spec.owner_id or row.counter != keeper.lease.counter:
        return asker  # the hand-over write will find out
    return row.next_owner if row.next_owner != spec.owner_id else None


async def leave_after_failure(spec: ReaderSpec, keeper: LeaseKeeper, checkpoints: CheckpointPacer) -> None:
    """``FAILED``: checkpoint what was acknowledged and release the lease, best effort (any
    error is logged: the lease then expires at the last checkpoint)."""
    try:
        if keeper.lost is None:
            await checkpoints.flush()
            await keeper.write("release", lambda lease: keeper.store.release(lease))
    except Exception as e:
        log.info("shard %s: release after the failure did not happen (%r); the lease will expire",
                 spec.shard_id, e)


async def seek(position: StartAt, spec: ReaderSpec, keeper: LeaseKeeper, checkpoints: CheckpointPacer,
               reading: Reading, stats: dict[str, Any]) -> None:
    """Reopen the shard at ``position``: records fetched and not acknowledged are dropped
    (their budget bytes given back; the caller has ended any fetch and delivery in flight),
    ``start_position`` is rewritten (fenced), the checkpoint cleared (the one allowed move
    backwards) and the fetcher reopened there.

    The write is retried like every lease write (:meth:`LeaseKeeper.retried`): a transient
    store error never fails the read loop; the lease is given up once in doubt.

    Raises:
        LeaseLostError: the lease was lost (or given up in doubt). KinesisError: the store
            refused the write for good (not retriable).
    """
    reading.give_back()
    fetcher = reading.fetcher
    assert fetcher is not None
    at = position.to_str()
    await keeper.retried("seek", lambda: keeper.write("seek", keeper.store.set_start_position, at))
    checkpoints.clear()
    stats["checkpoint"] = None
    fetcher.seek(position)
    log.info("shard %s: seek to %s", spec.shard_id, position)
