"""A fast webhook receiver in its own process, for benches and for tests that count arrivals.

It answers 200 to every POST with a few bytes of asyncio (a throughput bench's receiver shares
the CPU with what it measures), keeps each arrival's webhook id and time, and reports them over
HTTP. `take_requests` is its parser, shared with the chaos bench's receiver.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from typing import Any, NamedTuple

_HEAD_END = b"\r\n\r\n"


class RawRequest(NamedTuple):
    """The little a bench's receiver looks at: which path, and which webhook it was."""

    method: str
    path: str
    webhook_id: str


def take_requests(buffer: bytes) -> tuple[list[RawRequest], bytes]:
    """The complete requests at the start of `buffer`, and the bytes after them (a request
    still arriving). Enough HTTP/1.1 for our own senders (Content-Length bodies, keep-alive),
    and cheap: the receivers of a throughput bench share the CPU with what they measure."""
    taken: list[RawRequest] = []
    while (end := buffer.find(_HEAD_END)) >= 0:
        head = buffer[:end].decode("latin-1").split("\r\n")
        length, webhook_id = 0, ""
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "webhook-id":
                webhook_id = value.strip()
        if len(buffer) < end + 4 + length:
            break
        buffer = buffer[end + 4 + length :]
        method, path = head[0].split(" ")[:2]
        taken.append(RawRequest(method, path, webhook_id))
    return taken, buffer


def _receiver_main(port_queue: Any) -> None:
    """A minimal keep-alive HTTP/1.1 server: 200 to every POST, receipt times kept in memory.

    GET /_count answers how many webhooks arrived; GET /_dump answers them all (and clears):
    [[webhook-id, path, unix time], ...]. A path starting with /hang is recorded and never
    answered, like a partner that hangs.
    """
    records: list[tuple[str, str, float]] = []
    ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            arrived, self.buf = take_requests(self.buf + data)
            for method, path, msg_id in arrived:
                if method == "GET" and path in ("/_count", "/_dump"):
                    out = json.dumps(len(records) if path == "/_count" else records).encode()
                    if path == "/_dump":
                        records.clear()
                    self.transport.write(
                        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(out), out)
                    )
                    continue
                records.append((msg_id, path, time.time()))
                if path.startswith("/hang"):
                    continue
                self.transport.write(ok)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(
            Protocol, "127.0.0.1", 0, backlog=1024
        )
        port_queue.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(serve())


class ReceiverProcess:
    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        self.process = ctx.Process(target=_receiver_main, args=(queue,), daemon=True)
        self.process.start()
        self.port = queue.get(timeout=10)
        self.url = f"http://127.0.0.1:{self.port}"
        import requests

        self.http = requests.Session()

    def count(self) -> int:
        return int(self.http.get(self.url + "/_count", timeout=10).json())

    def dump(self) -> list[tuple[str, str, float]]:
        return [tuple(r) for r in self.http.get(self.url + "/_dump", timeout=30).json()]

    def __enter__(self) -> ReceiverProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_for(self, n: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.count() >= n:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self.process.terminate()
        self.process.join(5)
