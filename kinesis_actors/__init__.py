"""kinesis_actors: read Amazon Kinesis Data Streams on a Ray cluster, with KCL-style leases.

A ``Coordinator`` actor per subscription lists the shards and runs one ``ShardReader``
actor per shard lease; leases live in a ``LeaseStore`` (DynamoDB, or one Ray actor);
delivery is at-least-once: a checkpoint is written only after the downstream
acknowledged the batch. See README.md.
"""

from .batch import RecordBatch
from .broker import KinesisBroker, SeekHandle, Subscription
from .config import KinesisStream
from .errors import (
    InvalidError,
    KinesisError,
    LeaseLostError,
    LeaseStoreError,
    NotConnectedError,
    PartialBatchError,
    SinkError,
    StreamError,
)
from .leases import SHARD_END, DynamoLeaseStore, KclLeaseStore, Lease, LeaseStore, MemoryLeaseStore
from .leases.kcl import KclFleetLiveError
from .publisher import Publisher, PutResult
from .records import Record, StartAt

__version__ = "0.1.0"

__all__ = [
    "KinesisBroker",
    "KinesisStream",
    "StartAt",
    "Subscription",
    "SeekHandle",
    "Record",
    "RecordBatch",
    "Publisher",
    "PutResult",
    "Lease",
    "LeaseStore",
    "MemoryLeaseStore",
    "DynamoLeaseStore",
    "KclLeaseStore",
    "SHARD_END",
    "KinesisError",
    "NotConnectedError",
    "InvalidError",
    "StreamError",
    "LeaseLostError",
    "LeaseStoreError",
    "SinkError",
    "PartialBatchError",
    "KclFleetLiveError",
    "read_kinesis",
    "DatasetSink",
    "__version__",
]

# Ray Data is imported on first use, not by `import kinesis_actors`
_LAZY = {"read_kinesis": ".data", "DatasetSink": ".sinks.dataset"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
