"""What one consumer needs besides its lease: :class:`ReaderSpec`, and the reader defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..config import DEFAULT_MAX_BUFFERED_BYTES, KinesisStream
from ..delivery.options import DeliveryOptions
from ..records import Record, StartAt

__all__ = ["ReaderSpec", "kinesis_call_timeout_s", "Deliver", "Sleep", "Rng", "DEFAULT_MAX_BUFFERED_BYTES",
           "DEFAULT_THREADS"]

DEFAULT_THREADS = 16
"""Threads (and HTTP connections) of each of a reader's two pools: Kinesis and lease store."""

def kinesis_call_timeout_s(lease_duration_s: float) -> float:
    """Connect and read timeout of a reader's Kinesis calls: shorter than the lease (half of
    it, at most 10 s; up to 1 s for very short leases), seconds."""
    return min(10.0, max(0.5 * lease_duration_s, min(1.0, 0.75 * lease_duration_s)))


@dataclasses.dataclass(frozen=True)
class ReaderSpec:
    """What one consumer needs besides its lease (all picklable).

    Attributes:
        stream, shard_id: what to read. owner_id: the lease owner it reads for.
        start_at: position for a shard with no checkpoint and no recorded start position.
        lease_duration_s / renew_interval_s: lease timing, seconds.
        ending_sequence_number: set for a closed shard: reaching it is shard end.
        max_records: ``GetRecords`` ``Limit`` and the most records per delivered batch.
        idle_wait_s / max_idle_wait_s: the first and the longest wait at the tip, seconds
            (the wait doubles while the shard stays empty).
        max_sink_retries: retries of a failing batch before ``SinkError``.
        dead_letter: a Publisher for batches the sink refused, or None.
        consumer_arn: the registered stream consumer for enhanced fan-out
            (``retrieval="fanout"``); None reads with ``GetRecords``.
        min_checkpoint_interval_s: shortest gap between two checkpoint writes, seconds
            (``KinesisStream.min_checkpoint_interval_s``); 0 checkpoints every acknowledged
            batch; None writes the checkpoint with the lease's next renewal.
        delivery: the delivery controls (``KinesisStream.delivery_options()``); None: only
            ``max_sink_retries`` and ``dead_letter``.
        renew_deadline_s: how long after its last successful write a consumer keeps
            retrying a failing renewal, seconds (derived from the lease timing: the lease
            duration less one renew interval, at least half the lease duration).
    """

    stream: str
    shard_id: str
    owner_id: str
    start_at: StartAt
    lease_duration_s: float
    renew_interval_s: float
    ending_sequence_number: str | None = None
    max_records: int = KinesisStream.max_records  # the defaults are KinesisStream's, written once
    idle_wait_s: float = KinesisStream.idle_wait_s
    max_idle_wait_s: float = KinesisStream.max_idle_wait_s
    max_sink_retries: int = KinesisStream.max_sink_retries
    dead_letter: Any = None
    consumer_arn: str | None = None
    min_checkpoint_interval_s: float | None = KinesisStream.min_checkpoint_interval_s
    delivery: DeliveryOptions | None = None
    renew_deadline_s: float = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        duration = self.lease_duration_s
        deadline = max(duration - max(self.renew_interval_s, 0.1 * duration), 0.5 * duration)
        object.__setattr__(self, "renew_deadline_s", deadline)

    @property
    def controls(self) -> DeliveryOptions:
        """The delivery controls in force: ``delivery``, or ``max_sink_retries`` and
        ``dead_letter`` with every other control off (kinesis_actors.delivery)."""
        if self.delivery is not None:
            return self.delivery
        return DeliveryOptions(max_sink_retries=self.max_sink_retries, dead_letter=self.dead_letter)

    @property
    def call_timeout_s(self) -> float:
        """Connect and read timeout of Kinesis calls, seconds: :func:`kinesis_call_timeout_s`."""
        return kinesis_call_timeout_s(self.lease_duration_s)


Deliver = Callable[[Sequence[Record]], Awaitable[Any]]
"""``async deliver(records)``: returning acknowledges the batch, raising is a failure."""

Sleep = Callable[[float], Awaitable[Any]]
"""``async sleep(seconds)`` on the injected clock (``asyncio.sleep`` by default)."""

Rng = Callable[[], float]
"""A uniform draw in [0, 1) (``random.random`` by default): renewal spread, backoff jitter."""


