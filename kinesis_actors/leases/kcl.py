""":class:`KclLeaseStore`: a lease store over the DynamoDB lease table of a KCL application.

A Kinesis Client Library 2.x/3.x application (Java KCL, amazon-kclpy, kcl-rs) keeps its
progress in a DynamoDB table named after the application, in KCL's schema
(:mod:`kinesis_actors.leases.kcl_rows` quotes the source). This store reads and writes
that table as KCL does, so a stopped KCL fleet's checkpoints are where the library
resumes, and a KCL fleet started after ours resumes after our checkpoints.

The lease rules are :class:`~kinesis_actors.leases.rules.LeaseRules`'s; :class:`KclRows`
(:mod:`~kinesis_actors.leases.kcl_table`, re-exported here with :class:`KclFleetLiveError`)
maps the table interface onto KCL rows (:func:`~kinesis_actors.leases.kcl_rows.item_to_row`,
:func:`~kinesis_actors.leases.kcl_update.kcl_update`) through a
:class:`~kinesis_actors.leases.dynamodb.DynamoRows` client (settings, ``bind``, error
translation). What it never does, and why:

- it never creates, deletes or alters the table (a missing or foreign table is a
  ``LeaseStoreError`` at :meth:`KclLeaseStore.open`, which the broker calls in
  ``connect()``, before any stream is read);
- it writes no presence rows: KCL would read them as leases. Instances balance by
  counting lease owners, as KCL 2.x does (the Coordinator's planner already counts the
  owners of live leases); ``KclRows.presence`` is False, so ``heartbeat`` writes nothing;
- it writes no worker-metrics or coordinator-state entity. KCL 3.x keeps those in their
  own tables (``<app>-WorkerMetricStats``, ``<app>-CoordinatorState``) or, in newer
  versions, as rows of the lease table with an ``entityType`` other than ``LEASE``
  (``leases/EntityType.java``), which this store skips. A KCL 3.x leader reassigns only
  expired or unassigned leases to workers that have a fresh worker-metrics entry
  (``coordinator/assignment/LeaseAssignmentManager.java``: leases of a worker without one
  are left alone while their counter moves, and "if a worker has died, the lease will be
  expired and assigned in next iteration"): after our fleet stops, a KCL 3.x fleet takes
  our rows one ``failoverTimeMillis`` later, or at once where we released them.

A live KCL worker is refused: a KCL renewal raises ``leaseCounter`` without our
``kinesisActorsWriteToken``; seeing that on a row (between two of our reads, in any
process of the subscription) raises :class:`KclFleetLiveError`, which fails the
subscription. Why a live mix is not supported: each write stays fenced by the counter on
both sides, so no checkpoint passes an unacknowledged record, but the two fleets do not
agree on balancing (a KCL 3.x leader assigns only to workers with worker-metrics entries,
and KCL 2.x steals toward its own target, judged on its own ``failoverTimeMillis``), so
leases would move back and forth without bound, each move re-delivering a batch.
"""

from __future__ import annotations

import logging
from typing import Any

from ..aws import AwsSettings
from ..clock import Clock, WallClock, monotonic_s, wall_s
from ..errors import InvalidError
from ..records import StartAt
from .dynamodb import DynamoRows, check_settings
from .kcl_rows import LATEST
from .kcl_table import KclFleetLiveError, KclRows
from .protocol import Lease
from .rows import duration_to_ms, validate_names
from .rules import LeaseRules

__all__ = ["KclLeaseStore", "KclRows", "KclFleetLiveError"]

logger = logging.getLogger(__name__)


