"""One commit round of a table committer, as blocking calls on a :class:`~.backend.TableBackend`.

A round carries the staged rows of every shard its committer holds, and the position of every
one of those shards (the last staged record, or the last position carried forward). Each
attempt of a round:

1. loads the table (creating it from the rows' schema when it is missing and may be created);
2. reads the positions of the commits that landed since the last attempt (an incremental walk
   of the history; the first walk reads all of it), and looks there for an earlier attempt of
   this round whose outcome was unknown: found, that attempt is the round's result;
3. decides per shard, from the newest commit that mentions it:

   * a lease counter ABOVE ours: a newer owner fenced the shard; its rows are dropped
     (``stale``), and its reader learns that its lease is lost;
   * a counter below ours while the shard is not fenced yet (the table was missing when it
     opened), with a position other than the one it opened at: a previous owner committed
     meanwhile, so where the new owner started reading is not known to be safe; dropped (``moved``);
   * otherwise the shard is in the commit;

4. commits its rows and positions on top of the state it read. The table's optimistic check
   refuses the commit if anything landed since (:class:`~.backend.CommitConflict`): the next
   attempt starts again at step 1, so a fence that landed meanwhile is seen before any retry.

:func:`land` makes the attempts of one round until it lands, with the same rows each time.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ... import mutation
from ...backoff import Backoff
from ...errors import SinkError
from ..hooks import Point
from .backend import CommitConflict, TableBackend
from .positions import COMMIT_ID_KEY, ShardKey, TablePosition, decode_positions, encode_positions

__all__ = ["RoundShard", "RoundResult", "RoundRunner", "concat_rows", "land", "COMMIT_BACKOFF"]

log = logging.getLogger("kinesis_actors.sinks.tables")

COMMIT_BACKOFF = Backoff(base_s=0.2, cap_s=5.0, floor_s=0.05)
"""Waits between attempts of a commit the table or catalog failed (not a conflict), seconds."""

_NO_FENCE = mutation.register("table_commit_without_fence",
                              "a commit keeps the rows of a shard fenced by a newer owner's lease counter")


@dataclasses.dataclass
class RoundShard:
    """One held shard in a round.

    Attributes:
        counter: the lease counter its owner opened it with.
        fenced: True once a commit recorded this counter (the table fences older owners).
        base: where the table stood when the shard opened (unfenced shards only), or None.
        carry: its last committed position (carried forward in a commit without its rows), or None.
        rows: its staged rows (``pyarrow.Table`` each), in order.
        last: the position of its last staged record, or None (nothing staged).
        opening: True in the round that fences a newly opened shard (where the table stands
            then is where its owner starts: no earlier position to compare with).
    """

    counter: int
    fenced: bool
    base: Point | None
    carry: TablePosition | None
    rows: list[Any] = dataclasses.field(default_factory=list)
    last: Point | None = None
    opening: bool = False


@dataclasses.dataclass
class RoundResult:
    """What a round did.

    Attributes:
        committed: the position each shard now has in the table (committed by this round).
        seen: where the table stood for each shard before this round's commit (None: no mention).
        dropped: shards whose rows were refused, with why (``"stale"``, ``"moved"``).
        rows: rows committed. missing: the table does not exist (nothing committed).
        token: the commit's token in the table (None: no commit was made).
    """

    committed: dict[ShardKey, TablePosition] = dataclasses.field(default_factory=dict)
    seen: dict[ShardKey, TablePosition | None] = dataclasses.field(default_factory=dict)
    dropped: dict[ShardKey, str] = dataclasses.field(default_factory=dict)
    rows: int = 0
    missing: bool = False
    token: Any = None


def concat_rows(tables: list[Any]) -> Any:
    """The staged tables as one ``pyarrow.Table`` (schemas unified as pyarrow promotes them)."""
    import pyarrow as pa

    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="default")


class RoundRunner:
    """Runs the attempts of commit rounds against one backend (blocking; one attempt at a time).

    Keeps what it learnt of the table between attempts: the newest position of every shard its
    walks met, and up to which commit it walked. Not thread-safe: one caller at a time.

    Args:
        backend: the table.
        create_if_missing: create a missing table from the first round with rows.
    """

    def __init__(self, backend: TableBackend, *, create_if_missing: bool) -> None:
        self.backend = backend
        self.create_if_missing = create_if_missing
        self.known: dict[ShardKey, TablePosition] = {}
        self._walked_to: Any = None  # the head token of the last walk
        self._walked = False
        self._unknown: dict[str, RoundResult] = {}  # commit id -> result, for attempts whose outcome is unknown

    def _walk(self, state: Any) -> set[str]:
        """Read the commits since the last walk; returns the commit ids met."""
        head = self.backend.head(state)
        if self._walked and head == self._walked_to:
            return set()
        found: dict[ShardKey, TablePosition] = {}
        ids: set[str] = set()
        for record in self.backend.commits(state, self._walked_to if self._walked else None):
            cid = record.properties.get(COMMIT_ID_KEY)
            if isinstance(cid, str):
                ids.add(cid)
            for key, position in decode_positions(record.properties).items():
                found.setdefault(key, position)
        self.known.update(found)
        self._walked_to, self._walked = head, True
        return ids

    def attempt(self, shards: Mapping[ShardKey, RoundShard]) -> RoundResult:
        """One attempt of a round (see the module docstring).

        Raises:
            CommitConflict: the table moved under the commit (nothing of it is visible).
            SinkError: the table is missing and may not be created (not retriable).
            Exception: the table or catalog failed; the outcome of the commit is unknown.
        """
        state = self.backend.load()
        if state is None:
            tables = [t for s in shards.values() for t in s.rows]
            if not tables:
                return RoundResult(missing=True)
            if not self.create_if_missing:
                raise SinkError(f"table {self.backend.name} does not exist (create_if_missing=False)")
            self.backend.create(concat_rows(tables).schema)
            state = self.backend.load()
            if state is None:
                raise SinkError(f"table {self.backend.name} still missing after creating it", retriable=True)
        ids = self._walk(state)
        landed = [cid for cid in self._unknown if cid in ids]
        if landed:
            result = self._unknown[landed[0]]
            self._unknown.clear()
            log.info("table %s: a commit whose outcome was unknown had landed (%s)", self.backend.name, landed[0])
            return result
        result = self._decide(shards)
        if not result.committed:
            return result
        tables = [t for key in result.committed for t in shards[key].rows]
        rows = concat_rows(tables) if tables else None
        result.rows = 0 if rows is None else rows.num_rows
        commit_id = uuid.uuid4().hex
        self._unknown[commit_id] = result
        try:
            self.backend.commit(state, rows, encode_positions(result.committed, commit_id),
                                {k: p.lease_counter for k, p in result.committed.items()})
        except CommitConflict:
            del self._unknown[commit_id]  # refused: it never lands
            raise
        self._unknown.clear()
        self.known.update(result.committed)
        return result

    def _decide(self, shards: Mapping[ShardKey, RoundShard]) -> RoundResult:
        result = RoundResult()
        for key, shard in shards.items():
            seen = self.known.get(key)
            result.seen[key] = seen
            if seen is not None and seen.lease_counter > shard.counter and _NO_FENCE not in mutation.ACTIVE:
                result.dropped[key] = "stale"
                continue
            if (seen is not None and seen.lease_counter < shard.counter and not shard.fenced
                    and not shard.opening and seen.point != shard.base):
                result.dropped[key] = "moved"
                continue
            if shard.last is not None:
                result.committed[key] = TablePosition(shard.counter, *shard.last)
            elif shard.carry is not None:
                result.committed[key] = shard.carry.with_counter(shard.counter)
            elif seen is not None:
                result.committed[key] = seen.with_counter(shard.counter)
            else:
                result.committed[key] = TablePosition(shard.counter)
        return result

    @staticmethod
    def describe(result: RoundResult) -> str:
        """One line for the log."""
        drops = ", ".join(f"{k} ({why})" for k, why in sorted(result.dropped.items()))
        return f"{result.rows} rows, {len(result.committed)} shard positions" + (f"; refused: {drops}" if drops else "")


async def land(runner: RoundRunner, shards: Mapping[ShardKey, RoundShard], *,
               blocking: Callable[..., Awaitable[Any]], sleep: Callable[[float], Any],
               rng: Callable[[], float] = random.random, counters: dict[str, Any] | None = None) -> RoundResult:
    """Attempt the round ``shards`` until it lands (or is refused shard by shard), same rows each time.

    A conflict is retried after 20-120 ms (the next attempt re-reads the table, so it is cheap
    and a fence that landed meanwhile is seen); any other failure after :data:`COMMIT_BACKOFF`'s
    wait for the attempt's number. ``blocking(fn, *args)`` runs one attempt off the event loop;
    ``counters`` (``conflicts``, ``commit_failures``, ``last_error``) are updated in place. No
    attempt limit: the committer's waiters have their own deadlines, and cancelling this (its
    ``close``) is the other way out. Not :class:`~kinesis_actors.backoff.Retry`: a conflict is
    not a failure here (no backoff, not counted as one).

    Raises:
        SinkError: a non-retriable one from an attempt (the table is missing and may not be
            created); the round's rows are not committed.
    """
    counters = counters if counters is not None else {"conflicts": 0, "commit_failures": 0, "last_error": None}
    name = runner.backend.name
    attempt = 0
    while True:
        try:
            result: RoundResult = await blocking(runner.attempt, shards)
            return result
        except CommitConflict as e:
            counters["conflicts"] += 1
            log.debug("table %s: commit conflict (%s); re-reading the positions", name, e)
            await sleep(0.02 + 0.1 * rng())
        except Exception as e:
            if isinstance(e, SinkError) and not e.retriable:
                raise
            attempt += 1
            counters["commit_failures"] += 1
            counters["last_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log.warning("table %s: commit failed (%r); retry %d", name, e, attempt)
            await sleep(COMMIT_BACKOFF.delay_s(attempt, rng=rng))
