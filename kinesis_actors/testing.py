"""Fakes for testing code built on ``kinesis_actors`` (shipped in the package, FastStream style).

- :class:`InProcessLeaseStore`: the full lease logic with its rows in this process (no
  Ray, no network); ``store.peer()`` gives a second "host" over the same rows.
- :class:`FlakyLeaseStore`: wraps any lease store and fails the Nth call of a chosen
  method with a chosen exception (the idea of KCL's ``ExceptionThrowingLeaseRefresher``).
"""

from __future__ import annotations

import threading
from typing import Any

from .errors import LeaseStoreError
from .leases.memory import InProcessLeaseStore

__all__ = ["InProcessLeaseStore", "FlakyLeaseStore"]


class FlakyLeaseStore:
    """A lease store wrapper that fails chosen calls of one method; every other call passes through.

    Calls of ``method`` are counted from 1; calls ``nth`` to ``nth + times - 1`` raise
    ``exception``. With ``when="before"`` (default) the failing call never reaches the
    inner store (nothing changes); with ``when="after"`` the inner call runs first and
    its result is lost (a write that happened although the caller saw an error, like a
    lost response).

    Args:
        inner: the lease store to wrap.
        method: name of the method to fail, e.g. ``"renew"`` or ``"checkpoint"``.
        nth: the first call (1-based) that fails.
        exception: the exception instance or class to raise; default a retriable
            ``LeaseStoreError``.
        times: how many consecutive calls fail (default 1).
        when: ``"before"`` or ``"after"`` the inner call.

    Attributes:
        calls: how many times ``method`` was called so far.
        failures: how many of them failed.

    Example:
        >>> store = FlakyLeaseStore(InProcessLeaseStore(), "renew", nth=2)
        >>> lease = store.take("s", "shardId-0", owner="a", duration_s=1.0)
        >>> lease = store.renew(lease)   # call 1 passes
        >>> store.renew(lease)           # call 2 raises LeaseStoreError
        Traceback (most recent call last):
        ...
        kinesis_actors.errors.LeaseStoreError: injected failure of renew (call 2)
    """

    def __init__(
        self,
        inner: Any,
        method: str,
        *,
        nth: int = 1,
        exception: BaseException | type[BaseException] | None = None,
        times: int = 1,
        when: str = "before",
    ) -> None:
        if not callable(getattr(inner, method, None)):
            raise ValueError(f"{type(inner).__name__} has no method {method!r}")
        if nth < 1 or times < 1:
            raise ValueError(f"nth and times must be >= 1, got nth={nth!r}, times={times!r}")
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', got {when!r}")
        self.inner = inner
        self.method = method
        self.nth = nth
        self.times = times
        self.when = when
        self.exception = exception
        self.calls = 0
        self.failures = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FlakyLeaseStore({self.inner!r}, {self.method!r}, nth={self.nth}, times={self.times})"

    def _error(self, call: int) -> BaseException:
        exc = self.exception
        if exc is None:
            return LeaseStoreError(f"injected failure of {self.method} (call {call})", retriable=True)
        if isinstance(exc, type):
            return exc(f"injected failure of {self.method} (call {call})")
        return exc

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("inner", "method", "_lock"):
            raise AttributeError(name)  # not delegated (keeps pickling and copying sane)
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def flaky(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls += 1
                call = self.calls
                fail = self.nth <= call < self.nth + self.times
                if fail:
                    self.failures += 1
            if fail and self.when == "before":
                raise self._error(call)
            result = attr(*args, **kwargs)
            if fail:
                raise self._error(call)
            return result

        return flaky
