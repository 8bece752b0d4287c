"""The invariants every simulated history must keep (SPEC's 1-10 as far as a history shows them,
and issue 38's additions), checked by replaying the history in order.

- ``lost``: every published record is handled (acknowledged by the sink, dead-lettered, or
  rejected by the record filter) by the end of the quiet tail (SPEC 1).
- ``checkpoint_past_unacked``: no checkpoint write passes a record not yet handled, and
  ``SHARD_END`` is written only once every record of the shard is (SPEC 2).
- ``fenced_write``: a holder's write (renewal, checkpoint, release) is made by the row's owner
  of the moment, and by the one reader process holding it since the last take: a reader that
  lost its lease writes nothing more (SPEC 3).
- ``graceful_redelivery``: a reader that releases or hands over its lease has checkpointed every
  record it acknowledged before (the next record after the checkpoint is not one it
  acknowledged): a graceful handoff or close redelivers nothing (SPEC 10). Not checked under
  ``parallelization_factor`` > 1, whose checkpoint moves by whole rounds of lanes.
- ``steal_live``: a lease changes owner only when it was free, handed to that owner, or silent
  (counter unchanged) for a whole lease duration: one owner at a time, by counter.
- ``child_before_parent``: a child shard's records go to the sink only once all of its
  parents' records are handled (SPEC 4).
- ``checkpoint_backwards``: the stored checkpoint never moves backwards but by a seek, which
  removes it (and rewrites ``start_position``) first (SPEC 5).
- ``not_read``: every readable shard is read again, or has a batch delivered again, within
  ``lease + poll + renew + slack`` seconds of the faults stopping (SPEC 6 and 7). A reader
  retrying a batch the sink refused reads nothing new until it is acknowledged (one batch a
  shard), and waits up to the sink backoff's 10 s cap between attempts: that shard is owned
  and worked on, which is what this checks; whether its records get through is ``lost``'s.
- ``fatal``: no simulated fault but a sink refusing records past their retries fails a
  subscription (a table or Kinesis fault is retried, or costs a lease).
- ``unbounded_batches``: one reader has at most ``parallelization_factor`` batches of one shard
  at the sink at once (SPEC 8).
- ``key_order``: a record goes to the sink only after every earlier record of its shard and
  partition key was handled, or ahead of it in the same batch (per-key order, also under
  ``parallelization_factor``).
- ``start_at=LATEST``: only the records published before the shard's first ``LATEST``
  iterator are exempt from the rest; a replacement that re-resolved ``LATEST`` would skip
  later ones and break ``lost`` (SPEC 9). When the first owner recorded its ``LATEST`` start
  (as ``AT_TIMESTAMP``, 5 s early) and lost the lease before it read, the first iterator is
  the next owner's ``AT_TIMESTAMP`` one: the records before it are the exempt ones.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from kinesis_actors.leases.protocol import SHARD_END

__all__ = ["Violation", "check"]

LIVENESS_SLACK_S = 3.0
"""Slack over ``lease + poll + renew`` for a shard's first read after the faults stop (a reader
process starting, the first iterator), seconds."""


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken invariant: its name, the virtual time (from the run's start) and what broke."""

    name: str
    at: float
    what: str


class _Replay:
    """The state of a history replayed up to one event."""

    def __init__(self, world: Any) -> None:
        self.world, self.cfg = world, world.cfg
        self.handled: dict[str, set[int]] = defaultdict(set)
        self.published: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self.exempt: set[int] = set()
        self.checkpoint: dict[str, int] = {}
        self.counter_at: dict[str, float] = {}
        self.inflight: dict[tuple[str, str], int] = defaultdict(int)
        self.last_read: dict[str, float] = {}
        self.found: list[Violation] = []
        self.first: dict[Any, int] = {}  # shard or (shard, key) -> index of its first record maybe unhandled
        self.by_key: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
        self.acked_by: dict[tuple[str, str], set[int]] = defaultdict(set)  # (process, shard) -> seqs it acked
        self.holder: dict[str, str] = {}  # shard -> the reader process holding it since the last take
        self.taker: dict[str, str] = {}  # shard -> the incarnation that last took it
        self.start: dict[str, Any] = {}  # shard -> its start_position as last written
        self._exemptions()

    def _exemptions(self) -> None:
        """Records never to be delivered: filtered (key ``k0``), or before a LATEST start position
        (the shard's first iterator, LATEST or the AT_TIMESTAMP its recorded start resolves to)."""
        w = self.world
        filtered = w.cfg.controls.get("record_filter") is not None
        skipped: dict[str, int] = {}  # shard -> records before its first LATEST iterator (never to be read)
        for _, kind, f in w.history.events:
            if kind == "iterator" and f["shard"] not in skipped:
                skipped[f["shard"]] = f["pos"] if f["type"] in ("LATEST", "AT_TIMESTAMP") else 0
        for sid, shard in w.kinesis.shards.items():
            for i, r in enumerate(shard.records):
                seq = int(r["SequenceNumber"])
                if (filtered and r["PartitionKey"] == "k0") or i < skipped.get(sid, 0):
                    self.exempt.add(seq)
                self.published[sid].append((seq, r["PartitionKey"]))
                self.by_key[(sid, r["PartitionKey"])].append((seq, r["PartitionKey"]))

    def bad(self, name: str, t: float, what: str) -> None:
        self.found.append(Violation(name, t - self.world.history.t0, what))

    def unhandled(self, shard: str, upto: int | None) -> list[int]:
        """The first few published, not exempt, not handled seqs of ``shard`` up to ``upto`` (None: all)."""
        return self._pending(shard, self.published[shard], upto)

    def _pending(self, name: Any, seqs: list[tuple[int, str]], upto: int | None, skip: set[int] = frozenset()) -> list[int]:
        shard = name[0] if isinstance(name, tuple) else name
        done, i = self.handled[shard], self.first.get(name, 0)
        while i < len(seqs) and (seqs[i][0] in done or seqs[i][0] in self.exempt):
            i += 1
        self.first[name] = i  # handled only grows: what is behind the pointer stays handled
        out = []
        for seq, _ in seqs[i:]:
            if upto is not None and seq > upto:
                break
            if seq not in done and seq not in self.exempt and seq not in skip:
                out.append(seq)
                if len(out) >= 5:
                    break
        return out


