"""The seam between a consumer and how it reads its shard: :class:`Fetcher`, which polling
(:class:`~kinesis_actors.kinesis.ShardFetcher`, ``GetRecords``) and enhanced fan-out
(:class:`~kinesis_actors.fanout.FanOutFetcher`, ``SubscribeToShard``) both implement, so the
consumer never asks which one it holds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

from ..fanout import FanOutFetcher
from ..kinesis import Fetched, ShardFetcher
from ..records import StartAt
from .spec import ReaderSpec

__all__ = ["Fetcher", "IoKind", "new_fetcher"]

IoKind = Literal["poll", "open", "stream"]
"""Where a fetcher's next step runs: ``"poll"`` a recurring Kinesis call (within the
process's call limit), ``"open"`` a Kinesis call made once per lease or subscription
(outside it), ``"stream"`` a read of an open subscription (its own pool: it waits for the
next event)."""


@runtime_checkable
class Fetcher(Protocol):
    """One shard's read path, stepped by a consumer: each :meth:`step` is one blocking AWS call.

    Attributes:
        reserve_bytes: byte-budget reservation of one step, bytes (None: the budget's
            default, one ``GetRecords`` response).
    """

    reserve_bytes: int | None

    @property
    def position(self) -> StartAt:
        """Where the next iterator or subscription opens."""

    @property
    def has_iterator(self) -> bool:
        """True while the next step reads records (an iterator or a confirmed subscription is held)."""

    @property
    def io_kind(self) -> IoKind:
        """Where the next step runs (see :data:`IoKind`)."""

    def due_in(self) -> float:
        """Seconds until the next step may call AWS."""

    def step(self) -> Fetched | None:
        """One AWS call (blocking); a :class:`~kinesis_actors.kinesis.Fetched` answer or None."""

    def seek(self, position: StartAt) -> None:
        """Forget everything returned: the next step opens at ``position``."""

    def close(self) -> None:
        """End any open connection now, from any thread (a lost lease)."""

    def pause(self) -> bool:
        """Backpressure: drop what holds the service's data (a subscription); True if it did."""

    def counters(self) -> dict[str, int]:
        """Its call counters, as the reader's per-shard stats name them."""


def new_fetcher(spec: ReaderSpec, kinesis: Any, start: StartAt, *, restart_at: StartAt | None = None,
                clock: Callable[[], float]) -> Fetcher:
    """The fetcher of ``spec``: enhanced fan-out when it names a ``consumer_arn``, else polling."""
    if spec.consumer_arn:
        return FanOutFetcher(kinesis, spec.stream, spec.shard_id, start, consumer_arn=spec.consumer_arn,
                             restart_at=restart_at, ending_sequence_number=spec.ending_sequence_number, clock=clock)
    return ShardFetcher(kinesis, spec.stream, spec.shard_id, start, restart_at=restart_at,
                        ending_sequence_number=spec.ending_sequence_number, max_records=spec.max_records,
                        idle_wait_s=spec.idle_wait_s, max_idle_wait_s=spec.max_idle_wait_s, clock=clock)
