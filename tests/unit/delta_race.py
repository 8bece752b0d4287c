"""One process of the Delta commit race in test_table_commit.py (spawned: delta-rs's tokio
runtime does not survive a fork; this module imports little, so the spawn is quick)."""

from __future__ import annotations

from typing import Any


def commit_rounds(uri: str, who: int, rounds: int, barrier: Any, results: Any) -> None:
    """Each round: read the Delta table at ``uri``, meet the other process at ``barrier``, then
    commit one row under shard ``shardId-000000000000``'s application transaction with lease
    counter ``2 * round + who`` on top of what was read; put ``(round, "landed" | "refused")``."""
    import pyarrow as pa

    from kinesis_actors.sinks.tables.backend import CommitConflict
    from kinesis_actors.sinks.tables.delta import DeltaBackend
    from kinesis_actors.sinks.tables.positions import ShardKey

    backend, key = DeltaBackend(uri), ShardKey("orders", "shardId-000000000000")
    for r in range(rounds):
        state = backend.load()
        barrier.wait(timeout=60)
        try:
            backend.commit(state, pa.table({"data": [f"{who}-{r}"]}), {"round": str(r)}, {key: 2 * r + who})
            results.put((r, "landed"))
        except CommitConflict:
            results.put((r, "refused"))
