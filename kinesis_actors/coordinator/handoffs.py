"""Handoffs: the graceful lease moves between instances, from both ends.

As the thief, this instance writes a handoff request (``lease_next_owner``) on a row of
the most loaded instance; each request is in one :class:`RequestState`::

    ASKED --unanswered past handoff_timeout_s--> FORCING --force_handoff written--> (forgotten: taken)
      |                                            |
      |                                            `--the write failed--> ASKED (forced again next poll)
      `--handed over / taken / released / asked by another / closing--> (forgotten)

As the owner, when the lease poll sees a request on a row this instance reads, it tells
that shard's reader at once (``request_handoff``), so the move does not wait for the
reader's next renewal to see the request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from ..leases.protocol import Lease
from .handles import ReaderGone, ReaderHandle, ReaderUnreachable
from .tasks import TaskSet

__all__ = ["RequestState", "Handoffs"]

log = logging.getLogger("kinesis_actors.coordinator")

_WITHDRAW_TRIES = 3  # a withdrawal races the holder's hand-over write: read the row again this often


class RequestState(enum.Enum):
    """Where one of our handoff requests is (transitions in the module docstring)."""

    ASKED = "asked"
    FORCING = "forcing"


@dataclasses.dataclass
class Request:
    """One handoff request we made: whom we asked, when (injected clock, s), its state."""

    victim: str
    since: float
    state: RequestState = RequestState.ASKED


class Handoffs:
    """The handoff requests of one instance, and the requests it passes on to its readers.

    Args:
        store / io: the lease store and the runner of its blocking calls.
        take: re-takes a shard's row under our owner id (None: not ours to take).
        stream / owner_id: the stream name and our owner id.
        lease_duration_s: the duration of a forced lease, seconds.
        timeout_s: how long a request may stay unanswered before it is forced, seconds.
        tasks / counters: kept tasks; ``handoffs_requested``, ``handoffs_received``,
            ``handoffs_forced``, ``handoffs_passed_on`` and lease-store errors (``store_errors``) are counted here.
        call_timeout_s: timeout of a reader's ``request_handoff``, seconds.
    """

    def __init__(self, *, store: Any, io: Callable[..., Awaitable[Any]], take: Callable[[str], Awaitable[Lease | None]],
                 stream: str, owner_id: str, lease_duration_s: float, timeout_s: float, tasks: TaskSet,
                 counters: dict[str, int], call_timeout_s: float) -> None:
        self._store, self._io, self._take, self._stream, self._owner = store, io, take, stream, owner_id
        self._duration_s, self.timeout_s = lease_duration_s, timeout_s
        self._tasks, self.counters, self._call_timeout_s = tasks, counters, call_timeout_s
        self.requests: dict[str, Request] = {}
        self._passed_on: dict[str, tuple[str, int]] = {}  # shard id -> (asker, row counter) told to the reader
        for key in ("handoffs_requested", "handoffs_received", "handoffs_forced", "handoffs_passed_on", "store_errors"):
            counters.setdefault(key, 0)

    # ------------------------------------------------------------------ as the thief
    async def settle(self, rows: Mapping[str, Lease], now: float, held: Iterable[str],
                     listed: Iterable[str]) -> list[Lease]:
        """Follow our requests against the table just read: adopt those made before a
        restart, forget those it no longer shows, force those unanswered past ``timeout_s``
        (in parallel; a failed force stays ASKED). Returns the forced leases (to open)."""
        for shard_id, row in rows.items():
            if row.next_owner == self._owner and row.owner not in (None, self._owner):
                self.requests.setdefault(shard_id, Request(row.owner, now))
        held_set, listed_set = set(held), set(listed)
        due = []
        for shard_id, request in list(self.requests.items()):
            current = rows.get(shard_id)
            if current is None or current.finished or shard_id in held_set:
                del self.requests[shard_id]
            elif current.owner == self._owner:
                continue  # handed over: the take opens it
            elif current.next_owner != self._owner or current.owner is None:
                del self.requests[shard_id]  # taken, released or asked by another since
            elif now - request.since >= self.timeout_s and shard_id in listed_set:
                request.state = RequestState.FORCING
                due.append(shard_id)
        forced = await asyncio.gather(*(self._force(sid) for sid in due))
        return [lease for lease in forced if lease is not None]

    async def _force(self, shard_id: str) -> Lease | None:
        request = self.requests[shard_id]
        try:
            lease: Lease | None = await self._io(self._store.force_handoff, self._stream, shard_id,
                                                 owner=self._owner, duration_s=self._duration_s)
        except Exception as e:  # a lease-store error (throttled, unreachable): forced again next poll
            request.state = RequestState.ASKED
            self.counters["store_errors"] += 1
            log.warning("shard %s: forced takeover failed (%r); retried at the next poll", shard_id, e)
            return None
        self.requests.pop(shard_id, None)
        if lease is not None:
            self.counters["handoffs_forced"] += 1
            log.warning("shard %s: %s did not hand over within %.1f s; lease taken", shard_id, request.victim,
                        self.timeout_s)
        return lease

    async def ask(self, steal: Iterable[tuple[str, str]], rows: Mapping[str, Lease], now: float,
                  why: str) -> None:
        """Write the planned handoff requests (shard id, victim) in parallel; a failed
        write is logged, and the planner asks again at a later poll."""
        steal = list(steal)
        outcomes = await asyncio.gather(*(self._io(self._store.request_handoff, self._stream, sid, owner=self._owner,
                                                   expect_counter=rows[sid].counter) for sid, _ in steal),
                                        return_exceptions=True)
        for (shard_id, victim), asked in zip(steal, outcomes):
            if isinstance(asked, Exception):
                self.counters["store_errors"] += 1
                log.warning("shard %s: handoff request failed (%r)", shard_id, asked)
            elif isinstance(asked, BaseException):
                raise asked
            elif asked:
                self.requests[shard_id] = Request(victim, now)
                self.counters["handoffs_requested"] += 1
                log.info("shard %s: asked %s for a handoff (%s)", shard_id, victim, why)

    def received(self, shard_id: str) -> None:
        """We took ``shard_id``: a request for it is answered."""
        if self.requests.pop(shard_id, None) is not None:
            self.counters["handoffs_received"] += 1

    async def withdraw_all(self) -> None:
        """Closing: take back our requests, and release a row handed over meanwhile (so
        nobody waits a lease duration for an instance that is gone)."""
        await asyncio.gather(*(self._withdraw(sid) for sid in sorted(self.requests)))
        self.requests.clear()

    async def _withdraw(self, shard_id: str) -> None:
        store, stream, me = self._store, self._stream, self._owner
        try:
            for _ in range(_WITHDRAW_TRIES):
                if await self._io(store.withdraw_handoff, stream, shard_id, owner=me):
                    return
                row = await self._io(store.get, stream, shard_id)
                if row is not None and row.owner == me:
                    lease = await self._take(shard_id)
                    if lease is not None:
                        await self._io(store.release, lease)
                    return
        except Exception as e:  # a lease-store error: the request stays until it is taken or the row moves
            self.counters["store_errors"] += 1
            log.info("shard %s: could not withdraw the handoff request (%r)", shard_id, e)

    # ------------------------------------------------------------------ as the owner
    def pass_on(self, rows: Mapping[str, Lease], handle_of: Callable[[str], ReaderHandle | None]) -> None:
        """Tell the reader of each open shard whose row asks us for a handoff, once per request."""
        asked = {sid: (row.next_owner, row.counter) for sid, row in rows.items()
                 if row.owner == self._owner and row.next_owner not in (None, self._owner)}
        for sid in [s for s in self._passed_on if s not in asked]:
            del self._passed_on[sid]
        for sid, (asker, counter) in asked.items():
            handle = handle_of(sid)
            if handle is None or self._passed_on.get(sid, (None, 0))[0] == asker:
                continue
            assert asker is not None
            self._passed_on[sid] = (asker, counter)
            self._tasks.spawn(self._tell(handle, sid, asker), f"handoff-{sid}")

    async def _tell(self, handle: ReaderHandle, shard_id: str, asker: str) -> None:
        try:
            accepted = await asyncio.wait_for(handle.request_handoff(shard_id, asker), self._call_timeout_s)
        except (ReaderGone, ReaderUnreachable, asyncio.TimeoutError) as e:  # its renewal sees the request
            log.info("shard %s: could not pass the handoff request on to its reader (%r)", shard_id, e)
            return
        if accepted:
            self.counters["handoffs_passed_on"] += 1
            log.info("shard %s: handing over to %s", shard_id, asker)
