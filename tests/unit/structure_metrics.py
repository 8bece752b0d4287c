"""Structure figures of ``kinesis_actors``, measured with ``ast`` and one runtime trace.

``python -m tests.unit.structure_metrics`` prints every figure beside its goal;
``tests/unit/test_shape.py`` asserts every figure against its goal (``GOALS``). The
rules, exactly:

* **Import cycles**: a graph of the package's modules; an edge from a module to each
  package module it imports, at module level or inside a function or method, except an
  import under ``if TYPE_CHECKING:``. ``from P import n`` is an edge to ``P.n`` when that is
  a module, else to ``P``; ``import P.Q`` is an edge to ``P.Q``. A cycle is a strongly
  connected component of two or more modules (or a module importing itself); the figure
  is the number of such components.
* **Private members used from another module**: a name ``_x`` (not a dunder) that
  module ``M`` reaches as an attribute (``anything._x``) or imports
  (``from .m import _x``), where ``_x`` is defined in another module of the package and not
  in ``M`` itself. "Defined" means: a module-level function, class or assignment named
  ``_x``, a method or class attribute ``_x``, or an assignment ``self._x = ...``/``cls._x``.
  A private name of another library (``client._request_signer``) is not counted; a name
  defined in both ``M`` and another module is not counted (it reads as ``M``'s own).
* **Direct clock calls**: a call of ``time.monotonic``, ``time.time``, ``time.perf_counter``,
  ``time.process_time`` (and their ``_ns`` forms), ``datetime.now``/``utcnow``/``today``,
  ``date.today``, or an event loop's ``time()`` (``loop.time()``,
  ``asyncio.get_running_loop().time()``), through any import alias, in library code
  (every module of the package) outside ``kinesis_actors/clock.py``. A reference that is
  not called (``clock=time.monotonic``) is not a call.
* **Modules at 400-500 lines**: modules of the package whose line count is in [400, 500].
* **Files to follow** a batch, a checkpoint and a renewal: the distinct library files
  (``kinesis_actors/**``, but not ``kinesis_actors/testing.py``, whose fakes stand in for
  AWS) a Python frame is entered in, under ``sys.setprofile``, by the asyncio task doing
  the work, plus the files on its stack when the work lands (see :func:`trace_files`).
"""

from __future__ import annotations

import ast
import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kinesis_actors"
CLOCK_MODULE = "kinesis_actors.clock"