def _deliver(r: _Replay, t: float, f: dict[str, Any]) -> None:
    shard, seqs, keys = f["shard"], f["seqs"], f["keys"]
    r.inflight[(f["who"], shard)] += 1
    pf = r.cfg.controls.get("parallelization_factor", 1)
    if r.inflight[(f["who"], shard)] > pf:
        r.bad("unbounded_batches", t, f"{f['who']} has {r.inflight[(f['who'], shard)]} batches of {shard} out")
    for parent in r.world.kinesis.shards[shard].parents:
        left = r.unhandled(parent, None)
        if left:
            r.bad("child_before_parent", t, f"{shard} delivered while parent {parent} has {left[:5]} unhandled")
    in_batch = set(seqs)
    for seq, key in zip(seqs, keys):
        missing = r._pending((shard, key), r.by_key[(shard, key)], seq - 1, in_batch)
        if missing:
            r.bad("key_order", t, f"{shard} key {key}: {seq} delivered before {missing} were handled")
            return


def _write(r: _Replay, t: float, f: dict[str, Any]) -> None:
    shard, writer = f["shard"], str(f["who"]).split("/")[0].split(".")[0]
    holder_write = f["owner"] == f["was_owner"] and f["next"] == f["was_next"]
    if (holder_write or f["owner"] is None) and f["was_owner"] is not None and writer != f["was_owner"]:
        r.bad("fenced_write", t, f"{f['who']} wrote {shard} held by {f['was_owner']} (counter {f['counter']})")
    given = writer == f["was_owner"]  # the holder's own hand-over (to a requester, maybe one that withdrew since)
    if f["owner"] not in (None, f["was_owner"]) and f["was_owner"] is not None and f["was_next"] != f["owner"] \
            and not given:
        silent = t - r.counter_at.get(shard, float("-inf"))
        if silent < r.cfg.lease_s - 1e-6:
            r.bad("steal_live", t, f"{f['owner']} took {shard} from {f['was_owner']} {silent:.3f} s after its "
                                   f"last write (lease {r.cfg.lease_s} s)")
    if f["counter"] != f["was_counter"]:
        r.counter_at[shard] = t
    _graceful(r, t, f)  # before _holder: a hand-over ends the tenure whose acknowledgements it judges
    _holder(r, t, f)
    _checkpoint(r, t, f)


def _holder(r: _Replay, t: float, f: dict[str, Any]) -> None:
    """One reader process writes a lease between two takes: a stale reader of the same owner id
    (another incarnation, or another reader of this one) writes nothing more either."""
    shard, who = f["shard"], str(f["who"])
    incarnation, _, proc = who.partition("/")
    mine = incarnation.split(".")[0] == f["owner"]
    if f["owner"] != f["was_owner"] or f["was_owner"] is None or (proc == "coord" and mine):
        r.taker[shard] = incarnation if mine else None  # a hand-over: the receiver's incarnation writes next
        r.holder[shard] = ""
        for key in [k for k in r.acked_by if k[1] == shard]:
            r.acked_by[key].clear()  # acknowledged in an earlier tenure: a failure's to redeliver, not a release's
        return
    if not proc.startswith("r"):
        return  # handoff requests of other instances
    if r.taker.get(shard) is None:
        r.taker[shard] = incarnation
    if r.taker[shard] != incarnation or r.holder.get(shard) not in (None, "", who):
        r.bad("fenced_write", t, f"{who} wrote {shard}, held by {r.holder.get(shard) or r.taker.get(shard)} "
                                 f"since its last take (counter {f['counter']})")
    r.holder[shard] = who


