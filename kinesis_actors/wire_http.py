"""Keep-alive HTTP/1.1 to one endpoint for the ``GetRecords`` POSTs: :class:`WirePool`.

Why not urllib3 here: an idle shard at the tip polls once a second, and most of what it
then costs is per call, not per byte: urllib3's pool, ``Retry`` and ``Timeout`` objects and
its ``HTTPResponse``, and ``http.client``'s header parsing through ``email.parser`` (h11, a
sans-IO HTTP/1.1 library, spends the same on validating and normalising headers that
botocore has already built and the service has already framed).

The rule it is kept by: this client stays only while it saves at least 20 % of the Ray
processes' CPU per idle request against urllib3 (``KINESIS_ACTORS_WIRE_HTTP=0``, see
:data:`~kinesis_actors.wire.HTTP_ENV`), measured in one run with ``python -m bench.idle
--shards 256``, the two alternating (steady CPU per MB, ``python -m bench --only
throughput``, measured beside it). The figures it was kept by are in ``bench/runs/README.md``
(section "wire_http against urllib3") and ``bench/runs/2026-12-06_wire_http_*``; should a
later run show less, ``GetRecords`` goes through urllib3 as the fan-out path does.

So the HTTP/1.1 framing is done here, and only what these exchanges need: one request
(``POST``, botocore's signed headers with their ``Content-Length``, the body) written
with one ``sendall``; the answer's status line and headers, then a ``Content-Length``,
chunked or read-to-close body. Anything else (a malformed status line or header, a head
over 64 KiB, a broken chunk, the connection closed early) closes the connection and
raises ``ConnectionClosedError``, as a protocol error does through urllib3.

What it keeps from urllib3's behaviour as botocore configures it: connections kept
alive and reused (at most ``maxsize`` idle ones; more may be open at once, as urllib3's
non-blocking pool allows), a connection the server closed while idle is not reused
(checked before each reuse), TCP_NODELAY, TLS with botocore's CA bundle and the host
name checked, the connect and read timeouts, and botocore's exception classes for each
failure (:meth:`WirePool.post`). Proxies are not handled here: :func:`~.wire.wire_get_records`
leaves a client with a proxy to botocore's own path.
"""

from __future__ import annotations

import collections
import socket
import ssl
import threading
import weakref
from collections.abc import Iterable
from urllib.parse import urlsplit

from urllib3.util.wait import wait_for_read

__all__ = ["WirePool"]

_RECV = 256 * 1024
_MAX_HEAD = 64 * 1024
_DIGITS = "0123456789"
_HEX = b"0123456789abcdefABCDEF"


