"""Ray Data source: :func:`read_kinesis`, a bounded read of a stream into a ``ray.data.Dataset``.

Modelled on Ray's own Kafka source (``ray/data/_internal/datasource/kafka_datasource.py``):
one :class:`~ray.data.ReadTask` per shard (closed shards included), Arrow blocks with
the fixed module-level schema :data:`RECORD_SCHEMA`, eager argument checks that name the
bad value, and bounded memory per task (each task yields a block every
``max_records_per_block`` records instead of holding its shard).

Bounded: the call captures the time it was made. Each shard is read from ``start_at``
up to the first record whose ``ApproximateArrivalTimestamp`` is after that moment (or
after ``end_at``), the shard's end, or the shard's tip. "At the tip" is an empty
``GetRecords`` answer with ``MillisBehindLatest == 0``: it is observed after the call,
so every record that arrived before the call has been read. A busy stream therefore
ends at its first later record, and the read never waits for ``MillisBehindLatest`` to
reach 0 (kinesalite always says 0; a busy shard may never say it).

The bound compares the service's arrival timestamps (millisecond precision) with the
caller's clock: with clock skew between the two, records that arrived within the skew
of the call may fall on the other side of the bound.

It takes no leases and writes no checkpoints: it reads beside any subscription.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from .arrow import RECORD_SCHEMA, records_to_table
from .aws import AwsSettings
from .batch import RecordBatch
from .clock import monotonic_s, wall_s
from .config import validate_stream_name
from .errors import InvalidError, KinesisError
from .kinesis import ShardFetcher, ShardInfo, list_shards
from .records import StartAt

__all__ = ["read_kinesis", "KinesisDatasource", "RECORD_SCHEMA", "records_to_table", "ShardScan"]

log = logging.getLogger(__name__)

DEFAULT_MAX_RECORDS_PER_BLOCK = 10_000
_TRIM_HORIZON = StartAt.trim_horizon()  # the default start_at (StartAt is immutable)
_GET_RECORDS_LIMIT = 10_000
_MAX_THROTTLE_RETRIES = 20

# Keys of ``ray_remote_args`` that ``ray.data.read_datasource`` takes as named parameters
# (passing them in the deprecated dict would warn).
_NAMED_REMOTE_ARGS = ("num_cpus", "num_gpus", "memory", "label_selector", "fallback_strategy", "max_calls",
                      "resources", "accelerator_type", "runtime_env")


def _epoch_s(what: str, value: object) -> float:
    """A timezone-aware datetime or epoch seconds as float epoch seconds; InvalidError otherwise."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise InvalidError(f"{what} must be timezone-aware (e.g. tzinfo=timezone.utc), got {value!r}")
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise InvalidError(f"{what} must be a timezone-aware datetime or epoch seconds, got {value!r}")


class ShardScan:
    """The bounded read of one shard (plain Python: a unit test drives it with a fake client).

    It reads through :class:`~kinesis_actors.kinesis.ShardFetcher` (iterators,
    ``GetRecords``, expired iterators, throttling, pacing), the read path the
    subscription's read loops use too; this class only adds the bound and the blocks.
    Throttling is retried up to 20 times in a row, then raised.

    Args:
        kinesis: a boto3 Kinesis client.
        stream: the stream name. shard: the shard, as ``ListShards`` described it.
        start_at: where to open (``TRIM_HORIZON`` or ``AT_TIMESTAMP``).
        bound_s: epoch seconds; records that arrived after it end the scan.
        max_records_per_block / max_bytes_per_block: when to yield a block.
        sleep / clock: injectable for tests.
    """

    def __init__(self, kinesis: Any, stream: str, shard: ShardInfo, start_at: StartAt, bound_s: float, *,
                 max_records_per_block: int = DEFAULT_MAX_RECORDS_PER_BLOCK, max_bytes_per_block: int = 64 << 20,
                 sleep: Any = time.sleep, clock: Any = monotonic_s) -> None:
        self.stream = stream
        self.shard = shard
        self.bound_ms = bound_s * 1000.0
        self.max_records_per_block = max_records_per_block
        self.max_bytes_per_block = max_bytes_per_block
        self._sleep = sleep
        self.fetcher = ShardFetcher(kinesis, stream, shard.shard_id, start_at,
                                    ending_sequence_number=shard.ending_sequence_number, max_records=_GET_RECORDS_LIMIT,
                                    clock=clock)
        self.records = 0

    @property
    def calls(self) -> int:
        """``GetRecords`` calls made so far."""
        return self.fetcher.get_records_calls

    def blocks(self) -> Iterator[pa.Table]:
        """Yield Arrow blocks of at most ``max_records_per_block`` records until the bound.

        Blocks are made from the fetcher's :class:`~kinesis_actors.batch.RecordBatch`
        buffers (no Record objects are built); a block closes once it holds
        ``max_bytes_per_block`` bytes (``RecordBatch.nbytes``), so it may pass that by up
        to one ``GetRecords`` answer.

        Raises:
            KinesisError: a non-transient error, or throttling 20 times in a row.
        """
        fetcher = self.fetcher
        pending: list[RecordBatch] = []
        held = held_bytes = 0
        while True:
            wait = fetcher.due_in()
            if wait > 0:
                self._sleep(wait)
            got = fetcher.step()
            if fetcher.throttled_in_a_row >= _MAX_THROTTLE_RETRIES:
                raise KinesisError(f"{fetcher.resource}: throttled {fetcher.throttled_in_a_row} times in a row",
                                   retriable=True)
            if got is None:
                continue
            batch = got.records
            cut = batch.first_arriving_after(self.bound_ms / 1000.0)
            done = cut < len(batch)  # arrived after the bound: this and everything after it are out
            batch = batch[:cut]
            while batch:
                chunk = batch[: self.max_records_per_block - held]
                batch = batch[len(chunk):]
                pending.append(chunk)
                held, held_bytes = held + len(chunk), held_bytes + chunk.nbytes
                if held >= self.max_records_per_block or held_bytes >= self.max_bytes_per_block:
                    yield self._block(pending)
                    pending, held, held_bytes = [], 0, 0
            # at the tip now (after the call: every earlier record was read), or the shard ended
            if done or got.at_tip or got.shard_end:
                break
        if pending:
            yield self._block(pending)
        log.debug("shard %s: %d records in %d GetRecords calls", self.shard.shard_id, self.records, self.calls)

    def _block(self, batches: list[RecordBatch]) -> pa.Table:
        table = pa.Table.from_batches([b.to_arrow() for b in batches], schema=RECORD_SCHEMA)
        self.records += table.num_rows
        return table


