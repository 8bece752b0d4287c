"""``python -m tests.sim``: run seeds, replay one, hunt the planted mutants, print the figures.

- ``--seeds A-B``: every seed of the range; exits 1 on any violation, printing each failing
  seed, its violations and its shortened history.
- ``--seed N [--verbose]``: one seed (``--verbose``: its whole history, event by event, and
  the library's log); replaying a seed gives the same history.
- ``--mutants [--cap 500]``: for each registered mutant, seeds from ``--seeds``' start until
  one catches it (at most ``--cap``); a table; exits 1 unless every mutant is caught.
- ``--figures``: simulated seconds per wall second at 16 shards, 3 instances (20 records/s per
  shard, then idle), no faults.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from .mutants import hunt, registered
from .run import FAULT_S, Result, run_range, run_seed
from .speed import figures


def _seeds(text: str) -> range:
    a, _, b = text.partition("-")
    return range(int(a), int(b or a) + 1)


def _replay_flags(args: argparse.Namespace) -> str:
    """The flags a replay needs to draw the same history (the fault budget, the stuck-thread fault)."""
    return (f" --fault-s {args.fault_s:g}" if args.fault_s != FAULT_S else "") + (" --stuck" if args.stuck else "")


def _print_failure(result: Result, args: argparse.Namespace) -> None:
    print(f"seed {result.seed}: VIOLATION")
    for v in result.violations[:5]:
        print(f"  {v.name} at {v.at:.3f} s: {v.what}")
    print("\n".join("  " + line for line in result.report))
    print(f"  replay: PYTHONHASHSEED=0 .venv/bin/python -m tests.sim --seed {result.seed}{_replay_flags(args)} --verbose")


def _range(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    results = run_range(_seeds(args.seeds), fault_s=args.fault_s, workers=args.workers)
    wall = time.perf_counter() - t0
    bad = [r for r in results if r.violations]
    for r in bad:
        _print_failure(r, args)
    virtual = sum(r.virtual_s for r in results)
    print(f"sim: {len(results)} seeds ({args.seeds}) in {wall:.1f} s wall on {args.workers} workers, "
          f"{virtual:.0f} simulated s, {sum(r.events for r in results)} events; "
          f"{len(bad)} with violations{': seeds ' + ', '.join(str(r.seed) for r in bad) if bad else ''}")
    return 1 if bad else 0


def _one(args: argparse.Namespace) -> int:
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
    result = run_seed(args.seed, fault_s=args.fault_s, verbose=args.verbose)
    if args.verbose:
        print("\n".join(result.report))
    if result.violations:
        _print_failure(result, args)
    print(f"seed {result.seed}: {len(result.violations)} violations, {result.events} events, "
          f"{result.virtual_s:.1f} simulated s in {result.wall_s:.2f} s, history {result.digest[:16]}")
    return 1 if result.violations else 0


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); the exit status."""
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-1999", help="seed range A-B (default 0-1999)")
    p.add_argument("--seed", type=int, help="run (replay) one seed")
    p.add_argument("--verbose", action="store_true", help="with --seed: the whole history and the log")
    p.add_argument("--mutants", action="store_true", help="hunt every registered mutant")
    p.add_argument("--cap", type=int, default=500, help="most seeds per mutant (default 500)")
    p.add_argument("--figures", action="store_true", help="print the speed figures")
    p.add_argument("--stuck", action="store_true",
                   help="also a reader pool thread stuck for good (SIM_STUCK=1; a known liveness gap)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--fault-s", type=float, default=FAULT_S, help=f"simulated seconds of faults per seed (default {FAULT_S:.0f})")
    args = p.parse_args(argv)
    if args.stuck:
        os.environ["SIM_STUCK"] = "1"  # read by the faults, in this process and the forked workers
    if args.figures:
        for line in figures():
            print(line)
        return 0
    if args.seed is not None:
        return _one(args)
    if args.mutants:
        names = registered()
        if not names:
            print("sim-mutants: no mutant registered")
            return 1
        return hunt(names, start=_seeds(args.seeds).start, cap=args.cap, fault_s=args.fault_s, workers=args.workers)
    return _range(args)


if __name__ == "__main__":
    sys.exit(main())
