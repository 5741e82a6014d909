"""Outbound transport against real sockets: pinning, deadlines, caps, no redirects, TLS."""

from __future__ import annotations

import contextlib
import datetime as dt
import gzip
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from ipaddress import ip_network
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pytest_httpserver import HTTPServer

from app.net.guard import GuardPolicy
from app.net.http import MAX_BODY_BYTES, Transport

LOCAL = GuardPolicy(allow_private=True)
BODY = b'{"id":"evt_1","type":"payment.succeeded"}'
HEADERS = {"webhook-id": "evt_1", "content-type": "application/json", "user-agent": "Kurir/t"}
SLACK_S = 1.5


# ------------------------------------------------------------------ a raw test server


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer_port: int
    sni: str | None = None


class Conn:
    """The server side of one accepted connection, handed to handlers."""

    def __init__(self, sock: socket.socket, server: RawServer) -> None:
        self.sock = sock
        self.server = server
        self.buf = b""
        self.peer_port = sock.getpeername()[1]
        self.sni: str | None = None

    def read_request(self) -> Seen | None:
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        body, self.buf = self.buf[:length], self.buf[length:]
        return Seen(method, path, headers, body, self.peer_port, self.sni)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def respond(
        self, status: int = 200, body: bytes = b"ok", headers: dict[str, str] | None = None
    ) -> None:
        head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n"
        for name, value in (headers or {}).items():
            head += f"{name}: {value}\r\n"
        self.send(head.encode("latin-1") + b"\r\n" + body)

    def trickle(self, data: bytes, every_s: float) -> None:
        for i in range(len(data)):
            if self.server.stopping.wait(every_s):
                return
            self.send(data[i : i + 1])


Handler = Callable[[Conn, Seen], bool | None]


