"""Supervision of a subscription's Coordinator: start it, watch it, restart it when it dies.

:class:`Supervisor` is plain Python over a :class:`CoordinatorRef` factory, so a unit
test drives it with a fake Coordinator; :class:`RayCoordinatorRef` is the one over the
Coordinator actor. The subscription runs :meth:`Supervisor.run` in a daemon thread.

Fault model:

* The Coordinator's memory is a cache of the lease table, so a dead Coordinator is
  replaced by a new one that re-takes this owner's rows (an owner may re-take its own
  row at once: no lease expiry is waited for) and resumes after the checkpoints. Its
  readers die with it (Ray fate sharing).
* "Gone" (Ray's ``ActorDiedError``: the process or its node is dead) starts a
  replacement; "unreachable" (``ActorUnavailableError``, a slow answer) only retries,
  because the Coordinator may be back and two Coordinators of one owner would fence
  each other's readers.
* The first pass is retried when the Coordinator dies during it, up to ``attempts``
  Coordinators in all; any other failure of it (``StartError``) closes that
  Coordinator (releasing what it took) and is raised. A replacement whose first pass
  fails is closed the same way and tried again at the next check.
* A replacement is started without holding the caller's lock, so ``close()`` never
  waits for a restart; one that finishes starting after the stop is closed at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from .errors import KinesisError, StartError, ray_call_errors

__all__ = ["CoordinatorRef", "CoordinatorGone", "CoordinatorUnreachable", "Supervisor", "RayCoordinatorRef"]

log = logging.getLogger(__name__)


class CoordinatorGone(Exception):
    """The Coordinator's process is gone (Ray's ``ActorDiedError``): start another."""


class CoordinatorUnreachable(Exception):
    """The Coordinator did not answer now but may come back: ask again later."""


class CoordinatorRef(Protocol):
    """One Coordinator, as the supervisor sees it (blocking calls, each with its own timeout)."""

    def start(self, timeout_s: float) -> None:
        """Run its first pass. Raises ``StartError``, or ``CoordinatorGone`` if it died."""
        ...

    def ping(self) -> None:
        """Raises ``CoordinatorGone`` if it died, ``CoordinatorUnreachable`` if it did not answer."""
        ...

    def close(self, release: bool, grace_s: float) -> None:
        """Stop its readers (checkpoint, release when ``release``); may raise."""
        ...

    def kill(self) -> None:
        """Kill it (and with it its readers); never raises."""
        ...


class Supervisor:
    """Keeps one live Coordinator for a subscription.

    Args:
        spawn: creates a new Coordinator (not started yet).
        name: the stream name, for messages.
        start_timeout_s: the deadline of each first pass, seconds.
        period_s: how often :meth:`run` checks the Coordinator, seconds.
        attempts: Coordinators started in all for one first pass before giving up.
    """

    def __init__(self, spawn: Callable[[], CoordinatorRef], *, name: str, start_timeout_s: float,
                 period_s: float, attempts: int = 3) -> None:
        self._spawn = spawn
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.period_s = period_s
        self.attempts = attempts
        self.restarts = 0
        self._current: CoordinatorRef | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    @property
    def current(self) -> CoordinatorRef:
        """The Coordinator in charge now (after :meth:`start`)."""
        with self._lock:
            if self._current is None:
                raise KinesisError(f"{self.name}: no Coordinator started")
            return self._current

    def _first_pass(self) -> CoordinatorRef:
        """Start Coordinators until one finished its first pass (see the module docstring).

        Raises:
            StartError: its first pass failed, or ``attempts`` Coordinators died in it.
        """
        for attempt in range(1, self.attempts + 1):
            coordinator = self._spawn()
            try:
                coordinator.start(self.start_timeout_s)
            except CoordinatorGone as e:
                coordinator.kill()
                if attempt == self.attempts:
                    raise StartError(f"{self.name}: the Coordinator died during each of {attempt} first passes "
                                     f"({e})") from e
                log.warning("%s: the Coordinator died during its first pass (%s); starting another", self.name, e)
                self.restarts += 1
                continue
            except BaseException as e:
                self._abandon(coordinator)
                if isinstance(e, StartError):
                    raise
                raise StartError(f"{self.name}: the Coordinator's first pass failed: {e!r:.300}") from e
            return coordinator
        raise AssertionError("unreachable")

    def _abandon(self, coordinator: CoordinatorRef) -> None:
        """Close a Coordinator whose first pass failed (release what it took), then kill it."""
        try:
            coordinator.close(True, 1.0)
        except Exception as e:
            log.info("%s: closing the Coordinator after a failed first pass failed (%r)", self.name, e)
        coordinator.kill()

    def start(self) -> CoordinatorRef:
        """The subscription's first Coordinator, after its first pass.

        Raises:
            StartError: see :meth:`_first_pass`.
        """
        coordinator = self._first_pass()
        with self._lock:
            self._current = coordinator
        return coordinator

    def check(self) -> bool:
        """One watchdog step: ping the Coordinator; if it is gone, start a replacement.

        Returns:
            True when a replacement took over.
        """
        coordinator = self.current
        try:
            coordinator.ping()
            return False
        except CoordinatorUnreachable:
            return False  # maybe back: ask again at the next check
        except CoordinatorGone as e:
            if self._stopped.is_set():
                return False
            log.warning("%s: the Coordinator died (%s); starting a new one", self.name, e)
        coordinator.kill()
        try:
            replacement = self._first_pass()  # without the lock: stop() never waits for this
        except StartError as e:
            log.error("%s: could not restart the Coordinator (%s); trying again", self.name, e)
            return False
        with self._lock:
            if not self._stopped.is_set():
                self._current = replacement
                self.restarts += 1
                return True
        self._abandon(replacement)  # stopped while it started: close it too, then drop it
        return False

    def run(self) -> None:
        """Check every ``period_s`` until :meth:`stop` (the subscription's watchdog thread)."""
        while not self._stopped.wait(self.period_s):
            try:
                self.check()
            except Exception:
                if self._stopped.is_set():
                    return
                log.debug("%s: watchdog check failed", self.name, exc_info=True)

    def stop(self) -> CoordinatorRef | None:
        """Stop watching; returns the Coordinator in charge (for the caller to close)."""
        with self._lock:
            self._stopped.set()
            return self._current

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopped.is_set()


class RayCoordinatorRef:
    """:class:`CoordinatorRef` over a ``Coordinator`` actor: Ray's errors mapped to
    :class:`CoordinatorGone` / :class:`CoordinatorUnreachable`.

    Args:
        actor: the Coordinator actor handle.
        call_timeout_s: timeout of ``ping`` and ``close`` beyond their own work, seconds.
        start_margin_s: beyond ``start``'s deadline, for the Coordinator to say why it missed it.
    """

    def __init__(self, actor: Any, *, call_timeout_s: float = 60.0, start_margin_s: float = 30.0) -> None:
        self.actor = actor
        self.call_timeout_s = call_timeout_s
        self.start_margin_s = start_margin_s

    def _get(self, ref: Any, timeout_s: float) -> Any:
        import ray

        with ray_call_errors(gone=CoordinatorGone, unreachable=CoordinatorUnreachable):
            return ray.get(ref, timeout=timeout_s)

    def start(self, timeout_s: float) -> None:
        try:
            self._get(self.actor.start.remote(timeout_s), timeout_s + self.start_margin_s)
        except CoordinatorUnreachable as e:
            raise StartError(f"the Coordinator's first pass did not finish within "
                             f"{timeout_s + self.start_margin_s:.0f} s ({e})") from e

    def ping(self) -> None:
        self._get(self.actor.ping.remote(), 30.0)

    def close(self, release: bool, grace_s: float) -> None:
        self._get(self.actor.close.remote(release, grace_s), grace_s + self.call_timeout_s)

    def kill(self) -> None:
        import ray

        try:
            ray.kill(self.actor, no_restart=True)  # a dead actor is no error
        except (ValueError, ray.exceptions.RayError) as e:  # not an actor handle; Ray shut down already
            log.info("killing the Coordinator %r: %r", self.actor, e)
