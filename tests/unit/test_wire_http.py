"""WirePool (kinesis_actors.wire_http): the HTTP/1.1 framing of the GetRecords path, against a
scripted loopback server (a thread; no emulator, no Ray): kept-alive reuse, chunked and
read-to-close bodies, 100 Continue, and botocore's exception for each failure."""

from __future__ import annotations

import contextlib
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore import exceptions as bx

from kinesis_actors.wire_http import WirePool

Answer = Callable[[socket.socket, bytes], bool]  # writes an answer to a request; False closes


class Server:
    """Accepts connections on 127.0.0.1; each request (head + Content-Length body) is
    answered by the next function of ``answers``."""

    def __init__(self, answers: list[Answer], tls: ssl.SSLContext | None = None) -> None:
        self.answers = list(answers)
        self.tls = tls
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"{'https' if tls else 'http'}://localhost:{self.sock.getsockname()[1]}/"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):
                conn.close()
                return
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length:")))
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append(head + b"\r\n\r\n" + body)
                if not self.answers.pop(0)(conn, body):
                    return

    def close(self) -> None:
        self.sock.close()


def reply(raw: bytes, *, keep: bool = True) -> Answer:
    def answer(conn: socket.socket, body: bytes) -> bool:
        conn.sendall(raw)
        return keep
    return answer


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


@pytest.fixture
def serve() -> Any:
    servers: list[Server] = []

    def start(*answers: Answer) -> tuple[Server, WirePool]:
        server = Server(list(answers))
        servers.append(server)
        return server, WirePool(server.url, connect_timeout_s=2.0, read_timeout_s=1.0, maxsize=2, ca_certs=None)

    yield start
    for s in servers:
        s.close()


def post(pool: WirePool, body: bytes = b'{"a":1}') -> tuple[int, dict[str, str], bytes]:
    host = pool.url.split("//")[1].rstrip("/")
    return pool.post("/", [("Host", host), ("Content-Length", str(len(body)))], body)


def test_a_kept_alive_connection_carries_the_next_request(serve: Any) -> None:
    server, pool = serve(reply(ok(b"one", "x-amzn-RequestId: r1\r\n")), reply(ok(b"two")))
    assert post(pool, b"first") == (200, {"content-length": "3", "x-amzn-requestid": "r1"}, b"one")
    assert post(pool, b"second")[2] == b"two"
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST / HTTP/1.1\r\n") and server.requests[0].endswith(b"\r\n\r\nfirst")
    pool.close()


def test_a_large_body_arrives_across_many_reads(serve: Any) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB
    _, pool = serve(reply(ok(big)))
    assert post(pool)[2] == big


@pytest.mark.parametrize(("length", "connections"), [("", 1), ("Content-Length: 3\r\n", 2)])
def test_a_chunked_body_is_read_and_reused_unless_a_content_length_makes_it_ambiguous(
        serve: Any, length: str, connections: int) -> None:
    raw = (f"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n{length}\r\n".encode()
           + b"4;x=y\r\nabcd\r\n3\r\nefg\r\n0\r\nT: 1\r\n\r\n")  # an extension, a trailer
    server, pool = serve(reply(raw), reply(ok(b"next")))
    assert post(pool)[2] == b"abcdefg"
    assert post(pool)[2] == b"next" and server.connections == connections


def test_many_small_chunks_in_one_read_are_joined_in_order_and_the_connection_reused(serve: Any) -> None:
    # 3,000 chunks of 1-3 bytes: most arrive in one 256 KiB read, each taken from it in turn
    pieces = [bytes([65 + i % 26]) * (1 + i % 3) for i in range(3000)]
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")
    server, pool = serve(reply(raw), reply(ok(b"next")))
    assert post(pool)[2] == b"".join(pieces)
    assert post(pool)[2] == b"next" and server.connections == 1


