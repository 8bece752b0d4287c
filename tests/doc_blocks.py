"""The Python code blocks of README.md and docs/*.md, and which of them a test runs.

README.md: every ```python block runs, unless the line before its fence is
``<!-- docs: shown only -->`` (it needs kinesalite, kinesis-mock, a cluster, or names that are
not in the package yet). docs/*.md: a block runs only when the line before its fence is
``<!-- docs: runnable -->`` (most of the site's blocks are fragments).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOWN_ONLY = "<!-- docs: shown only -->"
RUNNABLE = "<!-- docs: runnable -->"
_FENCE = re.compile(r"^```python\s*$")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository
    line: int  # 1-based line of the opening fence
    code: str
    marker: str | None  # SHOWN_ONLY, RUNNABLE or None

    @property
    def runs(self) -> bool:
        if self.path == "README.md":
            return self.marker != SHOWN_ONLY
        return self.marker == RUNNABLE


def blocks(path: Path) -> list[Block]:
    """Every ```python block of one Markdown file, with the marker on the line before it."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if _FENCE.match(lines[i]):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = lines[i - 1].strip() if i else ""
            marker = before if before in (SHOWN_ONLY, RUNNABLE) else None
            out.append(Block(path.relative_to(ROOT).as_posix(), i + 1, "\n".join(lines[i + 1:end]), marker))
            i = end
        i += 1
    return out


def all_blocks() -> list[Block]:
    """The blocks of README.md and of every page of the site."""
    return [b for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] for b in blocks(p)]
