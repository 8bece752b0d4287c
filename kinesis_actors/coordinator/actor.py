"""The Ray actor shells: the ``Coordinator`` actor over :class:`CoordinatorCore`, and the
:class:`ReaderHandle` over a ``ShardReader`` actor (Ray's errors mapped by
:func:`kinesis_actors.errors.ray_call_errors`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from ..aws import AwsSettings, LazyClient
from ..config import KinesisStream
from ..errors import ray_call_errors
from ..leases.protocol import Lease, LeaseStore
from ..load.autoscale import ReaderDemand, reader_bundle
from ..reader import ReaderSpec, ShardEvent
from ..records import StartAt
from ..sinks import Sink
from .core import CoordinatorCore
from .handles import ReaderGone, ReaderHandle, ReaderUnreachable

__all__ = ["RayReaderHandle", "make_coordinator_actor"]

log = logging.getLogger("kinesis_actors.coordinator")


class RayReaderHandle:
    """:class:`ReaderHandle` over a ``ShardReader`` actor: Ray errors mapped to ReaderGone/ReaderUnreachable.

    Args:
        actor: the ShardReader actor handle.
    """

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with ray_call_errors(gone=ReaderGone, unreachable=ReaderUnreachable):
            return await getattr(self.actor, method).remote(*args, **kwargs)

    async def ping(self) -> None:
        await self._call("ping")

    async def add(self, spec: ReaderSpec, lease: Lease, *, lease_age_s: float | None = None) -> ShardEvent:
        answer: ShardEvent = await self._call("add", spec, lease, lease_age_s=lease_age_s)
        return answer

    async def events(self, timeout_s: float) -> list[ShardEvent]:
        answer: list[ShardEvent] = await self._call("events", timeout_s)
        return answer

    async def stop(self, shard_id: str | None, release: bool, grace_s: float) -> None:
        await self._call("stop", shard_id, release, grace_s)

    async def seek(self, shard_id: str, position: StartAt) -> bool:
        answer: bool = await self._call("seek", shard_id, position)
        return answer

    async def stats(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("stats")
        return answer

    async def request_handoff(self, shard_id: str, asker: str) -> bool:
        answer: bool = await self._call("request_handoff", shard_id, asker)
        return answer

    def kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception as e:  # not expected (killing a dead actor is a no-op): said, not raised
            log.warning("killing a reader failed (%r)", e)


def _launcher(stream: KinesisStream, aws: AwsSettings, store: LeaseStore, lease_duration_s: float, sink: Sink | None,
              pull_queue: Any) -> Callable[[int], ReaderHandle]:
    """The Coordinator actor's launcher: reader ``n`` is a ShardReader actor (``stream.actor_options()``)
    delivering to ``sink``, or to the pull queue's ``process_batch`` without one."""
    from ..reader import ShardReader, kinesis_call_timeout_s
    from ..sinks import ActorSink

    options = stream.actor_options()
    target: Sink = sink if sink is not None else ActorSink(pull_queue, "process_batch")
    call_timeout_s = kinesis_call_timeout_s(lease_duration_s)

    def launch(_: int) -> ReaderHandle:
        return RayReaderHandle(ShardReader.options(**options).remote(
            store, target, aws, call_timeout_s, stream.max_buffered_bytes,
            stream_threads=stream.max_shards_per_reader, load_window_s=stream.load_window_s))

    return launch


def _reader_demand(stream: KinesisStream) -> ReaderDemand | None:
    """Readers that need resources (``reader_options``) ask Ray's autoscaler for nodes that can
    hold them (:class:`ReaderDemand`); readers that need none: None."""
    bundle = reader_bundle(stream.actor_options())
    return ReaderDemand(bundle) if bundle else None


def make_coordinator_actor() -> Any:
    """The ``Coordinator`` Ray actor class (built on first use: importing this module does not import Ray)."""
    import ray

    @ray.remote(num_cpus=0, max_restarts=0,  # type: ignore[call-overload]  # Ray types task options only
                max_concurrency=1000)
    class Coordinator:
        """Ray actor shell over :class:`CoordinatorCore` (process name ``ray::Coordinator``).

        Owned by the subscription's handle, which restarts it if it dies.
        """

        def __init__(self, stream: KinesisStream, aws: AwsSettings, store: LeaseStore, owner_id: str,
                     lease_duration_s: float, renew_interval_s: float, sink: Sink | None, pull_queue: Any) -> None:
            logging.basicConfig(level=logging.INFO)
            # Our blocking calls (boto3, MemoryLeaseStore's ray.get) run in worker threads, never on the
            # event loop: Ray's warning about a blocking ray.get in an async actor does not apply. Ray reads
            # this switch at each ray.get.
            os.environ["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] = "0"

            launch = _launcher(stream, aws, store, lease_duration_s, sink, pull_queue)
            on_fatal = (lambda err: pull_queue.fail.remote(err)) if pull_queue is not None else None
            self.core = CoordinatorCore(stream, aws=aws, store=store, owner_id=owner_id,
                                        lease_duration_s=lease_duration_s, renew_interval_s=renew_interval_s,
                                        launcher=launch, on_fatal=on_fatal,
                                        # built after the readers launched; retried by call_with_retry alone
                                        kinesis=LazyClient(lambda: aws.client("kinesis", max_attempts=0)),
                                        reader_demand=_reader_demand(stream))

        async def start(self, timeout_s: float = 120.0) -> None:
            await self.core.start(timeout_s)

        async def close(self, release: bool = True, grace_s: float = 5.0, timeout_s: float = 15.0) -> None:
            await self.core.close(release=release, grace_s=grace_s, timeout_s=timeout_s)

        def error(self) -> BaseException | None:
            return self.core.error()

        async def wait(self, timeout_s: float | None) -> bool:
            return await self.core.wait(timeout_s)

        async def stats(self) -> dict[str, Any]:
            return {**await self.core.stats(), "coordinator": {"pid": os.getpid(),
                                                               "node_id": ray.get_runtime_context().get_node_id()}}

        def held(self) -> list[str]:
            return self.core.held()

        async def seek(self, position: StartAt, shard_id: str | None) -> list[str]:
            return await self.core.seek(position, shard_id)

        def ping(self) -> bool:
            return True

        def reader_handles(self) -> dict[str, Any]:
            """The ShardReader actor handle of each held shard (several shards share one)."""
            return {sid: handle.actor for sid, handle in self.core.reader_of().items()
                    if isinstance(handle, RayReaderHandle)}

    return Coordinator
