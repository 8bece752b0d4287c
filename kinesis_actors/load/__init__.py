"""Scaling with load: the figures readers measure and the decisions taken over them.

Pure code (no Ray, no I/O, time passed in as ``now`` on the caller's monotonic clock),
so every decision is unit-tested and simulated:

* :mod:`.meter`: moving averages over ``load_window_s`` of a process's CPU (cores) and
  of each shard's bytes/s and records/s; :mod:`.busy`: the busy fraction of a reader's
  event loop over the same window (the one part that touches the running loop: it times
  the loop's ``select``).
* :mod:`.placement`: :class:`LoadPlacer`, which reader of one instance each shard should
  be on (hot shards spread over reader processes, readers added for load merged away,
  the pool re-spread after a reader dies).
* :mod:`.throughput`: :func:`plan_by_throughput`, which leases an instance steals so that
  instances share the stream's bytes/s rather than its lease count.
"""

from .busy import BUSY_SATURATED, LoopBusyMeter, TimedSelector
from .meter import CpuMeter, LoadFigures, WindowRate
from .placement import LoadPlacer, LoadPlan, Move, ReaderLoad, ShardLoad
from .throughput import MEASURABLE_KBPS, plan_by_throughput

__all__ = ["BUSY_SATURATED", "LoopBusyMeter", "TimedSelector", "CpuMeter", "LoadFigures", "WindowRate", "LoadPlacer",
           "LoadPlan", "Move", "ReaderLoad", "ShardLoad", "MEASURABLE_KBPS", "plan_by_throughput"]
