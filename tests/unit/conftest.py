"""The unit tier never starts Ray and never opens a socket to an emulator: plain Python only.

A test whose code imports Ray (``import ray`` anywhere, in the test or in the library
code it drives) or calls ``ray.init`` fails, naming the module, instead of quietly
costing the tier seconds: importing Ray alone takes 2-18 s on a loaded 2-core machine.
The guard itself never imports Ray. When Ray was imported before (a run that collects
tests/integration first), ``ray.init`` is refused instead.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import pytest

from .metrics_recorder import metrics_sink  # noqa: F401  (a fixture for the unit tests)

_MESSAGE = "the unit tier must not {what} Ray (use the fakes in kinesis_actors.testing, or move the test to tests/integration)"


class _RayBlocker(importlib.abc.MetaPathFinder):
    """Refuses every import of ``ray`` or ``ray.*`` and remembers the attempts."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "ray" or fullname.startswith("ray."):
            self.attempts.append(fullname)
            raise ImportError(_MESSAGE.format(what="import") + f": {fullname}")
        return None


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    blocker = _RayBlocker()
    sys.meta_path.insert(0, blocker)
    ray = sys.modules.get("ray")
    if ray is not None:  # imported by an earlier tier of the same run: refuse starting it
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(_MESSAGE.format(what="start"))

        monkeypatch.setattr(ray, "init", refuse)
        worker = sys.modules.get("ray._private.worker")
        if worker is not None:
            monkeypatch.setattr(worker, "init", refuse)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)
    if blocker.attempts:
        pytest.fail(_MESSAGE.format(what="import") + f": {', '.join(sorted(set(blocker.attempts)))}")