def _graceful(r: _Replay, t: float, f: dict[str, Any]) -> None:
    """A reader that lets its lease go (release, hand-over) has checkpointed what it acknowledged (SPEC 10)."""
    shard, who, cp = f["shard"], str(f["who"]), f["checkpoint"]
    letting_go = f["was_owner"] is not None and (f["owner"] is None or f["owner"] == f["was_next"])
    if not letting_go or "/r" not in who or cp == SHARD_END or r.cfg.controls.get("parallelization_factor", 1) > 1:
        return  # lanes checkpoint by whole rounds: a round cut short at the stop is delivered again whole
    if getattr(r.world, "table", None) is not None:
        return  # a table sink acknowledges by staging: rows a handoff drops uncommitted are read again, and
        # land in the table once (tablecheck.py)
    after = int(cp) if cp is not None and str(cp).isdigit() else -1
    nxt = next((s for s, _ in r.published[shard] if s > after and s not in r.exempt), None)
    if nxt is not None and nxt in r.acked_by[(who, shard)]:
        r.bad("graceful_redelivery", t, f"{who} let {shard} go at checkpoint {cp} having acknowledged {nxt}: "
                                        "the next owner delivers it again")


def _checkpoint(r: _Replay, t: float, f: dict[str, Any]) -> None:
    shard, cp = f["shard"], f["checkpoint"]
    moved = f.get("start") is not None and r.start.get(shard, f.get("start")) != f.get("start")
    r.start[shard] = f.get("start")
    if (cp is None and f["was_checkpoint"] is not None) or moved:  # a seek: checkpoint removed, start_position moved
        r.checkpoint.pop(shard, None)
        for who, sid in list(r.acked_by):
            if sid == shard:
                r.acked_by[(who, sid)].clear()  # what was acknowledged before a seek is delivered again
    if cp == f["was_checkpoint"] or cp is None:
        return
    if cp == SHARD_END:
        left = r.unhandled(shard, None)
        if left:
            r.bad("checkpoint_past_unacked", t, f"SHARD_END of {shard} written with {left[:5]} unhandled")
        return
    if not str(cp).isdigit():
        return
    seq = int(cp)
    left = r.unhandled(shard, seq)
    if left:
        r.bad("checkpoint_past_unacked", t, f"{shard} checkpointed at {seq} by {f['who']} with {left[:5]} unhandled")
    old = r.checkpoint.get(shard)
    if old is not None and seq < old:
        r.bad("checkpoint_backwards", t, f"{shard} checkpoint {old} -> {seq} by {f['who']} without a seek")
    r.checkpoint[shard] = seq


def _event(r: _Replay, t: float, kind: str, f: dict[str, Any]) -> None:
    if kind == "deliver":
        _deliver(r, t, f)
    elif kind in ("ack", "nack"):
        r.inflight[(f["who"], f["shard"])] -= 1
        if kind == "ack":
            r.handled[f["shard"]].update(f["seqs"])
            r.acked_by[(f["who"], f["shard"])].update(f["seqs"])
    elif kind == "fatal" and f["error"] != "SinkError":
        r.bad("fatal", t, f"{f['owner']}'s subscription failed on {f['error']}: {f['what']}")
    elif kind == "dead":
        r.handled[f["shard"]].update(f["seqs"])
    elif kind == "write":
        _write(r, t, f)
    elif kind == "read":
        r.last_read[f["shard"]] = t


def _liveness(r: _Replay, events: list[Any]) -> None:
    """Every shard readable when the faults stop is read or delivered (or ends) within the bound after they stop."""
    w, cfg = r.world, r.cfg
    bound = cfg.lease_s + cfg.poll_s + cfg.renew_s + LIVENESS_SLACK_S
    quiet = next((t for t, kind, _ in events if kind == "quiet"), w.fault_end)
    # an instance started as the faults stop (a crashed one back) must first see a lease silent for
    # a whole lease duration, as any taker: the window starts once the last of them started
    quiet = max([quiet] + [t for t, kind, _ in events if kind == "start" and t <= quiet + cfg.lease_s])
    ended_at: dict[str, float] = {}
    first_read: dict[str, float] = {}
    for t, kind, f in events:
        if kind == "write" and f["checkpoint"] == SHARD_END:
            ended_at.setdefault(f["shard"], t)
        elif kind in ("read", "deliver") and t >= quiet:
            first_read.setdefault(f["shard"], t)
    for sid, shard in w.kinesis.shards.items():
        if not all(ended_at.get(p, float("inf")) <= quiet for p in shard.parents):
            continue  # readable only once its parents end: ``lost`` covers it
        seen = min(first_read.get(sid, float("inf")), ended_at.get(sid, float("inf")))
        if ended_at.get(sid, float("inf")) > quiet and seen > quiet + bound:
            r.bad("not_read", quiet + bound, f"{sid} not read within {bound:.1f} s after the faults stopped")


def check(world: Any) -> list[Violation]:
    """Every violation in ``world``'s history (empty: the history keeps every invariant)."""
    r = _Replay(world)
    events = world.history.events
    for t, kind, f in events:
        _event(r, t, kind, f)
        if r.found:
            return r.found
    _liveness(r, events)
    for sid in sorted(world.kinesis.shards):
        left = r.unhandled(sid, None)
        if left:
            r.bad("lost", world.now(), f"{sid}: {len(left)} records never handled, first {left[:5]}")
    return r.found
