"""The lease model: :class:`Lease` (one row of the lease table) and the :class:`LeaseStore` protocol.

A lease is one row per shard, keyed ``"<stream>:<shard id>"`` (shard ids repeat across
streams), in the style of the Kinesis Client Library's lease table:

================================ ==== =================================================
attribute                        type meaning
================================ ==== =================================================
``lease_key``                    S    hash key, ``"<stream>:<shard id>"``
``lease_owner``                  S    owner id of the holder; absent when free
``lease_counter``                N    +1 on every take, renew and checkpoint (fencing token)
``lease_duration_ms``            N    the holder's lease duration
``lease_expiry``                 N    holder's wall clock + duration, epoch ms (for people)
``checkpoint``                   S    last acknowledged sequence number, or ``SHARD_END``
``checkpoint_sub_sequence``      N    sub-sequence inside a KPL aggregate
``start_position``               S    where a never-checkpointed shard was first opened
``parent_shard_ids``             SS   parents of a child shard (resharding)
``lease_next_owner``             S    an instance asking for a graceful handoff
``stream_arn``                   S    the stream's ARN when the row was (re)started
``stream_creation_ms``           N    the stream's creation time, epoch ms: with the ARN,
                                      which incarnation of the stream the row belongs to
``throughput_kbps``              N    the shard's recent throughput, KB/s, written by its
                                      holder with each renewal (KCL 3.x's ``throughputKBps``)
``lease_write_token``            S    random, new on every write that raises the counter:
                                      a writer tells its own write that landed although
                                      the call failed (a retried ``UpdateItem``)
================================ ==== =================================================

Presence rows (one per live instance reading a stream, for lease balancing) share the
table under a key that cannot be a shard's, ``"<stream>#instance#<owner>"``, with
``stream``, ``lease_owner``, ``lease_counter`` (+1 on every heartbeat),
``lease_duration_ms`` and ``lease_expiry``. They are judged fresh or stale by the same
observation rule as leases and are never returned by ``list()``.

Expiry is judged as KCL judges it: never by comparing another host's wall clock. Each
store notes, per row, the counter it last saw and when it first saw it (its own
monotonic clock); the lease is expired *for that store* once the counter has stayed
the same for the row's ``lease_duration_ms``.
"""

from __future__ import annotations

import builtins
import dataclasses
from typing import Any, Protocol, runtime_checkable

__all__ = ["Lease", "Instance", "TableSnapshot", "LeaseStore", "SHARD_END"]

SHARD_END = "SHARD_END"
"""Checkpoint value of a shard read to its end and fully acknowledged (KCL's sentinel)."""

@dataclasses.dataclass(frozen=True)
class Lease:
    """One row of the lease table, as a store last wrote or read it (immutable).

    Attributes:
        stream: stream name.
        shard_id: shard id, e.g. ``"shardId-000000000000"``.
        owner: owner id of the holder, or None when the lease is free.
        counter: lease counter; raised by every successful take, renew and checkpoint.
        expiry_ms: holder's wall clock at its last write + duration, epoch milliseconds.
            Informational only: expiry decisions never read it.
        duration_ms: the holder's lease duration, milliseconds.
        checkpoint: last acknowledged sequence number, ``SHARD_END``, or None.
        checkpoint_sub_sequence: user-record sub-sequence inside a KPL aggregate, or None.
        start_position: where a never-checkpointed shard was first opened (a
            serialised ``StartAt``), so a replacement reader never re-resolves ``LATEST``.
        parent_shard_ids: parent shards of a child shard (after a split or merge).
        next_owner: owner id of an instance waiting for a graceful handoff, or None.
        stream_arn / stream_creation_ms: the identity of the stream incarnation the row
            belongs to (``DescribeStreamSummary``'s ARN and creation time), or None on a
            row written without it. A stream deleted and re-created under the same name
            has another identity: its old rows' checkpoints are never applied.
        throughput_kbps: the shard's throughput its holder measured (KB/s, a moving average
            over ``load_window_s``), written with its renewals; None until one was written.
    """

    stream: str
    shard_id: str
    owner: str | None
    counter: int
    expiry_ms: int = 0
    duration_ms: int = 0
    checkpoint: str | None = None
    checkpoint_sub_sequence: int | None = None
    start_position: str | None = None
    parent_shard_ids: tuple[str, ...] = ()
    next_owner: str | None = None
    stream_arn: str | None = None
    stream_creation_ms: int | None = None
    throughput_kbps: float | None = None

    @property
    def key(self) -> str:
        """The row's hash key, ``"<stream>:<shard id>"``."""
        return f"{self.stream}:{self.shard_id}"

    @property
    def stream_identity(self) -> tuple[str, int] | None:
        """``(stream_arn, stream_creation_ms)`` of the row's stream incarnation, or None if unknown."""
        if self.stream_arn is None or self.stream_creation_ms is None:
            return None
        return (self.stream_arn, self.stream_creation_ms)

    @property
    def finished(self) -> bool:
        """True once the shard was read to its end and acknowledged (``checkpoint == SHARD_END``)."""
        return self.checkpoint == SHARD_END


