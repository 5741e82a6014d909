"""Hostile endpoints on real sockets (127.0.0.1): each path misbehaves in one way.

Used by tests/integration/test_hostile_endpoints.py and bench/hostile.py. Every behaviour
runs on its own thread per connection and gives up when the client goes away, so a sender
that cuts the exchange short frees the server too.

| path             | what the endpoint does                                               |
|------------------|----------------------------------------------------------------------|
| /trickle         | answers one byte per second, forever                                 |
| /huge            | a 1 GiB body (Content-Length), streamed as fast as it is read         |
| /gzip-bomb       | ``Content-Encoding: gzip``: 1 MiB on the wire, 1 GiB once inflated     |
|                  | (both answer 500, or the status in ``?status=``)                     |
| /many-headers    | 10,000 response headers                                              |
| /huge-header     | one 1 MiB response header                                            |
| /silent          | accepts the connection, reads the request, never answers             |
| /garbage         | answers bytes that are not HTTP                                      |
| /redirect-loop   | 302 to itself, every time                                            |
| /close-mid       | announces 10,000 body bytes, sends 100, closes                       |
| anything else    | 200 ``ok`` (keep-alive)                                              |
"""

from __future__ import annotations

import contextlib
import functools
import random
import socket
import struct
import threading
import zlib
from collections import Counter
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

GIB = 1 << 30
MIB = 1 << 20
HOSTILE_PATHS = (
    "/trickle",
    "/huge",
    "/gzip-bomb",
    "/many-headers",
    "/huge-header",
    "/silent",
    "/garbage",
    "/redirect-loop",
    "/close-mid",
)
_MAX_REQUEST_HEAD = 64 * 1024


@functools.cache
def gzip_bomb(inflated: int = GIB) -> bytes:
    """A gzip member that inflates to `inflated` zero bytes, built without inflating it.

    One MiB of zeros is deflated once and ended with a full flush, which byte-aligns the
    output and resets the window: the same block repeated is a valid stream of n MiB.
    """
    assert inflated % MIB == 0
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = packer.compress(b"\0" * MIB) + packer.flush(zlib.Z_FULL_FLUSH)
    tail = packer.flush(zlib.Z_FINISH)
    crc = 0
    zeros = b"\0" * MIB
    for _ in range(inflated // MIB):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, inflated & 0xFFFFFFFF)
    return header + block * (inflated // MIB) + tail + trailer


class HostileServer:
    """A threaded HTTP/1.1-ish server whose paths misbehave as the module docstring says."""

    def __init__(self, *, host: str = "127.0.0.1") -> None:
        self.stopping = threading.Event()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(256)
        self.listener.settimeout(0.05)
        self.port = int(self.listener.getsockname()[1])
        self.url = f"http://{host}:{self.port}"
        self.hits: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._serve, name="hostile-accept", daemon=True)
        self._behaviours: dict[str, Callable[[socket.socket, str], bool]] = {
            "/trickle": self._trickle,
            "/huge": self._huge,
            "/gzip-bomb": self._gzip_bomb,
            "/many-headers": self._many_headers,
            "/huge-header": self._huge_header,
            "/silent": self._silent,
            "/garbage": self._garbage,
            "/redirect-loop": self._redirect_loop,
            "/close-mid": self._close_mid,
        }

    def __enter__(self) -> HostileServer:
        gzip_bomb()  # built before the first request, not during it
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        with self._lock:
            open_now = list(self._open)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=2)

    # ------------------------------------------------------------------ plumbing

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self._open.add(sock)
            threading.Thread(
                target=self._connection, args=(sock,), name="hostile-conn", daemon=True
            ).start()

    def _connection(self, sock: socket.socket) -> None:
        buf = b""
        try:
            while not self.stopping.is_set():
                target, buf = _read_request(sock, buf)
                if target is None:
                    return
                path = urlsplit(target).path
                with self._lock:
                    self.hits[path] += 1
                behaviour = self._behaviours.get(path, self._ok)
                if not behaviour(sock, target):
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._open.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def _send_slowly(self, sock: socket.socket, data: bytes, every_s: float) -> None:
        for i in range(len(data)):
            if self.stopping.wait(every_s):
                return
            sock.sendall(data[i : i + 1])

    # ------------------------------------------------------------------ behaviours

    def _ok(self, sock: socket.socket, path: str) -> bool:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return True

    def _trickle(self, sock: socket.socket, path: str) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n"
        self._send_slowly(sock, head, 1.0)
        while not self.stopping.is_set():
            self._send_slowly(sock, b"x" * 60, 1.0)
        return False

    def _huge(self, sock: socket.socket, path: str) -> bool:
        sock.sendall(
            b"HTTP/1.1 %d X\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % (_status(path), GIB)
        )
        block = b"H" * (64 * 1024)
        for _ in range(GIB // len(block)):
            if self.stopping.is_set():
                break
            sock.sendall(block)  # raises once the client has hung up
        return False

    def _gzip_bomb(self, sock: socket.socket, path: str) -> bool:
        bomb = gzip_bomb()
        sock.sendall(
            b"HTTP/1.1 %d X\r\nContent-Encoding: gzip\r\nContent-Type: text/plain\r\n"
            b"Content-Length: %d\r\n\r\n" % (_status(path), len(bomb)) + bomb
        )
        return True

    def _many_headers(self, sock: socket.socket, path: str) -> bool:
        headers = b"".join(b"X-Flood-%d: %d\r\n" % (i, i) for i in range(10_000))
        sock.sendall(b"HTTP/1.1 200 OK\r\n" + headers + b"Content-Length: 2\r\n\r\nok")
        return True

    def _huge_header(self, sock: socket.socket, path: str) -> bool:
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * MIB + b"\r\nContent-Length: 2\r\n\r\nok"
        )
        return True

    def _silent(self, sock: socket.socket, path: str) -> bool:
        sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                if not sock.recv(4096):
                    return False  # the client gave up
            except TimeoutError:
                continue
        return False

    def _garbage(self, sock: socket.socket, path: str) -> bool:
        noise = random.Random(path).randbytes(16 * 1024)  # noqa: S311 - noise, not secrets
        sock.sendall(b"\x16\x03\x01 SSH-2.0-not-http\r\n" + noise)
        return False

    def _redirect_loop(self, sock: socket.socket, path: str) -> bool:
        sock.sendall(
            b"HTTP/1.1 302 Found\r\nLocation: %s%s\r\nContent-Length: 0\r\n\r\n"
            % (self.url.encode(), path.encode())
        )
        return True

    def _close_mid(self, sock: socket.socket, path: str) -> bool:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n" + b"m" * 100)
        return False


def _status(target: str) -> int:
    return int(parse_qs(urlsplit(target).query).get("status", ["500"])[0])


def _read_request(sock: socket.socket, buf: bytes) -> tuple[str | None, bytes]:
    """Read one request (head and Content-Length body): (target or None at EOF, leftover)."""
    while b"\r\n\r\n" not in buf:
        if len(buf) > _MAX_REQUEST_HEAD:
            return None, b""
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        buf += chunk
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    path = parts[1] if len(parts) > 1 else "/"
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    while len(buf) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None, b""
        buf += chunk
    return path, buf[length:]
