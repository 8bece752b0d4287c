"""Ray's own autoscaler on its fake multi-node provider answers ``request_resources`` here: a node
with the requested custom resource appears, an actor needing it lands there, and the node goes
once the request is withdrawn. This is what the library's reader demand relies on."""

from __future__ import annotations

import pytest

from .fake_autoscaler import FakeAutoscalingHead

DRIVER = r'''
import json, time
import ray
from ray.autoscaler.sdk import request_resources

def wait(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")

def reader_nodes():
    return [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("kinesis_reader", 0) > 0]

ray.init(address=ADDRESS, logging_level="WARNING")
assert not reader_nodes()
t0 = time.monotonic()
request_resources(bundles=[{"kinesis_reader": 1}])
node = wait(reader_nodes, 90, "a node with kinesis_reader")[0]
added_s = time.monotonic() - t0

@ray.remote(num_cpus=0, resources={"kinesis_reader": 1})
class Probe:
    def node(self):
        return ray.get_runtime_context().get_node_id()

probe = Probe.remote()
placed = ray.get(probe.node.remote(), timeout=60)
ray.kill(probe)
t1 = time.monotonic()
request_resources(bundles=[])
wait(lambda: not reader_nodes(), 90, "the idle node to go")
print(json.dumps({"node": node, "placed": placed, "added_s": added_s, "removed_s": time.monotonic() - t1}))
'''


@pytest.mark.timeout(300)
def test_request_resources_makes_the_fake_provider_add_then_remove_a_node() -> None:
    head = FakeAutoscalingHead(worker_resources={"CPU": 1, "kinesis_reader": 4}).start()
    try:
        got = head.run_driver(DRIVER, timeout_s=240)
    finally:
        head.stop()
    print(f"fake autoscaler: node added {got['added_s']:.1f} s after the request, gone {got['removed_s']:.1f} s after"
          " it was withdrawn")
    assert got["placed"] == got["node"]
    assert got["added_s"] < 90 and got["removed_s"] < 90
    assert not head.processes()
