"""Error answers through the fast ``GetRecords`` path equal botocore's: a loopback HTTP
server answers each call with a canned error body (or drops, or stalls), and the same
call is made through ``client.get_records`` and ``WireGetRecords.call``."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from kinesis_actors.aws import AwsSettings
from kinesis_actors.errors import is_throttling, is_unreachable, translate_aws_error
from kinesis_actors.wire import KNOWN_ERROR_CODES, WireGetRecords

ITERATOR = "AAAAAAAAAAGcanned"


class _Canned(BaseHTTPRequestHandler):
    answer: tuple[int, bytes, float, bool] = (200, b"{}", 0.0, False)  # status, body, delay, drop

    hosts: ClassVar[list[list[str]]] = []  # the Host headers of each request received

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).hosts.append(self.headers.get_all("Host") or [])
        status, body, delay, drop = type(self).answer
        if delay:
            time.sleep(delay)
        if drop:
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("x-amzn-RequestId", "req-1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, type[_Canned]]]:
    handler = type("Handler", (_Canned,), {})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def _client(url: str, read_timeout_s: float = 5.0) -> Any:
    return AwsSettings(endpoint=url, test_credentials=True, connect_timeout_s=1.0).client(
        "kinesis", read_timeout_s=read_timeout_s, max_attempts=0)


def _errors(client: Any) -> tuple[BaseException, BaseException]:
    with pytest.raises(Exception) as want:
        client.get_records(ShardIterator=ITERATOR, Limit=100)
    with pytest.raises(Exception) as got:
        WireGetRecords(client).call(ITERATOR, 100, shard_id="shardId-000000000000", stream="s")
    return want.value, got.value


def _same(want: BaseException, got: BaseException) -> None:
    assert type(got) is type(want)
    assert str(got) == str(want)
    assert is_throttling(got) == is_throttling(want) and is_unreachable(got) == is_unreachable(want)
    a, b = (translate_aws_error(e, operation="GetRecords", resource="s/x") for e in (want, got))
    assert (type(a), a.aws_code, a.retriable, str(a)) == (type(b), b.aws_code, b.retriable, str(b))


BODIES = [
    *[(400, {"__type": code, "message": f"canned {code}"}) for code in sorted(KNOWN_ERROR_CODES)
      if not code.startswith(("Internal", "Service"))],
    (400, {"__type": "com.amazonaws.kinesis.v20131202#ExpiredIteratorException", "message": "Iterator expired"}),
    (400, {"__type": "InvalidArgumentException", "message": "Iterator has expired"}),
    (400, {"__type": "ExpiredIteratorException", "Message": "capital M"}),
    (400, {"__type": "ProvisionedThroughputExceededException"}),
    (500, {"__type": "InternalFailure", "message": "boom"}),
    (503, {"__type": "ServiceUnavailable", "message": "later"}),
    (400, {"__type": "SomethingNewException", "message": "an error this module does not know"}),
    (403, {"__type": "UnrecognizedClientException", "message": "bad key"}),
    (500, b""),
    (502, b"<html>Bad gateway</html>"),
]


@pytest.mark.parametrize(("status", "body"), BODIES, ids=[f"{s}-{str(b)[:60]}" for s, b in BODIES])
def test_error_bodies_give_botocore_s_errors(server: tuple[str, type[_Canned]], status: int, body: Any) -> None:
    url, handler = server
    handler.answer = (status, body if isinstance(body, bytes) else json.dumps(body).encode(), 0.0, False)
    want, got = _errors(_client(url))
    _same(want, got)
    w, g = want.response, got.response  # type: ignore[attr-defined]
    assert g["Error"] == w["Error"]
    assert {k: v for k, v in g.items() if k != "ResponseMetadata"} == {k: v for k, v in w.items()
                                                                       if k != "ResponseMetadata"}
    for key in ("HTTPStatusCode", "RequestId", "RetryAttempts"):
        assert g["ResponseMetadata"].get(key) == w["ResponseMetadata"].get(key), key


def test_a_dropped_connection_and_a_read_timeout_give_botocore_s_errors(server: tuple[str, type[_Canned]]) -> None:
    url, handler = server
    handler.answer = (200, b"{}", 0.0, True)
    want, got = _errors(_client(url))
    _same(want, got)
    handler.answer = (200, b"{}", 1.0, False)
    want, got = _errors(_client(url, read_timeout_s=0.3))
    _same(want, got)
    assert is_throttling(got)


def test_a_refused_connection_gives_botocore_s_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    want, got = _errors(_client(f"http://127.0.0.1:{port}"))
    _same(want, got)
    assert is_unreachable(got)


def test_a_canned_end_of_shard_answer_with_child_shards_equals_botocore(server: tuple[str, type[_Canned]]) -> None:
    """AWS's last answer of a closed shard (kinesalite ends one with a null iterator but no
    ``ChildShards``): records, null ``NextShardIterator``, ``ChildShards``."""
    from kinesis_actors.records import records_from_response

    url, handler = server
    body = {"Records": [{"SequenceNumber": "49590338271490256608559692538361571095921575989136588898",
                         "ApproximateArrivalTimestamp": 1.764633769123E9, "Data": "aGVsbG8=",
                         "PartitionKey": "pk", "EncryptionType": "NONE"}],
            "NextShardIterator": None, "MillisBehindLatest": 0,
            "ChildShards": [{"ShardId": "shardId-000000000001", "ParentShards": ["shardId-000000000000"],
                             "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "17014118346046923173168730"}},
                            {"ShardId": "shardId-000000000002", "ParentShards": ["shardId-000000000000"],
                             "HashKeyRange": {"StartingHashKey": "17014118346046923173168731",
                                              "EndingHashKey": "340282366920938463463374607431768211455"}}]}
    handler.answer = (200, json.dumps(body).encode(), 0.0, False)
    client = _client(url)
    boto = client.get_records(ShardIterator=ITERATOR, Limit=100)
    fast = WireGetRecords(client).call(ITERATOR, 100, shard_id="shardId-000000000000", stream="s")
    assert fast["Records"] == records_from_response(boto["Records"], shard_id="shardId-000000000000", stream="s")
    assert fast["Records"][0].data == b"hello"
    assert fast.get("NextShardIterator") is None and boto.get("NextShardIterator") is None
    assert fast["ChildShards"] == boto["ChildShards"] and fast["MillisBehindLatest"] == boto["MillisBehindLatest"]


@pytest.mark.parametrize("hook", ["before-sign", "before-send"])
def test_the_host_sent_is_the_host_of_the_url_a_hook_moved_the_request_to(server: tuple[str, type[_Canned]],
                                                                           hook: str) -> None:
    """The fast path signs a Host header computed once for the endpoint; a hook that moves the request to
    another URL must still send (and, before signing, sign) that URL's Host, as botocore's path does."""
    url, handler = server
    handler.answer = (200, json.dumps({"Records": [], "NextShardIterator": ITERATOR, "MillisBehindLatest": 0}).encode(),
                      0.0, False)
    port = url.rsplit(":", 1)[1]
    client = _client(f"http://localhost:{port}")
    client.meta.events.register(f"{hook}.kinesis.GetRecords",
                                lambda request, **kw: setattr(request, "url", f"http://127.0.0.1:{port}/"))
    handler.hosts.clear()
    client.get_records(ShardIterator=ITERATOR, Limit=1)
    WireGetRecords(client).call(ITERATOR, 1, shard_id="shardId-000000000000", stream="s")
    assert handler.hosts == [[f"127.0.0.1:{port}"]] * 2
