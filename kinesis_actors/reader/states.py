"""The life of one shard lease in a reader: :class:`ConsumerState`, what each state does, and why it stops.

A consumer's next move is decided by its state and ONE :class:`Stop` (compare KCL's
``ConsumerStates`` and its single ``ShutdownReason``): no combination of flags. Each state
carries its behaviour in :data:`BEHAVIOURS`: the task it runs and the state it moves to once
the task returns, for each stop reason. :data:`TRANSITIONS` is derived from it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

__all__ = ["ConsumerState", "TRANSITIONS", "TERMINAL", "BEHAVIOURS", "Behaviour", "StopReason", "Stop"]


class ConsumerState(str, enum.Enum):
    """The life of one shard lease in a reader (compare KCL's ``ConsumerStates``).

    A ``str`` enum: a member equals its value (``ConsumerState.LOST == "lost"``), the
    string the shard's ``stats()["state"]`` carries.

    Transitions (:data:`BEHAVIOURS` lists them by stop reason)::

        INITIALIZING ──► PROCESSING ──► SHUTTING_DOWN ──► CLOSED | HANDED_OVER | SHARD_ENDED
             │               │                 │
             └───────────────┴─────────────────┴─────► LOST | FAILED   (from every live state)

    * ``INITIALIZING``: the lease is held; recording where a never-read shard opens and
      fetching the first iterator.
    * ``PROCESSING``: GetRecords -> deliver -> acknowledge -> checkpoint, until a stop.
    * ``SHUTTING_DOWN``: the lease is let go as the stop says: what was acknowledged is
      checkpointed, then the lease is released (``REQUESTED``) or handed over
      (``HANDOFF``); or ``SHARD_END`` is written and the lease released (``SHARD_END``).
    * Terminal: ``SHARD_ENDED`` (read to its end, every batch acknowledged, ``SHARD_END``
      written, released), ``CLOSED`` (stopped; released unless asked to keep it),
      ``HANDED_OVER`` (given to the instance that asked), ``LOST`` (fenced or lapsed:
      wrote nothing more), ``FAILED`` (a fatal error: the sink gave up, the stream is
      gone; what was acknowledged is checkpointed and the lease released, best effort).
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
        return self in TERMINAL


class StopReason(str, enum.Enum):
    """Why a consumer leaves ``PROCESSING`` (compare KCL's ``ShutdownReason``), strongest last.

    * ``REQUESTED``: :meth:`ShardConsumer.stop` (close, re-homing): finish the batch in
      flight, then release the lease (or keep it, ``release=False``) -> ``CLOSED``.
    * ``HANDOFF``: another instance asked for the lease (a write returned
      ``lease_next_owner``, or ``request_handoff``): finish the batch in flight, then one
      fenced ``hand_over`` -> ``HANDED_OVER``.
    * ``SHARD_END``: read to its end, every record acknowledged -> ``SHARD_ENDED``.
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


_TERMINAL: dict[StopReason | None, ConsumerState] = {  # the state each stop reason ends in
    StopReason.REQUESTED: ConsumerState.CLOSED, StopReason.HANDOFF: ConsumerState.HANDED_OVER,
    StopReason.SHARD_END: ConsumerState.SHARD_ENDED, StopReason.FAILED: ConsumerState.FAILED,
    StopReason.LEASE_LOST: ConsumerState.LOST}


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """What a consumer does in one state (KCL's ``ConsumerState``: its task, its transitions).

    Attributes:
        task: the name of the :class:`~.consumer.ShardConsumer` coroutine method run on
            entering the state (None: nothing to run).
        next: the state entered once the task returns, by the reason of the stop then in
            force (``None``: no stop); empty for a terminal state.
    """

    task: str | None
    next: Mapping[StopReason | None, ConsumerState] = dataclasses.field(default_factory=dict)


_S, _R = ConsumerState, StopReason
_LEAVE: Mapping[StopReason | None, ConsumerState] = {
    _R.REQUESTED: _S.SHUTTING_DOWN, _R.HANDOFF: _S.SHUTTING_DOWN, _R.SHARD_END: _S.SHUTTING_DOWN,
    _R.FAILED: _S.FAILED, _R.LEASE_LOST: _S.LOST}
BEHAVIOURS: Mapping[ConsumerState, Behaviour] = {
    _S.INITIALIZING: Behaviour("initialize", {None: _S.PROCESSING, **_LEAVE}),
    _S.PROCESSING: Behaviour("process", _LEAVE),
    _S.SHUTTING_DOWN: Behaviour("shut_down", dict(_TERMINAL)),
    _S.FAILED: Behaviour("leave_after_failure"),
    _S.SHARD_ENDED: Behaviour(None), _S.CLOSED: Behaviour(None), _S.HANDED_OVER: Behaviour(None),
    _S.LOST: Behaviour(None),
}
"""Each state's task and transitions:

* ``INITIALIZING`` runs ``initialize`` (record the start position, fetch the first
  iterator; a row already at ``SHARD_END`` stops with ``SHARD_END``), then ``PROCESSING``.
* ``PROCESSING`` runs ``process``, the read loop, until a stop; ``REQUESTED``, ``HANDOFF``
  and ``SHARD_END`` lead to ``SHUTTING_DOWN``.
* ``SHUTTING_DOWN`` runs ``shut_down``, which lets the lease go as its stop says, then
  enters the terminal state of the stop's reason (a hand-over whose asker withdrew
  becomes a release, ``CLOSED``).
* ``FAILED`` runs ``leave_after_failure`` (checkpoint and release, best effort).
* ``LEASE_LOST`` leads to ``LOST`` from every live state: nothing more is written.
"""

TRANSITIONS: Mapping[ConsumerState, frozenset[ConsumerState]] = {
    state: frozenset(behaviour.next.values()) for state, behaviour in BEHAVIOURS.items()}
"""The allowed moves of :class:`ConsumerState` (from :data:`BEHAVIOURS`); a terminal state allows none."""

TERMINAL: frozenset[ConsumerState] = frozenset(state for state, moves in TRANSITIONS.items() if not moves)
"""The states a consumer never leaves."""
