"""The scaling-with-load keywords of KinesisStream: defaults and validation."""

from __future__ import annotations

import math

import pytest

from kinesis_actors import InvalidError, KinesisStream


def test_defaults() -> None:
    cfg = KinesisStream("s")
    assert cfg.reader_target_cpu == 0.6 and cfg.max_readers is None and cfg.load_window_s == 10.0
    assert cfg.balance_by == "load" and cfg.balance_threshold == 0.1


def test_good_values_are_kept() -> None:
    cfg = KinesisStream("s", reader_target_cpu=None, max_readers=8, load_window_s=2, balance_by="count",
                        balance_threshold=0.25)
    assert cfg.reader_target_cpu is None and cfg.max_readers == 8 and cfg.load_window_s == 2
    assert KinesisStream("s", reader_target_cpu=1.5).reader_target_cpu == 1.5


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("reader_target_cpu", 0), ("reader_target_cpu", -0.5), ("reader_target_cpu", math.nan),
        ("reader_target_cpu", True), ("reader_target_cpu", "0.6"),
        ("max_readers", 0), ("max_readers", 2.5), ("max_readers", True),
        ("load_window_s", 0), ("load_window_s", math.inf), ("load_window_s", None),
        ("balance_by", "cpu"), ("balance_by", None),
        ("balance_threshold", 0), ("balance_threshold", 1), ("balance_threshold", math.nan),
        ("balance_threshold", False),
    ],
)
def test_bad_values_are_refused_with_the_value_named(field: str, bad: object) -> None:
    with pytest.raises(InvalidError, match=field) as info:
        KinesisStream("s", **{field: bad})
    assert repr(bad) in str(info.value)
