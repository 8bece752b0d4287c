"""A simulated Kinesis stream (the boto3 client calls the library makes), deterministic.

Shards hold records with stream-wide increasing sequence numbers; iterators are
``"<shard>|<position>|<issued at>"`` and expire 300 s after issue (AWS: 5 minutes), answered
with ``ExpiredIteratorException``; a closed shard read to its end answers
``NextShardIterator: null``; ``MillisBehindLatest`` is the age of the shard's newest record
behind the read position. :meth:`SimKinesis.split` and :meth:`SimKinesis.merge` reshard
(parents closed at their last record, children open, listed with their parents).
Throttling (``ProvisionedThroughputExceededException``) and stalls are decided by the
simulator's faults through :attr:`SimKinesis.throttle` (shard id -> chance per call).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ReadTimeoutError

from kinesis_actors.testing import client_error

__all__ = ["SimKinesis", "SimShard", "ITERATOR_TTL_S"]

ITERATOR_TTL_S = 300.0
"""How long a shard iterator stays valid (AWS: 5 minutes), seconds."""


@dataclasses.dataclass
class SimShard:
    """One shard: its records (``GetRecords`` dicts), parents and whether it is closed."""

    shard_id: str
    parents: tuple[str, ...] = ()
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    arrivals: list[float] = dataclasses.field(default_factory=list)  # virtual monotonic, per record
    closed: bool = False
    first_seq: int = 0
    hash_range: tuple[int, int] = (0, 2**128 - 1)

    def index_after(self, seq: int) -> int:
        """Position of the first record with a sequence number above ``seq``."""
        lo, hi = 0, len(self.records)
        while lo < hi:
            mid = (lo + hi) // 2
            if int(self.records[mid]["SequenceNumber"]) <= seq:
                lo = mid + 1
            else:
                hi = mid
        return lo


class SimKinesis:
    """The simulated stream ``name`` with ``n_shards`` open shards at the start.

    Args:
        n_shards: open shards ``shardId-000000000000`` onwards.
        clock: virtual monotonic seconds. wall: virtual epoch seconds (arrival timestamps).
        chance: ``chance(p)`` -> True with probability ``p`` (the seeded random source).
        name: the stream name.
    """

    def __init__(self, n_shards: int, *, clock: Callable[[], float], wall: Callable[[], float],
                 chance: Callable[[float], bool], name: str = "sim") -> None:
        self.name, self._clock, self._wall, self._chance = name, clock, wall, chance
        self.shards: dict[str, SimShard] = {}
        self.next_seq = 1000
        self.throttle: dict[str, float] = {}
        self.calls = 0
        self.expire_chance = 0.0
        self.timeouts: set[str] = set()  # shards whose next call fails with botocore's ReadTimeoutError
        self.on_read: Callable[[str, int, int], None] | None = None  # (shard, first index, count) per answer
        self.on_iterator: Callable[[str, str, int], None] | None = None  # (shard, type, position) per iterator
        for _ in range(n_shards):
            self._new_shard(())

    def _new_shard(self, parents: tuple[str, ...]) -> SimShard:
        sid = f"shardId-{len(self.shards):012d}"
        shard = SimShard(sid, parents, first_seq=self.next_seq)
        self.shards[sid] = shard
        return shard

    def open_shards(self) -> list[str]:
        """Ids of the open shards, sorted."""
        return sorted(s.shard_id for s in self.shards.values() if not s.closed)

    def put(self, shard_id: str, key: str, data: bytes) -> int:
        """Append one record to an open shard; its sequence number."""
        shard = self.shards[shard_id]
        assert not shard.closed, f"put into closed shard {shard_id}"
        self.next_seq += 1
        wall = self._wall()
        shard.records.append({"Data": data, "PartitionKey": key, "SequenceNumber": str(self.next_seq),
                              "ApproximateArrivalTimestamp": _dt.datetime.fromtimestamp(wall, _dt.timezone.utc)})
        shard.arrivals.append(self._clock())
        return self.next_seq

    def split(self, shard_id: str) -> tuple[str, str]:
        """Close ``shard_id``; two open children take its hash range."""
        parent = self.shards[shard_id]
        parent.closed = True
        lo, hi = parent.hash_range
        mid = (lo + hi) // 2
        a, b = self._new_shard((shard_id,)), self._new_shard((shard_id,))
        a.hash_range, b.hash_range = (lo, mid), (mid + 1, hi)
        return a.shard_id, b.shard_id

    def merge(self, first: str, second: str) -> str:
        """Close two open shards; one open child with both as parents."""
        for sid in (first, second):
            self.shards[sid].closed = True
        child = self._new_shard((first, second))
        child.hash_range = (min(self.shards[first].hash_range[0], self.shards[second].hash_range[0]),
                            max(self.shards[first].hash_range[1], self.shards[second].hash_range[1]))
        return child.shard_id

    def _timeout(self, shard_id: str) -> None:
        if shard_id in self.timeouts:
            self.timeouts.discard(shard_id)
            raise ReadTimeoutError(endpoint_url="https://kinesis.sim")

    # ------------------------------------------------------------------ the client calls
    def list_shards(self, **_: Any) -> dict[str, Any]:
        """Every shard, parents and closed shards' ending sequence numbers included."""
        out = []
        for s in self.shards.values():
            seq: dict[str, str] = {"StartingSequenceNumber": str(s.first_seq)}
            if s.closed:
                seq["EndingSequenceNumber"] = s.records[-1]["SequenceNumber"] if s.records else str(s.first_seq)
            item: dict[str, Any] = {"ShardId": s.shard_id, "SequenceNumberRange": seq,
                                    "HashKeyRange": {"StartingHashKey": str(s.hash_range[0]),
                                                     "EndingHashKey": str(s.hash_range[1])}}
            if s.parents:
                item["ParentShardId"] = s.parents[0]
            if len(s.parents) > 1:
                item["AdjacentParentShardId"] = s.parents[1]
            out.append(item)
        return {"Shards": out}

    def describe_stream_summary(self, **_: Any) -> dict[str, Any]:
        """The stream's summary with its ARN and creation time (its identity)."""
        return {"StreamDescriptionSummary": {
            "StreamName": self.name, "StreamStatus": "ACTIVE", "OpenShardCount": len(self.open_shards()),
            "StreamARN": f"arn:aws:kinesis:us-east-1:0:stream/{self.name}",
            "StreamCreationTimestamp": _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)}}

    def get_shard_iterator(self, *, ShardId: str, ShardIteratorType: str, **kw: Any) -> dict[str, str]:
        """An iterator at the position the type names."""
        self.calls += 1
        self._timeout(ShardId)
        shard = self.shards[ShardId]
        if ShardIteratorType == "TRIM_HORIZON":
            pos = 0
        elif ShardIteratorType == "LATEST":
            pos = len(shard.records)
        elif ShardIteratorType == "AT_SEQUENCE_NUMBER":
            pos = shard.index_after(int(kw["StartingSequenceNumber"]) - 1)
        elif ShardIteratorType == "AFTER_SEQUENCE_NUMBER":
            pos = shard.index_after(int(kw["StartingSequenceNumber"]))
        else:  # AT_TIMESTAMP
            when = kw["Timestamp"]
            when = when.timestamp() if isinstance(when, _dt.datetime) else float(when)
            pos = next((i for i, r in enumerate(shard.records)
                        if r["ApproximateArrivalTimestamp"].timestamp() >= when), len(shard.records))
        if self.on_iterator is not None:
            self.on_iterator(ShardId, ShardIteratorType, pos)
        return {"ShardIterator": f"{ShardId}|{pos}|{self._clock()!r}"}

    def get_records(self, *, ShardIterator: str, Limit: int = 10_000) -> dict[str, Any]:
        """Up to ``Limit`` records from the iterator's position (errors per the faults)."""
        self.calls += 1
        sid, pos_s, issued = ShardIterator.split("|")
        self._timeout(sid)
        if self._clock() - float(issued) > ITERATOR_TTL_S or self._chance(self.expire_chance):
            raise client_error("ExpiredIteratorException")
        if self._chance(self.throttle.get(sid, 0.0)):
            raise client_error("ProvisionedThroughputExceededException")
        shard, pos = self.shards[sid], int(pos_s)
        out = shard.records[pos:pos + Limit]
        nxt = pos + len(out)
        if self.on_read is not None:
            self.on_read(sid, pos, len(out))
        behind = 0 if nxt >= len(shard.records) else int(1000 * max(0.0, shard.arrivals[-1] - shard.arrivals[nxt]))
        end = shard.closed and nxt >= len(shard.records)
        return {"Records": out, "NextShardIterator": None if end else f"{sid}|{nxt}|{self._clock()!r}",
                "MillisBehindLatest": behind}