@dataclasses.dataclass(frozen=True)
class Instance:
    """One presence row: an instance (a subscription's owner id) reading ``stream``.

    Attributes:
        stream: stream name.
        owner: owner id of the instance.
        counter: raised by every heartbeat; a counter that stays the same for
            ``duration_ms`` (as a store observes it) makes the instance stale.
        duration_ms: how long the row stays fresh without a heartbeat, milliseconds.
        expiry_ms: writer's wall clock at its last heartbeat + duration, epoch ms
            (informational only).
    """

    stream: str
    owner: str
    counter: int
    duration_ms: int = 0
    expiry_ms: int = 0

    @property
    def key(self) -> str:
        """The presence row's key, ``"<stream>#instance#<owner>"``."""
        return f"{self.stream}#instance#{self.owner}"


@dataclasses.dataclass(frozen=True)
class TableSnapshot:
    """One consistent scan of a stream's rows: its shard leases and its live instances."""

    leases: list[Lease]
    instances: list[Instance]


@runtime_checkable
class LeaseStore(Protocol):
    """Storage of the lease table: every call the library makes on a store.

    Every write is conditional on the owner and counter the caller holds (fencing) and
    returns the new :class:`Lease`; a failed condition raises ``LeaseLostError`` and
    changes nothing. Reads are strongly consistent. Implementations share their logic
    (``kinesis_actors.leases.rules.LeaseRules``): ``MemoryLeaseStore`` (one Ray
    actor), ``DynamoLeaseStore`` (a DynamoDB table) and
    ``kinesis_actors.testing.InProcessLeaseStore``. Methods may raise ``InvalidError``
    (bad input, before any I/O) and ``LeaseStoreError`` (table missing or unreachable
    past retries). Stores are picklable: they cross into the Coordinator and readers.
    """

    # lifecycle (the broker calls these at connect() and shutdown())
    def bind(self, aws: Any) -> LeaseStore:
        """A store whose unset AWS settings are taken from the broker's ``AwsSettings``
        (itself when it has none to take). No I/O."""
        ...

    def open(self) -> LeaseStore:
        """Make the store ready in the calling process (create what it owns); returns it."""
        ...

    def close(self) -> None:
        """Release what :meth:`open` created (a store that owns nothing does nothing)."""
        ...

    # leases
    def take(self, stream: str, shard_id: str, *, owner: str, duration_s: float,
             parent_shard_ids: tuple[str, ...] = (), stream_identity: tuple[str, int] | None = None) -> Lease | None:
        """Take the shard's lease for ``owner`` if it is free, already ``owner``'s, or expired
        for this store; create the row if missing (with ``parent_shard_ids``). Returns the
        new Lease, or None when another owner holds it live or won a race for it. A row of
        another ``stream_identity`` (ARN, creation ms) is restarted (its checkpoint dropped)."""
        ...

    def renew(self, lease: Lease, *, duration_s: float | None = None, throughput_kbps: float | None = None) -> Lease:
        """Extend a held lease (counter +1), with the shard's ``throughput_kbps`` when given (the
        same write). ``LeaseLostError`` if not held any more."""
        ...

    def checkpoint(self, lease: Lease, sequence_number: str, *, sub_sequence: int | None = None,
                   throughput_kbps: float | None = None) -> Lease:
        """Record the last acknowledged sequence number (or ``SHARD_END``); counter +1; with the
        shard's ``throughput_kbps`` when given (the same write)."""
        ...

    def set_start_position(self, lease: Lease, position: str) -> Lease:
        """Record where the shard opens and clear its checkpoint (first open, or a seek)."""
        ...

    def release(self, lease: Lease) -> Lease:
        """Clear the owner, keep the checkpoint. ``LeaseLostError`` if not held any more."""
        ...

    def get(self, stream: str, shard_id: str) -> Lease | None:
        """The shard's row (consistent read), or None."""
        ...

    def list(self, stream: str) -> builtins.list[Lease]:
        """Every shard row of ``stream`` (consistent read), sorted by shard id."""
        ...

    def is_expired(self, lease: Lease | Instance) -> bool:
        """True if the row's counter has not changed for its duration, as this store saw it."""
        ...

    def snapshot(self, stream: str) -> TableSnapshot:
        """One consistent read of ``stream``'s rows: its shard leases and its live instances."""
        ...

    # lease balancing: graceful handoff and presence rows
    def request_handoff(self, stream: str, shard_id: str, *, owner: str, expect_counter: int) -> bool:
        """Ask the holder to hand the lease over to ``owner`` (sets ``lease_next_owner``)."""
        ...

    def withdraw_handoff(self, stream: str, shard_id: str, *, owner: str) -> bool:
        """Take back ``owner``'s handoff request (clears ``lease_next_owner`` if it names ``owner``)."""
        ...

    def hand_over(self, lease: Lease, *, to: str | None = None) -> Lease:
        """The holder gives the lease to ``to`` (default ``lease.next_owner``): owner changes,
        counter +1, checkpoint kept. ``LeaseLostError`` if not held any more."""
        ...

    def force_handoff(self, stream: str, shard_id: str, *, owner: str, duration_s: float) -> Lease | None:
        """Take a lease whose holder did not honour ``owner``'s handoff request in time."""
        ...

    def heartbeat(self, stream: str, owner: str, *, duration_s: float) -> Instance:
        """Create or refresh ``owner``'s presence row for ``stream`` (counter +1)."""
        ...

    def instances(self, stream: str, *, include_stale: bool = False) -> builtins.list[Instance]:
        """Presence rows of ``stream`` (fresh ones only, unless ``include_stale``), sorted by owner."""
        ...

    def remove_presence(self, stream: str, owner: str) -> None:
        """Delete ``owner``'s presence row for ``stream`` (idempotent)."""
        ...