GOALS: dict[str, int] = {
    "batch_files": 7,
    "renewal_files": 3,
    "checkpoint_files": 3,
    "import_cycles": 0,
    "private_members": 0,
    "clock_calls_outside_clock_module": 0,
    "clock_calls_in_clock_module": 3,
    "modules_400_500_lines": 4,
}
"""Each figure's goal: the figure must be at most this."""


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> path (``pkg.__init__`` named ``pkg``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


# ---------------------------------------------------------------------------- import cycles
def _resolve(name: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports at run time (see the module docstring)."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in _runtime_nodes(_parse(path)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            graph[name].update(t for t in targets if t in mods)
    return graph


def import_cycles() -> list[list[str]]:
    """The strongly connected components of :func:`import_graph` that are cycles (Tarjan)."""
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


# ---------------------------------------------------------------------------- private members
def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined_private(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
                    elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                            and sub.value.id in ("self", "cls"):
                        names.add(sub.attr)
    return {n for n in names if _private(n)}


def private_members() -> list[tuple[str, int, str]]:
    """``(module, line, name)`` of each private member reached from another module."""
    mods = modules()
    trees = {m: _parse(p) for m, p in mods.items()}
    defined = {m: _defined_private(t) for m, t in trees.items()}
    everywhere: set[str] = set().union(*defined.values())
    found = []
    for m, tree in trees.items():
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Attribute) and _private(node.attr):
                names = [node.attr]
            elif isinstance(node, ast.ImportFrom) and _resolve(m, mods[m], node).startswith("kinesis_actors"):
                names = [a.name for a in node.names if _private(a.name)]
            for n in names:
                if n in everywhere and n not in defined[m]:
                    found.append((m, getattr(node, "lineno", 0), n))
    return sorted(found)


# ---------------------------------------------------------------------------- clock calls
_TIME_FUNCS = {"monotonic", "time", "perf_counter", "process_time", "monotonic_ns", "time_ns",
               "perf_counter_ns", "process_time_ns"}
_DATETIME_FUNCS = {"now", "utcnow", "today"}
_LOOP_GETTERS = {"get_running_loop", "get_event_loop"}


def _aliases(tree: ast.Module) -> tuple[set[str], set[str], set[str], set[str]]:
    """Names bound to the ``time`` module, to its clock functions, to the ``datetime`` module,
    and to the ``datetime``/``date`` classes."""
    time_mod, time_funcs, dt_mod, dt_classes = set(), set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "time":
                    time_mod.add(a.asname or "time")
                elif a.name == "datetime":
                    dt_mod.add(a.asname or "datetime")
        elif isinstance(node, ast.ImportFrom) and not node.level:
            for a in node.names:
                if node.module == "time" and a.name in _TIME_FUNCS:
                    time_funcs.add(a.asname or a.name)
                elif node.module == "datetime" and a.name in ("datetime", "date"):
                    dt_classes.add(a.asname or a.name)
    return time_mod, time_funcs, dt_mod, dt_classes


def _is_clock_call(call: ast.Call, aliases: tuple[set[str], set[str], set[str], set[str]]) -> bool:
    time_mod, time_funcs, dt_mod, dt_classes = aliases
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in time_funcs
    if not isinstance(f, ast.Attribute):
        return False
    v = f.value
    if f.attr in _TIME_FUNCS and isinstance(v, ast.Name) and v.id in time_mod:
        return True
    if f.attr in _DATETIME_FUNCS:
        if isinstance(v, ast.Name) and v.id in dt_classes:
            return True
        if isinstance(v, ast.Attribute) and v.attr in ("datetime", "date") and isinstance(v.value, ast.Name) \
                and v.value.id in dt_mod:
            return True
    if f.attr == "time" and not call.args:
        if isinstance(v, ast.Name) and v.id == "loop":
            return True
        if isinstance(v, ast.Call) and isinstance(v.func, (ast.Attribute, ast.Name)):
            getter = v.func.attr if isinstance(v.func, ast.Attribute) else v.func.id
            return getter in _LOOP_GETTERS
    return False


def clock_calls() -> list[tuple[str, int]]:
    """``(module, line)`` of every direct clock call in the package (``clock.py`` included)."""
    found = []
    for m, path in modules().items():
        tree = _parse(path)
        aliases = _aliases(tree)
        found += [(m, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_clock_call(n, aliases)]
    return sorted(found)


# ---------------------------------------------------------------------------- module sizes
def modules_400_500() -> list[tuple[str, int]]:
    """``(module, lines)`` of each module of 400 to 500 lines."""
    out = []
    for m, path in modules().items():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if 400 <= n <= 500:
            out.append((m, n))
    return sorted(out)


# ---------------------------------------------------------------------------- runtime trace
class _Tracer:
    """Files entered per asyncio task while on (``sys.setprofile``), library files only."""

    def __init__(self) -> None:
        self.by_task: dict[int, set[str]] = {}
        self._prefix = str(PACKAGE) + os.sep
        self._skip = {str(PACKAGE / "testing.py")}

    def _library(self, filename: str) -> bool:
        return filename.startswith(self._prefix) and filename not in self._skip

    def _profile(self, frame: Any, event: str, _: Any) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if self._library(filename):
            try:
                task = id(asyncio.current_task())
            except RuntimeError:
                task = 0
            self.by_task.setdefault(task, set()).add(filename)

    def on(self) -> None:
        self.by_task = {}
        sys.setprofile(self._profile)

    def off(self) -> None:
        sys.setprofile(None)

    def stack(self, frame: Any) -> set[str]:
        """The library files on the stack (awaiting coroutines included) of ``frame``."""
        out = set()
        while frame is not None:
            if self._library(frame.f_code.co_filename):
                out.add(frame.f_code.co_filename)
            frame = frame.f_back
        return out

    def files(self, tasks: set[int], stack: set[str]) -> set[str]:
        out = set(stack)
        for t in tasks:
            out |= self.by_task.get(t, set())
        return {str(Path(f).relative_to(ROOT)) for f in out}


def trace_files() -> dict[str, list[str]]:
    """Drive one batch, one checkpoint and one renewal of one shard (factor 1) through a
    ``ShardReaderCore`` over the fakes of :mod:`kinesis_actors.testing` (a
    :class:`~kinesis_actors.testing.FakeClock`, :class:`~kinesis_actors.testing.InlineIo`,
    an :class:`~kinesis_actors.leases.memory.InProcessLeaseStore`); returns the library files
    each entered (see the module docstring), by walk.

    * batch: from a record put into an idle shard being read, to the sink's call: the files
      of the tasks that called ``GetRecords`` (with the record) and the sink, plus the sink
      call's stack;
    * checkpoint: from the sink's return to the store's ``checkpoint`` returning: the
      checkpointing task's files plus its stack at the store;
    * renewal: from the checkpoint to the next ``renew`` returning: the renewing task's
      files plus its stack at the store.
    """
    from kinesis_actors.leases.memory import InProcessLeaseStore
    from kinesis_actors.reader import ReaderSpec, ShardReaderCore
    from kinesis_actors.records import StartAt
    from kinesis_actors.testing import FakeClock, FakeShard, InlineIo

    tracer, marks = _Tracer(), {}
    clock = FakeClock()

    def mark(walk: str) -> None:
        if walk not in marks:
            frame = sys._getframe(2)
            marks[walk] = (id(asyncio.current_task()), tracer.stack(frame))
            tracer.off()

    class Shard(FakeShard):
        def get_records(self, **kw: Any) -> Any:
            out = super().get_records(**kw)
            if out["Records"] and "fetch" not in marks:
                marks["fetch"] = (id(asyncio.current_task()), set())
            return out

    class Store(InProcessLeaseStore):
        def checkpoint(self, *a: Any, **kw: Any) -> Any:
            out = super().checkpoint(*a, **kw)
            if "batch" in marks:
                mark("checkpoint")
            return out

        def renew(self, *a: Any, **kw: Any) -> Any:
            out = super().renew(*a, **kw)
            if "checkpoint" in marks:
                mark("renewal")
            return out

    walks: dict[str, list[str]] = {}
    delivered: list[Any] = []

    async def deliver(records: list[Any]) -> None:
        delivered.extend(records)
        mark("batch")
        walks["batch"] = sorted(tracer.files({marks["fetch"][0], marks["batch"][0]}, marks["batch"][1]))
        tracer.on()  # the checkpoint walk starts as the sink returns

    async def scenario() -> None:
        store, shard = Store(clock=clock), Shard(0)
        shard.clock = clock
        core = ShardReaderCore(store=store, deliver=deliver, kinesis=shard, clock=clock, sleep=clock.sleep,
                               io=InlineIo(clock))
        spec = ReaderSpec(stream="s", shard_id="shardId-000000000000", owner_id="me", start_at=StartAt.trim_horizon(),
                          lease_duration_s=10.0, renew_interval_s=3.0, idle_wait_s=0.2, max_idle_wait_s=0.2)
        lease = store.take("s", spec.shard_id, owner="me", duration_s=10.0)
        await clock.finish(core.add(spec, lease), within_s=5)
        await clock.run_for(0.5)
        shard.add(1, b"x")
        tracer.on()
        await clock.until(lambda: "checkpoint" in marks, within_s=5, what="the batch and its checkpoint")
        walks["checkpoint"] = sorted(tracer.files({marks["checkpoint"][0]}, marks["checkpoint"][1]))
        tracer.on()
        await clock.until(lambda: "renewal" in marks, within_s=10, what="a renewal")
        walks["renewal"] = sorted(tracer.files({marks["renewal"][0]}, marks["renewal"][1]))
        await clock.finish(core.close(), within_s=30)

    try:
        asyncio.run(scenario())
    finally:
        tracer.off()
    return walks


# ---------------------------------------------------------------------------- all figures
def figures(*, trace: bool = True) -> dict[str, Any]:
    """Every figure of :data:`GOALS` (``trace=False`` skips the runtime trace), and the details."""
    calls = clock_calls()
    out: dict[str, Any] = {
        "import_cycles": len(cycles := import_cycles()), "cycles": cycles,
        "private_members": len(priv := private_members()), "privates": priv,
        "clock_calls_outside_clock_module": len(outside := [c for c in calls if c[0] != CLOCK_MODULE]),
        "clock_calls_in_clock_module": sum(1 for c in calls if c[0] == CLOCK_MODULE), "clock_sites": outside,
        "modules_400_500_lines": len(big := modules_400_500()), "big_modules": big,
    }
    if trace:
        walks = trace_files()
        out.update({f"{w}_files": len(walks.get(w, [])) for w in ("batch", "checkpoint", "renewal")}, walks=walks)
    return out


def table(figs: dict[str, Any]) -> str:
    """The figures beside their goals, one line each, then the details."""
    lines = [f"{'figure':<36} {'now':>5} {'goal':>6}"]
    for name, goal in GOALS.items():
        if name in figs:
            ok = "ok" if figs[name] <= goal else "over"
            lines.append(f"{name:<36} {figs[name]:>5} {'<= ' + str(goal):>6}  {ok}")
    lines.append("")
    for c in figs["cycles"]:
        lines.append("cycle: " + " -> ".join(c))
    for m, line, name in figs["privates"]:
        lines.append(f"private: {m}:{line} {name}")
    for m, line in figs["clock_sites"]:
        lines.append(f"clock call: {m}:{line}")
    for m, n in figs["big_modules"]:
        lines.append(f"400-500 lines: {m} ({n})")
    for walk, files in figs.get("walks", {}).items():
        lines.append(f"{walk} walk: {', '.join(files)}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(figures()))
