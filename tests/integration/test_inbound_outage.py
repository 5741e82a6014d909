"""The database goes away mid-stream: the receiver answers only 503s, and nothing it
acknowledged is lost.

The shared PostgreSQL is never stopped. On PostgreSQL the app reaches the database through a
TCP proxy on 127.0.0.1 that this test cuts (open connections reset, new ones refused) and
restores. On SQLite the app uses a database file of its own, opened afresh for every
transaction (NullPool), whose directory is renamed away and back: the file cannot be opened.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from app import migrate
from app.db import Database, _configure_sqlite
from app.inbound import sources
from app.models import InboundEvent
from app.runtime import Runtime
from app.web import create_app
from tests.conftest import LiveServer
from tests.support import inbound as kit

SW = "standard-webhooks"
CLIENTS = 4
PER_CLIENT = 60


class CuttableProxy:
    """A TCP forwarder whose cut() resets every connection and refuses new ones."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.down = threading.Event()
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down.is_set():
                self._reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                self._reset(client)
                continue
            upstream.settimeout(None)
            with self.lock:
                if self.down.is_set():  # cut while we were connecting upstream
                    self._reset(client)
                    self._reset(upstream)
                    continue
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        """Drop a connection as a stopped server does. shutdown() first: a bare close()
        would not wake the pump blocked in recv() on it, and nothing would reach the peer."""
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            self.down.set()
            victims, self.open = self.open, []
        for sock in victims:
            self._reset(sock)

    def restore(self) -> None:
        self.down.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


class Outage:
    """Make the app's database unreachable and reachable again."""

    def __init__(self, cut: Any, restore: Any) -> None:
        self.cut, self.restore = cut, restore


@pytest.fixture
def isolated(
    backend: str, migrated: Any, runtime: Runtime, tmp_path: Path
) -> Iterator[tuple[Runtime, Outage, Database]]:
    """A Runtime whose database this test can take away; plus a direct handle to check it."""
    if backend == "postgresql":
        real = make_url(migrated.url)
        proxy = CuttableProxy((real.host or "127.0.0.1", real.port or 5432))
        via_proxy = real.set(host="127.0.0.1", port=proxy.port)
        database = Database(via_proxy.render_as_string(hide_password=False), pool_size=8)
        direct = migrated.db
        outage = Outage(proxy.cut, proxy.restore)
        try:
            yield Runtime(runtime.settings, database=database), outage, direct
        finally:
            database.dispose()
            proxy.close()
        return
    home = tmp_path / "store"
    away = tmp_path / "store-away"
    home.mkdir()
    url = f"sqlite:///{home / 'kurir.db'}"
    migrate.upgrade(url)
    engine = create_engine(
        url, poolclass=NullPool, connect_args={"timeout": 5, "check_same_thread": False}
    )
    _configure_sqlite(engine)
    database = Database(url, engine=engine)
    outage = Outage(lambda: home.rename(away), lambda: away.rename(home))
    try:
        yield Runtime(runtime.settings, database=database), outage, database
    finally:
        database.dispose()


def test_database_lost_mid_stream_only_503s_and_every_ack_is_stored(isolated, monkeypatch):
    rt, outage, direct = isolated
    # Re-read the source on every request, so the outage is met on the first query too.
    monkeypatch.setattr(sources, "CONFIG_CACHE_TTL_S", 0.0)
    with rt.db.begin() as session:
        sources.create_source(
            session, rt.secret_box, rt.settings, name="psp", scheme=SW, secrets=[kit.SECRETS[SW]]
        )
    app = create_app(runtime=rt)
    bodies = {}
    for c in range(CLIENTS):
        for n in range(PER_CLIENT):
            event_id = f"evt-{c}-{n}"
            bodies[event_id] = kit.signed_callback(
                SW, event_id=event_id, resource_id=f"pay_{n % 7}", version=n + 1
            )
    results: dict[str, list[int]] = {event_id: [] for event_id in bodies}
    lock = threading.Lock()
    acks = threading.Semaphore(0)
    unavailable = threading.Semaphore(0)

    def send(server_url: str, event_ids: list[str]) -> None:
        with requests.Session() as http:
            for event_id in event_ids:
                body, headers = bodies[event_id]
                try:
                    status = http.post(
                        f"{server_url}/inbound/psp", data=body, headers=dict(headers), timeout=30
                    ).status_code
                except requests.RequestException:
                    status = -1
                with lock:
                    results[event_id].append(status)
                (acks if 200 <= status < 300 else unavailable).release()
                time.sleep(0.004)  # a stream, not a burst

    with LiveServer(app) as server:
        clients = [
            threading.Thread(
                target=send, args=(server.url, [f"evt-{c}-{n}" for n in range(PER_CLIENT)])
            )
            for c in range(CLIENTS)
        ]
        for thread in clients:
            thread.start()
        for _ in range(30):
            assert acks.acquire(timeout=30)
        outage.cut()
        try:
            for _ in range(20):  # the stream keeps coming while the store is gone
                assert unavailable.acquire(timeout=30)
        finally:
            outage.restore()
        for thread in clients:
            thread.join(60)
        statuses = [s for seen in results.values() for s in seen]
        assert set(statuses) <= {202, 503}, sorted(set(statuses))
        assert statuses.count(503) >= 20 and statuses.count(202) >= 30
        # Nothing the receiver acknowledged was lost, nothing it stored is half a row.
        acked = {e for e, seen in results.items() if any(200 <= s < 300 for s in seen)}
        with direct.begin() as session:
            stored = {e.event_id: e for e in session.scalars(select(InboundEvent))}
        assert acked <= set(stored)
        for event_id, event in stored.items():
            assert event.raw_body == bodies[event_id][0]
            assert event.status == "received" and event.resource_id is not None
        # The partner retries what got 503: now every event is stored exactly once.
        with requests.Session() as http:
            for event_id, seen in results.items():
                if 503 in seen and not any(200 <= s < 300 for s in seen):
                    body, headers = bodies[event_id]
                    answer = http.post(
                        f"{server.url}/inbound/psp", data=body, headers=dict(headers), timeout=30
                    )
                    assert answer.status_code in (200, 202)
    with direct.begin() as session:
        rows = list(session.scalars(select(InboundEvent.event_id)))
    assert sorted(rows) == sorted(bodies)


def test_503_carries_retry_after(isolated):
    rt, outage, _ = isolated
    with rt.db.begin() as session:
        sources.create_source(
            session, rt.secret_box, rt.settings, name="psp2", scheme=SW, secrets=[kit.SECRETS[SW]]
        )
    body, headers = kit.signed_callback(SW, event_id="e1", resource_id="pay_1", version=1)
    client = create_app(runtime=rt).test_client()
    sources.invalidate_cache()
    outage.cut()
    try:
        response = client.post("/inbound/psp2", data=body, headers=headers)
    finally:
        outage.restore()
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert response.get_json()["error"]["code"] == "store_unavailable"
    assert client.post("/inbound/psp2", data=body, headers=headers).status_code == 202
