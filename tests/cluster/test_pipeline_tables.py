"""cluster/pipeline.py's table sinks: ``--sink iceberg:<namespace.table>`` with ``--iceberg-catalog``,
and ``--sink delta:<path>``, parsed and built without Ray or AWS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinesis_actors.sinks import DeltaSink, IcebergSink

from .test_manifests import import_pipeline

ENV = {"KA_STREAM": "orders", "KA_LEASE_TABLE": "orders-leases"}


def test_iceberg_and_delta_sinks_from_flags(tmp_path: Path) -> None:
    pipeline = import_pipeline()
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    cfg = pipeline.parse_args(["--sink", "iceberg:ka.events", "--iceberg-catalog", json.dumps(catalog),
                               "--commit-interval-s", "1"], ENV)
    sink = pipeline.make_sink(cfg)
    assert isinstance(sink, IcebergSink) and (sink.table, sink.catalog, sink.commit_interval_s) == (
        "ka.events", catalog, 1.0)
    delta = pipeline.make_sink(pipeline.parse_args([], {**ENV, "KA_SINK": f"delta:{tmp_path}/t"}))
    assert isinstance(delta, DeltaSink) and delta.table_uri == f"{tmp_path}/t" and delta.commit_interval_s == 10.0
    assert pipeline.records_written({"rows_committed": 7}) == 7 == pipeline.records_written({"records_written": 7})


def test_an_iceberg_sink_needs_its_catalog() -> None:
    with pytest.raises(SystemExit):
        import_pipeline().parse_args(["--sink", "iceberg:ka.events"], ENV)
