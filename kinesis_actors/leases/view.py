"""The lease table as people read it: the shard rows of a table, each checkpoint's lag,
and a printed table (``kinesis-actors leases``, the demo, notebooks).

Reads the table with plain consistent ``Scan`` pages: no lease store and no expiry
judgement. The expiry shown is ``lease_expiry``, the holder's wall clock plus its
duration at its last write; the library never decides anything from it (expiry is
judged on each store's own monotonic clock), so it is labelled as the holder's clock,
and a free lease shows as free.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Sequence
from typing import Any

from ..clock import wall_ms
from ..errors import LeaseStoreError, translate_aws_error
from .dynamodb import from_item
from .kcl_rows import view_row

__all__ = ["scan_lease_rows", "scan_kcl_rows", "add_lag", "print_lease_table"]

log = logging.getLogger(__name__)


def scan_lease_rows(dynamodb: Any, table: str, stream: str | None = None) -> list[dict[str, Any]]:
    """Every shard row of the lease table ``table`` (consistent ``Scan``), of ``stream`` only if given.

    Args:
        dynamodb: a boto3 DynamoDB client.
        table: the lease table name. stream: only this stream's rows, or None for all.

    Returns:
        Dicts sorted by (stream, shard id): ``stream``, ``shard_id``, ``owner`` (None when
        free), ``counter``, ``checkpoint``, ``expiry_ms`` (the holder's wall clock, epoch ms).

    Raises:
        LeaseStoreError: the table is missing or unreachable (the message names it).
    """
    rows: list[dict[str, Any]] = []
    for row in _scan_pages(dynamodb, table):
        key = str(row.get("lease_key", ""))
        if "#" in key or ":" not in key:
            continue  # presence rows and anything that is not a shard's lease
        row_stream, shard_id = key.split(":", 1)
        if stream is not None and row_stream != stream:
            continue
        rows.append({
            "stream": row_stream,
            "shard_id": shard_id,
            "owner": row.get("lease_owner"),
            "counter": int(row.get("lease_counter", 0)),
            "checkpoint": row.get("checkpoint"),
            "expiry_ms": int(row["lease_expiry"]) if row.get("lease_expiry") is not None else None,
        })  # fmt: skip
    rows.sort(key=lambda r: (r["stream"], r["shard_id"]))
    return rows


def scan_kcl_rows(dynamodb: Any, table: str, stream: str | None = None) -> list[dict[str, Any]]:
    """Every lease row of a KCL 2.x/3.x lease table (consistent ``Scan``), as :func:`scan_lease_rows` returns rows.

    Args:
        dynamodb: a boto3 DynamoDB client.
        table: the KCL application's lease table.
        stream: a multi-stream table: only this stream's rows; a single-stream table (which
            does not record its stream): the stream its rows belong to (shown, and used for
            the lag); None: every row, a single-stream table's with stream None.

    Returns:
        Dicts sorted by (stream, shard id), as :func:`scan_lease_rows`; ``owner`` is KCL's
        holder (``checkpointOwner`` during a KCL 3.x handoff), ``checkpoint`` shows a KPL
        sub-sequence as ``<seq>.<sub>``, ``expiry_ms`` is None (KCL rows record none).
        KCL 3.x worker-metrics and coordinator-state entities are skipped.

    Raises:
        LeaseStoreError: the table is missing or unreachable (the message names it).
    """
    rows: list[dict[str, Any]] = []
    for item in _scan_pages(dynamodb, table):
        row = view_row(item, stream)
        if row is None or (stream is not None and row["stream"] != stream):
            continue
        rows.append(row)
    rows.sort(key=lambda r: (r["stream"] or "", r["shard_id"]))
    return rows


def _scan_pages(dynamodb: Any, table: str) -> list[dict[str, Any]]:
    """Every item of ``table`` (a consistent ``Scan``, paged by botocore's paginator), as rows."""
    try:
        pages = dynamodb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
        return [from_item(item) for page in pages for item in page.get("Items", ())]
    except Exception as e:
        err = translate_aws_error(e, operation="Scan", resource=table)
        meta = getattr(dynamodb, "meta", None)
        where = "".join(f" {label} {value}" for label, value in (("in region", getattr(meta, "region_name", None)),
                                                                  ("at", getattr(meta, "endpoint_url", None))) if value)
        message = f"lease table {table!r} does not exist{where}" if err.aws_code == "ResourceNotFoundException" \
            else f"lease table {table!r}: {err}"
        raise LeaseStoreError(message, aws_code=err.aws_code) from e


def add_lag(kinesis: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Set ``row["lag_ms"]``: how far each checkpoint is behind its shard's tip, ms (two
    Kinesis calls a shard: meant for a view, not a hot path). None when it cannot be told."""
    from ..metrics import checkpoint_lag_ms

    for row in rows:
        try:
            row["lag_ms"] = checkpoint_lag_ms(kinesis, row["stream"], row["shard_id"], row["checkpoint"])
        except Exception as exc:  # a deleted stream or shard: show the row anyway
            log.debug("lag of %s/%s: %r", row["stream"], row["shard_id"], exc)
            row["lag_ms"] = None


def print_lease_table(console: Any, title: str, rows: Sequence[dict[str, Any]], *, expiry: bool,
                      streams: bool = False, records: dict[str, int] | None = None) -> None:
    """Print ``rows`` (from :func:`scan_lease_rows`) as a table on a ``rich`` console.

    Columns: [stream], shard, owner (``free`` when nobody holds it), counter (the lease
    counter: +1 on every take, renew and checkpoint), [records read, from ``records`` by
    shard id], checkpoint (a sequence number, not a count), [expiry on the holder's
    clock, with its distance from this host's clock], [lag]."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", expand=False)
    lag = any("lag_ms" in r for r in rows)
    columns = (["stream"] if streams else []) + ["shard", "owner", "lease counter"] + (
        ["records read"] if records is not None else []) + ["checkpoint (sequence number)"] + (
        ["expiry (holder's clock, UTC)"] if expiry else []) + (["lag (s)"] if lag else [])
    for name in columns:
        table.add_column(name, justify="right" if name in ("lease counter", "records read") else "left",
                         overflow="fold")
    now_ms = wall_ms()
    for r in rows:
        cells = [r["shard_id"], r["owner"] or "free", str(r["counter"])]
        if records is not None:
            cells.append(str(records.get(r["shard_id"], 0)))
        cells.append(r["checkpoint"] or "-")
        if streams:
            cells.insert(0, r["stream"])
        if expiry:
            if r.get("expiry_ms") and r["owner"]:
                at = _dt.datetime.fromtimestamp(r["expiry_ms"] / 1000, tz=_dt.timezone.utc)
                delta = (r["expiry_ms"] - now_ms) / 1000
                cells.append(f"{at:%H:%M:%S} ({delta:+.1f} s)")
            else:
                cells.append("-")  # free: nothing expires
        if lag:
            cells.append("-" if r.get("lag_ms") is None else f"{r['lag_ms'] / 1000:.1f}")
        table.add_row(*cells)
    console.print(table)
