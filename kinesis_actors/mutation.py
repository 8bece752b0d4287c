"""Planted bugs (mutants) that the deterministic simulator must catch; off everywhere else.

Each name in :data:`MUTANTS` is a known way to break a guarantee (a checkpoint before the
acknowledgement, a take without the lease-counter condition, ...). The library code at that
spot reads ``name in mutation.ACTIVE`` (no function call: a batch's path enters no
extra frame) and, only when the simulator has planted that mutant with
:func:`planted`, does the wrong thing. Nothing but the simulator (``make sim-mutants``) and
the tests of the mutants themselves plants one; in every other process :data:`ACTIVE` is the
empty set and the check is one frozenset lookup, made per batch or per event, never per
record. A mutant of the lanes (``checkpoint_before_ack``, ``partial_ack_checkpoints_batch``)
is read when a consumer builds its lanes: plant it before the consumer is created.

Each module registers its mutants at import: :func:`planted` knows the names of the modules
imported so far (``kinesis_actors.kinesis``, ``.leases``, ``.delivery``, ``.reader``,
``.coordinator`` and ``.sinks.tables`` hold them all).

Why in the library and not monkeypatched from outside: a mutant must break the code users
run, at the line that holds the guarantee, and stay in place as that code changes; a patch
from outside would silently stop applying when the function it replaced is renamed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

MUTANTS: dict[str, str] = {}
"""Name -> what the planted bug does. Filled by the modules that hold the mutated lines
through :func:`register` at import, so the table lives next to the code it breaks."""

ACTIVE: frozenset[str] = frozenset()
"""The mutants planted now (empty outside the simulator)."""


def register(name: str, what: str) -> str:
    """Declare mutant ``name`` (``what``: the bug, one line); returns ``name``.

    Raises:
        ValueError: ``name`` is already declared with another description.
    """
    if MUTANTS.get(name, what) != what:
        raise ValueError(f"mutant {name!r} declared twice")
    MUTANTS[name] = what
    return name


@contextmanager
def planted(*names: str) -> Iterator[None]:
    """Plant ``names`` for the duration of the ``with`` block (process-wide; not thread-safe).

    Raises:
        ValueError: a name is not a declared mutant (import the module that declares it first).
    """
    global ACTIVE
    unknown = sorted(set(names) - set(MUTANTS))
    if unknown:
        raise ValueError(f"unknown mutants: {unknown}")
    before, ACTIVE = ACTIVE, frozenset(names)
    try:
        yield
    finally:
        ACTIVE = before