def _import_datasource_base() -> type:
    from ray.data.datasource import Datasource

    return Datasource


class KinesisDatasource(_import_datasource_base()):  # type: ignore[misc]
    """A bounded read of one stream: one ``ReadTask`` per shard. Use :func:`read_kinesis`.

    The constructor checks its arguments, captures the bound (now, or ``end_at`` if
    earlier) and lists the shards (``ListShards``): the set of shards and the bound are
    fixed at the call, so executing the Dataset twice reads the same records (while
    they are within the stream's retention).
    """

    def __init__(self, stream: str, *, start_at: StartAt, end_at: Any, aws: AwsSettings,
                 max_records_per_block: int) -> None:
        self.stream = validate_stream_name(stream)
        if not isinstance(start_at, StartAt):
            raise InvalidError(f"start_at must be a StartAt (e.g. StartAt.trim_horizon()), got {start_at!r}")
        if start_at.kind == "LATEST":
            raise InvalidError("start_at=StartAt.latest() would read nothing: a bounded read ends at the call; "
                               "use StartAt.trim_horizon() or StartAt.at_timestamp(...)")
        if start_at.needs_shard:
            raise InvalidError(f"start_at {start_at} names one shard's sequence number; read_kinesis reads every shard")
        if (isinstance(max_records_per_block, bool) or not isinstance(max_records_per_block, int)
                or max_records_per_block <= 0):
            raise InvalidError(f"max_records_per_block must be a positive int, got {max_records_per_block!r}")
        now_s = wall_s()
        bound_s = now_s if end_at is None else min(now_s, _epoch_s("end_at", end_at))
        starts_ms = start_at.timestamp_ms if start_at.kind == "AT_TIMESTAMP" else None
        if starts_ms is not None and starts_ms / 1000.0 > bound_s:
            raise InvalidError(f"start_at {start_at} is after the end of the read "
                               f"({_dt.datetime.fromtimestamp(bound_s, _dt.timezone.utc).isoformat()})")
        self.start_at = start_at
        self.bound_s = bound_s
        self.aws = aws
        self.max_records_per_block = max_records_per_block
        self.shards: list[ShardInfo] = list_shards(aws.client("kinesis", max_attempts=0), self.stream)
        from ray.data.context import DataContext

        self._max_bytes_per_block = int(DataContext.get_current().target_max_block_size or (128 << 20))

    def get_name(self) -> str:
        return "Kinesis"

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[Any]:
        """One ``ReadTask`` per shard (``parallelism`` is ignored, as in Ray's Kafka source)."""
        from ray.data.block import BlockMetadata
        from ray.data.datasource import ReadTask

        tasks = []
        for shard in self.shards:
            def read_fn(shard: ShardInfo = shard, aws: AwsSettings = self.aws, stream: str = self.stream,
                        start_at: StartAt = self.start_at, bound_s: float = self.bound_s,
                        max_rows: int = self.max_records_per_block,
                        max_bytes: int = self._max_bytes_per_block) -> Iterator[pa.Table]:
                scan = ShardScan(aws.client("kinesis", max_attempts=0), stream, shard, start_at, bound_s,
                                 max_records_per_block=max_rows, max_bytes_per_block=max_bytes)
                yield from scan.blocks()

            metadata = BlockMetadata(num_rows=None, size_bytes=None,
                                     input_files=(f"kinesis://{self.stream}/{shard.shard_id}",),
                                     exec_stats=None)
            tasks.append(ReadTask(read_fn, metadata, schema=RECORD_SCHEMA, per_task_row_limit=per_task_row_limit))
        return tasks


