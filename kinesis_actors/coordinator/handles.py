"""What the Coordinator needs of a reader (:class:`ReaderHandle`) and the two ways a call to one fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..leases.protocol import Lease
from ..reader import ReaderSpec, ShardEvent
from ..records import StartAt

__all__ = ["ReaderHandle", "ReaderGone", "ReaderUnreachable", "Launcher"]


class ReaderHandle(Protocol):
    """What the Coordinator needs of one reader (a Ray actor, or in-process in unit tests).

    Every call raises ``ReaderGone`` when the reader died (crash, node lost) and
    ``ReaderUnreachable`` when it may come back (Ray's ``ActorUnavailableError``).

    ``add``'s ``lease_age_s`` is how long ago (seconds, on the Coordinator's monotonic
    clock) the Coordinator sent the take that produced ``lease``: a lower bound on the
    lease's age. ``request_handoff(shard_id, asker)`` has the effect of a store write
    answering ``lease_next_owner=asker`` (finish the batch in flight, checkpoint, one
    fenced hand-over write); False when the shard is not read there.
    """

    async def ping(self) -> None: ...
    async def add(self, spec: ReaderSpec, lease: Lease, *, lease_age_s: float | None = None) -> ShardEvent: ...
    async def events(self, timeout_s: float) -> list[ShardEvent]: ...
    async def stop(self, shard_id: str | None, release: bool, grace_s: float) -> None: ...
    async def seek(self, shard_id: str, position: StartAt) -> bool: ...
    async def stats(self) -> dict[str, Any]: ...
    async def request_handoff(self, shard_id: str, asker: str) -> bool: ...
    def kill(self) -> None: ...


class ReaderGone(Exception):
    """The reader's process is gone: re-home its leases."""


class ReaderUnreachable(Exception):
    """The reader cannot be reached now but may come back: retry."""


Launcher = Callable[[int], ReaderHandle]
"""Creates reader number ``n`` of the pool (a Ray actor) and returns its handle at once."""
