"""A counting HTTP proxy on loopback: forwards every request to one upstream (the emulator's
DynamoDB endpoint) and logs each one by its ``X-Amz-Target`` operation (``UpdateItem``,
``Scan``...), with its time and its request and response sizes.

Pointing a ``DynamoLeaseStore``'s ``endpoint`` at it counts every lease-table request that
the Coordinator and the readers make (they are other processes: botocore hooks in this
process would not see them), on the wire, as AWS would bill them: one request per call
attempt, retries included.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WRITES = frozenset({"UpdateItem", "PutItem", "DeleteItem"})
READS = frozenset({"GetItem", "Query", "Scan"})
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


@dataclass(frozen=True)
class Call:
    """One forwarded request: wall time (s), operation, request and response body bytes, status."""

    time: float
    op: str
    request_bytes: int
    response_bytes: int
    status: int


class CountingProxy:
    """``with CountingProxy(upstream) as proxy: ... proxy.url ... proxy.calls(t0, t1)``."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._host, self._port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self._log: list[Call] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._upstream: list[http.client.HTTPConnection] = []  # closed on exit
        self.dropped = 0  # requests whose client died before their body arrived
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy._forward(self)

            def do_GET(self) -> None:
                proxy._forward(self)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="count-proxy", daemon=True)

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self._host, self._port, timeout=60)
            with self._lock:
                self._upstream.append(conn)
        return conn  # type: ignore[no-any-return]

    def _forward(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length)
        if len(body) < length:  # the client died mid-request (a SIGKILLed reader): nothing to forward
            req.close_connection = True
            with self._lock:
                self.dropped += 1
            return
        target = req.headers.get("X-Amz-Target", "")
        op = target.rsplit(".", 1)[-1] if target else "?"
        headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP}
        for attempt in (1, 2):  # a pooled upstream connection the emulator closed: reconnect once
            conn = self._conn()
            try:
                conn.request(req.command, req.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    req.send_error(502)
                    return
        with self._lock:
            self._log.append(Call(time.time(), op, len(body), len(data), resp.status))
        req.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP:
                req.send_header(k, v)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def calls(self, t0: float = 0.0, t1: float = float("inf")) -> list[Call]:
        """The requests forwarded between wall times ``t0`` and ``t1`` (seconds)."""
        with self._lock:
            return [c for c in self._log if t0 <= c.time <= t1]

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for conn in self._upstream:
                conn.close()
