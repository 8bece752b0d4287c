"""One retry-wait policy for the whole library: capped exponential backoff with full jitter.

Every retry loop (throttled ``GetRecords``, failed subscriptions, ``PutRecords``, a sink
that raised, a reader that failed to start, a renewal that failed) waits
:meth:`Backoff.delay_s` between attempts, so the formula lives in one place.

Full jitter is AWS's recommendation ("Exponential Backoff And Jitter", AWS Architecture
Blog, 2015, also botocore's ``standard`` retry mode): the ``n``-th wait (1-based) is drawn
uniformly from ``[floor_s, min(cap_s, base_s * 2 ** (n - 1))]``. Many callers retrying
at once spread out instead of retrying in lock step, which matters here because
hundreds of shard loops in one process can be throttled by the same event.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from .errors import InvalidError

__all__ = ["Backoff", "THROTTLE_BACKOFF"]


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
