"""The one backoff policy: full jitter within [floor, min(cap, base * 2 ** (n - 1))]."""

import asyncio
from typing import Any

import pytest

from kinesis_actors.backoff import THROTTLE_BACKOFF, Backoff, Retry
from kinesis_actors.errors import InvalidError
from kinesis_actors.testing import FakeClock


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


class Flaky:
    """Fails ``failures`` times with ``error``, then returns "ok"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_retry_paces_each_failure_by_the_backoff_until_success() -> None:
    clock, seen = FakeClock(), []
    retry = Retry(Backoff(base_s=0.1, cap_s=1.0), max_attempts=5, clock=clock, rng=lambda: 1.0)
    fn = Flaky(3, ValueError("transient"))
    out = retry.call(fn, retry_on=lambda e: True, on_retry=lambda e, n, p: seen.append((n, p)), sleep=clock.advance)
    assert out == "ok" and fn.calls == 4
    assert seen == [(1, 0.1), (2, 0.2), (3, 0.4)]
    assert clock() == pytest.approx(1000.7), "the waits ran on the injected sleep"


def test_retry_stops_at_max_attempts_on_a_refused_error_and_at_the_deadline() -> None:
    clock = FakeClock()
    bounded = Retry(Backoff(base_s=0.1, cap_s=1.0), max_attempts=3, clock=clock, rng=lambda: 1.0)
    fn = Flaky(10, ValueError("still failing"))
    with pytest.raises(ValueError, match="still failing"):
        bounded.call(fn, retry_on=lambda e: True, sleep=clock.advance)
    assert fn.calls == 3, "three attempts in all"
    refused = Flaky(10, KeyError("not transient"))
    with pytest.raises(KeyError):
        bounded.call(refused, retry_on=lambda e: isinstance(e, ValueError), sleep=clock.advance)
    assert refused.calls == 1
    timed = Retry(Backoff(base_s=0.4, cap_s=0.4), deadline_s=1.0, clock=clock, rng=lambda: 1.0)
    started, fn = clock(), Flaky(100, ValueError("throttled"))
    with pytest.raises(ValueError):
        timed.call(fn, retry_on=lambda e: True, sleep=clock.advance)
    assert clock() - started == pytest.approx(1.0), "the last wait is cut short at the deadline"
    assert fn.calls == 4  # at 0, 0.4, 0.8 and 1.0 s


def test_retry_call_async_awaits_the_injected_sleep_and_never_retries_a_cancellation() -> None:
    async def scenario() -> None:
        slept: list[float] = []

        async def sleep(s: float) -> None:
            slept.append(s)

        flaky = Flaky(2, OSError("reset"))

        async def call() -> Any:
            return flaky()

        retry = Retry(Backoff(base_s=0.2, cap_s=0.2), rng=lambda: 1.0)
        assert await retry.call_async(call, retry_on=lambda e: True, sleep=sleep) == "ok"
        assert slept == [0.2, 0.2]

        async def cancelled() -> None:
            raise asyncio.CancelledError

        with pytest.raises(asyncio.CancelledError):
            await retry.call_async(cancelled, retry_on=lambda e: True, sleep=sleep)
        assert slept == [0.2, 0.2]

    asyncio.run(scenario())


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"deadline_s": -1.0}])
def test_a_bad_retry_is_invalid(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidError):
        Retry(Backoff(), **kwargs)
