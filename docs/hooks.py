"""MkDocs hooks: links from a page to a repository file outside ``docs/`` (``../cluster/README.md``).

MkDocs only knows the files under ``docs/``; a page may still point at a file of the repository
(``cluster/README.md``, ``examples/quickstart.py``). Such a link is rewritten to the file's path
as inline code, and a link to a repository file that does not exist fails the build, so the
strict build keeps catching broken links.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
_LINK = re.compile(r"\[([^\]]+)\]\(((?:\.\./)+[^)#\s]+)(#[^)]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Rewrite links that leave ``docs/`` into code spans naming the repository path."""
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
