"""A load generator's HTTP/1.1 client: prebuilt request bytes on a kept-alive socket.

On a 2-core machine the client shares the CPU with the server it measures. `requests` spends
~1.2 ms of CPU per POST and `http.client` ~0.2 ms; writing prebuilt bytes and reading the
answer by its Content-Length costs ~0.05 ms, so the figures describe the server, not us.
Enough HTTP for our own servers (gunicorn, Werkzeug): Content-Length bodies, keep-alive,
and a reconnect when the server closes the connection.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

_HEAD_END = b"\r\n\r\n"


def request_bytes(url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> bytes:
    """One complete request for `url` (its path and query), ready to write to a socket."""
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Connection:
    """One kept-alive connection; `exchange` writes a request and returns (status, body)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.timeout_s = timeout_s
        self.sock: socket.socket | None = None
        self.buffer = bytearray()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer.clear()
        return sock

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        """Send one request; one reconnect when a kept-alive socket turned out closed."""
        for attempt in (1, 2):
            if self.sock is None:
                self.sock = self._connect()
            try:
                self.sock.sendall(request)
                return self._read_response()
            except (ConnectionError, BrokenPipeError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _recv(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buffer += chunk

    def _read_response(self) -> tuple[int, bytes]:
        while (end := self.buffer.find(_HEAD_END)) < 0:
            self._recv()
        head = bytes(self.buffer[: end + 2]).lower()
        status = int(head[9:12])
        length = 0
        start = head.find(b"\r\ncontent-length:")
        if start >= 0:
            length = int(head[start + 17 : head.index(b"\r\n", start + 2)])
        total = end + 4 + length
        while len(self.buffer) < total:
            self._recv()
        body = bytes(self.buffer[end + 4 : total])
        del self.buffer[:total]
        if b"\r\nconnection: close" in head:
            self.close()
        return status, body

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def run_clients(
    url: str, requests_: Sequence[bytes], clients: int, *, due: Callable[[int], float] | None = None
) -> tuple[list[float], list[int], float]:
    """Send every request from `clients` threads, each on its own connection.

    Closed loop by default: each client sends its share back to back. With `due`, request i
    waits until `due(i)` seconds after the start and its latency counts from then (open loop,
    so a slow server cannot slow the offered load down and hide its own queueing).
    Returns (latencies in ms, statuses, elapsed seconds).
    """
    latencies: list[list[float]] = [[] for _ in range(clients)]
    statuses: list[list[int]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    origin = [0.0]

    def run(k: int) -> None:
        connection = Connection(url)
        barrier.wait()
        try:
            for i in range(k, len(requests_), clients):
                start = time.perf_counter()
                if due is not None:
                    start = origin[0] + due(i)
                    delay = start - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                try:
                    status, _ = connection.exchange(requests_[i])
                except OSError:
                    status = -1
                latencies[k].append((time.perf_counter() - start) * 1000)
                statuses[k].append(status)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(clients)]
    for thread in threads:
        thread.start()
    origin[0] = time.perf_counter() + 0.05
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return (
        [x for chunk in latencies for x in chunk],
        [s for chunk in statuses for s in chunk],
        elapsed,
    )
