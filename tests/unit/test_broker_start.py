"""SPEC Lifecycle 2: Ray starts at the first subscribe, after DescribeStreamSummary answered, so a
wrong endpoint or a missing stream is named before Ray's start is paid (no Ray in these tests)."""

from __future__ import annotations

import socket
import sys
from typing import Any

import pytest
from botocore.exceptions import ClientError

from kinesis_actors import KinesisBroker, KinesisError, KinesisStream, StreamError
from kinesis_actors.connection import ConnectionState


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: KinesisBroker) -> None:
        raise AssertionError("Ray was started before the stream was checked")

    monkeypatch.setattr(KinesisBroker, "_start_ray", refuse)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on exit: nothing listens there


def ray_running() -> bool:
    """Whether this process has a Ray runtime: under `make test` the integration tier, run earlier in
    the same pytest session, leaves one up, so the tests compare before and after."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def test_connect_does_not_start_ray_and_a_refused_endpoint_is_named(no_ray: None) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    ray_before = ray_running()
    broker = KinesisBroker(endpoint=url, region="us-east-1", test_credentials=True).connect()
    with pytest.raises(KinesisError, match=f"cannot reach {url}"):
        broker.subscribe(KinesisStream("orders", create_if_missing=2))
    assert ray_running() == ray_before
    broker.shutdown()


class MissingStreamKinesis:
    def describe_stream_summary(self, **kwargs: Any) -> Any:
        raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "not found"}},
                          "DescribeStreamSummary")


def test_a_missing_stream_is_named_before_ray_starts(no_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ConnectionState, "client", lambda self, service, **_: MissingStreamKinesis())
    broker = KinesisBroker(endpoint="http://127.0.0.1:4567", region="us-east-1", test_credentials=True).connect()
    with pytest.raises(StreamError, match="'nope' does not exist"):
        broker.subscribe(KinesisStream("nope"))
    broker.shutdown()
