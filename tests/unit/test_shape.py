"""Shape limits of the package (issue 22): a module <= 500 lines, a class <= 400, a function <= 60.

Spans are measured with ``ast``: a class or function runs from its ``def``/``class`` line to
its last line (``end_lineno``), docstrings included, decorators not. A module is measured by
its line count. ``kinesis_actors/demo/`` and ``kinesis_actors/testing.py`` are exempt.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import kinesis_actors

MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 60

PACKAGE = Path(kinesis_actors.__file__).resolve().parent
EXEMPT_DIRS = ("demo",)
EXEMPT_FILES = ("testing.py",)


def _modules() -> Iterator[Path]:
    """Every ``.py`` file of the package, minus the exempt ones, in a stable order."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in EXEMPT_DIRS or rel.as_posix() in EXEMPT_FILES:
            continue
        yield path


def _spans(tree: ast.AST) -> Iterator[tuple[str, str, int]]:
    """(kind, qualified name, lines) of every class and function in ``tree``, nested ones too."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                end = child.end_lineno if child.end_lineno is not None else child.lineno
                yield kind, name, end - child.lineno + 1
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)

    return walk(tree, "")


def _violations() -> list[str]:
    found: list[str] = []
    for path in _modules():
        rel = path.relative_to(PACKAGE.parent).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{rel}: module {lines} lines > {MAX_MODULE_LINES}")
        for kind, name, span in _spans(ast.parse(source, filename=str(path))):
            limit = MAX_CLASS_LINES if kind == "class" else MAX_FUNCTION_LINES
            if span > limit:
                found.append(f"{rel}: {kind} {name} {span} lines > {limit}")
    return found


def test_the_walk_sees_the_package() -> None:
    modules = [p.relative_to(PACKAGE).as_posix() for p in _modules()]
    assert "reader/consumer.py" in modules and "coordinator/core.py" in modules
    assert not any(m.startswith("demo/") or m == "testing.py" for m in modules)


def test_spans_count_def_to_last_line() -> None:
    tree = ast.parse('class A:\n    """doc."""\n\n    def f(self):\n        return 1\n')
    assert list(_spans(tree)) == [("class", "A", 5), ("function", "A.f", 2)]


def test_no_module_class_or_function_over_the_limits() -> None:
    violations = _violations()
    assert not violations, "shape limits of issue 22 broken:\n" + "\n".join(violations)
