"""Supervisor (a subscription's watchdog) over fake Coordinators: no Ray."""

from __future__ import annotations

import threading

import pytest

from kinesis_actors.errors import StartError
from kinesis_actors.supervision import CoordinatorGone, CoordinatorUnreachable, Supervisor


class FakeCoordinator:
    """Scripted: what its first pass and its pings do; records close and kill."""

    def __init__(self, n: int, start: BaseException | None = None) -> None:
        self.n = n
        self.start_error = start
        self.ping_errors: list[BaseException] = []
        self.closed: list[tuple[bool, float]] = []
        self.killed = False
        self.started = threading.Event()
        self.gate: threading.Event | None = None

    def start(self, timeout_s: float) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        self.started.set()
        if self.start_error is not None:
            raise self.start_error

    def ping(self) -> None:
        if self.ping_errors:
            raise self.ping_errors.pop(0)

    def close(self, release: bool, grace_s: float) -> None:
        self.closed.append((release, grace_s))

    def kill(self) -> None:
        self.killed = True


class Factory:
    """Makes FakeCoordinators in turn; ``gates[n]`` holds the n-th one's first pass (1-based)."""

    def __init__(self, *scripts: BaseException | None, gates: dict[int, threading.Event] | None = None) -> None:
        self.scripts = list(scripts)
        self.gates = gates or {}
        self.made: list[FakeCoordinator] = []

    def __call__(self) -> FakeCoordinator:
        coordinator = FakeCoordinator(len(self.made) + 1, self.scripts.pop(0) if self.scripts else None)
        coordinator.gate = self.gates.get(coordinator.n)
        self.made.append(coordinator)
        return coordinator


def supervisor(factory: Factory) -> Supervisor:
    return Supervisor(factory, name="orders", start_timeout_s=5.0, period_s=0.01, attempts=3)


def test_a_coordinator_that_dies_in_its_first_pass_is_replaced() -> None:
    factory = Factory(CoordinatorGone("ActorDiedError"), None)
    sup = supervisor(factory)
    assert sup.start() is factory.made[1]
    assert factory.made[0].killed and sup.restarts == 1


def test_every_attempt_dying_is_a_start_error() -> None:
    factory = Factory(*[CoordinatorGone("ActorDiedError")] * 3)
    with pytest.raises(StartError, match="died during each of 3 first passes"):
        supervisor(factory).start()
    assert len(factory.made) == 3 and all(c.killed for c in factory.made)


def test_a_failed_first_pass_releases_what_it_took_and_is_raised() -> None:
    factory = Factory(StartError("2 of 4 shards opened", started=2, total=4))
    with pytest.raises(StartError, match="2 of 4") as err:
        supervisor(factory).start()
    assert err.value.started == 2 and len(factory.made) == 1, "not retried: it was not a crash"
    assert factory.made[0].closed == [(True, 1.0)] and factory.made[0].killed


def test_a_dead_coordinator_is_replaced_an_unreachable_one_is_not() -> None:
    factory = Factory()
    sup = supervisor(factory)
    first = sup.start()
    first.ping_errors.append(CoordinatorUnreachable("slow"))  # type: ignore[attr-defined]
    assert sup.check() is False and sup.current is first and len(factory.made) == 1
    first.ping_errors.append(CoordinatorGone("ActorDiedError"))  # type: ignore[attr-defined]
    assert sup.check() is True
    assert sup.current is factory.made[1] and first.killed and sup.restarts == 1  # type: ignore[attr-defined]


def test_a_replacement_whose_first_pass_fails_is_closed_and_tried_again_later() -> None:
    factory = Factory(None, StartError("slow readers"), None)
    sup = supervisor(factory)
    first = sup.start()
    first.ping_errors += [CoordinatorGone("dead"), CoordinatorGone("dead")]  # type: ignore[attr-defined]
    assert sup.check() is False, "the replacement failed: nothing swapped"
    assert factory.made[1].closed and factory.made[1].killed and sup.current is first
    assert sup.check() is True and sup.current is factory.made[2] and sup.restarts == 1


def test_a_replacement_that_starts_after_the_stop_is_closed_not_kept() -> None:
    gate = threading.Event()
    factory = Factory(gates={2: gate})  # the replacement's first pass waits for the gate
    sup = supervisor(factory)
    first = sup.start()
    first.ping_errors.append(CoordinatorGone("dead"))  # type: ignore[attr-defined]
    watcher = threading.Thread(target=sup.check)
    watcher.start()
    assert sup.stop() is first, "stop() returns at once with the Coordinator in charge"
    gate.set()
    watcher.join(10)
    replacement = factory.made[1]
    assert replacement.started.is_set() and replacement.closed and replacement.killed
    assert sup.current is first and sup.restarts == 0
