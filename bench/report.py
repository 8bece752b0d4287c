"""``python -m bench.report [results.json]``: the Markdown table of a results file (for the README)."""

from __future__ import annotations

import json
import os
import sys

from .common import fmt


def markdown(data: dict) -> str:
    m = data.get("machine", {})
    lines = [
        f"Measured {data.get('date')} on {m.get('cores')} cores, {m.get('memory_gib')} GiB "
        f"(Python {m.get('python')}, Ray {m.get('ray')}, boto3 {m.get('boto3')}, moto {m.get('moto')}; "
        f"`python -m bench`{' --quick' if data.get('mode') == 'quick' else ''}, emulator: moto server).",
        "",
        "| section | figure | value | unit | anchor | ratio | goal | met |",
        "|---|---|---:|---|---|---:|---|---|",
    ]
    for f in data.get("figures", []):
        anchor = f.get("anchor") or ""
        if f.get("anchor_value") is not None:
            anchor = f"{anchor} = {fmt(f['anchor_value'])}"
        ratio = "" if f.get("ratio") is None else f"{f['ratio']:.2f}x"
        met = "" if f.get("goal_met") is None else ("yes" if f["goal_met"] else "**no**")
        lines.append(f"| {f['section']} | {f['name']} | {fmt(f['value'])} | {f['unit']} | {anchor} | {ratio} | "
                     f"{f.get('goal') or ''} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.json")
    with open(path) as f:
        print(markdown(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
