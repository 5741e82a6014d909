"""Kurir behind a real PgBouncer in transaction pooling mode.

The publish, delivery, inbound and feed test modules run once more through the pooler
(marked `pgbouncer`, see tests/conftest.py). This module shows what that proves: with
psycopg's prepared statements on, pooled transactions fail, so a regression cannot pass
unnoticed; and a busy run of every pipeline at once loses nothing while PostgreSQL sees no
more server connections than the pooler's pool.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest
import requests
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError

from app.config import normalise_database_url
from app.db import make_engine
from app.models import SUCCEEDED, Delivery, InboundEvent
from tests.support import inbound as kit
from tests.support.factories import Receiver, WorkerThread, wait_for
from tests.support.pgbouncer import DEFAULT_POOL_SIZE
from tests.support.publish import make_endpoint, order

SW = "standard-webhooks"


def _with_threshold(url: str, value: str) -> str:
    base = url.split("?", 1)[0]
    return normalise_database_url(f"{base}?prepare_threshold={value}")


def _interleaved_failures(url: str, transactions: int = 300) -> list[str]:
    """Short transactions over three pooled client connections in a shuffled order, so a
    connection's next transaction often runs on another server connection. Each connection
    runs its own statement, as Kurir's connections do: psycopg names prepared statements per
    connection (`_pg3_0`, ...), so on a shared server one name stands for different queries."""
    engine = make_engine(url, pool_size=3)
    connections = [engine.connect() for _ in range(3)]
    # Three transactions open at once: the pooler has (at least) three server connections,
    # among which it then hands out each next transaction in turn.
    opened = [connection.begin() for connection in connections]
    for connection in connections:
        connection.execute(text("SELECT 1"))
    for transaction in opened:
        transaction.commit()
    order_of_use = random.Random(7)  # noqa: S311 (not a secret)
    failures: list[str] = []
    try:
        for n in range(transactions):
            which = order_of_use.randrange(len(connections))
            connection = connections[which]
            try:
                with connection.begin():
                    got = connection.execute(
                        text(f"SELECT CAST(:n AS integer) + {which}"), {"n": n}
                    ).scalar()
                if got != n + which:
                    failures.append(f"another connection's statement answered: {got}")
            except DBAPIError as exc:
                failures.append(type(exc.orig).__name__)
    finally:
        for connection in connections:
            connection.close()
        engine.dispose()
    return failures


def test_prepared_statements_break_behind_the_pooler_and_the_url_turns_them_off(pgbouncer_url):
    """The pooled test runs are only worth something if session state fails there: psycopg's
    prepared statements (on from a query's 1st run here) fail, or worse, run another
    connection's query; with `prepare_threshold=none` nothing does."""
    prepared = _interleaved_failures(_with_threshold(pgbouncer_url, "0"))
    assert prepared, "prepared statements went through a transaction pooler unharmed"
    assert _interleaved_failures(_with_threshold(pgbouncer_url, "none")) == []


# ----------------------------------------------------------------------- connection budget


def _plain(url: str) -> str:
    """A libpq URL: no SQLAlchemy driver name, no Kurir query parameter."""
    return url.split("?", 1)[0].replace("postgresql+psycopg://", "postgresql://", 1)


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def _pooler_pid(pooled_url: str) -> int:
    """The pid of the PgBouncer listening on the pooled URL's port."""
    port = _port(pooled_url)
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port:
            assert connection.pid is not None
            return int(connection.pid)
    raise AssertionError(f"nothing listens on the pooler's port {port}")


class ServerConnections:
    """Samples how many backends PostgreSQL serves the pooler (identified by the pooler
    process's own sockets, so a leftover connection of an earlier test in this process
    cannot be mistaken for Kurir's), leaving out `excluded` pids; keeps the highest count.
    It also counts backends opened during the run from anywhere but the pooler: Kurir
    reaching PostgreSQL around the pooler would show there."""

    def __init__(self, upstream_url: str, pooled_url: str, excluded: list[int]) -> None:
        self.url = _plain(upstream_url)
        self.pooler = psutil.Process(_pooler_pid(pooled_url))
        self.upstream_port = _port(self.url)
        self.excluded = excluded
        self.peak = 0
        self.bypassing: set[int] = set()
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _pooler_ports(self) -> list[int]:
        return [
            c.laddr.port
            for c in self.pooler.net_connections(kind="tcp")
            if c.raddr and c.raddr.port == self.upstream_port
        ]

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, prepare_threshold=None) as connection:
            row = connection.execute("SELECT now()").fetchone()
            assert row is not None
            started = row[0]
            while not self.stop.is_set():
                rows = connection.execute(
                    "SELECT pid, client_port, backend_start > %s FROM pg_stat_activity"
                    " WHERE datname = current_database() AND backend_type = 'client backend'"
                    " AND pid <> pg_backend_pid() AND NOT pid = ANY(%s)",
                    (started, self.excluded),
                ).fetchall()
                ports = set(self._pooler_ports())
                pooled = [pid for pid, port, _ in rows if port in ports]
                self.bypassing |= {pid for pid, port, new in rows if new and port not in ports}
                self.peak = max(self.peak, len(pooled))
                self.samples += 1
                self.stop.wait(0.01)

    def __enter__(self) -> ServerConnections:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@contextmanager
