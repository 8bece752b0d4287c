"""Checkpoint pacing of one consumer: ``min_checkpoint_interval_s``.

* Only acknowledged positions are ever written: the consumer calls
  :meth:`CheckpointPacer.acknowledged` after the downstream acknowledged a batch, never before.
* A periodic flush (``due_only``) writes at most once per ``min_checkpoint_interval_s``
  (every acknowledged batch, when it is 0); a forced flush (close, handoff, failure)
  always writes what is pending. ``SHARD_END`` and a seek drop what is pending
  (:meth:`CheckpointPacer.clear`): each writes its own position.
* A lost lease drops what is pending: the next owner resumes at the stored checkpoint,
  so every record acknowledged since is delivered again (at-least-once).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .lease import LeaseKeeper

__all__ = ["CheckpointPacer"]


class CheckpointPacer:
    """The acknowledged-but-not-checkpointed position of one lease, and when to write it.

    Args:
        keeper: the consumer's :class:`~.lease.LeaseKeeper` (its fenced, retried
            :meth:`~.lease.LeaseKeeper.checkpoint` write).
        interval_s: ``min_checkpoint_interval_s``, seconds (>= 0; 0: every acknowledged batch).
        clock: monotonic seconds (the consumer's injected clock).
        sleep_alive: ``async sleep_alive(seconds)`` for the keeper's retry waits (keeps the
            loop's heartbeat going while it waits).
        stats: the consumer's stats dict (``checkpoint`` and ``checkpoints_written`` are kept there).
    """

    def __init__(self, keeper: LeaseKeeper, interval_s: float, *, clock: Callable[[], float],
                 sleep_alive: Callable[[float], Awaitable[Any]], stats: dict[str, Any]) -> None:
        self._keeper = keeper
        self._interval_s = interval_s
        self._clock = clock
        self._sleep_alive = sleep_alive
        self._stats = stats
        self.pending: tuple[str, int | None] | None = None  # (sequence, sub-sequence) acknowledged, not written
        self._written_at = float("-inf")  # when the last checkpoint was written (injected clock, s)

    def acknowledged(self, sequence_number: str, sub_sequence: int | None) -> None:
        """The downstream acknowledged every record up to this one: it may be checkpointed."""
        self.pending = (sequence_number, sub_sequence)

    def clear(self) -> None:
        """Drop what is pending (``SHARD_END`` or a seek writes its own position instead)."""
        self.pending = None

    async def flush(self, *, due_only: bool = False) -> None:
        """Write the checkpoint of the last acknowledged record, if not written yet. With
        ``due_only``, only once ``min_checkpoint_interval_s`` passed since the last write
        (always, when it is 0).

        Raises:
            LeaseLostError, KinesisError: as :meth:`LeaseKeeper.checkpoint`.
        """
        pending = self.pending
        if pending is None:
            return
        if due_only and self._clock() - self._written_at < self._interval_s:
            return
        await self._keeper.checkpoint(*pending, self._sleep_alive)
        self._written_at = self._clock()
        if self.pending == pending:
            self.pending = None
        self._stats["checkpoint"] = pending[0]
        self._stats["checkpoints_written"] += 1
