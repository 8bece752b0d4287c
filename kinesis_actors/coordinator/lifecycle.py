"""The life of one Coordinator: :class:`CoordinatorState` and the one table of its moves.

Compare the reader's :class:`~kinesis_actors.reader.ConsumerState` and Ray Serve's
``ReplicaState``: the core's phase is one value, read by every part through
:class:`Lifecycle` (the pool, the placements), never a flag copied into each of them.
"""

from __future__ import annotations

import enum
import logging

__all__ = ["CoordinatorState", "TRANSITIONS", "Lifecycle"]

log = logging.getLogger("kinesis_actors.coordinator")


class CoordinatorState(str, enum.Enum):
    """The phase of a :class:`~kinesis_actors.coordinator.CoordinatorCore`.

    Transitions (:data:`TRANSITIONS` is the one place that allows them)::

        NEW ──► STARTING ──► RUNNING ──► CLOSING ──► CLOSED
         │          │                       │
         └──────────┴──────────────────────►┘ ──────► FAILED

    * ``NEW``: built; nothing runs.
    * ``STARTING``: the first pass (``ListShards``, the table, the first takes and opens);
      the tick runs the presence part only.
    * ``RUNNING``: the first pass finished; the tick runs every part when it is due.
    * ``CLOSING``: a close is under way (asked for, or after a fatal error): no reader is
      started, no lease taken or placed; the tick and its steps are cancelled.
    * ``CLOSED``: closed, no fatal error parked. ``FAILED``: closed after a fatal error,
      which :meth:`~kinesis_actors.coordinator.CoordinatorCore.error` returns.
    """

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        """True for the states a Coordinator never leaves."""
        return not TRANSITIONS[self]


_S = CoordinatorState
TRANSITIONS: dict[CoordinatorState, frozenset[CoordinatorState]] = {
    _S.NEW: frozenset({_S.STARTING, _S.CLOSING}),
    _S.STARTING: frozenset({_S.RUNNING, _S.CLOSING}),
    _S.RUNNING: frozenset({_S.CLOSING}),
    _S.CLOSING: frozenset({_S.CLOSED, _S.FAILED}),
    _S.CLOSED: frozenset(),
    _S.FAILED: frozenset(),
}
"""The allowed moves of :class:`CoordinatorState`; a terminal state allows none."""


class Lifecycle:
    """The current :class:`CoordinatorState` of one Coordinator, moved only along :data:`TRANSITIONS`.

    Args:
        name: the subscription's stream name (for the log).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = CoordinatorState.NEW

    def move(self, to: CoordinatorState) -> None:
        """Move to ``to``.

        Raises:
            RuntimeError: ``to`` is not allowed from the current state (a bug of the caller).
        """
        if to not in TRANSITIONS[self.state]:
            raise RuntimeError(f"coordinator {self.name}: {self.state.value} -> {to.value} is not a transition")
        log.debug("coordinator %s: %s -> %s", self.name, self.state.value, to.value)
        self.state = to

    @property
    def running(self) -> bool:
        """The first pass finished and no close began: the tick runs every part."""
        return self.state is CoordinatorState.RUNNING

    @property
    def closing(self) -> bool:
        """A close began (``CLOSING`` or a terminal state): start, take and place nothing more."""
        return self.state in (CoordinatorState.CLOSING, CoordinatorState.CLOSED, CoordinatorState.FAILED)