class _Conn:
    """One socket, one request at a time, and the bytes read past the last answer.

    ``buf[pos:]`` is what was read and not yet consumed: taking bytes moves ``pos`` instead of
    copying the rest of the buffer, so a chunked body of many small chunks read in 256 KiB
    pieces costs one copy per chunk, not one of the whole remaining buffer per chunk. A
    buffer read to its end is dropped at once (:meth:`_take`): a connection idle in the pool
    keeps no read of up to 256 KiB alive."""

    __slots__ = ("buf", "pos", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.pos = 0

    def dropped(self) -> bool:
        """True if the server closed the idle connection (or sent anything unasked)."""
        if len(self.buf) > self.pos:
            return True
        try:  # urllib3's own check before reuse: poll where there is one (select refuses fds >= 1024)
            return wait_for_read(self.sock, timeout=0)
        except (OSError, ValueError):
            return True

    def recv(self) -> bytes:
        data = self.sock.recv(_RECV)
        if not data:
            raise _Closed("the server closed the connection before the whole answer")
        return data

    def _more(self) -> None:
        """Append one read to the unconsumed bytes (dropping the consumed ones)."""
        self.buf, self.pos = self.buf[self.pos:] + self.recv(), 0

    def _until(self, sep: bytes, what: str) -> bytes:
        """The bytes before the next ``sep`` (consumed with it); at most 64 KiB before it."""
        while (end := self.buf.find(sep, self.pos)) < 0:
            if len(self.buf) - self.pos > _MAX_HEAD:
                raise _Closed(f"{what} is larger than 64 KiB")
            self._more()
        if end - self.pos > _MAX_HEAD:
            raise _Closed(f"{what} is larger than 64 KiB")
        out = self.buf[self.pos:end]
        self._take(end + len(sep))
        return out

    def _take(self, end: int) -> None:
        """Consume the buffer up to ``end``; an emptied buffer is let go."""
        if end >= len(self.buf):
            self.buf, self.pos = b"", 0
        else:
            self.pos = end

    def head(self) -> bytes:
        """Read up to the blank line that ends the status line and headers; returns them."""
        return self._until(b"\r\n\r\n", "the answer's head")

    def exactly(self, n: int) -> bytes:
        """The next ``n`` bytes."""
        buf, pos = self.buf, self.pos
        if len(buf) - pos >= n:
            self._take(pos + n)
            return buf[pos:pos + n]
        chunks = [buf[pos:]]
        have = len(chunks[0])
        while have < n:
            data = self.recv()
            chunks.append(data)
            have += len(data)
        whole = b"".join(chunks)
        self.buf, self.pos = whole[n:], 0
        return whole[:n]  # the whole object itself when nothing was read past the answer

    def line(self) -> bytes:
        return self._until(b"\r\n", "a chunk size line")

    def chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size_text = self.line().split(b";", 1)[0].strip()
            if not size_text or size_text.strip(_HEX):  # int() would also take "+5", "0x5", "5_0"
                raise _Closed(f"a bad chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                while self.line():  # trailers, then the blank line
                    pass
                return b"".join(parts)
            parts.append(self.exactly(size))
            if self.exactly(2) != b"\r\n":
                raise _Closed("a chunk not followed by CRLF")

    def to_close(self) -> bytes:
        parts = [self.buf[self.pos:]]
        self.buf, self.pos = b"", 0
        while data := self.sock.recv(_RECV):
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Closed(ConnectionError):
    """The connection closed or broke the protocol before the whole answer."""


class WirePool:
    """Kept-alive HTTP/1.1 connections to one ``http``/``https`` endpoint (thread-safe).

    Args:
        url: the endpoint, ``scheme://host[:port]/...`` (the path is not used here).
        connect_timeout_s, read_timeout_s: seconds (botocore's ``connect_timeout`` and
            ``read_timeout``; None waits for ever).
        maxsize: idle connections kept, at most (botocore's ``max_pool_connections``).
        ca_certs: CA bundle for ``https`` (botocore's), or None for the system's.

    Raises:
        ValueError: the URL's scheme is not ``http`` or ``https``.
    """

    def __init__(self, url: str, *, connect_timeout_s: float | None, read_timeout_s: float | None,
                 maxsize: int, ca_certs: str | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) endpoint: {url!r}")
        self.url = url
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = ssl.create_default_context(cafile=ca_certs) if parts.scheme == "https" else None
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._maxsize = max(1, maxsize)
        self._idle: collections.deque[_Conn] = collections.deque()
        self._lock = threading.Lock()
        # the idle sockets close when the pool is collected (urllib3's pools do the same)
        weakref.finalize(self, _close_all, self._idle)

    def post(self, target: str, headers: list[tuple[str, str]], body: bytes) -> tuple[int, dict[str, str], bytes]:
        """One POST of ``body`` to ``target`` (the request path) with ``headers`` (which
        must hold ``Host`` and ``Content-Length``); blocking.

        Returns:
            (status, headers with lower-case names, body).

        Raises (botocore's classes, as its urllib3 session raises them):
            EndpointConnectionError: the connection could not be made (refused, no route,
                the name did not resolve). ConnectTimeoutError: connecting took longer than
                the connect timeout. SSLError: the TLS handshake failed.
            ReadTimeoutError: the answer took longer than the read timeout.
            ConnectionClosedError: the connection closed, or broke the protocol, before
                the whole answer arrived.
        """
        from botocore import exceptions as bx

        conn = self._get()
        request = "".join([f"POST {target} HTTP/1.1\r\n", *(f"{k}: {v}\r\n" for k, v in headers), "\r\n"])
        try:
            try:
                conn.sock.sendall(request.encode("latin-1") + body)
                status, answer_headers, content, reusable = self._receive(conn)
            except TimeoutError as e:
                raise bx.ReadTimeoutError(endpoint_url=self.url, error=e) from e
            except (OSError, UnicodeError) as e:
                raise bx.ConnectionClosedError(endpoint_url=self.url, error=e) from e
        except BaseException:
            conn.close()
            raise
        if reusable:
            self._put(conn)
        else:
            conn.close()
        return status, answer_headers, content

    @staticmethod
    def _receive(conn: _Conn) -> tuple[int, dict[str, str], bytes, bool]:
        """(status, headers with lower-case names, body, whether the connection may be reused)."""
        while True:
            lines = conn.head().decode("latin-1").split("\r\n")
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or len(code) != 3 or code.strip(_DIGITS) or rest[3:4] not in ("", " "):
                raise _Closed(f"a bad status line {lines[0][:40]!r}")
            status = int(code)
            if status >= 200 or status == 101:
                break  # 1xx (100 Continue): the real answer follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _Closed(f"a bad header line {line[:40]!r}")
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        reusable = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        length = headers.get("content-length")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            # with a Content-Length too the framing is ambiguous (RFC 9112, 6.1): not reused
            return status, headers, conn.chunked(), reusable and length is None
        if length is not None:
            # str.isdigit() also takes "²"; int() refuses over 4,300 digits (ValueError)
            if not length or length.strip(_DIGITS) or len(length) > 18:
                raise _Closed(f"a bad Content-Length {length[:20]!r}")
            return status, headers, conn.exactly(int(length)), reusable
        if status in (204, 304):
            return status, headers, b"", reusable
        return status, headers, conn.to_close(), False

    def _get(self) -> _Conn:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.dropped():
                    return conn
                conn.close()
        return self._connect()

    def _put(self, conn: _Conn) -> None:
        with self._lock:
            if len(self._idle) < self._maxsize:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self) -> _Conn:
        from botocore import exceptions as bx

        try:
            sock = socket.create_connection((self._host, self._port), timeout=self._connect_timeout)
        except TimeoutError as e:
            raise bx.ConnectTimeoutError(endpoint_url=self.url, error=e) from e
        except (OSError, UnicodeError) as e:  # UnicodeError: a host name IDNA refuses
            raise bx.EndpointConnectionError(endpoint_url=self.url, error=e) from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._host)
        except TimeoutError as e:
            sock.close()
            raise bx.ConnectTimeoutError(endpoint_url=self.url, error=e) from e
        except ssl.SSLError as e:
            sock.close()
            raise bx.SSLError(endpoint_url=self.url, error=e) from e
        except OSError as e:
            sock.close()
            raise bx.EndpointConnectionError(endpoint_url=self.url, error=e) from e
        sock.settimeout(self._read_timeout)
        return _Conn(sock)

    def close(self) -> None:
        """Close the idle connections; later posts open new ones."""
        with self._lock:
            idle = list(self._idle)
            self._idle.clear()
        _close_all(idle)

    def __repr__(self) -> str:
        return f"WirePool({self.url!r}, idle={len(self._idle)})"


def _close_all(conns: Iterable[_Conn]) -> None:
    for conn in list(conns):
        conn.close()
