"""SPEC Lifecycle 2: Ray starts at the first subscribe, after DescribeStreamSummary answered, so a
wrong endpoint or a missing stream is named before Ray's start is paid (no Ray in these tests)."""

from __future__ import annotations

import socket
import sys
from typing import Any

import pytest
from botocore.exceptions import ClientError

from kinesis_actors import KinesisBroker, KinesisError, KinesisStream, NotConnectedError, StreamError
from kinesis_actors.connection import ConnectionState


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: KinesisBroker, *args: Any) -> None:
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


# ----------------------------------------------------------------------------- dead letters
def fail_on_aws_or_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any AWS client or any pickling of a publisher fails the test."""
    from kinesis_actors import Publisher

    def no_aws(self: ConnectionState, service: str, **kwargs: Any) -> Any:
        raise AssertionError(f"an AWS {service} client was used before the dead-letter publisher was checked")

    def no_pickle(self: Publisher) -> Any:
        raise AssertionError("the dead-letter publisher was pickled before it was checked")

    monkeypatch.setattr(ConnectionState, "client", no_aws)
    monkeypatch.setattr(Publisher, "__reduce__", no_pickle)


def test_a_dead_letter_publisher_of_an_unconnected_broker_is_refused_by_subscribe(
        no_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    fail_on_aws_or_pickle(monkeypatch)
    url = f"http://127.0.0.1:{closed_port()}"
    other = KinesisBroker(endpoint=url, region="us-east-1", test_credentials=True)  # never connected
    broker = KinesisBroker(endpoint=url, region="us-east-1", test_credentials=True).connect()
    stream = KinesisStream("orders", dead_letter=other.publisher("orders-dlq"), max_sink_retries=1)
    with pytest.raises(NotConnectedError, match=r"dead-letter publisher .*'orders'.*Publisher\('orders-dlq'\).*"
                                                r"not connected yet"):
        broker.subscribe(stream, sink=None)
    other.connect().shutdown()  # and after its broker was shut down
    with pytest.raises(NotConnectedError, match=r"Publisher\('orders-dlq'\).*shut down"):
        broker.subscribe(stream, sink=None)
    assert "orders" not in broker._state.subscriptions  # nothing reserved: a retry may subscribe
    broker.shutdown()


def test_a_dead_letter_publisher_taken_before_connect_works_once_connected(
        no_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same broker's publisher taken before connect() shares its connection: subscribe()
    accepts it and goes on to the stream check (the first AWS call), and it pickles for readers."""
    import pickle

    url = f"http://127.0.0.1:{closed_port()}"
    broker = KinesisBroker(endpoint=url, region="us-east-1", test_credentials=True)
    early = broker.publisher("orders-dlq")
    with pytest.raises(NotConnectedError):
        early.check_connected()
    conn = broker.connect()
    early.check_connected()
    clone = pickle.loads(pickle.dumps(early))  # what a reader receives
    assert clone.stream == "orders-dlq" and clone._state.require().endpoint == url
    fail_on_aws_or_pickle(monkeypatch)
    with pytest.raises(AssertionError, match="an AWS kinesis client was used"):  # past the dead-letter check
        conn.subscribe(KinesisStream("orders", dead_letter=early), sink=None)
    conn.shutdown()
