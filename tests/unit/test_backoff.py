"""The one backoff policy: full jitter within [floor, min(cap, base * 2 ** (n - 1))]."""

import pytest

from kinesis_actors.backoff import THROTTLE_BACKOFF, Backoff
from kinesis_actors.errors import InvalidError


def test_ceiling_doubles_then_caps() -> None:
    policy = Backoff(base_s=0.1, cap_s=1.0)
    assert [policy.ceiling_s(n) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.ceiling_s(0) == 0.1
    assert policy.ceiling_s(10_000) == 1.0  # no overflow for long outages


def test_delay_spans_floor_to_ceiling() -> None:
    policy = Backoff(base_s=0.4, cap_s=5.0, floor_s=0.2)
    assert policy.delay_s(3, rng=lambda: 0.0) == 0.2
    assert policy.delay_s(3, rng=lambda: 1.0) == pytest.approx(1.6)
    assert THROTTLE_BACKOFF.delay_s(1, rng=lambda: 0.0) >= 0.2


@pytest.mark.parametrize("kwargs", [{"base_s": 0}, {"base_s": 2.0, "cap_s": 1.0}, {"floor_s": 1.0}, {"floor_s": -1}])
def test_bad_policy_is_invalid(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidError):
        Backoff(**kwargs)
