"""The table side of the chaos scenarios with a table sink (test_table_chaos.py): what an
Iceberg or Delta table holds, read back from the table itself, against what the publisher put.

* :func:`table_verdict`: the table's rows (``data`` = the event number, ``shard_id``,
  ``sequence_number``) through the one checker (checker.py), in each shard's sequence order
  (a table has no delivery order): ``duplicated`` counts rows of an event beyond its first,
  ``lost`` events published and not in the table.
* :func:`counter_regressions`: a commit that carries a lower lease counter for a shard than an
  older commit did: a fenced owner's late commit that landed (must be none).
* :func:`checkpoints_ahead`: a lease-table checkpoint sampled at time ``t`` that no commit
  made by ``t`` had reached (a crash then would skip records; must be none).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.unit.table_fixtures import iceberg_catalog, scan

from .checker import Delivered, Published, Verdict, check

TABLE = "chaos.events"
KINDS = ("iceberg", "delta")


def iceberg_sink(tmp: Path, commit_interval_s: float) -> Any:
    """An IcebergSink on pyiceberg's SQL catalog (SQLite file under ``tmp``, local warehouse)."""
    from kinesis_actors.sinks import IcebergSink

    return IcebergSink(TABLE, catalog=iceberg_catalog(tmp), commit_interval_s=commit_interval_s)


def table_sink(kind: str, tmp: Path, commit_interval_s: float) -> Any:
    """An IcebergSink (:func:`iceberg_sink`) or a DeltaSink on the local filesystem (the table in
    ``tmp/delta-events``): every process given the same ``kind`` and ``tmp`` writes one table."""
    if kind == "iceberg":
        return iceberg_sink(tmp, commit_interval_s)
    from kinesis_actors.sinks import DeltaSink

    return DeltaSink(str(tmp / "delta-events"), commit_interval_s=commit_interval_s)


def table_numbers(backend: Any) -> set[int]:
    """The event numbers the table holds now (empty: no table yet)."""
    rows = scan(backend)
    return set() if rows is None else {int(b) for b in rows.column("data").to_pylist()}


def table_verdict(scenario: str, published: Iterable[Published], backend: Any) -> Verdict:
    """The checker's verdict on the table's rows (see the module docstring)."""
    rows = scan(backend)
    found: list[tuple[str, int, int, str]] = []
    if rows is not None:
        for data, shard, seq in zip(rows.column("data").to_pylist(), rows.column("shard_id").to_pylist(),
                                    rows.column("sequence_number").to_pylist()):
            found.append((shard, int(seq), int(data), seq))
    found.sort()
    delivered = [Delivered(n, shard, seq, float(i), "table") for i, (shard, _, n, seq) in enumerate(found)]
    verdict = check(scenario, published, delivered)
    verdict.figures["table_rows"] = len(found)
    verdict.figures["table_distinct"] = verdict.distinct_delivered
    return verdict


def commits_oldest_first(backend: Any) -> list[tuple[float, dict[str, tuple[int, int | None]]]]:
    """Every commit of the table, oldest first: ``(epoch s of its Iceberg snapshot or Delta
    commit, {shard id: (lease counter, sequence number or None)})`` (commits without positions
    skipped)."""
    from kinesis_actors.sinks.tables.positions import decode_positions

    state = backend.load()
    out = []
    for record in backend.commits(state):
        positions = decode_positions(record.properties)
        if positions:
            t = (state.snapshot_by_id(record.token).timestamp_ms if hasattr(state, "snapshot_by_id")
                 else record.properties["timestamp"]) / 1000.0
            out.append((t, {k.shard_id: (p.lease_counter, None if p.sequence_number is None
                                         else int(p.sequence_number)) for k, p in positions.items()}))
    return list(reversed(out))


def counter_regressions(commits: list[tuple[float, dict[str, tuple[int, int | None]]]]) -> list[dict[str, Any]]:
    """Each commit (oldest first) that holds a lower lease counter for a shard than an older one."""
    top: dict[str, int] = {}
    out = []
    for t, positions in commits:
        for shard, (counter, _) in positions.items():
            if counter < top.get(shard, -1):
                out.append({"shard_id": shard, "t": t, "counter": counter, "after": top[shard]})
            top[shard] = max(top.get(shard, -1), counter)
    return out


def checkpoints_ahead(samples: Iterable[tuple[float, dict[str, Any]]],
                      commits: list[tuple[float, dict[str, tuple[int, int | None]]]]) -> list[dict[str, Any]]:
    """Each sampled lease-table checkpoint (``(epoch s, {shard id: checkpoint})``, as
    ``LeaseSampler.checkpoints()``) beyond every position its shard had in a commit made
    before the sample (snapshot times and samples come from this machine's one clock)."""
    out = []
    for t, rows in samples:
        for shard, cp in rows.items():
            if not cp or not cp.isdigit():
                continue
            reached = max((seq for ct, pos in commits if ct <= t for s, (_, seq) in pos.items()
                           if s == shard and seq is not None), default=-1)
            if int(cp) > reached:
                out.append({"shard_id": shard, "t": t, "checkpoint": cp, "table": reached})
    return out


def read_stats(path: str) -> dict[str, Any]:
    """The table sink's last counters an instance wrote at its close ({} if it wrote none)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data
