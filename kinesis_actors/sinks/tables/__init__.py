"""Effectively-once output to tables: :class:`IcebergSink` and :class:`DeltaSink`.

* :mod:`.positions`: shard positions as table commits record them, and how they compare.
* :mod:`.backend`: the :class:`TableBackend` seam; :mod:`.iceberg` (pyiceberg) and
  :mod:`.delta` (deltalake) implement it.
* :mod:`.rounds`: one commit round (read the positions, refuse fenced shards, commit).
* :mod:`.committer`: :class:`TableCommitter`, the one committer of a subscription.
* :mod:`.staging`: what the committer holds per shard between commits.
* :mod:`.handle`: :class:`TableSink`, the handle over the committer's Ray actor.
* :mod:`.sink`: the sinks, one per table format.
* :mod:`.link`: :class:`ShardTableLink`, the sink's hook in each shard lease's read loop.
* :mod:`.checks`: the options ``subscribe`` refuses with a table sink.

pyiceberg and deltalake are the ``tables`` extra (``pip install "kinesis-actors[tables]"``);
this package imports them only when a table is reached.
"""

from __future__ import annotations

from .backend import CommitConflict, CommitRecord, TableBackend
from .checks import check_table_sink
from .committer import TableCommitter
from .link import ShardTableLink
from .positions import ShardKey, TablePosition, resume_after
from .sink import EXTRA_HINT, DeltaSink, IcebergSink, TableSink, is_table_sink

__all__ = ["IcebergSink", "DeltaSink", "TableSink", "TableCommitter", "ShardTableLink", "is_table_sink",
           "check_table_sink", "ShardKey", "TablePosition", "resume_after", "TableBackend", "CommitConflict",
           "CommitRecord", "EXTRA_HINT"]