class KclLeaseStore(LeaseRules):
    """A ``LeaseStore`` over an existing KCL 2.x/3.x lease table (Java KCL, amazon-kclpy, kcl-rs):
    :class:`LeaseRules` over :class:`KclRows`.

    The constructor does no I/O; :meth:`open` (the broker's ``connect()``) checks the table.
    Our fencing (owner + counter) is KCL's own: ``leaseOwner`` (``checkpointOwner`` during a
    KCL 3.x handoff) + ``leaseCounter``. Rows are written as KCL writes them (see
    :mod:`~kinesis_actors.leases.kcl_update`). A KCL worker renews and checkpoints in separate
    writes; a checkpoint riding a renewal is ONE ``UpdateItem`` here, with KCL's names: KCL's own
    checkpoint write (``setCheckpoint`` through ``updateLease``) already raises ``leaseCounter``,
    which is all a KCL reader of the row takes for a renewal. Sentinel checkpoints are read as
    KCL reads them: ``TRIM_HORIZON`` (and ``AT_TIMESTAMP``, whose timestamp is KCL's
    configuration) resumes at the oldest record and ``LATEST`` at the tip (resolved once, at the
    take, into ``AT_TIMESTAMP`` of that moment), whatever the subscription's ``start_at`` says.
    KPL sub-sequence checkpoints resume inside the aggregate, after the user record.

    Args:
        application: the KCL application name, which is its lease table's name (KCL's
            default ``tableName``); 3-255 characters of ``[a-zA-Z0-9_.-]``.
        endpoint: as for ``DynamoLeaseStore``; unset, inherited from the broker (so are the next two).
        region: as for ``DynamoLeaseStore``.
        test_credentials: as for ``DynamoLeaseStore``.
        session: as for ``DynamoLeaseStore``; unset, inherited from the broker.
        stream: the stream of a single-stream table (which does not record it), or None to
            bind to the first stream used; another stream then raises ``InvalidError``.
        multi_stream: the table's layout; None detects it at :meth:`open` (rows with
            ``streamName`` make it multi-stream; an empty table is single-stream).
        clock: the monotonic clock, seconds.
        wall_clock: the epoch clock, seconds.

    Raises:
        InvalidError: a bad application name or stream name.

    Errors of the methods: ``LeaseStoreError`` for a missing or foreign table, naming it;
    :class:`KclFleetLiveError` when a live KCL worker is seen; otherwise as
    ``DynamoLeaseStore``. The broker's ``lease_duration_s`` plays KCL's ``failoverTimeMillis``.
    """

    def __init__(self, application: str, *, endpoint: str | None = None, region: str | None = None,
                 test_credentials: bool | None = None, session: Any = None, stream: str | None = None,
                 multi_stream: bool | None = None, clock: Clock = monotonic_s, wall_clock: WallClock = wall_s) -> None:
        check_settings(application, endpoint)
        if stream is not None:
            validate_names(stream)
        if multi_stream is not None and not isinstance(multi_stream, bool):
            raise InvalidError(f"multi_stream must be True, False or None, got {multi_stream!r}")
        dynamo = DynamoRows(application, endpoint=endpoint, region=region, test_credentials=test_credentials,
                            session=session)
        super().__init__(KclRows(dynamo, stream, multi_stream), clock=clock, wall_clock=wall_clock)

    @property
    def kcl(self) -> KclRows:
        """The table's :class:`KclRows`."""
        assert isinstance(self.rows, KclRows)
        return self.rows

    def __repr__(self) -> str:
        return f"KclLeaseStore({self.kcl.table!r}, endpoint={self.endpoint!r}, stream={self.stream!r})"

    @property
    def table(self) -> str:
        """The lease table name (the KCL application's)."""
        return self.kcl.table

    @property
    def endpoint(self) -> str | None:
        """The endpoint URL in effect (explicit, else inherited from the broker), or None."""
        return self.kcl.dynamo.endpoint

    @property
    def stream(self) -> str | None:
        """The stream of a single-stream table (given, or bound at first use), or None."""
        return self.kcl.stream

    @property
    def multi_stream(self) -> bool | None:
        """True for a multi-stream table, False for single-stream, None before :meth:`open`."""
        return self.kcl.multi

    def settings(self) -> AwsSettings:
        """The AWS settings in effect (as ``DynamoLeaseStore.settings``)."""
        return self.kcl.dynamo.settings()

    def bind(self, aws: AwsSettings) -> KclLeaseStore:
        """A copy whose unset settings come from the broker's ``aws``; no I/O.

        Raises:
            InvalidError: ``aws`` is not an ``AwsSettings``.
        """
        if not isinstance(aws, AwsSettings):
            raise InvalidError(f"bind needs an AwsSettings, got {type(aws).__name__}")
        other: KclLeaseStore = self.peer(rows=self.kcl.peer(self.kcl.dynamo.bound(aws)))
        return other

    def claim_stream(self, stream: str) -> None:
        """Bind a single-stream store to ``stream`` (the broker calls it at ``subscribe``). No I/O.

        Raises:
            InvalidError: a bad name, or a single-stream store bound to another stream.
        """
        self.kcl.check_stream(stream)

    def open(self) -> KclLeaseStore:
        """Check the table (see :meth:`KclRows.ensure_table`); returns self.

        Raises:
            LeaseStoreError: the table is missing or not a KCL lease table (the message names it).
        """
        self.kcl.ensure_table()
        return self

    def take(self, stream: str, shard_id: str, *, owner: str, duration_s: float,
             parent_shard_ids: tuple[str, ...] = (), stream_identity: tuple[str, int] | None = None) -> Lease | None:
        """Take the shard's lease as :meth:`LeaseRules.take` does, writing what KCL's ``takeLease``
        writes. ``duration_s`` also becomes the failover time this store judges KCL rows by. A
        row whose checkpoint is KCL's ``LATEST`` is resolved once, here: its start position
        becomes ``AT_TIMESTAMP`` of this moment (a second fenced write), so a replacement reader
        never re-resolves the tip and skips records.

        Raises:
            KclFleetLiveError: a live KCL worker was seen on the table.
            InvalidError / LeaseStoreError: as :meth:`LeaseRules.take`; a stream other than a
                single-stream table's.
        """
        validate_names(stream, shard_id, owner)
        duration_to_ms(duration_s)
        self.kcl.expect(stream, stream_identity)
        lease = super().take(stream, shard_id, owner=owner, duration_s=duration_s,
                             parent_shard_ids=parent_shard_ids, stream_identity=stream_identity)
        self.kcl.duration_ms = duration_to_ms(duration_s)
        if lease is not None and lease.checkpoint is None and lease.start_position == LATEST:
            at = StartAt("AT_TIMESTAMP", timestamp_ms=int(self.wall_clock() * 1000)).to_str()
            lease = self.set_start_position(lease, at)
            logger.info("lease %s: KCL checkpoint LATEST resolved once, to %s", lease.key, at)
        return lease

    def release(self, lease: Lease) -> Lease:
        """Release as KCL's ``evictLease`` does: ``leaseOwner`` and ``checkpointOwner`` removed,
        counter +1, checkpoint kept, so a KCL worker can take the row at once. During a
        pending handoff KCL's evict removes only ``checkpointOwner``, giving the row to the
        asker: that is :meth:`LeaseRules.hand_over`. When ``lease.next_owner`` names an asker,
        the row is read first (one ``GetItem``) and handed to the asker it names now, or released
        if none: a request is withdrawn without moving the counter, so the Lease's may be stale.

        Raises:
            InvalidError / LeaseLostError / LeaseStoreError: as :meth:`LeaseRules.release`
                (LeaseStoreError from the read too).
        """
        if lease.next_owner and lease.next_owner != lease.owner:
            row = self.get(lease.stream, lease.shard_id)
            asker = row.next_owner if row is not None and row.owner == lease.owner else None
            if asker and asker != lease.owner:
                return self.hand_over(lease, to=asker)
        return super().release(lease)
