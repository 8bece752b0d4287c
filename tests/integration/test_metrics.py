"""Metrics on Ray's Prometheus endpoint agree with Subscription.stats() (no dashboard needed)."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator

import pytest
import ray

from kinesis_actors import KinesisBroker, KinesisStream, StartAt

from .helpers import Collector, create_stream, wait_until

pytestmark = pytest.mark.usefixtures("ray_session")

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")


def metrics_url() -> str:
    ports = [n.get("MetricsExportPort") for n in ray.nodes() if n.get("Alive")]
    if not ports or not ports[0]:
        pytest.skip("this Ray node exports no Prometheus metrics")
    return f"http://127.0.0.1:{ports[0]}/metrics"


def scrape(url: str, name: str, stream: str) -> dict[str, float]:
    """Sum of ``name`` per shard id (or ``""`` for per-instance metrics) for one stream."""
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        m = _LINE.match(line)
        if not m or m["name"] != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        if labels.get("stream") != stream:
            continue
        key = labels.get("shard_id", "")
        out[key] = out.get(key, 0.0) + float(m["value"])
    return out


@pytest.fixture
def conn(endpoint: str) -> Iterator[KinesisBroker]:
    broker = KinesisBroker(endpoint=endpoint, region="us-east-1", test_credentials=True,
                           lease_duration_s=4.0, renew_interval_s=1.0).connect()
    yield broker
    broker.shutdown()


def test_per_shard_and_per_instance_metrics_reach_prometheus(conn: KinesisBroker, endpoint: str, unique: str) -> None:
    url = metrics_url()
    stream = f"metrics-{unique}"
    create_stream(endpoint, stream, 2)
    conn.publisher(stream).put_many([(f"m-{i}".encode(), f"k{i}") for i in range(60)])
    sink = Collector.remote()
    with conn.subscribe(KinesisStream(stream, start_at=StartAt.trim_horizon(), shard_sync_interval_s=1.0,
                                      lease_poll_interval_s=0.3), sink=sink) as sub:
        wait_until(lambda: len(ray.get(sink.payloads.remote())) >= 60, timeout_s=30, what="60 records delivered")
        stats = wait_until(lambda: (s := sub.stats()) and sum(v["records"] for v in s["shards"].values()) == 60 and s,
                           timeout_s=20, what="stats at 60")
        per_shard = {sid: v["records"] for sid, v in stats["shards"].items()}
        assert all("checkpoint_age_s" in v for v in stats["shards"].values())
        # Ray ships metrics every few seconds: wait for the same figures on the endpoint
        wait_until(lambda: scrape(url, "ray_kinesis_actors_records_delivered_total", stream) == per_shard,
                   timeout_s=40, interval_s=1.0, what=f"records_delivered == {per_shard} on {url}")
        assert sum(scrape(url, "ray_kinesis_actors_bytes_delivered_total", stream).values()) == sum(
            v["bytes"] for v in stats["shards"].values())
        wait_until(lambda: scrape(url, "ray_kinesis_actors_leases_held", stream) == {"": float(stats["leases_held"])},
                   timeout_s=20, interval_s=1.0, what="leases_held")
        assert scrape(url, "ray_kinesis_actors_leases_taken_total", stream)[""] >= 2
        assert set(scrape(url, "ray_kinesis_actors_millis_behind_latest", stream)) == set(per_shard)
        assert set(scrape(url, "ray_kinesis_actors_get_records_calls_total", stream)) == set(per_shard)