class RawServer:
    """A threaded HTTP/1.1 server on 127.0.0.1 whose handlers control every byte sent."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.requests: list[Seen] = []
        self.connections = 0
        self.tls_errors: list[str] = []
        self.stopping = threading.Event()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.settimeout(0.05)
        self.port = int(self.listener.getsockname()[1])
        self._open: list[socket.socket] = []
        self._local = threading.local()
        if tls is not None:
            tls.sni_callback = self._on_sni
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def _on_sni(self, sock: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        self._local.sni = name  # runs in the thread doing this connection's handshake

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            self._open.append(sock)
            threading.Thread(target=self._connection, args=(sock,), daemon=True).start()

    def _connection(self, sock: socket.socket) -> None:
        self._local.sni = None
        try:
            if self.tls is not None:
                try:
                    sock = self.tls.wrap_socket(sock, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    self.tls_errors.append(str(exc))
                    return
                self._open.append(sock)
            conn = Conn(sock, self)
            conn.sni = self._local.sni
            while not self.stopping.is_set():
                seen = conn.read_request()
                if seen is None:
                    return
                self.requests.append(seen)
                if self.handler(conn, seen) is False:
                    return
        except OSError:
            return
        finally:
            sock.close()

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._thread.join(timeout=2)


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def make(handler: Handler, tls: ssl.SSLContext | None = None) -> RawServer:
        server = RawServer(handler, tls)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def transport() -> Iterator[Transport]:
    with Transport() as t:
        yield t


def ok(conn: Conn, seen: Seen) -> None:
    conn.respond(200, b"thanks")


# ------------------------------------------------------------------------- basics


def test_post_delivers_body_and_headers(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(ok)
    result = transport.post(server.url("/hook?x=1"), BODY, HEADERS, 5, LOCAL)
    assert result.error is None and result.status == 200 and result.ok
    assert result.body == b"thanks"
    assert 0 <= result.duration_ms < 5000
    [seen] = server.requests
    assert (seen.method, seen.path, seen.body) == ("POST", "/hook?x=1", BODY)
    assert seen.headers["host"] == f"127.0.0.1:{server.port}"
    assert seen.headers["webhook-id"] == "evt_1"
    assert seen.headers["user-agent"] == "Kurir/t"
    assert seen.headers["content-length"] == str(len(BODY))
    assert seen.headers["accept-encoding"] == "identity"
    assert "cookie" not in seen.headers
    assert result.request_headers["Host"] == f"127.0.0.1:{server.port}"
    assert result.request_headers["webhook-id"] == "evt_1"
    assert result.request_headers["Content-Length"] == str(len(BODY))


def test_works_with_pytest_httpserver(httpserver: HTTPServer, transport: Transport) -> None:
    httpserver.expect_request("/in", method="POST", data=BODY).respond_with_data("", status=204)
    result = transport.post(httpserver.url_for("/in"), BODY, HEADERS, 5, LOCAL)
    assert (result.status, result.error, result.ok) == (204, None, True)
    httpserver.check_assertions()


def test_caller_cannot_override_framing_headers(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(ok)
    evil = dict(HEADERS, Host="metadata.internal", **{"Content-Length": "1", "Connection": "x"})
    evil["Transfer-Encoding"] = "chunked"
    result = transport.post(server.url(), BODY, evil, 5, LOCAL)
    assert result.ok
    [seen] = server.requests
    assert seen.headers["host"] == f"127.0.0.1:{server.port}"
    assert seen.headers["content-length"] == str(len(BODY))
    assert "transfer-encoding" not in seen.headers
    assert seen.body == BODY


def test_header_with_newline_is_an_invalid_request(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(ok)
    result = transport.post(server.url(), BODY, {"x-bad": "a\r\nInjected: 1"}, 5, LOCAL)
    assert result.error == "invalid_request"
    assert server.requests == []


def test_non_2xx_is_returned_with_its_body(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(lambda c, s: c.respond(500, b"boom"))
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert (result.status, result.body, result.error, result.ok) == (500, b"boom", None, False)


def test_retry_after_and_response_headers_exposed(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(lambda c, s: c.respond(429, b"", {"Retry-After": "30", "X-Thing": "y"}))
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.status == 429
    assert result.retry_after == "30"
    assert result.response_headers["x-thing"] == "y"


def test_keep_alive_reuses_one_connection(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(ok)
    for _ in range(5):
        assert transport.post(server.url(), BODY, HEADERS, 5, LOCAL).ok
    assert server.connections == 1
    assert len({s.peer_port for s in server.requests}) == 1


def test_cookies_are_never_sent_back(serve: Callable[..., RawServer], transport: Transport) -> None:
    server = serve(lambda c, s: c.respond(200, b"", {"Set-Cookie": "sid=abc; Path=/"}))
    transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert all("cookie" not in s.headers for s in server.requests)


def test_environment_proxies_are_ignored(
    serve: Callable[..., RawServer], transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    proxy = f"http://127.0.0.1:{dead.getsockname()[1]}"
    dead.close()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    server = serve(ok)
    assert transport.post(server.url(), BODY, HEADERS, 5, LOCAL).ok


def test_concurrent_posts_from_a_thread_pool(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(ok)
    results = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(25):
            r = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 200
    assert all(r.ok for r in results), {r.error for r in results}
    assert len(server.requests) == 200
    assert server.connections <= 16


# ---------------------------------------------------------------------- redirects


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirects_are_not_followed(
    serve: Callable[..., RawServer], transport: Transport, status: int
) -> None:
    target = serve(ok)
    big = b"R" * 1_000_000
    server = serve(lambda c, s: c.respond(status, big, {"Location": target.url("/stolen")}))
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.status == status
    assert result.error is None and not result.ok
    assert len(result.body) == MAX_BODY_BYTES
    assert result.response_headers["location"] == target.url("/stolen")
    time.sleep(0.1)
    assert target.connections == 0 and target.requests == []


# ------------------------------------------------------------------ response caps


def test_ten_megabyte_body_is_cut_at_4_kib(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    huge = bytes(range(256)) * (10 * 1024 * 1024 // 256)

    def handler(conn: Conn, seen: Seen) -> None:
        conn.respond(200, huge if seen.path == "/big" else b"small")

    server = serve(handler)
    started = time.monotonic()
    result = transport.post(server.url("/big"), BODY, HEADERS, 5, LOCAL)
    assert time.monotonic() - started < 2
    assert result.ok
    assert result.body == huge[:MAX_BODY_BYTES] and result.truncated
    # the half-read connection is not reused: the next exchange is clean
    after = transport.post(server.url("/next"), BODY, HEADERS, 5, LOCAL)
    assert (after.status, after.body, after.truncated) == (200, b"small", False)


def test_chunked_endless_body_is_cut(serve: Callable[..., RawServer], transport: Transport) -> None:
    def handler(conn: Conn, seen: Seen) -> bool:
        conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"C" * 1000
        for _ in range(20_000):
            conn.send(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        return False

    server = serve(handler)
    started = time.monotonic()
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert time.monotonic() - started < 2
    assert result.status == 200 and result.error is None
    assert result.body == b"C" * MAX_BODY_BYTES


def test_gzip_bomb_is_not_inflated(serve: Callable[..., RawServer], transport: Transport) -> None:
    bomb = gzip.compress(b"\0" * (50 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < 100_000
    server = serve(
        lambda c, s: c.respond(
            200, bomb, {"Content-Encoding": "gzip", "Content-Type": "text/plain"}
        )
    )
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.ok
    assert len(result.body) == MAX_BODY_BYTES
    assert result.body == bomb[:MAX_BODY_BYTES]
    assert result.body[:2] == b"\x1f\x8b"


def test_small_gzip_body_is_kept_raw(serve: Callable[..., RawServer], transport: Transport) -> None:
    packed = gzip.compress(b"hello")
    server = serve(lambda c, s: c.respond(200, packed, {"Content-Encoding": "gzip"}))
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.body == packed


# ---------------------------------------------------------------------- deadlines


def _hang(conn: Conn, seen: Seen) -> bool:
    conn.server.stopping.wait(30)
    return False


def test_hanging_server_times_out(serve: Callable[..., RawServer], transport: Transport) -> None:
    server = serve(_hang)
    started = time.monotonic()
    result = transport.post(server.url(), BODY, HEADERS, 1.0, LOCAL)
    elapsed = time.monotonic() - started
    assert result.error == "timeout" and result.status is None and not result.ok
    assert 0.9 <= elapsed < 1.0 + SLACK_S
    assert len(server.requests) == 1


def test_server_trickling_the_status_line_times_out(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    response = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 200 + b"\r\nContent-Length: 2\r\n\r\nok"

    def handler(conn: Conn, seen: Seen) -> bool:
        conn.trickle(response, 0.1)
        return False

    server = serve(handler)
    started = time.monotonic()
    result = transport.post(server.url(), BODY, HEADERS, 1.0, LOCAL)
    elapsed = time.monotonic() - started
    assert result.error == "timeout" and result.status is None
    assert 0.9 <= elapsed < 1.0 + SLACK_S


def test_server_trickling_the_body_times_out(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    def handler(conn: Conn, seen: Seen) -> bool:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        conn.trickle(b"b" * 1000, 0.1)
        return False

    server = serve(handler)
    started = time.monotonic()
    result = transport.post(server.url(), BODY, HEADERS, 1.0, LOCAL)
    elapsed = time.monotonic() - started
    assert result.status == 200
    assert result.error == "timeout" and not result.ok
    assert 0.9 <= elapsed < 1.0 + SLACK_S
    assert 0 < len(result.body) < 20


def test_one_byte_per_second_body_times_out(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    def handler(conn: Conn, seen: Seen) -> bool:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        conn.trickle(b"b" * 100, 1.0)
        return False

    server = serve(handler)
    started = time.monotonic()
    result = transport.post(server.url(), BODY, HEADERS, 2.5, LOCAL)
    assert result.error == "timeout"
    assert time.monotonic() - started < 2.5 + SLACK_S


def test_transport_is_healthy_after_a_timeout(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    def handler(conn: Conn, seen: Seen) -> bool | None:
        if seen.path == "/slow":
            return _hang(conn, seen)
        conn.respond(200, b"fine")
        return None

    server = serve(handler)
    assert transport.post(server.url("/slow"), BODY, HEADERS, 0.5, LOCAL).error == "timeout"
    after = transport.post(server.url("/fast"), BODY, HEADERS, 5, LOCAL)
    assert (after.status, after.body, after.error) == (200, b"fine", None)


def test_slow_dns_is_bounded_by_the_deadline(serve: Callable[..., RawServer]) -> None:
    release = threading.Event()

    def slow(host: str, port: int) -> list[str]:
        release.wait(5)
        return ["127.0.0.1"]

    with Transport(resolver=slow) as transport:
        started = time.monotonic()
        result = transport.post("http://slow-dns.test/", BODY, HEADERS, 0.5, LOCAL)
        release.set()
    assert result.error == "timeout"
    assert time.monotonic() - started < 0.5 + SLACK_S


def test_deadline_expiring_on_a_reused_connection(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    """A pooled connection must come under the new exchange's deadline too."""
    calls = []

    def handler(conn: Conn, seen: Seen) -> bool | None:
        calls.append(seen.path)
        if len(calls) == 1:
            conn.respond(200, b"first")
            return None
        return _hang(conn, seen)

    server = serve(handler)
    assert transport.post(server.url(), BODY, HEADERS, 5, LOCAL).ok
    started = time.monotonic()
    result = transport.post(server.url(), BODY, HEADERS, 0.8, LOCAL)
    assert result.error == "timeout"
    assert time.monotonic() - started < 0.8 + SLACK_S
    assert server.connections == 1