def read_kinesis(
    stream: str,
    *,
    start_at: StartAt = _TRIM_HORIZON,
    end_at: _dt.datetime | float | None = None,
    endpoint: str | None = None,
    region: str | None = None,
    test_credentials: bool = False,
    ray_remote_args: Mapping[str, Any] | None = None,
    override_num_blocks: int | None = None,
    max_records_per_block: int = DEFAULT_MAX_RECORDS_PER_BLOCK,
) -> Any:
    """Read the records of ``stream`` that arrived before this call into a ``ray.data.Dataset``.

    One read task per shard (open and closed). Each task reads its shard from
    ``start_at`` and stops at the first record that arrived after the call (or after
    ``end_at``), at the shard's end, or at its tip, yielding an Arrow block every
    ``max_records_per_block`` records, so a task's memory does not grow with the shard.
    KPL aggregates are split into their user records (``sub_sequence_number`` set).
    No lease is taken and no checkpoint written.

    Args:
        stream: the stream name (positional).
        start_at: ``StartAt.trim_horizon()`` (default) or ``StartAt.at_timestamp(dt)``.
            ``LATEST`` (always empty here) and the sequence-number kinds are refused.
        end_at: a timezone-aware datetime or epoch seconds: only records that arrived
            at or before it. Default: the moment of this call. A later ``end_at`` is
            clamped to the call: the read never waits for records.
        endpoint: endpoint URL (an emulator), or None for AWS.
        region: AWS region, or None for boto3's default chain.
        test_credentials: fixed dummy keys, for emulators.
        ray_remote_args: Ray options for each read task (``num_cpus``, ``memory``,
            ``resources``, ``runtime_env``, ``scheduling_strategy``...).
        override_num_blocks: passed to ``ray.data.read_datasource`` (blocks are split
            or coalesced after the read).
        max_records_per_block: most records in one Arrow block (10,000).

    Returns:
        A lazy ``ray.data.Dataset`` with :data:`RECORD_SCHEMA`: ``data`` (binary),
        ``partition_key``, ``sequence_number`` (strings), ``sub_sequence_number``
        (int64, null unless KPL), ``approximate_arrival_timestamp`` (timestamp[ms, UTC]),
        ``shard_id``, ``stream``.

    Raises:
        InvalidError: a bad argument (the message names the value), before any AWS call.
        StreamError: the stream does not exist, or the credentials were refused.

    Example::

        ds = read_kinesis("orders", start_at=StartAt.trim_horizon(), endpoint=url,
                          region="us-east-1", test_credentials=True)
        ds.groupby("shard_id").count().show()
    """
    import ray

    aws, remote, named = _checked_read_options(endpoint, region, test_credentials, ray_remote_args, override_num_blocks)
    datasource = KinesisDatasource(stream, start_at=start_at, end_at=end_at, aws=aws,
                                   max_records_per_block=max_records_per_block)
    return ray.data.read_datasource(datasource, override_num_blocks=override_num_blocks,
                                    ray_remote_args=remote or None, **named)


def _checked_read_options(endpoint: str | None, region: str | None, test_credentials: bool,
                          ray_remote_args: Mapping[str, Any] | None, override_num_blocks: int | None,
                          ) -> tuple[AwsSettings, dict[str, Any], dict[str, Any]]:
    """Check :func:`read_kinesis`'s connection and Ray options (before any AWS call) and return
    the :class:`AwsSettings`, then the remote args split in two: those passed as
    ``ray_remote_args`` and those ``read_datasource`` takes by name.

    Raises:
        InvalidError: a bad argument (the message names the value).
    """
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://"))):
        raise InvalidError(f"endpoint must be an http(s) URL, got {endpoint!r}")
    if region is not None and (not isinstance(region, str) or not region):
        raise InvalidError(f"region must be a non-empty string, got {region!r}")
    if not isinstance(test_credentials, bool):
        raise InvalidError(f"test_credentials must be a bool, got {test_credentials!r}")
    if ray_remote_args is not None and not isinstance(ray_remote_args, Mapping):
        raise InvalidError(f"ray_remote_args must be a dict, got {ray_remote_args!r}")
    if override_num_blocks is not None and (isinstance(override_num_blocks, bool)
                                            or not isinstance(override_num_blocks, int) or override_num_blocks <= 0):
        raise InvalidError(f"override_num_blocks must be a positive int or None, got {override_num_blocks!r}")
    aws = AwsSettings(endpoint=endpoint, region=region, test_credentials=test_credentials)
    remote = dict(ray_remote_args or {})
    named = {k: remote.pop(k) for k in _NAMED_REMOTE_ARGS if k in remote}
    return aws, remote, named
