"""The README's Python blocks (all but those marked shown only) and the site's blocks marked runnable,
run in order in one fresh Python process against an emulator of their own.

The blocks are written for AWS (``KinesisBroker(region=...)``, boto3's default chain), so the
process gets the emulator through boto3's own settings: the variables the README's ``export`` lines
set (its emulator instructions), ``AWS_ENDPOINT_URL`` pointed at this test's emulator. The blocks
run as a user would paste them; nothing in them is rewritten.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.doc_blocks import ROOT, all_blocks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# Each block runs in a namespace of its own, in the order of the pages; a failure names the block.
RUNNER = """
import json, sys, time, traceback
for b in json.load(sys.stdin):
    t0 = time.monotonic()
    try:
        exec(compile(b["code"], f"{b['path']}:{b['line']}", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
        print(f"FAILED {b['path']}:{b['line']}", flush=True)
        sys.exit(1)
    print(f"--- ran {b['path']}:{b['line']} in {time.monotonic() - t0:.1f} s", flush=True)
print("ALL BLOCKS RAN", flush=True)
"""


def readme_exports() -> dict[str, str]:
    """The variables the README's emulator instructions set: every ``NAME=value`` of its ``export`` lines."""
    words = [w for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("export ")
             for w in line.split("#")[0].split()[1:]]
    return dict(w.split("=", 1) for w in words)


def test_the_readme_and_the_runnable_site_examples_run_on_the_emulator() -> None:
    from kinesis_actors.emulator import Emulator

    runnable = [b for b in all_blocks() if b.runs]
    assert {b.path for b in runnable} >= {"README.md", "docs/getting-started.md"}, runnable
    with Emulator() as emu:
        exports = readme_exports()
        assert {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(exports), exports
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(exports, AWS_ENDPOINT_URL=emu.endpoint, PYTHONPATH=str(ROOT))
        payload = json.dumps([{"path": b.path, "line": b.line, "code": b.code} for b in runnable])
        proc = subprocess.run([sys.executable, "-c", RUNNER], input=payload, capture_output=True, text=True,
                              timeout=240, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "ALL BLOCKS RAN" in proc.stdout, out[-6000:]
    assert "read 2000" in proc.stdout, out[-3000:]  # the pull block read every record put_many wrote
    assert "sink ValueError" in proc.stdout, out[-3000:]  # the dead letter names the sink's error
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("--- ran")))
