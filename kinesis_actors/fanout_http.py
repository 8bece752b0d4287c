"""Enhanced fan-out's transport: one ``SubscribeToShard`` over HTTP/1.1 (:class:`HttpSubscriber`),
its body as an :class:`EventSource` of raw event-stream bytes. Also importable from
:mod:`kinesis_actors.fanout` (whose docstring explains the wire format and the HTTP/2 seam).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol

import urllib3

from .errors import KinesisError
from .wire import loads

__all__ = ["EventSource", "Subscribe", "HttpSubscriber"]

log = logging.getLogger("kinesis_actors.fanout")

_READ_CHUNK = 256 * 1024


class EventSource(Protocol):
    """The body of one accepted ``SubscribeToShard``: raw event-stream bytes."""

    def read(self) -> bytes:
        """The next bytes that arrived (blocking until some do, within the read timeout);
        ``b""`` when the subscription ended. Raises on a dropped connection or a timeout."""
        ...

    def close(self) -> None:
        """End the subscription now (thread-safe; wakes a :meth:`read` in progress)."""
        ...


Subscribe = Callable[[dict[str, Any]], EventSource]
"""Opens one subscription: ``subscribe(params)`` with boto3's ``subscribe_to_shard``
keyword arguments (``ConsumerARN``, ``ShardId``, ``StartingPosition``). Returns once the
service accepted it (HTTP 200); raises a botocore ``ClientError`` (with the AWS code) when
refused, or a network error."""


class _SignedRequest(BaseException):
    """Carries the request botocore signed out of ``subscribe_to_shard`` (a BaseException,
    so botocore's ``except Exception`` around the send does not retry or wrap it)."""

    def __init__(self, request: Any) -> None:
        super().__init__("SubscribeToShard request captured")
        self.request = request


def _capture_subscribe(request: Any, **_: Any) -> None:
    raise _SignedRequest(request)


class _HttpEvents:
    """:class:`EventSource` over a streaming urllib3 response."""

    def __init__(self, response: Any, pool: Any) -> None:
        self._response = response
        self._pool = pool
        connection = getattr(response, "connection", None)
        self._sock: socket.socket | None = getattr(connection, "sock", None)
        self._closed = False
        self._lock = threading.Lock()

    def read(self) -> bytes:
        if self._closed:
            return b""
        data: bytes = self._response.read1(_READ_CHUNK)
        return data

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread
            except OSError as e:  # already closed by the peer
                log.debug("shutting down a subscription's socket: %r", e)
        try:
            self._response.close()
        except (OSError, urllib3.exceptions.HTTPError) as e:  # the socket was shut down above
            log.debug("closing a subscription's response: %r", e)
        self._pool.clear()


class HttpSubscriber:
    """The HTTP/1.1 :data:`Subscribe` over a boto3 Kinesis client (see the module docstring).

    botocore serialises and signs ``SubscribeToShard`` (a ``before-send`` hook, registered
    once per client, takes the signed request out before botocore sends it); urllib3 sends
    it on a connection of its own (one per subscription), with the client's connect and
    read timeouts, botocore's CA bundle, and without retries (the fetcher decides).
    Proxies from the environment (``HTTPS_PROXY``) are not used for subscriptions.

    Args:
        client: a boto3 Kinesis client (its endpoint, region, credentials and timeouts).

    Raises (from a call):
        botocore.exceptions.ClientError: the service refused the subscription (HTTP status
            and the AWS code from the JSON body's ``__type``).
        urllib3 errors, OSError: the connection failed.
    """

    def __init__(self, client: Any) -> None:
        import urllib3
        from botocore.httpsession import get_cert_path

        self._client = client
        config = client.meta.config
        self._timeout = urllib3.Timeout(connect=config.connect_timeout, read=config.read_timeout)
        self._urllib3 = urllib3
        self._ca_certs = get_cert_path(True)
        client.meta.events.register("before-send.kinesis.SubscribeToShard", _capture_subscribe,
                                    unique_id="kinesis-actors-subscribe-to-shard")

    def __call__(self, params: dict[str, Any]) -> EventSource:
        from botocore.exceptions import ClientError

        try:
            self._client.subscribe_to_shard(**params)
        except _SignedRequest as captured:
            request = captured.request
        else:  # pragma: no cover - the hook always raises
            raise KinesisError("SubscribeToShard was sent without the event-stream hook")
        pool = self._urllib3.PoolManager(num_pools=1, maxsize=1, timeout=self._timeout, retries=False,
                                         ca_certs=self._ca_certs)
        response = pool.request(request.method, request.url, body=request.body, headers=dict(request.headers),
                                preload_content=False, retries=False)
        if response.status == 200:
            return _HttpEvents(response, pool)
        body = response.read()
        response.close()
        pool.clear()
        try:
            error = loads(body or b"{}")
        except ValueError:
            error = {}
        code = str(error.get("__type") or f"HTTP{response.status}").rpartition("#")[2]
        message = str(error.get("message") or error.get("Message") or code)
        raise ClientError({"Error": {"Code": code, "Message": message},
                           "ResponseMetadata": {"HTTPStatusCode": response.status}}, "SubscribeToShard")