# ------------------------------------------------------------------ SSRF and errors


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "2130706433", "0x7f.1", "127.1", "[::ffff:127.0.0.1]"],
)  # fmt: skip
def test_default_policy_refuses_loopback_without_connecting(
    serve: Callable[..., RawServer], transport: Transport, host: str
) -> None:
    server = serve(ok)
    result = transport.post(server.url(host=host), BODY, HEADERS, 5, GuardPolicy())
    assert result.error == "blocked_address" and result.status is None
    assert result.error_detail
    time.sleep(0.05)
    assert server.connections == 0 and server.requests == []


def test_allow_cidrs_lets_one_network_through(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(ok)
    policy = GuardPolicy(allow_cidrs=(ip_network("127.0.0.0/8"),))
    assert transport.post(server.url(), BODY, HEADERS, 5, policy).ok
    other = GuardPolicy(allow_cidrs=(ip_network("10.0.0.0/8"),))
    assert transport.post(server.url(), BODY, HEADERS, 5, other).error == "blocked_address"
    assert len(server.requests) == 1


def test_numeric_spelling_connects_to_what_it_means(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(ok)
    result = transport.post(server.url(host="2130706433"), BODY, HEADERS, 5, LOCAL)
    assert result.ok
    assert server.requests[0].headers["host"] == f"2130706433:{server.port}"


class FlippingResolver:
    """Answers with a safe address first, then an internal one: a DNS rebinding attack."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.answers = ["127.0.0.1"]

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        return list(self.answers)


def test_connects_to_the_checked_address_and_rechecks_every_attempt(
    serve: Callable[..., RawServer],
) -> None:
    server = serve(ok)
    resolver = FlippingResolver()
    policy = GuardPolicy(allow_cidrs=(ip_network("127.0.0.0/8"),))
    url = f"http://rebind.test:{server.port}/hook"
    with Transport(resolver=resolver) as transport:
        first = transport.post(url, BODY, HEADERS, 5, policy)
        assert first.ok
        assert resolver.calls == ["rebind.test"]  # resolved once, not again by the HTTP stack
        assert server.requests[0].headers["host"] == f"rebind.test:{server.port}"
        resolver.answers = ["169.254.169.254"]
        second = transport.post(url, BODY, HEADERS, 5, policy)
        assert second.error == "blocked_address"
        assert resolver.calls == ["rebind.test", "rebind.test"]
    assert len(server.requests) == 1


def test_falls_back_to_the_next_checked_address(serve: Callable[..., RawServer]) -> None:
    server = serve(ok)  # listens on 127.0.0.1 only, so 127.0.0.2 refuses

    def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.2", "127.0.0.1"]

    with Transport(resolver=resolver) as transport:
        result = transport.post(f"http://two.test:{server.port}/", BODY, HEADERS, 5, LOCAL)
    assert result.ok
    assert server.requests[0].headers["host"] == f"two.test:{server.port}"


def test_fallback_address_is_still_under_the_deadline(serve: Callable[..., RawServer]) -> None:
    def handler(conn: Conn, seen: Seen) -> bool:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        conn.trickle(b"b" * 1000, 0.1)
        return False

    server = serve(handler)

    def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.2", "127.0.0.1"]

    with Transport(resolver=resolver) as transport:
        started = time.monotonic()
        result = transport.post(f"http://two.test:{server.port}/", BODY, HEADERS, 1.0, LOCAL)
    assert result.error == "timeout" and result.status == 200
    assert time.monotonic() - started < 1.0 + SLACK_S


def test_sessions_are_bounded_and_evicted_cleanly(serve: Callable[..., RawServer]) -> None:
    servers = [serve(ok) for _ in range(3)]
    with Transport(max_sessions=1) as transport:
        for _ in range(2):
            for server in servers:
                assert transport.post(server.url(), BODY, HEADERS, 5, LOCAL).ok
    assert [len(s.requests) for s in servers] == [2, 2, 2]


def test_credentials_in_the_url_become_basic_auth(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(ok)
    url = f"http://hook:s%40cret@127.0.0.1:{server.port}/auth"
    assert transport.post(url, BODY, HEADERS, 5, LOCAL).ok
    seen = server.requests[0]
    assert seen.headers["authorization"] == "Basic aG9vazpzQGNyZXQ="
    assert seen.headers["host"] == f"127.0.0.1:{server.port}"


def test_each_request_sends_what_requests_would(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    """Routes are prepared once per URL and address; each request still gets requests' own
    quoting, its defaults under the caller's headers, and Basic auth from the URL."""
    server = serve(ok)
    url = f"http://hook:pw@127.0.0.1:{server.port}/a%20b/\u00fc?q=1"
    for n in range(2):
        headers = dict(HEADERS, Accept="application/json", **{"webhook-id": f"evt_{n}"})
        result = transport.post(url, BODY, headers, 5, LOCAL)
        assert result.ok, result.error_detail
        assert result.request_headers["Accept"] == "application/json"
        assert result.request_headers["Authorization"] == "Basic aG9vazpwdw=="
        assert result.request_headers["Content-Length"] == str(len(BODY))
    first, second = server.requests
    assert first.path == second.path == "/a%20b/%C3%BC?q=1"
    assert [s.headers["webhook-id"] for s in (first, second)] == ["evt_0", "evt_1"]
    assert second.headers["accept"] == "application/json"
    assert second.headers["accept-encoding"] == "identity"
    assert second.headers["authorization"] == "Basic aG9vazpwdw=="


def test_a_route_whose_pool_was_closed_is_prepared_again(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    """A pool manager closes the pools it evicts; a route must not send through one."""
    server = serve(ok)
    assert transport.post(server.url(), BODY, HEADERS, 5, LOCAL).ok
    for origin in list(transport._sessions.values()):
        origin.session.close()  # closes every pool the session's adapter made
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.ok, result.error_detail
    assert len(server.requests) == 2


def test_connection_refused(transport: Transport) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    result = transport.post(f"http://127.0.0.1:{port}/", BODY, HEADERS, 5, LOCAL)
    assert result.error == "connection_error" and result.status is None


def test_server_closing_without_answer(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(lambda c, s: False)
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.error == "connection_error" and result.status is None


def test_truncated_body_is_a_connection_error(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    def handler(conn: Conn, seen: Seen) -> bool:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part")
        return False

    server = serve(handler)
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.status == 200 and result.error == "connection_error" and not result.ok
    assert result.body == b"only-part"


def test_an_answer_that_is_not_http_is_a_protocol_error(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    server = serve(lambda c, s: c.send(b"SSH-2.0-OpenSSH_9.6\r\n" + bytes(range(256))) or False)
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.error == "protocol_error" and result.status is None


@pytest.mark.parametrize(
    "head",
    [
        b"".join(b"X-Flood-%d: 1\r\n" % i for i in range(10_000)),
        b"X-Huge: " + b"h" * (1024 * 1024) + b"\r\n",
    ],
    ids=["10k-headers", "1MiB-header"],
)
def test_a_header_flood_is_a_protocol_error(
    serve: Callable[..., RawServer], transport: Transport, head: bytes
) -> None:
    server = serve(
        lambda c, s: c.send(b"HTTP/1.1 200 OK\r\n" + head + b"Content-Length: 2\r\n\r\nok") or False
    )
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.error == "protocol_error" and not result.ok


def test_broken_chunk_framing_is_a_protocol_error(
    serve: Callable[..., RawServer], transport: Transport
) -> None:
    def handler(conn: Conn, seen: Seen) -> bool:
        conn.send(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nnot-a-size\r\n"
        )
        return False

    server = serve(handler)
    result = transport.post(server.url(), BODY, HEADERS, 5, LOCAL)
    assert result.status == 200 and result.error == "protocol_error" and not result.ok


def test_unresolvable_host(transport: Transport) -> None:
    def nxdomain(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with Transport(resolver=nxdomain) as t:
        result = t.post("https://nowhere.invalid/", BODY, HEADERS, 5, GuardPolicy())
    assert result.error == "connection_error"


@pytest.mark.parametrize(
    "url", ["ftp://example.com/", "example.com", "http://[::1/", "http://a b/", "javascript:x"],
)  # fmt: skip
def test_invalid_urls(transport: Transport, url: str) -> None:
    result = transport.post(url, BODY, HEADERS, 5, LOCAL)
    assert result.error == "invalid_url" and result.status is None


# --------------------------------------------------------------------------- TLS


@dataclass
class Pki:
    ca_file: str
    contexts: dict[str, ssl.SSLContext] = field(default_factory=dict)


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root: Path = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("Kurir Test CA", ca_key, None, ca_key, ca=True)
    (root / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki = Pki(str(root / "ca.pem"))
    for host in ("kurir.test", "other.test"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(host, key, ca.subject, ca_key, ca=False)
        (root / f"{host}.pem").write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(root / f"{host}.pem")
        pki.contexts[host] = ctx
    return pki


def _to_loopback(host: str, port: int) -> list[str]:
    return ["127.0.0.1"]


def test_https_pins_the_ip_but_keeps_sni_and_host(
    serve: Callable[..., RawServer], pki: Pki
) -> None:
    server = serve(ok, tls=pki.contexts["kurir.test"])
    with Transport(resolver=_to_loopback, ca_certs=pki.ca_file) as transport:
        url = server.url(host="kurir.test", scheme="https")
        for _ in range(3):
            result = transport.post(url, BODY, HEADERS, 5, LOCAL)
            assert result.ok, result.error_detail
    assert [s.sni for s in server.requests] == ["kurir.test"] * 3
    assert server.requests[0].headers["host"] == f"kurir.test:{server.port}"
    assert server.connections == 1


def test_https_certificate_for_another_name_is_a_tls_error(
    serve: Callable[..., RawServer], pki: Pki
) -> None:
    server = serve(ok, tls=pki.contexts["other.test"])
    with Transport(resolver=_to_loopback, ca_certs=pki.ca_file) as transport:
        result = transport.post(
            server.url(host="kurir.test", scheme="https"), BODY, HEADERS, 5, LOCAL
        )
    assert result.error == "tls_error", result.error_detail
    assert server.requests == []


def test_https_untrusted_certificate_is_a_tls_error(
    serve: Callable[..., RawServer], pki: Pki
) -> None:
    server = serve(ok, tls=pki.contexts["kurir.test"])
    with Transport(resolver=_to_loopback) as transport:
        result = transport.post(
            server.url(host="kurir.test", scheme="https"), BODY, HEADERS, 5, LOCAL
        )
    assert result.error == "tls_error"
    assert server.requests == []


def test_https_handshake_that_hangs_times_out(serve: Callable[..., RawServer], pki: Pki) -> None:
    server = serve(ok)  # plain TCP server: never answers a ClientHello
    with Transport(resolver=_to_loopback, ca_certs=pki.ca_file) as transport:
        started = time.monotonic()
        result = transport.post(
            server.url(host="kurir.test", scheme="https"), BODY, HEADERS, 1.0, LOCAL,
            connect_timeout_s=5.0,
        )  # fmt: skip
    assert result.error == "timeout"
    assert time.monotonic() - started < 1.0 + SLACK_S


def test_finished_deadlines_do_not_pile_up_in_the_watchdog() -> None:
    """10,000 exchanges that finished long before their 30 s deadline leave a small heap."""
    from app.net.http import WATCHDOG_COMPACT_AT, _Deadline, _Watchdog

    watchdog = _Watchdog()
    try:
        for _ in range(10_000):
            deadline = _Deadline(time.monotonic() + 30)
            watchdog.arm(deadline)
            deadline.finish()
        live = _Deadline(time.monotonic() + 30)
        watchdog.arm(live)
        with watchdog._cond:  # the timer thread pops finished entries meanwhile
            heap = list(watchdog._heap)
        assert len(heap) <= WATCHDOG_COMPACT_AT
        assert any(entry[2] is live for entry in heap)
    finally:
        watchdog.close()
