"""Coordinator: one per subscription. Lists shards, reads the lease table, takes leases,
keeps a pool of ShardReaders and packs the leases into them, re-homes a dead reader's leases.

One module per role; a part with a life of its own has one state enum, drawn in its docstring:

* :mod:`.pool` -- the reader pool (``ReaderState``: STARTING / READY / GONE);
* :mod:`.placements` -- place, re-home, open (``HeldState``: WAITING / PLACING / OPENING / OPEN);
* :mod:`.handoffs` -- handoff requests, as thief and as owner (``RequestState``);
* :mod:`.poll` -- the lease-table poll, resharding, stream identity (``PollOutcome``);
* :mod:`.presence` -- the presence row and stats (``PresenceState``);
* :mod:`.lifecycle` -- the core's own phase (``CoordinatorState``: NEW / STARTING /
  RUNNING / CLOSING / CLOSED / FAILED);
* :mod:`.core` -- :class:`CoordinatorCore`, which composes the parts; :mod:`.tick` -- the
  tick that runs each part when due; :mod:`.closing` -- the close under one deadline;
  :mod:`.tasks` -- the kept task sets;
* :mod:`.actor` -- the Ray actor shells, apart from all of the above.

Fault model:

* Everything durable is in the lease table; the Coordinator's memory is a cache. A new
  Coordinator (after a crash, restarted by the subscription's handle) re-takes the rows
  its owner id holds (the owner may re-take its own row at once) and opens them on new
  readers, which resume after the checkpoints.
* Readers are actors the Coordinator creates, so Ray kills them with it (fate sharing).
* The pool keeps one reader more than the leases need (:func:`pool_size`, at least 2),
  spread over the nodes (``SPREAD`` by default), so the leases of a dead reader have
  room on live readers at once. When a reader dies (its process killed, its node lost:
  Ray's ``ActorDiedError``), the Coordinator re-takes each of its leases under the same
  owner id (raising the lease counter, which fences the old loops should they still
  run) and opens them on live readers, without waiting for lease expiry or for a new
  actor; a replacement reader starts in the background to restore the spare. A shard
  is held by exactly one placement from its take until its reader reports how it
  ended, so no lease poll can take it a second time while it moves.
* Each part of the tick (``ListShards``, lease poll, pool upkeep, presence) runs in its
  own task with its own try/except and log line: a failing part is retried when next due.
  One failed take, forced takeover or handoff request costs no other of the same poll.
* A fatal error (``SinkError``, a deleted stream) is parked: the subscription reports it
  on the user's next call; the readers stop and release what they hold.
* ``close(timeout_s=15.0)`` fits stopping the readers, releasing, withdrawing and
  removing the presence row in one deadline; past it the rest is left to expire.

The first pass (:meth:`CoordinatorCore.start`) starts the pool in parallel, waits for
room, then takes the leases and opens them (each reader holds its first iterator
before it returns; with ``retrieval="fanout"`` the pass first registers or finds the
stream consumer, and "open" means the shard's first ``SubscribeToShard`` was accepted:
its first frame arrived and was not a refusal).
It never fails because an actor is slow: it waits up to its deadline, then raises
:class:`~kinesis_actors.errors.StartError` saying how many shards opened and why the
others did not. A reader that fails to start is retried by the pool upkeep with
backoff; a lease waits for room, never for a re-resolved ``LATEST`` (a consumer
records its start position before it reads).

Balancing: the Coordinator heartbeats a presence row every ``renew_interval_s``
(deleted on a clean close) and, at each lease poll, runs the pure planner of
:mod:`kinesis_actors.balancing` over the table: it takes free, expired and own leases,
and below ``ceil(readable shards / live instances)`` asks the most loaded instance for
a graceful handoff (``lease_next_owner``), up to ``max_leases_to_steal`` requests at
once. The owner's lease poll sees the request and tells that shard's reader at once
(``request_handoff``); its consumer checkpoints the batch in flight and hands the row
over in one fenced write; the next poll re-takes it. A request not honoured within
``handoff_timeout_s`` is forced (``force_handoff``). Requests are withdrawn on a clean close.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..metrics import coordinator_tick
from .core import CoordinatorCore
from .handles import Launcher, ReaderGone, ReaderHandle, ReaderUnreachable
from .lifecycle import CoordinatorState
from .placements import HeldState
from .poll import PollOutcome
from .pool import ReaderState, pick_reader, pool_size

__all__ = ["CoordinatorCore", "ReaderHandle", "ReaderGone", "ReaderUnreachable", "Coordinator", "pool_size",
           "pick_reader", "Launcher", "PollOutcome", "ReaderState", "HeldState", "CoordinatorState",
           "coordinator_tick"]

if TYPE_CHECKING:
    Coordinator: Any  # the Ray actor class, built on first access (below)

_ACTOR: Any = None


def __getattr__(name: str) -> Any:  # lazy: importing the package does not import Ray
    global _ACTOR
    if name == "Coordinator":
        if _ACTOR is None:
            from .actor import make_coordinator_actor

            _ACTOR = make_coordinator_actor()
        return _ACTOR
    raise AttributeError(name)
