"""README.md and the site's pages, offline: the README's size, links and three figures against
kcl-rs (the same text bench.report generates from bench/results.json), the generated benchmark
page against that JSON, and the Python blocks' markers."""

from __future__ import annotations

import ast
import json
import re

import pytest

from bench.cite import PLACEHOLDER, FigureError, cite, expand_figures, placeholders
from bench.common import fmt
from bench.docs_page import readme_figures, section_runs
from bench.fold import fill_commits, fold, load_run
from tests.doc_blocks import ROOT, RUNNABLE, SHOWN_ONLY, all_blocks, blocks

README = ROOT / "README.md"
RESULTS = json.loads((ROOT / "bench" / "results.json").read_text())


def test_the_readme_reads_in_five_minutes() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_the_readme_quotes_the_three_figures_against_kcl_rs_as_generated_from_the_results() -> None:
    lines = readme_figures(RESULTS)
    assert len(lines) == 3, lines
    text = README.read_text()
    for line in lines:
        assert line in text.splitlines(), f"README.md lacks (python -m bench.report --readme): {line}"
    assert "(docs/benchmarks.md)" in text


def test_every_link_of_the_readme_to_a_file_reaches_one() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target


def test_every_python_block_parses_and_markers_name_a_block() -> None:
    found = all_blocks()
    assert found, "no Python blocks found"
    for b in found:
        ast.parse(b.code, filename=f"{b.path}:{b.line}")
    for path in [README, *(ROOT / "docs").glob("*.md")]:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() in (SHOWN_ONLY, RUNNABLE):
                assert i + 1 < len(lines) and lines[i + 1].startswith("```python"), f"{path.name}:{i + 1}"


def test_the_readme_runs_push_pull_put_many_and_a_dead_letter_stream_and_shows_the_table_sink() -> None:
    readme = blocks(README)
    ran = "\n".join(b.code for b in readme if b.runs)
    for name in ("process_batch", "next_batch", "put_many", "dead_letter="):
        assert name in ran, name
    shown = [b for b in readme if not b.runs]
    assert shown and all("IcebergSink" in b.code or "DeltaSink" in b.code for b in shown), shown


def test_the_benchmark_page_shows_the_figures_of_the_results_file_and_its_charts_exist() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    values = {f["name"]: f["value"] for f in RESULTS["figures"] if f.get("value") is not None}
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", page, re.MULTILINE)
    assert len(rows) >= 20, "the chart tables are missing: run python -m bench.report --docs"
    for name, shown in rows:
        assert fmt(values[name]) == shown.strip(), f"{name}: page {shown.strip()}, results {fmt(values[name])}"
    charts = re.findall(r"!\[[^\]]*\]\((assets/bench/[\w.]+\.svg)\)", page)
    assert len(charts) == 5, charts
    for chart in charts:
        assert (ROOT / "docs" / chart).stat().st_size > 1000, chart
    for line in readme_figures(RESULTS):
        assert line in page.splitlines()


def _all(module_file: str) -> list[str]:
    tree = ast.parse((ROOT / "kinesis_actors" / module_file).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"{module_file} has no __all__")


def test_the_api_reference_documents_every_public_name() -> None:
    reference = (ROOT / "docs" / "reference.md").read_text()
    documented = set(re.findall(r"^::: kinesis_actors(?:\.\w+)*\.(\w+)$", reference, re.MULTILINE))
    public = {*_all("__init__.py"), *_all("sinks/__init__.py")} - {"__version__"}
    assert public <= documented, f"add to docs/reference.md: {sorted(public - documented)}"


PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_a_placeholder_is_expanded_from_the_results_and_an_unknown_one_fails() -> None:
    value = next(f["value"] for f in RESULTS["figures"] if f["name"] == "reader_sigkill_to_shards_delivering_s")
    text = "{{ failover.reader_sigkill_to_shards_delivering_s }} s, `{{ failover.no_such_figure }}` (code)"
    assert expand_figures(text, RESULTS) == f"{fmt(value)} s, `{{{{ failover.no_such_figure }}}}` (code)"
    assert expand_figures("{{ failover.@commit }}", RESULTS) == section_runs(RESULTS)["failover"]["commit"]
    for unknown in ("{{ failover.no_such_figure }}", "{{ no_such_section.x }}", "{{ failover.@when }}",
                    "{{ failover.ray_actor_start_s.unit }}", "{{ table no_such_table }}"):
        with pytest.raises(FigureError):
            expand_figures(unknown, RESULTS)


def test_every_placeholder_of_the_docs_names_a_figure_of_the_results() -> None:
    missing, cited = [], 0
    for page in PAGES:
        text = page.read_text()
        if page == README:
            assert not placeholders(text), "GitHub does not expand placeholders: README.md quotes figures as text"
            continue
        for section, name, field, spec in placeholders(text):
            cited += 1
            try:
                cite(RESULTS, section, name, field, spec)
            except FigureError as e:
                missing.append(f"{page.name}: {e.args[0]}")
    assert not missing, missing
    assert cited >= 80, cited  # production.md and chaos.md alone cite more


def test_no_page_cites_a_run_kept_outside_the_results_file() -> None:
    cites = []
    for page in PAGES:
        for paragraph in re.split(r"\n\s*\n", page.read_text()):
            if re.search(r"bench/runs/|bench/chaos\.json", paragraph) and "bench.fold" not in paragraph:
                cites.append(f"{page.name}: {paragraph.strip()[:120]}")
    assert not cites, "fold the run into bench/results.json (python -m bench.fold) and cite it: " + "; ".join(cites)


def test_each_folded_section_holds_the_figures_of_the_file_it_was_folded_from() -> None:
    folded = [r for r in RESULTS["merged_runs"] if r.get("source")]
    assert {s for r in folded for s in r["params"]["sections"]} >= {"lease_cost", "idle_256", "chaos"}
    for run in folded:
        (section,) = run["params"]["sections"]
        paths = [str(ROOT / p) for p in run["source"].split(",")]
        again = fold({"figures": []}, load_run(paths, section), run["source"])
        have = [f for f in RESULTS["figures"] if f["section"] == section]
        assert again["figures"] == have, f"{run['source']} changed: python -m bench.fold it again"


def test_the_results_file_names_every_commit_its_kept_run_copies_record() -> None:
    """The benchmark page reads provenance from bench/results.json alone (python -m bench.fold --commits)."""
    assert fill_commits(json.loads(json.dumps(RESULTS))) == []
    assert section_runs(RESULTS)["throughput"]["commit"] != "not recorded"


_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+")


def test_production_tables_type_no_measured_decimal_outside_a_placeholder() -> None:
    """A decimal number in a table of production.md is a measured figure unless the table is marked derived
    (computed by hand from configuration and prices) by a ``<!-- derived: ... -->`` line before it."""
    typed, tables = [], 0
    blocks = re.split(r"\n\s*\n", (ROOT / "docs" / "production.md").read_text())
    for block in blocks:
        rows = [line for line in block.splitlines() if line.startswith("|")]
        if not rows or block.lstrip().startswith("<!-- derived:"):
            continue
        tables += 1
        for row in rows:
            bare = re.sub(r"`[^`]*`", "", PLACEHOLDER.sub("", row))
            typed += [f"{n} in: {row[:100]}" for n in _DECIMAL.findall(bare)]
    assert tables >= 4, tables
    assert not typed, typed
