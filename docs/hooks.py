"""MkDocs hooks: measured figures named instead of copied, and links to repository files outside ``docs/``.

**Figures.** A page never types a measured number; it names it, and this hook writes the number in from
``bench/results.json`` at build time::

    0.0087 CPU s/MB          ->  {{ throughput.product_readers_coordinator_cpu_s_per_mb_after_start }} CPU s/MB
    from the run's record    ->  {{ lease_cost.@run }}  (section, date, commit, load average)

``{{ section.name }}`` is the figure ``name`` of section ``section`` (as ``python -m bench.report`` lists
them), printed as the benchmark page prints it; ``{{ section.name.anchor_value }}`` (or ``.ratio``) another
field of it; ``{{ section.name : ,.0f }}`` a Python format spec; ``{{ section.@run }}`` the section's
provenance, and ``@date``, ``@commit``, ``@load``, ``@started``, ``@source`` one part of it. The syntax is
chosen for the raw Markdown (GitHub's view, a review diff): the figure's name and section stay readable where the
number will be, the braces cannot be mistaken for a number, and no plugin is needed (Material and mkdocstrings
leave ``{{ }}`` alone). A placeholder naming a section, figure or field the results lack fails the build.
Runs kept elsewhere (``bench/runs/``, the chaos suite's reference run) are folded into the results file by
``python -m bench.fold`` before a page cites them.

**Links.**
MkDocs only knows the files under ``docs/``; a page may still point at a file of the repository
(``cluster/README.md``, ``examples/quickstart.py``). Such a link is rewritten to the file's path
as inline code, and a link to a repository file that does not exist fails the build, so the
strict build keeps catching broken links.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "bench" / "results.json"
if str(ROOT) not in sys.path:  # the mkdocs script's sys.path lacks the repository (bench.cite)
    sys.path.insert(0, str(ROOT))

from bench.cite import FigureError, expand_figures  # noqa: E402
from bench.docs_page import load  # noqa: E402

_LINK = re.compile(r"\[([^\]]+)\]\(((?:\.\./)+[^)#\s]+)(#[^)]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Write the cited figures in (``PluginError`` naming the page on an unknown one) and rewrite links that leave
    ``docs/`` into code spans naming the repository path."""
    try:
        markdown = expand_figures(markdown, load(str(RESULTS)))
    except FigureError as e:
        raise PluginError(f"{page.file.src_path}: {e.args[0]}") from e
    here = (DOCS / page.file.src_path).parent

    def rewrite(m: re.Match[str]) -> str:
        target = (here / m.group(2)).resolve()
        if DOCS in target.parents or target == DOCS:
            return m.group(0)
        if not target.exists():
            raise PluginError(f"{page.file.src_path}: link to {m.group(2)}, which the repository does not have")
        rel = target.relative_to(ROOT).as_posix()
        text = m.group(1)
        return f"{text} (`{rel}`)" if text.strip("`") != rel else f"`{rel}`"

    return _LINK.sub(rewrite, markdown)
