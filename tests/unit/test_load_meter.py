"""Load figures (WindowRate, CpuMeter, LoadFigures) with injected clocks and CPU counters."""

from __future__ import annotations

from typing import Any

from kinesis_actors.load import CpuMeter, LoadFigures, WindowRate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_rate_is_unknown_before_a_full_window_then_averages_the_last_one() -> None:
    rate = WindowRate(10.0)
    for t in range(10):
        rate.add(float(t), 100.0 * t)
        assert rate.rate() is None
    rate.add(10.0, 1000.0)
    assert rate.rate() == 100.0
    for t in range(11, 31):
        rate.add(float(t), 1000.0 + 10.0 * (t - 10))  # the rate falls to 10/s
    assert rate.rate() == 10.0
    assert len(rate._samples) <= 12  # bounded by the samples of one window


def test_sparse_samples_average_over_the_span_and_a_reset_counter_restarts() -> None:
    rate = WindowRate(10.0)
    rate.add(0.0, 0.0)
    rate.add(25.0, 500.0)
    assert rate.rate() == 20.0
    rate.add(26.0, 3.0)  # the counter went down: a new consumer
    assert rate.rate() is None


def test_cpu_meter_reports_cores() -> None:
    clock, used = Clock(), [0.0]
    meter = CpuMeter(10.0, cpu_time=lambda: used[0], clock=clock)
    assert meter.sample() is None
    for _ in range(10):
        clock.now += 1.0
        used[0] += 0.75
        figure = meter.sample()
    assert figure == 0.75


def test_load_figures_annotate_the_reader_stats() -> None:
    clock, used = Clock(), [0.0]
    figures = LoadFigures(5.0, cpu_time=lambda: used[0], clock=clock)
    reader: dict[str, Any] = {}
    shards: dict[str, dict[str, Any]] = {"s0": {"bytes": 0, "records": 0}, "s1": {"bytes": 0, "records": 0}}
    figures.annotate(reader, shards)
    assert reader["cpu"] == 0.0 and shards["s0"]["bytes_per_s"] == 0.0 and not shards["s0"]["load_known"]
    for _ in range(5):
        clock.now += 1.0
        used[0] += 0.5
        shards["s0"]["bytes"] += 2000
        shards["s0"]["records"] += 20
        figures.annotate(reader, shards)
    assert reader["cpu"] == 0.5
    assert shards["s0"]["bytes_per_s"] == 2000.0 and shards["s0"]["records_per_s"] == 20.0
    assert shards["s1"]["bytes_per_s"] == 0.0 and shards["s1"]["load_known"]
    figures.annotate(reader, {"s1": shards["s1"]})
    assert list(figures._shards) == ["s1"]
