"""A recording stand-in for ``ray.util.metrics`` behind :mod:`kinesis_actors.metrics`, and
the ``metrics_sink`` fixture (registered in conftest.py) that installs one for a test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kinesis_actors import metrics


class RecordingSink:
    """What :mod:`kinesis_actors.metrics` exported, by name and tags (``metrics.set_sink`` takes it).

    Attributes:
        counters: the sum of every ``inc`` per (name, sorted tag items).
        gauges: the last ``set`` per (name, sorted tag items).
        calls: how many ``inc`` and ``set`` calls were made.
    """

    def __init__(self) -> None:
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.calls = 0

    def inc(self, name: str, value: float, tags: Any) -> None:
        self.calls += 1
        key = (name, tuple(sorted(tags.items())))
        self.counters[key] = self.counters.get(key, 0) + value

    def set(self, name: str, value: float, tags: Any) -> None:
        self.calls += 1
        self.gauges[(name, tuple(sorted(tags.items())))] = value

    def counter(self, name: str, **tags: str) -> float:
        """The counter ``name`` with exactly ``tags``; 0 if never incremented."""
        return self.counters.get((name, tuple(sorted(tags.items()))), 0)

    def gauge(self, name: str, **tags: str) -> float | None:
        """The last value of gauge ``name`` with exactly ``tags``; None if never set."""
        return self.gauges.get((name, tuple(sorted(tags.items()))))


@pytest.fixture
def metrics_sink() -> Iterator[RecordingSink]:
    """A :class:`RecordingSink` set as the metrics sink for one test."""
    recorder = RecordingSink()
    metrics.set_sink(recorder)
    yield recorder
    metrics.set_sink(None)
