"""``make sim-mutants``: every mutant registered in :mod:`kinesis_actors.mutation` must be caught.

For each mutant, seeds from ``start`` on run with it planted, in rounds over the workers, until
one has a violation that the same seed without the mutant does not have (caught) or ``cap``
seeds passed (missed). The mutants are read from
:data:`kinesis_actors.mutation.MUTANTS` after importing the library's modules (each registers
its own at import), never listed here.
"""

from __future__ import annotations

import importlib
import pkgutil
import time

import kinesis_actors
from kinesis_actors import mutation

from .run import run_range, run_seed

__all__ = ["registered", "hunt", "NOT_SIMULATED"]

NOT_SIMULATED: dict[str, str] = {}
"""Mutants of parts the simulator does not model: listed in the table as not simulated, not hunted,
and not counted as caught (``make sim-mutants`` says how many there are)."""


def registered() -> list[str]:
    """Every mutant name the library declares (all its modules imported first), sorted."""
    for info in pkgutil.walk_packages(kinesis_actors.__path__, "kinesis_actors."):
        if any(part in info.name for part in (".demo", ".emulator", "notebook")):
            continue
        try:
            importlib.import_module(info.name)
        except Exception:  # an optional extra missing (pyiceberg, deltalake...): no mutant there
            continue
    return sorted(mutation.MUTANTS)


def hunt(names: list[str], *, start: int, cap: int, fault_s: float, workers: int) -> int:
    """Hunt each of ``names``; print the table; 0 if every one was caught, else 1."""
    rows, t0 = [], time.perf_counter()
    skipped = [n for n in names if n in NOT_SIMULATED]
    for name in (n for n in names if n not in NOT_SIMULATED):
        t = time.perf_counter()
        taken, caught, why = 0, False, ""
        step = max(8, 4 * workers)
        while taken < cap and not caught:
            batch = range(start + taken, start + min(cap, taken + step))
            for result in run_range(batch, fault_s=fault_s, mutants=(name,), workers=workers):
                taken += 1
                if result.violations and not run_seed(result.seed, fault_s=fault_s).violations:
                    caught, why = True, f"seed {result.seed}: {result.violations[0].name}"  # clean unplanted
                    break
        rows.append((name, taken, caught, why, time.perf_counter() - t))
    print(f"{'mutant':<36} {'seeds':>5}  caught  by")
    for name, taken, caught, why, wall in rows:
        print(f"{name:<36} {taken:>5}  {'yes' if caught else 'NO ':<6}  {why} ({wall:.1f} s)")
    for name in skipped:
        print(f"{name:<36} {'-':>5}  n/a     not simulated: {NOT_SIMULATED[name]}")
    missed = [r[0] for r in rows if not r[2]]
    print(f"sim-mutants: {len(rows) - len(missed)} of {len(rows)} caught in {time.perf_counter() - t0:.1f} s"
          + (f"; MISSED: {', '.join(missed)}" if missed else "")
          + (f"; {len(skipped)} not simulated" if skipped else ""))
    return 1 if missed else 0
