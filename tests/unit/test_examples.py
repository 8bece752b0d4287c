"""examples/quickstart.py without Ray: its keys reach both shards of its 2-shard stream."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_the_quickstart_keys_reach_both_shards_of_a_two_shard_stream() -> None:
    spec = importlib.util.spec_from_file_location("quickstart_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    keys = module.partition_keys(10)
    assert len(keys) == 10
    # CreateStream with 2 shards splits the 128-bit hash key range at 2**127; a key goes by its MD5.
    halves = {int(hashlib.md5(k.encode()).hexdigest(), 16) >= 2**127 for k in keys}
    assert halves == {True, False}, keys
