"""Figures named on a page instead of copied: ``{{ section.name }}`` placeholders and ``{{ table NAME }}`` lines,
expanded from ``bench/results.json`` by ``docs/hooks.py`` when the site is built (the syntax is described there).

Every figure comes from the results file; provenance (``@run``) from :func:`bench.docs_page.section_runs`. A
placeholder the results cannot answer raises :class:`FigureError`, which fails the strict build.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .docs_page import section_runs, show


class FigureError(KeyError):
    """A placeholder names a figure (or a field, or a section) that ``bench/results.json`` lacks."""


# {{ section.name }}, {{ section.name.field }}, {{ section.@run }}; then an optional ": format-spec".
PLACEHOLDER = re.compile(r"\{\{\s*([a-z0-9_]+)\.(@?\w+)(?:\.(\w+))?\s*(?::\s*([^}]*?))?\s*\}\}")
FIELDS = ("value", "anchor_value", "ratio")
RUN_FIELDS = ("run", "date", "commit", "load", "started", "source")


def cite(data: dict[str, Any], section: str, name: str, field: str | None = None, spec: str | None = None) -> str:
    """The text of one placeholder: a figure's ``value`` (or ``anchor_value``, ``ratio``) as :func:`fmt`
    prints it, or with ``spec`` (a Python format spec such as ``.3f`` or ``,.0f``); ``@run`` (and ``@date``,
    ``@commit``, ``@load``, ``@started``, ``@source``) give the section's provenance. Raises
    :class:`FigureError` for a section, figure or field the results lack, or a figure without a value."""
    runs = section_runs(data)
    if section not in runs:
        raise FigureError(f"bench/results.json has no section {section!r}")
    if name.startswith("@"):
        run, what = runs[section], name[1:]
        if what not in RUN_FIELDS or field or spec:
            raise FigureError(f"{{{{ {section}.{name} }}}}: say one of @{', @'.join(RUN_FIELDS)}")
        if what == "run":
            commit = "commit not recorded" if run["commit"] == "not recorded" else f"at {run['commit']}"
            return f"[bench {section}, {run['date']} {commit}, load {run['load']}]"
        return run[what]
    value = figure_value(data, section, name, field or "value")
    return format(value, spec) if spec else show(value)


def figure_value(data: dict[str, Any], section: str, name: str, field: str = "value") -> Any:
    """The ``field`` (``value``, ``anchor_value`` or ``ratio``) of figure ``name`` of ``section``; raises
    :class:`FigureError` when the results lack it or it is null."""
    by_key = {f["name"]: f for f in data.get("figures", []) if f["section"] == section}
    value = by_key.get(name, {}).get(field)
    if name not in by_key or field not in FIELDS or value is None:
        raise FigureError(f"bench/results.json: section {section!r} has no {field} of {name!r}")
    return value


# (shards, MB/s, label) of production.md's worked examples; True: min_checkpoint_interval_s=0
SIZING_ROWS = ((500, 10, False), (100, 100, False), (500, 100, False), (500, 200, False), (500, 200, True),
               (500, 500, False), (500, 1000, False))


def sizing_table(data: dict[str, Any]) -> list[str]:
    """production.md's worked examples of its sizing rule: ``c = b × per_MB + r × 1 ms`` cores per shard with
    ``per_MB`` the readers' and Coordinator's steady CPU s/MB (``throughput`` section) and ``r = 5 + 1/3``
    requests/s per shard (+5 checkpoint writes/s with ``min_checkpoint_interval_s=0``); readers
    ``ceil(N / floor(0.5 / c)) + 1``; memory ``readers × 100 MiB + N × 0.13 MiB`` (+74 MiB per reader with full
    byte budgets). Raises :class:`FigureError` without the per-MB figure."""
    import math

    per_mb = float(figure_value(data, "throughput", "product_readers_coordinator_cpu_s_per_mb_after_start"))
    rows = ["| stream | MB/s per shard `b` | cores per shard `c` | `max_shards_per_reader` (`<= 0.5 / c`) | "
            "reader cores (`N × c`) | readers (`ceil(N/max)+1`) | nodes of 8 cores, readers only "
            "(`ceil(readers / 8)`) | reader memory at rest | worst case with full byte budgets |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, mb_s, every_batch in SIZING_ROWS:
        b = mb_s / n
        c = b * per_mb + (5 + 1 / 3) * 0.001 + (0.005 if every_batch else 0.0)
        cap = math.floor(0.5 / c)
        readers = math.ceil(n / cap) + 1
        rest = readers * 100 + n * 0.13
        label = f"{n} shards, {mb_s:,} MB/s" + (", `min_checkpoint_interval_s=0`" if every_batch else "")
        rows.append(f"| {label} | {b:g} | {c:.4f} | {cap} | {n * c:.1f} | {readers} | {math.ceil(readers / 8)} | "
                    f"{rest / 1024:.2f} GiB | {(rest + readers * 74) / 1024:.2f} GiB |")
    return rows


TABLES: dict[str, Callable[[dict[str, Any]], list[str]]] = {"sizing": sizing_table}
_TABLE = re.compile(r"^\{\{\s*table\s+(\w+)\s*\}\}$", re.MULTILINE)


def _table(data: dict[str, Any], name: str) -> str:
    if name not in TABLES:
        raise FigureError(f"{{{{ table {name} }}}}: tables are {', '.join(TABLES)}")
    return "\n".join(TABLES[name](data))


_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def _outside_code_spans(markdown: str, sub: Callable[[str], str]) -> str:
    """``sub`` applied to every part of ``markdown`` but its inline code spans (a placeholder in backticks is
    shown as written, so a page can explain the syntax); fenced blocks are expanded whole."""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if fenced or "`" not in line:
            out.append(sub(line))
            continue
        parts, last = [], 0
        for m in _CODE_SPAN.finditer(line):
            parts += [sub(line[last:m.start()]), m.group(0)]
            last = m.end()
        out.append("".join([*parts, sub(line[last:])]))
    return "\n".join(out)


def expand_figures(markdown: str, data: dict[str, Any]) -> str:
    """``markdown`` with every placeholder outside inline code replaced by :func:`cite`'s text, and every
    ``{{ table NAME }}`` line by the table :data:`TABLES` computes from the figures (:class:`FigureError` on the
    first unknown one)."""
    markdown = _TABLE.sub(lambda m: _table(data, m.group(1)), markdown)
    return _outside_code_spans(markdown, lambda text: PLACEHOLDER.sub(
        lambda m: cite(data, m.group(1), m.group(2), m.group(3), m.group(4)), text))


def placeholders(markdown: str) -> list[tuple[str, str, str | None, str | None]]:
    """Every placeholder :func:`expand_figures` expands in ``markdown``, as (section, name, field, spec)."""
    found: list[tuple[str, str, str | None, str | None]] = []

    def collect(text: str) -> str:
        found.extend((m.group(1), m.group(2), m.group(3), m.group(4)) for m in PLACEHOLDER.finditer(text))
        return text

    _outside_code_spans(markdown, collect)
    return found
