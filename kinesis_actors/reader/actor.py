"""ShardReader: the Ray actor shell over :class:`~kinesis_actors.reader.core.ShardReaderCore`
(built lazily: importing the package does not import Ray)."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
from typing import Any

from ..aws import AwsSettings
from ..config import DEFAULT_MAX_SHARDS_PER_READER
from ..leases.protocol import Lease, LeaseStore
from ..load.busy import LoopBusyMeter
from ..records import StartAt
from ..sinks.hooks import shard_hooks
from ..sinks.protocol import Sink
from .core import ShardEvent, ShardReaderCore
from .io import ReaderIo
from .spec import DEFAULT_THREADS, ReaderSpec

__all__ = ["make_ray_actor", "reader_core"]


def reader_core(store: LeaseStore, sink: Sink, aws: AwsSettings, call_timeout_s: float, max_buffered_bytes: int,
                threads: int, stream_threads: int, load_window_s: float = 10.0) -> ShardReaderCore:
    """The :class:`ShardReaderCore` of a reader process: its Kinesis client (no botocore
    retries: every attempt is the loop's own, paced; each call times out within the lease,
    ``call_timeout_s``) and its pools, ``threads`` each (as many HTTP connections). The process
    runs one core on one event loop, so that loop's busy fraction is measured (:mod:`~kinesis_actors.load.busy`)."""
    logging.basicConfig(level=logging.INFO)
    # Our blocking calls (boto3, MemoryLeaseStore's ray.get) run in worker threads, never on the
    # event loop: Ray's warning about a blocking ray.get in an async actor does not apply. Ray reads
    # this switch at each ray.get.
    os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] = "0"
    settings = dataclasses.replace(aws, connect_timeout_s=min(aws.connect_timeout_s, call_timeout_s))
    kinesis = settings.client("kinesis", read_timeout_s=call_timeout_s, max_attempts=0, max_pool_connections=threads)
    core = ShardReaderCore(store=store, deliver=sink.deliver, kinesis=kinesis, max_buffered_bytes=max_buffered_bytes,
                           io=ReaderIo(kinesis_threads=threads, store_threads=threads, stream_threads=stream_threads),
                           hooks=shard_hooks(sink), load_window_s=load_window_s,
                           loop_busy=LoopBusyMeter(load_window_s))
    # What the process holds by now (Ray, botocore and its service model: about 125,000
    # objects the collector tracks) lives as long as the process. Python's full collections
    # stop every thread and scan every tracked object, and records gathered by the shards
    # promote enough objects to start one every few responses: 30-80 ms pauses of all of
    # this process's shards, measured at parallelization_factor=4. Frozen, they are not
    # scanned again (gc.freeze; reference counting still frees them).
    gc.collect()
    gc.freeze()
    return core


def make_ray_actor() -> Any:
    """The ``ShardReader`` Ray actor class (imports Ray)."""
    import ray

    @ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0,  # type: ignore[call-overload]  # Ray types task options only
                max_concurrency=4096)
    class ShardReader:
        """Ray actor shell over :class:`ShardReaderCore` (process name ``ray::ShardReader``).

        Created by its Coordinator (and dies with it), one per pool slot; the Coordinator
        adds shard leases to it (at most ``max_shards_per_reader``). Async actor: every
        method runs on the process's one event loop, blocking calls in :class:`ReaderIo`.

        Args:
            store: the lease store. sink: where batches go (a :class:`~kinesis_actors.sinks.Sink`).
            aws: settings for the Kinesis client.
            call_timeout_s: connect and read timeout of every Kinesis call, seconds.
            max_buffered_bytes: this process's byte budget.
            threads: threads (and HTTP connections) of each pool.
            stream_threads: most threads reading enhanced fan-out subscriptions (the shard cap).
            load_window_s: the window of the load figures (process CPU, shard bytes/s), seconds.
        """

        def __init__(self, store: LeaseStore, sink: Sink, aws: AwsSettings, call_timeout_s: float,
                     max_buffered_bytes: int, threads: int = DEFAULT_THREADS,
                     stream_threads: int = DEFAULT_MAX_SHARDS_PER_READER, load_window_s: float = 10.0) -> None:
            self.core = reader_core(store, sink, aws, call_timeout_s, max_buffered_bytes, threads, stream_threads,
                                    load_window_s)
            # Where this reader runs, for operators and chaos tests (``Subscription.stats()``).
            self.core.info.update(node_id=ray.get_runtime_context().get_node_id(), pid=os.getpid())

        async def add(self, spec: ReaderSpec, lease: Lease, lease_age_s: float | None = None) -> ShardEvent:
            return await self.core.add(spec, lease, lease_age_s=lease_age_s)

        async def events(self, timeout_s: float) -> list[ShardEvent]:
            return await self.core.events(timeout_s)

        async def stop(self, shard_id: str | None, release: bool = True, grace_s: float = 5.0) -> None:
            await self.core.stop(shard_id, release=release, grace_s=grace_s)

        async def seek(self, shard_id: str, position: StartAt) -> bool:
            return await self.core.seek(shard_id, position)

        def stats(self) -> dict[str, Any]:
            return self.core.stats()

        def shard_ids(self) -> list[str]:
            return self.core.shard_ids()

        def request_handoff(self, shard_id: str, asker: str) -> bool:
            return self.core.request_handoff(shard_id, asker)

        def ping(self) -> bool:
            return True

    return ShardReader
