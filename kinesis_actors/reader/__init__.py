"""ShardReader: one process that holds many shard leases, one read loop (a :class:`ShardConsumer`) per lease.

One plain class per role, each testable alone:

* :mod:`.states`: :class:`ConsumerState` (the life of one lease: each state's task and
  transitions, :data:`TRANSITIONS`) and :class:`Stop` / :class:`StopReason` (why a
  consumer stops; one per consumer).
* :mod:`.consumer`: :class:`ShardConsumer`, the state machine of one lease and its one read
  loop: GetRecords -> deliver -> acknowledge -> checkpoint, for every ``parallelization_factor``.
* :mod:`.tasks`: the tasks of the other states: open the shard, let the lease go, seek.
* :mod:`.reading`: :class:`~.reading.Reading`, one consumer's fetches (one fetched ahead),
  and the :class:`ByteBudget` (``max_buffered_bytes`` plus one response at most).
* :mod:`.lease`: :class:`LeaseKeeper`, the consumer's fenced store writes, its renew loop
  and its liveness (a stuck loop lets its lease lapse; a slow downstream never does);
  :class:`CheckpointPacer`, the acknowledged position not yet checkpointed, written at
  most once per ``min_checkpoint_interval_s`` (always at close, handoff and failure).
* :mod:`.delivery`: :class:`BatchDelivery`, the delivery controls wired for one consumer
  (retries with backoff, dead letters, ``SinkError``, the lanes of ``parallelization_factor``).
* :mod:`.fetcher`: the :class:`Fetcher` protocol that polling
  (:class:`~kinesis_actors.kinesis.ShardFetcher`) and enhanced fan-out
  (:class:`~kinesis_actors.fanout.FanOutFetcher`) implement.
* :mod:`.io`: what one process's consumers share: the thread pools (:class:`ReaderIo`:
  Kinesis calls, lease-store calls and subscriptions apart, so a stuck ``GetRecords``
  never delays a renewal) and the Kinesis :class:`CallLimit` (a stuck call holds its own
  shard only).
* :mod:`.core`: :class:`ShardReaderCore`, the consumers of one process (plain asyncio).
* :mod:`.actor`: :class:`ShardReader`, the thin Ray actor over :class:`ShardReaderCore`.

Every timer runs on the injected clock and ``sleep`` (``kinesis_actors.testing.FakeClock``
in unit tests). Threads over botocore, not an async client: boto3 is what the rest of the
library and its users run, and aiobotocore pins an older botocore.
"""

from __future__ import annotations

from typing import Any

from .consumer import STOP_SLACK_S, ShardConsumer
from .core import ShardEvent, ShardReaderCore
from .delivery import BatchDelivery, DeliveryResult
from .fetcher import Fetcher
from .io import STUCK_CALL_S, CallLimit, ReaderIo
from .lease import CheckpointPacer, LeaseKeeper
from .reading import FANOUT_BUDGET_DROP_S, ByteBudget
from .spec import DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_THREADS, Deliver, ReaderSpec, kinesis_call_timeout_s
from .states import TRANSITIONS, ConsumerState, Stop, StopReason

__all__ = ["ConsumerState", "TRANSITIONS", "Stop", "StopReason", "ReaderSpec", "kinesis_call_timeout_s",
           "ShardConsumer", "ShardReaderCore", "ShardEvent", "ByteBudget", "CallLimit", "ReaderIo", "LeaseKeeper",
           "CheckpointPacer", "BatchDelivery", "DeliveryResult", "Fetcher", "Deliver", "ShardReader",
           "DEFAULT_MAX_BUFFERED_BYTES", "DEFAULT_THREADS", "FANOUT_BUDGET_DROP_S", "STOP_SLACK_S", "STUCK_CALL_S"]

_ACTOR: Any = None


def __getattr__(name: str) -> Any:  # lazy: `import kinesis_actors` does not import Ray
    global _ACTOR
    if name == "ShardReader":
        if _ACTOR is None:
            from .actor import make_ray_actor

            _ACTOR = make_ray_actor()
        return _ACTOR
    raise AttributeError(name)
