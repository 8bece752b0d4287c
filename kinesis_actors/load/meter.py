"""Load figures of one reader process: CPU (cores) and per-shard bytes/s and records/s,
each a moving average over the last ``load_window_s``.

A figure is a rate of a cumulative counter (CPU seconds of the process, bytes and
records a shard fetched), sampled whenever it is read: the rate is the counter's growth
between the newest sample and the newest sample at least one window older, divided by
the time between them. Sparse samples therefore still give a true average (over a
slightly longer span); nothing runs in the background. Before a full window has been
sampled the figure is not known yet (None; ``stats()`` shows ``0.0``).

CPU is read through an injected function, by default :func:`~kinesis_actors.clock.cpu_s` (user +
system CPU seconds of every thread of this process, as the kernel accounts them), so a
reader's figure covers its event loop, its I/O threads and the record filter alike.
psutil reads the same accounting (``Process.cpu_times``: the kernel's user + system CPU of the
process) and averages only since its previous call (``Process.cpu_percent``), not over a
window, so it would add a dependency to the library for nothing the standard library lacks;
the window is kept here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..clock import Clock, cpu_s, monotonic_s
from .busy import LoopBusyMeter
from .window import WindowRate

__all__ = ["WindowRate", "CpuMeter", "LoadFigures"]


class CpuMeter:
    """This process's CPU use, cores (CPU seconds per second), averaged over ``window_s``.

    Args:
        window_s: the window, seconds.
        cpu_time: CPU seconds used so far by the process (default :func:`~kinesis_actors.clock.cpu_s`).
        clock: monotonic seconds (default :func:`kinesis_actors.clock.monotonic_s`).
    """

    def __init__(self, window_s: float, *, cpu_time: Callable[[], float] = cpu_s,
                 clock: Clock = monotonic_s) -> None:
        self._rate = WindowRate(window_s)
        self._cpu_time, self._clock = cpu_time, clock

    def sample(self) -> float | None:
        """Take a sample now; the average over the last window, cores, or None before a full one."""
        self._rate.add(self._clock(), self._cpu_time())
        return self._rate.rate()


class LoadFigures:
    """Adds the load figures to a reader's ``stats()`` result.

    The reader's figures gain ``cpu`` (cores over the last window, ``0.0`` before a full
    one), ``load_known`` (a full window was measured), ``loop_busy`` (the fraction of wall
    time its event loop was busy over the last window, 0..1, ``0.0`` while not known: see
    :mod:`.busy`) and ``loop_busy_known``; each shard's gain
    ``bytes_per_s`` and ``records_per_s`` (from its cumulative ``bytes`` and ``records``;
    ``0.0`` before a full window) and ``load_known``. Shards no longer listed are forgotten.

    Args:
        window_s: ``load_window_s``, seconds.
        cpu_time / clock: as for :class:`CpuMeter`.
        busy: the meter of the event loop :meth:`annotate` runs on (attached at its first call),
            or None: ``loop_busy`` is then not known.
    """

    def __init__(self, window_s: float, *, cpu_time: Callable[[], float] = cpu_s,
                 clock: Clock = monotonic_s, busy: LoopBusyMeter | None = None) -> None:
        self.window_s = window_s
        self._cpu = CpuMeter(window_s, cpu_time=cpu_time, clock=clock)
        self.busy = busy
        self._clock = clock
        self._shards: dict[str, tuple[WindowRate, WindowRate]] = {}

    def annotate(self, reader: dict[str, Any], shards: Mapping[str, dict[str, Any]]) -> None:
        """Sample now and write the figures into ``reader`` and each of ``shards`` (in place).
        Called on the reader's event loop, which is then the loop measured (attached once)."""
        now = self._clock()
        cpu = self._cpu.sample()
        reader["cpu"] = round(cpu, 4) if cpu is not None else 0.0
        reader["load_known"] = cpu is not None
        busy = None
        if self.busy is not None:
            self.busy.attach_running()
            busy = self.busy.sample()
        reader["loop_busy"] = round(busy, 4) if busy is not None else 0.0
        reader["loop_busy_known"] = busy is not None
        reader["load_window_s"] = self.window_s
        for sid in [s for s in self._shards if s not in shards]:
            del self._shards[sid]
        for sid, figures in shards.items():
            rates = self._shards.get(sid)
            if rates is None:
                rates = self._shards[sid] = (WindowRate(self.window_s), WindowRate(self.window_s))
            rates[0].add(now, float(figures.get("bytes", 0) or 0))
            rates[1].add(now, float(figures.get("records", 0) or 0))
            bytes_per_s, records_per_s = rates[0].rate(), rates[1].rate()
            figures["bytes_per_s"] = round(bytes_per_s, 1) if bytes_per_s is not None else 0.0
            figures["records_per_s"] = round(records_per_s, 2) if records_per_s is not None else 0.0
            figures["load_known"] = bytes_per_s is not None
