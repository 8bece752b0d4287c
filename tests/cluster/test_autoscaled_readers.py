"""Readers that need a resource only autoscaled worker nodes have: the Coordinator asks Ray's own
autoscaler (fake multi-node provider) for them, a node is added, the shards are read there, and
after close the request is withdrawn and the node goes idle and away."""

from __future__ import annotations

import pytest

from .fake_autoscaler import FakeAutoscalingHead

DRIVER = r'''
import json, time
import ray
from kinesis_actors import KinesisBroker, KinesisStream, StartAt

def wait(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")

def reader_nodes():
    return {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("kinesis_reader", 0) > 0}

ray.init(address=ADDRESS, logging_level="WARNING")
assert not reader_nodes()
conn = KinesisBroker(endpoint=ENDPOINT, region="us-east-1", test_credentials=True).connect()
t0 = time.monotonic()
sub = conn.subscribe(KinesisStream(STREAM, create_if_missing=1, start_at=StartAt.trim_horizon(),
                                   reader_options={"resources": {"kinesis_reader": 1}},
                                   lease_poll_interval_s=0.5, shard_sync_interval_s=2.0), start_timeout_s=150)
opened_s = time.monotonic() - t0
conn.publisher(STREAM).put_many([(b"r-%d" % i, "k") for i in range(20)])
got = []
deadline = time.monotonic() + 60
while len(got) < 20 and time.monotonic() < deadline:
    got += [r.data for r in sub.next_batch(timeout_s=1.0)]
stats = sub.stats()
nodes = reader_nodes()
reader_node_ids = {r.get("node_id") for r in stats["readers"]}
sub.close()
t1 = time.monotonic()
wait(lambda: not reader_nodes(), 120, "the idle node to go")
print(json.dumps({"opened_s": opened_s, "records": len(got), "reader_nodes": sorted(reader_node_ids),
                  "autoscaled": sorted(nodes), "removed_s": time.monotonic() - t1}))
conn.shutdown()
'''


@pytest.mark.timeout(400)
def test_readers_needing_a_worker_resource_get_a_node_from_the_autoscaler(endpoint: str, unique: str) -> None:
    head = FakeAutoscalingHead(worker_resources={"CPU": 1, "kinesis_reader": 4}).start()
    try:
        got = head.run_driver(f"ENDPOINT = {endpoint!r}\nSTREAM = 'auto-{unique}'\n" + DRIVER, timeout_s=360)
    finally:
        head.stop()
    print(f"autoscaled readers: open {got['opened_s']:.1f} s after subscribe, node gone {got['removed_s']:.1f} s "
          "after close")
    assert got["records"] == 20
    assert got["reader_nodes"] and set(got["reader_nodes"]) <= set(got["autoscaled"])
    assert not head.processes()
