"""Sinks: where readers deliver batches (see :mod:`kinesis_actors.sinks.protocol`).

* :class:`Sink`, :class:`ActorSink`, :func:`as_sink`: the protocol and a Ray actor as a sink.
* :class:`GatheringSink`: a sink that writes batches in groups, and what a subscription's close asks of it.
* :mod:`~kinesis_actors.sinks.pull`: pull mode's queue actor.
* :class:`DatasetSink` (:mod:`~kinesis_actors.sinks.dataset`): windows handed to a function as a
  ``ray.data.Dataset``; imported on first use (it needs Ray Data).
* :class:`IcebergSink`, :class:`DeltaSink` (:mod:`~kinesis_actors.sinks.tables`): effectively-once
  output to tables (the ``tables`` extra: pyiceberg, deltalake).
"""

from __future__ import annotations

import sys
from typing import Any

from .protocol import ActorSink, GatheringSink, Sink, as_sink

__all__ = ["Sink", "GatheringSink", "ActorSink", "as_sink", "DatasetSink", "IcebergSink", "DeltaSink"]


def loaded_table_sink(sink: object) -> Any:
    """``sink`` if it is an IcebergSink or DeltaSink, else None (the library's own helper, for
    ``subscribe`` and ``seek``: not in ``__all__``). Never imports :mod:`~kinesis_actors.sinks.tables`
    (a table sink exists only once it was imported)."""
    tables = sys.modules.get(f"{__name__}.tables")
    return sink if tables is not None and tables.is_table_sink(sink) else None


def __getattr__(name: str) -> object:
    if name == "DatasetSink":
        from .dataset import DatasetSink

        return DatasetSink
    if name in ("IcebergSink", "DeltaSink"):
        from . import tables

        return getattr(tables, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