def pinned_servers(pooled_url: str, count: int) -> Iterator[list[int]]:
    """Hold `count` of the pooler's server connections in open transactions, so Kurir has
    only the rest; yields their backend pids."""
    holders = [psycopg.connect(_plain(pooled_url), prepare_threshold=None) for _ in range(count)]
    try:
        pids = []
        for holder in holders:
            row = holder.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pids.append(int(row[0]))
        yield pids
    finally:
        for holder in holders:
            holder.rollback()
            holder.close()


@pytest.fixture
def only_pooled_connections(migrated_databases: dict[str, Any]) -> None:
    """The direct (`postgresql` backend) pool closed, so every connection PostgreSQL then
    serves for the test database is the pooler's; it reconnects when next used."""
    direct = migrated_databases.get("postgresql")
    if direct is not None:
        direct.db.engine.dispose()


@pytest.mark.parametrize("backend", ["pgbouncer"])
def test_publish_deliver_and_receive_at_once_on_three_server_connections(
    backend, live_server, auth, acme, runtime, client, pgbouncer_url, only_pooled_connections
):
    """8 threads publish over HTTP (half with an Idempotency-Key) and post signed inbound
    callbacks while a 16-thread worker delivers and processes them, all through a pooler
    left with 3 server connections: every event arrives once, every callback is applied,
    and PostgreSQL never serves Kurir more than those 3 connections."""
    publishers, per_thread, left = 8, 15, 3
    errors: list[str] = []
    kit.create_source(runtime, "psp", SW)
    with Receiver() as receiver:
        make_endpoint(client, auth, url=f"{receiver.url}/hook")

        def work(thread: int) -> None:
            with requests.Session() as http:
                for n in range(per_thread):
                    headers = {**auth, **({"Idempotency-Key": f"t{thread}-{n}"} if n % 2 else {})}
                    answer = http.post(
                        f"{live_server.url}/v1/partners/acme/events",
                        json=order(f"o-{thread}-{n}"),
                        headers=headers,
                        timeout=60,
                    )
                    if answer.status_code != 202:
                        errors.append(f"publish {answer.status_code}: {answer.text}")
                    body, signed = kit.signed_callback(
                        SW, event_id=f"cb-{thread}-{n}", resource_id=f"r{thread}", version=n + 1
                    )
                    answer = http.post(
                        f"{live_server.url}/inbound/psp",
                        data=body,
                        headers=dict(signed),
                        timeout=60,
                    )
                    if answer.status_code != 202:
                        errors.append(f"inbound {answer.status_code}: {answer.text}")

        def settled() -> bool:
            with runtime.db.begin() as session:
                delivered = session.scalars(
                    select(Delivery.id).where(Delivery.state == SUCCEEDED)
                ).all()
                applied = session.scalars(
                    select(InboundEvent.id).where(InboundEvent.status == "applied")
                ).all()
            return len(delivered) == total and len(applied) == total

        total = publishers * per_thread
        with (
            pinned_servers(pgbouncer_url, DEFAULT_POOL_SIZE - left) as pinned,
            ServerConnections(os.environ["TEST_DATABASE_URL"], pgbouncer_url, pinned) as servers,
            WorkerThread(runtime),
        ):
            threads = [threading.Thread(target=work, args=(i,)) for i in range(publishers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            assert not errors, errors[:3]
            wait_for(settled, timeout_s=120, interval_s=0.1, message="all delivered and applied")
        ids = receiver.event_ids("/hook")
        assert len(ids) == total and len(set(ids)) == total

    assert servers.samples > 0 and servers.peak >= 1
    assert not servers.bypassing, f"backends opened around the pooler: {servers.bypassing}"
    assert servers.peak <= left, f"PostgreSQL served Kurir {servers.peak} connections, not {left}"
