"""Lease writes of the read loop that a transient store error must not turn into a failed
subscription: the ``start_position`` of a first open and the ``SHARD_END`` checkpoint are
retried (``LeaseKeeper.retried``) as renewals and checkpoints are, until the lease is in doubt.

The DynamoDB stores make one attempt per call (botocore's retries are off under the lease
keeper's), so without this a single throttled ``UpdateItem`` there ends the consumer FAILED,
which the Coordinator reports as the subscription's fatal error."""

from __future__ import annotations

import asyncio
from typing import Any

from kinesis_actors import SHARD_END
from kinesis_actors.errors import LeaseStoreError
from kinesis_actors.reader import ConsumerState
from kinesis_actors.testing import FakeShard, FlakyLeaseStore, InProcessLeaseStore

from .test_reader_core import SHARD, STREAM, Recorder, make_reader, run_until


class UnreachableAtShardEnd:
    """A store that becomes unreachable (a retriable error) at the first ``SHARD_END``
    checkpoint, for its next ``times`` writes (renewals and checkpoints alike)."""

    def __init__(self, inner: InProcessLeaseStore, times: int) -> None:
        self.inner, self.left, self.failures, self.down = inner, times, 0, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _fail(self) -> None:
        if self.down and self.left:
            self.left -= 1
            self.failures += 1
            raise LeaseStoreError("throttled (injected)", retriable=True)

    def renew(self, lease: Any, **kwargs: Any) -> Any:
        self._fail()
        return self.inner.renew(lease, **kwargs)

    def checkpoint(self, lease: Any, sequence_number: str, **kwargs: Any) -> Any:
        self.down = self.down or sequence_number == SHARD_END
        self._fail()
        return self.inner.checkpoint(lease, sequence_number, **kwargs)


def test_a_first_open_whose_start_position_write_is_throttled_twice_still_reads() -> None:
    inner, sink = InProcessLeaseStore(), Recorder()
    store = FlakyLeaseStore(inner, "set_start_position", nth=1, times=2)
    reader = make_reader(FakeShard(5), store, sink)  # type: ignore[arg-type]
    outcome = asyncio.run(run_until(reader, lambda: len(sink.seqs) == 5))
    assert outcome == ConsumerState.CLOSED and store.failures == 2
    assert sink.seqs == [1, 2, 3, 4, 5]
    assert inner.get(STREAM, SHARD).start_position == "TRIM_HORIZON"


def test_a_shard_end_checkpoint_throttled_twice_is_written_and_the_shard_ends() -> None:
    inner, sink = InProcessLeaseStore(), Recorder()
    store = UnreachableAtShardEnd(inner, times=2)
    reader = make_reader(FakeShard(5, closed=True), store, sink)  # type: ignore[arg-type]
    outcome = asyncio.run(run_until(reader, lambda: False))
    assert outcome == ConsumerState.SHARD_ENDED and store.failures == 2 and not store.left
    row = inner.get(STREAM, SHARD)
    assert row.checkpoint == SHARD_END and row.owner is None


def test_a_shard_end_checkpoint_failing_past_the_deadline_loses_the_lease_without_failing() -> None:
    inner, sink = InProcessLeaseStore(), Recorder()
    store = UnreachableAtShardEnd(inner, times=10_000)
    reader = make_reader(FakeShard(5, closed=True), store, sink, lease_duration_s=0.6)  # type: ignore[arg-type]
    outcome = asyncio.run(run_until(reader, lambda: False))
    assert outcome == ConsumerState.LOST and reader.error is None
    row = inner.get(STREAM, SHARD)
    assert row.checkpoint != SHARD_END and row.owner == "me"  # left to expire; the next owner reads the end again
