"""One retry policy for the whole library: :class:`Backoff` (capped exponential backoff with
full jitter) and :class:`Retry` (the attempts of one call paced by it).

Every retry (throttled ``GetRecords``, failed subscriptions, ``PutRecords``, a sink that
raised, dead letters, the control plane, a reader that failed to start, a renewal that
failed) waits :meth:`Backoff.delay_s` between attempts, so the formula lives in one place;
a loop that calls until success, a refusal, a number of attempts or a deadline is
:meth:`Retry.call` (blocking) or :meth:`Retry.call_async`, and a loop with more to do
between attempts (the delivery engine's partial acknowledgements) asks
:meth:`Retry.pause_s` whether and how long to wait.

Retries live in one layer. botocore's own retries (``Config(retries={"mode": "standard",
"max_attempts": n})``, :class:`~kinesis_actors.aws.AwsSettings.max_attempts`, 3 by default:
throttling, 5xx and connection errors, each retried after its own jittered wait) are turned
off (``max_attempts=0``) on a client whose caller retries with :class:`Retry`, so one slow
or throttled call never costs ``(n + 1) x (ours)`` attempts and the caller's deadline holds:
the readers' Kinesis client, the publisher's and the control plane's calls.

Full jitter is AWS's recommendation ("Exponential Backoff And Jitter", AWS Architecture
Blog, 2015, also botocore's ``standard`` retry mode): the ``n``-th wait (1-based) is drawn
uniformly from ``[floor_s, min(cap_s, base_s * 2 ** (n - 1))]``. Many callers retrying
at once spread out instead of retrying in lock step, which matters here because
hundreds of shard loops in one process can be throttled by the same event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .clock import Clock, monotonic_s
from .errors import InvalidError

__all__ = ["Backoff", "THROTTLE_BACKOFF", "Retry"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter.

    Attributes:
        base_s: the ceiling of the first wait, seconds (> 0).
        cap_s: the largest ceiling, seconds (>= ``base_s``).
        floor_s: the shortest wait, seconds (0 <= ``floor_s`` <= ``base_s``); a floor keeps a
            loop from retrying at once when the service asks it to slow down.

    Raises:
        InvalidError: on creation, for values outside the ranges above.

    Example:
        >>> Backoff(base_s=0.1, cap_s=5.0).delay_s(1, rng=lambda: 1.0)
        0.1
    """

    base_s: float = 0.2
    cap_s: float = 5.0
    floor_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and self.cap_s >= self.base_s and 0 <= self.floor_s <= self.base_s):
            raise InvalidError(f"Backoff needs 0 < base_s <= cap_s and 0 <= floor_s <= base_s, got {self!r}")

    def ceiling_s(self, attempt: int) -> float:
        """The largest wait before retry number ``attempt`` (1-based; values below 1 count as 1), seconds."""
        exponent = min(max(attempt, 1) - 1, 62)  # 2 ** 62 already exceeds any cap: no float overflow
        return min(self.cap_s, self.base_s * 2.0**exponent)

    def delay_s(self, attempt: int, *, rng: Callable[[], float] = random.random) -> float:
        """The wait before retry number ``attempt`` (1-based), seconds, in ``[floor_s, ceiling_s(attempt)]``.

        Args:
            attempt: how many attempts failed in a row so far (1 for the first retry).
            rng: uniform in ``[0, 1)`` (injectable for tests).
        """
        ceiling = self.ceiling_s(attempt)
        return self.floor_s + rng() * (ceiling - self.floor_s)


THROTTLE_BACKOFF = Backoff(base_s=0.4, cap_s=5.0, floor_s=0.2)
"""Kinesis throttling (``ProvisionedThroughputExceededException``, ``LimitExceededException``) and
failed subscriptions: at least 0.2 s (a shard allows 5 calls per second), at most 5 s."""


@dataclasses.dataclass(frozen=True)
class Retry:
    """The attempts of one call, paced by a :class:`Backoff`.

    Attributes:
        backoff: the waits between attempts.
        max_attempts: attempts in all (the first included), or None for no bound.
        deadline_s: no retry starts later than this many seconds after the first attempt
            (on ``clock``), and no wait runs past it; None for no deadline.
        clock: the monotonic clock the deadline is read on (seconds).
        rng: uniform in ``[0, 1)``, the jitter (injectable for tests).

    Raises:
        InvalidError: on creation, ``max_attempts`` below 1 or a negative ``deadline_s``.

    Example:
        >>> Retry(Backoff(base_s=0.1, cap_s=1.0), max_attempts=2, rng=lambda: 1.0).pause_s(1, started=0.0)
        0.1
    """

    backoff: Backoff
    max_attempts: int | None = None
    deadline_s: float | None = None
    clock: Clock = monotonic_s
    rng: Callable[[], float] = random.random

    def __post_init__(self) -> None:
        if (self.max_attempts is not None and self.max_attempts < 1) or (self.deadline_s or 0) < 0:
            raise InvalidError(f"Retry needs max_attempts >= 1 and deadline_s >= 0, got {self!r}")

    def pause_s(self, failed: int, *, started: float) -> float | None:
        """The wait before the next attempt after ``failed`` failed attempts (1-based), seconds,
        cut short at the deadline; None when no attempt is left (``max_attempts`` made, or the
        deadline, counted from ``started`` on ``clock``, passed)."""
        if self.max_attempts is not None and failed >= self.max_attempts:
            return None
        pause = self.backoff.delay_s(failed, rng=self.rng)
        if self.deadline_s is None:
            return pause
        left = started + self.deadline_s - self.clock()
        return None if left <= 0 else min(pause, left)

    def call(self, fn: Callable[[], T], *, retry_on: Callable[[Exception], bool],
             on_retry: Callable[[Exception, int, float], None] | None = None,
             sleep: Callable[[float], object] = time.sleep) -> T:
        """Call ``fn`` until it returns; retry an error for which ``retry_on`` is true while an
        attempt is left, after ``on_retry(error, failed, pause_s)`` and ``sleep(pause_s)``
        (blocking: for the driver, the publisher and the control plane).

        Raises:
            The last error of ``fn``: one ``retry_on`` refuses, or once no attempt is left.
        """
        started, failed = self.clock(), 0
        while True:
            try:
                return fn()
            except Exception as e:
                failed += 1
                pause = self._after_failure(e, failed, started, retry_on, on_retry)
                if pause is None:
                    raise
                sleep(pause)

    async def call_async(self, fn: Callable[[], Awaitable[T]], *, retry_on: Callable[[Exception], bool],
                         on_retry: Callable[[Exception, int, float], None] | None = None,
                         sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> T:
        """:meth:`call` for a coroutine function, waiting with ``await sleep(pause_s)``;
        a cancellation is never retried (it is not an ``Exception``).

        Raises:
            The last error of ``fn``: one ``retry_on`` refuses, or once no attempt is left.
        """
        started, failed = self.clock(), 0
        while True:
            try:
                return await fn()
            except Exception as e:
                failed += 1
                pause = self._after_failure(e, failed, started, retry_on, on_retry)
                if pause is None:
                    raise
                await sleep(pause)

    def _after_failure(self, error: Exception, failed: int, started: float,
                       retry_on: Callable[[Exception], bool],
                       on_retry: Callable[[Exception, int, float], None] | None) -> float | None:
        """The decision :meth:`call` and :meth:`call_async` share: the pause before the next
        attempt (``on_retry`` told), or None to raise ``error``."""
        pause = self.pause_s(failed, started=started) if retry_on(error) else None
        if pause is not None and on_retry is not None:
            on_retry(error, failed, pause)
        return pause