def test_connection_close_and_http_1_0_are_not_reused(serve: Any) -> None:
    server, pool = serve(reply(ok(b"a", "Connection: close\r\n"), keep=False),
                         reply(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nb", keep=False), reply(ok(b"c")))
    assert [post(pool)[2] for _ in range(3)] == [b"a", b"b", b"c"]
    assert server.connections == 3


def test_a_body_without_a_length_is_read_to_the_close(serve: Any) -> None:
    server, pool = serve(reply(b"HTTP/1.1 200 OK\r\n\r\nto the end", keep=False), reply(ok(b"x")))
    assert post(pool)[2] == b"to the end"
    assert post(pool)[2] == b"x" and server.connections == 2


def test_100_continue_is_skipped(serve: Any) -> None:
    _, pool = serve(reply(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after")))
    assert post(pool)[::2] == (200, b"after")


def test_an_error_status_is_returned_with_its_headers(serve: Any) -> None:
    body = b'{"__type":"ExpiredIteratorException"}'
    _, pool = serve(reply(f"HTTP/1.1 400 Bad Request\r\nContent-Length: {len(body)}\r\nX-Amzn-ErrorType: E\r\n\r\n"
                          .encode() + body))
    assert post(pool) == (400, {"content-length": str(len(body)), "x-amzn-errortype": "E"}, body)


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",  # a bad status line
    b"SPDY/3 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",  # a bad header line
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",  # "superscript two": str.isdigit() is True
    b"HTTP/1.1 200 OK\r\nContent-Length: " + b"0" * 4300 + b"2\r\n\r\n{}",  # int(): ValueError over 4,300 digits
    b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 \xb2\xb2\xb2 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabcde\r\n0\r\n\r\n",  # int() takes a sign
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nabcde\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # closed mid-body
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # a bad chunk size
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",  # no CRLF after the chunk
    b"HTTP/1.1 200 OK\r\nContent-Le",  # closed mid-head
])
def test_a_broken_answer_raises_connection_closed_and_drops_the_connection(serve: Any, raw: bytes) -> None:
    server, pool = serve(reply(raw, keep=False), reply(ok(b"fine")))
    with pytest.raises(bx.ConnectionClosedError):
        post(pool)
    assert post(pool)[2] == b"fine" and server.connections == 2


def test_keep_alive_holds_for_socket_descriptors_over_1023(serve: Any) -> None:
    """select.select refuses descriptors >= 1024: a busy process must still reuse connections."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the descriptor limit is under 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    try:
        with contextlib.ExitStack() as pad:
            for _ in range(1030):  # the next sockets get descriptors >= 1024
                pad.enter_context(open("/dev/null"))
            server, pool = serve(reply(ok(b"a")), reply(ok(b"b")), reply(ok(b"c")))
            assert [post(pool)[2] for _ in range(3)] == [b"a", b"b", b"c"]
            assert server.connections == 1
            pool.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_head_over_64_kib_is_refused(serve: Any) -> None:
    raw = b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * 70_000 + b"\r\nContent-Length: 0\r\n\r\n"
    _, pool = serve(reply(raw, keep=False))
    with pytest.raises(bx.ConnectionClosedError):
        post(pool)


def test_a_silent_server_raises_read_timeout(serve: Any) -> None:
    _, pool = serve(lambda conn, body: threading.Event().wait(3.0))
    with pytest.raises(bx.ReadTimeoutError):
        post(pool)


def test_a_refused_connection_raises_endpoint_connection_error() -> None:
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    pool = WirePool(f"http://127.0.0.1:{port}/", connect_timeout_s=1.0, read_timeout_s=1.0, maxsize=1, ca_certs=None)
    with pytest.raises(bx.EndpointConnectionError):
        post(pool)


def test_an_idle_connection_the_server_closed_is_not_reused(serve: Any) -> None:
    server, pool = serve(reply(ok(b"a"), keep=False), reply(ok(b"b")))
    assert post(pool)[2] == b"a"  # kept by the pool; the server then closed its end
    deadline = time.monotonic() + 5.0
    while not pool._idle[0].dropped():  # wait, bounded, for the server's close to reach the kept socket
        assert time.monotonic() < deadline, "the server's close never reached the idle connection"
        time.sleep(0.01)
    assert post(pool)[2] == b"b" and server.connections == 2


def test_a_non_http_url_is_refused() -> None:
    with pytest.raises(ValueError):
        WirePool("ftp://127.0.0.1/", connect_timeout_s=1.0, read_timeout_s=1.0, maxsize=1, ca_certs=None)


def _self_signed(tmp_path: Any) -> tuple[str, str]:
    """A certificate for ``localhost`` and its key, as PEM files."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def test_tls_checks_the_certificate_against_the_ca_bundle(tmp_path: Any) -> None:
    cert, key = _self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server = Server([reply(ok(b"secret")), reply(ok(b"again"))], tls=tls)
    try:
        trusted = WirePool(server.url, connect_timeout_s=2.0, read_timeout_s=2.0, maxsize=1, ca_certs=cert)
        assert post(trusted)[2] == b"secret" and post(trusted)[2] == b"again"
        assert server.connections == 1
        untrusted = WirePool(server.url, connect_timeout_s=2.0, read_timeout_s=2.0, maxsize=1, ca_certs=None)
        with pytest.raises(bx.SSLError):
            post(untrusted)
    finally:
        server.close()


def test_a_host_name_idna_refuses_raises_endpoint_connection_error() -> None:
    pool = WirePool(f"http://{'a' * 64}.example:80/", connect_timeout_s=1.0, read_timeout_s=1.0, maxsize=1,
                    ca_certs=None)
    with pytest.raises(bx.EndpointConnectionError):
        post(pool)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_answers_split_at_random_read_boundaries_are_framed_exactly(seed: int) -> None:
    # random Content-Length and chunked answers (1-300,000-byte chunks, extensions, trailers,
    # a 100 Continue first), each followed by a second answer on the same connection, written
    # in random pieces: every body comes back whole and the second answer intact
    from kinesis_actors.wire_http import _Conn

    rng = random.Random(seed)
    for _ in range(60):
        body = rng.randbytes(rng.choice([0, 1, 5, 3000, 70_000, 300_000, 1_000_000]))
        head = (b"HTTP/1.1 100 Continue\r\n\r\n" if rng.random() < 0.2 else b"") + b"HTTP/1.1 200 OK\r\nX-A: b\r\n"
        if rng.random() < 0.5:
            raw = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        else:
            sizes = [rng.choice([1, 2, 7, 4096, 65_536, 300_000]) for _ in range(len(body) + 1)]
            parts, at = [], 0
            for n in sizes:
                if at >= len(body):
                    break
                piece, at = body[at:at + n], at + n
                parts.append(b"%x%s\r\n%s\r\n" % (len(piece), b";x=y" if rng.random() < 0.1 else b"", piece))
            raw = (head + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(parts) + b"0\r\n"
                   + (b"T: 1\r\n" if rng.random() < 0.3 else b"") + b"\r\n")
        raw += ok(b"next")
        cuts = [*sorted(rng.randrange(len(raw) + 1) for _ in range(rng.randrange(6))), len(raw)]
        a, b = socket.socketpair()
        writer = threading.Thread(target=lambda a=a, raw=raw, cuts=cuts: [a.sendall(raw[x:y]) for x, y in
                                                                       zip([0, *cuts], cuts) if y > x])
        writer.start()
        try:
            b.settimeout(5)
            conn = _Conn(b)
            status, _, got, reusable = WirePool._receive(conn)
            assert (status, bytes(got), reusable) == (200, body, True)
            assert bytes(WirePool._receive(conn)[2]) == b"next"
            writer.join()
            assert not conn.dropped()  # nothing read past the second answer
        finally:
            writer.join()
            a.close()
            b.close()


def test_a_connection_keeps_no_read_once_its_answer_is_consumed(serve: Any) -> None:
    # a small answer arrives in one read with nothing after it: the idle connection in the
    # pool holds no buffer (up to 256 KiB per connection otherwise)
    _, pool = serve(reply(ok(b"x" * 1000)))
    assert post(pool)[2] == b"x" * 1000
    (conn,) = pool._idle
    assert conn.buf == b"" and conn.pos == 0
