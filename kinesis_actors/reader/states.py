"""The life of one shard lease in a reader: :class:`ConsumerState`, its moves, and why it stops.

A consumer's next move is decided by its state and ONE :class:`Stop` (compare KCL's
``ConsumerStates`` and its single ``ShutdownReason``): no combination of flags.
"""

from __future__ import annotations

import dataclasses
import enum

__all__ = ["ConsumerState", "TRANSITIONS", "StopReason", "Stop"]


class ConsumerState(str, enum.Enum):
    """The life of one shard lease in a reader (compare KCL's ``ConsumerStates``).

    A ``str`` enum: a member equals its value (``ConsumerState.LOST == "lost"``), so
    callers that compare with the values keep working.

    Transitions (:data:`TRANSITIONS` is the one place that allows them)::

        INITIALIZING ──► PROCESSING ──► SHUTTING_DOWN ──► CLOSED
             │               │                 └────────► HANDED_OVER
             │               ├─────► SHARD_ENDED
             └───────────────┴─────► LOST, FAILED    (from any live state)

    * ``INITIALIZING``: the lease is held; recording where a never-read shard opens and
      fetching the first iterator.
    * ``PROCESSING``: GetRecords -> deliver -> acknowledge -> checkpoint.
    * ``SHUTTING_DOWN``: asked to stop (close, or another instance asked for the lease):
      the batch in flight is acknowledged and checkpointed, nothing new is fetched.
    * Terminal: ``SHARD_ENDED`` (read to its end, every batch acknowledged, ``SHARD_END``
      written, released), ``CLOSED`` (stopped; released unless asked to keep it),
      ``HANDED_OVER`` (given to the instance that asked), ``LOST`` (fenced or lapsed:
      wrote nothing more), ``FAILED`` (a fatal error: the sink gave up, the stream is gone).
    """

    INITIALIZING = "initializing"
    PROCESSING = "processing"
    SHUTTING_DOWN = "shutting_down"
    SHARD_ENDED = "shard_ended"
    CLOSED = "closed"
    HANDED_OVER = "handed_over"
    LOST = "lost"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        """True for the states a consumer never leaves."""
        return not TRANSITIONS[self]


_S = ConsumerState
TRANSITIONS: dict[ConsumerState, frozenset[ConsumerState]] = {
    _S.INITIALIZING: frozenset({_S.PROCESSING, _S.SHUTTING_DOWN, _S.SHARD_ENDED, _S.LOST, _S.FAILED}),
    _S.PROCESSING: frozenset({_S.SHUTTING_DOWN, _S.SHARD_ENDED, _S.LOST, _S.FAILED}),
    _S.SHUTTING_DOWN: frozenset({_S.CLOSED, _S.HANDED_OVER, _S.LOST, _S.FAILED}),
    _S.SHARD_ENDED: frozenset(), _S.CLOSED: frozenset(), _S.HANDED_OVER: frozenset(),
    _S.LOST: frozenset(), _S.FAILED: frozenset(),
}
"""The allowed moves of :class:`ConsumerState`; a terminal state allows none."""


class StopReason(str, enum.Enum):
    """Why a consumer leaves ``PROCESSING`` (compare KCL's ``ShutdownReason``), strongest last.

    * ``REQUESTED``: :meth:`ShardConsumer.stop` (close, re-homing): finish the batch in
      flight, then release the lease (or keep it, ``release=False``) -> ``CLOSED``.
    * ``HANDOFF``: another instance asked for the lease (a write returned
      ``lease_next_owner``, or ``request_handoff``): finish the batch in flight, then one
      fenced ``hand_over`` -> ``HANDED_OVER``.
    * ``SHARD_END``: read to its end -> ``SHARD_ENDED``.
    * ``FAILED``: a fatal error (the sink gave up, the stream is gone) -> ``FAILED``.
    * ``LEASE_LOST``: fenced or lapsed: write nothing more -> ``LOST``.
    """

    REQUESTED = "requested"
    HANDOFF = "handoff"
    SHARD_END = "shard_end"
    FAILED = "failed"
    LEASE_LOST = "lease_lost"


_RANK = {StopReason.REQUESTED: 0, StopReason.HANDOFF: 1, StopReason.SHARD_END: 2, StopReason.FAILED: 3,
         StopReason.LEASE_LOST: 4}


@dataclasses.dataclass(frozen=True)
class Stop:
    """One stop of a consumer: its reason and what the reason needs.

    Attributes:
        reason: see :class:`StopReason`.
        release: ``REQUESTED`` only: release the lease (True) or keep it for its next owner (False).
        to: ``HANDOFF`` only: the owner id of the instance that asked.
        why: what happened, for the log.
    """

    reason: StopReason
    release: bool = True
    to: str | None = None
    why: str = ""

    def merge(self, new: Stop) -> Stop:
        """The stop that holds when ``new`` arrives after this one: the stronger reason wins;
        a request to keep the lease (``release=False``) beats a handoff (the process is
        closing without giving the lease away); a first handoff asker stays."""
        if new.reason is StopReason.REQUESTED and self.reason is StopReason.HANDOFF:
            return new if not new.release else self
        if new.reason is StopReason.HANDOFF and self.reason is StopReason.REQUESTED and not self.release:
            return self
        if _RANK[new.reason] > _RANK[self.reason]:
            return new
        if new.reason is self.reason is StopReason.REQUESTED:
            return new
        return self

    @property
    def terminal(self) -> ConsumerState:
        """The state a consumer that stopped for this reason ends in (when nothing fails on the way)."""
        return _TERMINAL[self.reason]


_TERMINAL = {StopReason.REQUESTED: ConsumerState.CLOSED, StopReason.HANDOFF: ConsumerState.HANDED_OVER,
             StopReason.SHARD_END: ConsumerState.SHARD_ENDED, StopReason.FAILED: ConsumerState.FAILED,
             StopReason.LEASE_LOST: ConsumerState.LOST}
