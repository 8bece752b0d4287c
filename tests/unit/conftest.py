"""The unit tier never starts Ray and never opens a socket to an emulator: plain Python only.

A test that calls ``ray.init`` (directly, or through a Ray call that would start a
runtime) fails at once, naming the call, instead of quietly costing the tier seconds.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray
    import ray._private.worker as worker

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the unit tier must not start Ray (move this test to tests/integration)")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(worker, "init", refuse)
