"""The emulator's server: moto's dispatcher app on a werkzeug server bound to loopback,
counting the requests it serves (:data:`REQUESTS_PATH`); :func:`serve` runs it in the
calling process (the child of :class:`~kinesis_actors.emulator.Emulator`, or the
``kinesis-actors emulator`` command)."""

from __future__ import annotations

import io
import ipaddress
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from ..errors import InvalidError
from .patches import patch_moto

__all__ = ["serve", "DEFAULT_HOST", "REQUESTS_PATH"]

log = logging.getLogger("kinesis_actors.emulator")

DEFAULT_HOST = "127.0.0.1"
_LISTEN_BACKLOG = 1024


def check_host(host: str) -> None:
    try:
        is_loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        is_loopback = False
    if not is_loopback:
        raise InvalidError(f"emulator host must be a loopback IP address such as 127.0.0.1, not {host!r}")


def check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidError(f"emulator port must be an int in 0..65535 (0 = any free port), not {port!r}")


def _format_endpoint(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


REQUESTS_PATH = "/_kinesis_actors/requests"
"""``GET`` on the emulator: JSON ``{"total": n, "by_operation": {"GetRecords": n, ...}}``,
the requests served since it started (this path itself not counted)."""


class _RequestCounter:
    """WSGI middleware: counts requests by AWS operation (``X-Amz-Target``), serves the
    counts at :data:`REQUESTS_PATH`. Counting costs a dict increment under a lock."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == REQUESTS_PATH:
            with self.lock:
                counts = dict(self.counts)
            body = json.dumps({"total": sum(counts.values()), "by_operation": counts}).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]
        target = environ.get("HTTP_X_AMZ_TARGET")  # e.g. "Kinesis_20131202.GetRecords"
        operation = target.rsplit(".", 1)[-1] if target else "(other)"
        with self.lock:
            self.counts[operation] = self.counts.get(operation, 0) + 1
        # The whole response before any of it is written: an app failing part-way then fails
        # before the headers went out (werkzeug answers 500), never after a Content-Length
        # on a kept-alive connection (the client would wait for the rest until its timeout).
        result = self.app(environ, start_response)
        try:
            return [b"".join(result)]
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()


class _KeepAlive:
    """werkzeug request-handler mixin: HTTP/1.1 keep-alive, as the real service keeps
    connections open, where werkzeug's development server closes every connection.

    werkzeug ends each response with ``Connection: close`` because after the app it drains
    whatever the socket still holds, which on a kept-alive connection would be the next
    request. Here the request body (exactly ``Content-Length`` bytes) is read before the
    app runs, and the app reads it from memory; werkzeug's drain then finds that buffer
    empty and stops, leaving the next request in the socket. Requests with a chunked body,
    ``Expect: 100-continue``, HTTP/1.0, the client's ``Connection: close``, or a
    ``Content-Length`` repeated or not in ASCII digits keep werkzeug's behaviour, as does
    any answer sent outside ``run_wsgi`` (http.server's own errors). ``TCP_NODELAY``: the
    status line, headers and body are separate writes, and with Nagle on a kept-alive
    connection would wait for the client's delayed ACK (40 ms)."""

    _keep_alive = False  # True while run_wsgi answers a request on a connection kept open

    def setup(self) -> None:
        super().setup()  # type: ignore[misc]
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[attr-defined]

    def _body_length(self) -> int | None:
        """The request body's length if the connection may stay open after the answer, else None."""
        headers = self.headers  # type: ignore[attr-defined]
        if self.request_version != "HTTP/1.1" or self.close_connection:  # type: ignore[attr-defined]
            return None
        if "Transfer-Encoding" in headers or "Expect" in headers:
            return None
        lengths = headers.get_all("Content-Length") or ["0"]
        if len(lengths) != 1 or not (lengths[0].isascii() and lengths[0].isdigit()):
            return None
        return int(lengths[0])

    def run_wsgi(self) -> None:
        length = self._body_length()
        if length is None:
            super().run_wsgi()  # type: ignore[misc]
            return
        sock_file = self.rfile
        self.rfile: Any = io.BytesIO(sock_file.read(length))
        self._keep_alive = True
        try:
            super().run_wsgi()  # type: ignore[misc]
        finally:
            self.rfile = sock_file
            self._keep_alive = False  # an error answer to the next request (before run_wsgi) closes

    def send_header(self, keyword: str, value: str) -> None:
        if self._keep_alive and keyword.lower() == "connection" and value.lower() == "close":
            return
        super().send_header(keyword, value)  # type: ignore[misc]


def _make_server(host: str, port: int, *, threaded: bool = True) -> Any:
    """A werkzeug server for moto's dispatcher app (threaded unless ``threaded=False``: one
    request at a time, as many test setups run moto), bound (listening) on host:port.

    Raises:
        OSError: host:port cannot be bound (e.g. EADDRINUSE).
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    werkzeug_log = logging.getLogger("werkzeug")
    if werkzeug_log.level == logging.NOTSET:
        werkzeug_log.setLevel(logging.WARNING)  # no line per request unless asked for

    class _QuietHandler(_KeepAlive, MotoRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if werkzeug_log.isEnabledFor(logging.INFO):
                super().log_request(code, size)

    app = _RequestCounter(DomainDispatcherApplication(create_backend_app))
    # Bind the socket ourselves: werkzeug prints to stderr and sys.exit(1)s when the
    # port is taken, where we want an OSError.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_LISTEN_BACKLOG)
        return make_server(host, port, app, threaded=threaded, request_handler=_QuietHandler, fd=sock.fileno())
    finally:
        sock.close()  # the server holds its own duplicate of the descriptor


def serve(host: str = DEFAULT_HOST, port: int = 0, ready: Callable[[str], None] | None = None, *,
          threaded: bool = True) -> None:
    """Run the patched moto server in this process until interrupted (blocking).

    Patches moto (see the module docstring), binds ``host:port``, calls
    ``ready(endpoint)`` once the socket is listening, then serves requests on a
    threaded werkzeug server. Prints nothing itself; it logs through ``logging``.
    When called from the main thread it returns on KeyboardInterrupt or SIGTERM
    (the previous SIGTERM handler is restored); from another thread it only
    returns when the process is interrupted.

    Args:
        host: loopback IP address to bind (``127.0.0.1`` by default).
        port: TCP port; 0 picks a free one (the chosen port is in the endpoint).
        ready: called once with the endpoint URL (``"http://127.0.0.1:<port>"``)
            when the server is listening; exceptions from it propagate.
        threaded: a thread per request (default); False serves one request at a time.

    Raises:
        InvalidError: host is not a loopback IP address, or port is out of range.
        MotoPatchError: moto is missing or its internals changed shape.
        OSError: the address cannot be bound (e.g. the port is in use).
    """
    check_host(host)
    check_port(port)
    patch_moto()
    server = _make_server(host, port, threaded=threaded)
    bound_port = server.server_address[1]
    endpoint = _format_endpoint(host, bound_port)
    os.environ.setdefault("MOTO_PORT", str(bound_port))  # moto builds some URLs from it

    in_main = threading.current_thread() is threading.main_thread()
    previous: Any = None
    if in_main:

        def _on_sigterm(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        log.info("moto emulator (Kinesis + DynamoDB) listening on %s", endpoint)
        if ready is not None:
            ready(endpoint)
        server.serve_forever(poll_interval=0.2)  # werkzeug returns quietly on KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        server.server_close()
        log.info("moto emulator on %s stopped", endpoint)
