"""Chaos: at-least-once delivery while workers are SIGKILLed, Redis restarts and PostgreSQL
drops every connection. Prints published, delivered, lost (must be 0) and duplicates.

    .venv/bin/python bench/chaos.py [-n 10000] [--endpoints 20] [--backend postgresql|sqlite]
                                    [--workers 2] [--publish-seconds 40] [--database-url URL]

Everything it touches is its own: a PostgreSQL database (default `bench_chaos`, WIPED and
migrated; on --backend sqlite a file in a temporary directory), a redis-server it starts on
a free port (it restarts and flushes it), a receiver process listening on one port per
endpoint, and the Kurir processes: `kurir api` (gunicorn), `kurir scheduler` (the sweeper:
it re-enqueues after a Redis flush and takes back the deliveries of killed workers once their
lease expires) and --workers `kurir worker`.

Events are published through the HTTP API (`POST /v1/partners/{uid}/events`, what a service
calls), paced over --publish-seconds, round-robin over --endpoints partners with one endpoint
each, so deliveries = events. A publish that fails (an outage) is retried with the same
`Idempotency-Key`; an event counts as published once the API answered 2xx with its id.
The receivers answer 500 to --failure-rate of requests at random and record every request.

Faults, while publishing (placed by the share of events published, so they fall inside
publishing however slow the machine is):
  - every 2-5 s a random worker is SIGKILLed and started again, until publishing ends;
  - Redis is restarted twice: at 25 % with its data saved (connections drop, queues
    survive), at 75 % after a FLUSHALL (every queued job is lost);
  - at 50 %, PostgreSQL only: every backend of this database is terminated
    (`pg_terminate_backend`, `datname = current_database()`).

Then it waits until every published event has a 2xx receipt (or --drain-timeout passes).
Figures:
  - lost: published (event, endpoint) pairs with no 2xx receipt and no open dead letter;
  - duplicates: 2xx receipts beyond the first per pair (count and share of delivered);
  - time to drain after the last fault: from the last fault to the first 2xx of the last
    pair to get one;
  - attempts per delivery, worker CPU per delivery (process time of every worker
    incarnation, read just before it was killed or stopped).

The retry schedule is shortened (KURIR_RETRY_SCHEDULE, 13 attempts over ~50 s) so that a run
drains in minutes; 13 attempts at 10 % failures would all fail with probability 1e-13, so
nothing should go dead. Exit status 1 if anything was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import redis  # noqa: E402

from app.ports import free_port  # noqa: E402
from bench import rawhttp  # noqa: E402
from bench.fresh_db import fresh_database  # noqa: E402
from tests.support.fast_receiver import take_requests  # noqa: E402
from tests.support.processes import stop_groups  # noqa: E402

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/bench_chaos"
SECRET_KEY = "chaos-secret-key"  # noqa: S105 - a throwaway database
TYPE_NAME = "order.paid"
RETRY_SCHEDULE = "1,2,2,3,3,4,4,5,5,5,5,5"  # 12 retries: 13 attempts within ~50 s
LEASE_SECONDS = 5  # the engine raises it to 2 x timeout + its own margins (~13 s here)
ENDPOINT_TIMEOUT_S = 2


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- receivers


def _receiver_main(endpoints: int, failure_rate: float, seed: int, ready: Any) -> None:
    """One asyncio process, one listening port per endpoint plus a control port (put on
    `ready` as [endpoint ports…, control port] once all listen).

    Every request is recorded as [webhook-id, endpoint index, status, unix time]; a random
    `failure_rate` of them is answered 500. GET /_stats → {"ok_pairs", "requests"};
    GET /_dump → every record.
    """
    rng = random.Random(seed)
    records: list[tuple[str, int, int, float]] = []
    ok_pairs: set[tuple[str, int]] = set()

    def answer(status: int, body: bytes) -> bytes:
        reason = b"OK" if status == 200 else b"Internal Server Error"
        return b"HTTP/1.1 %d %s\r\ncontent-length: %d\r\ncontent-type: text/plain\r\n\r\n%s" % (
            status,
            reason,
            len(body),
            body,
        )

    class Protocol(asyncio.Protocol):
        def __init__(self, index: int | None) -> None:
            self.index = index
            self.buf = b""

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            arrived, self.buf = take_requests(self.buf + data)
            for _, path, msg_id in arrived:
                if self.index is None:
                    if path == "/_stats":
                        out = json.dumps({"ok_pairs": len(ok_pairs), "requests": len(records)})
                    else:
                        out = json.dumps(records)
                    self.transport.write(answer(200, out.encode()))
                    continue
                status = 500 if rng.random() < failure_rate else 200
                records.append((msg_id, self.index, status, time.time()))
                if status == 200:
                    ok_pairs.add((msg_id, self.index))
                self.transport.write(answer(status, b"ok" if status == 200 else b"no"))

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        bound: list[int] = []
        for index in range(endpoints):
            server = await loop.create_server(
                lambda i=index: Protocol(i), "127.0.0.1", 0, backlog=512
            )
            bound.append(server.sockets[0].getsockname()[1])
        control = await loop.create_server(lambda: Protocol(None), "127.0.0.1", 0)
        bound.append(control.sockets[0].getsockname()[1])
        ready.put(bound)
        await asyncio.Event().wait()

    asyncio.run(serve())


class Receivers:
    """The partners' servers: one port per endpoint, all in one process (never killed)."""

    def __init__(self, endpoints: int, failure_rate: float, seed: int) -> None:
        # The child binds port 0 and reports what it got: a port picked here and bound there
        # could be taken in between (an outgoing connection's local port, on a busy machine).
        ctx = mp.get_context("spawn")
        ready = ctx.Queue()
        self.process = ctx.Process(
            target=_receiver_main, daemon=True, args=(endpoints, failure_rate, seed, ready)
        )
        self.process.start()
        try:
            bound = ready.get(timeout=60)
        except queue.Empty:
            raise RuntimeError("receivers did not start") from None
        self.ports = bound[:-1]
        self.control = rawhttp.Connection(f"http://127.0.0.1:{bound[-1]}")
        self.urls = [f"http://127.0.0.1:{port}/hook" for port in self.ports]

    def _get(self, path: str) -> Any:
        request = rawhttp.request_bytes(
            f"http://127.0.0.1:{self.control.address[1]}{path}", b"", {}, method="GET"
        )
        return json.loads(self.control.exchange(request)[1])

    def stats(self) -> dict[str, int]:
        return dict(self._get("/_stats"))

    def dump(self) -> list[tuple[str, int, int, float]]:
        return [tuple(r) for r in self._get("/_dump")]  # type: ignore[misc]

    def close(self) -> None:
        self.control.close()
        self.process.terminate()
        self.process.join(5)


# ---------------------------------------------------------------------------- Redis


class OwnRedis:
    """A redis-server on a free port that this script starts, restarts and flushes."""

    def __init__(self, work_dir: Path) -> None:
        self.dir = work_dir / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--dbfilename",
                "dump.rdb",
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, OSError):
                if client.ping():
                    # Loaded: a later stop without a save must come back empty, not with this.
                    (self.dir / "dump.rdb").unlink(missing_ok=True)
                    client.close()
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self, *, save: bool) -> None:
        """SHUTDOWN SAVE keeps the data for the next start (a restart that loses nothing)."""
        if self.process is None:
            return
        client = redis.Redis.from_url(self.url, socket_timeout=10)
        with contextlib.suppress(redis.RedisError, OSError):
            client.shutdown(save=save, nosave=not save)
        client.close()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def flushall(self) -> None:
        client = redis.Redis.from_url(self.url)
        client.flushall()
        client.close()


# ---------------------------------------------------------------------------- Kurir


class Kurir:
    """The processes under test, and the setup they need (key, contract, partners)."""

    def __init__(
        self, database_url: str, redis_url: str, work_dir: Path, workers: int, on_log: Path
    ) -> None:
        self.env = dict(
            os.environ,
            DATABASE_URL=database_url,
            REDIS_URL=redis_url,
            KURIR_DATA_DIR=str(work_dir / "data"),
            KURIR_SECRET_KEY=SECRET_KEY,
            KURIR_ALLOW_PRIVATE_TARGETS="1",
            KURIR_RETRY_SCHEDULE=RETRY_SCHEDULE,
            KURIR_DELIVERY_LEASE_SECONDS=str(LEASE_SECONDS),
            KURIR_DEFAULT_TIMEOUT_S=str(ENDPOINT_TIMEOUT_S),
            KURIR_SWEEP_INTERVAL_SECONDS="1",
            KURIR_LOG_LEVEL=os.environ.get("CHAOS_LOG_LEVEL", "warning"),
            PYTHONPATH=str(ROOT),
        )
        self.workers_n = workers
        self.log_file = open(on_log, "ab")  # noqa: SIM115 - closed in stop()
        self.api: subprocess.Popen[bytes] | None = None
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.worker_cpu_s = 0.0
        self.incarnations = 0
        self.api_url = ""

    def setup(self, endpoint_urls: list[str]) -> str:
        """Migrate, create the contract, one partner per endpoint and an API key."""
        from app import event_types, migrate
        from app.accounts import create_api_key
        from app.config import load_settings
        from app.registry import endpoints as service
        from app.registry import partners
        from app.runtime import Runtime

        settings = load_settings(self.env)
        migrate.upgrade(settings.resolved_database_url)
        runtime = Runtime(settings)
        try:
            with runtime.db.begin() as session:
                event_types.register(
                    session, {"name": TYPE_NAME, "version": 1, "schema": {"type": "object"}}
                )
                for n, url in enumerate(endpoint_urls):
                    partner = partners.create_partner(
                        session, {"uid": f"p{n:02d}", "name": f"partner {n}"}
                    )
                    service.create_endpoint(
                        session,
                        partner,
                        {"url": url, "timeout_s": ENDPOINT_TIMEOUT_S},
                        settings,
                        runtime.secret_box,
                    )
                _, token = create_api_key(session, "chaos", ["admin"])
        finally:
            runtime.close()
        return token

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", *args],
            env=self.env,
            cwd=ROOT,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self) -> None:
        port = free_port()
        self.api = self._spawn("api", "--port", str(port), "--workers", "1", "--threads", "8")
        self.api_url = f"http://127.0.0.1:{port}"
        self.scheduler = self._spawn("scheduler")
        self.workers = [self._spawn("worker") for _ in range(self.workers_n)]
        self.incarnations = self.workers_n
        probe = rawhttp.Connection(self.api_url, timeout_s=2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                request = rawhttp.request_bytes(self.api_url + "/readyz", b"", {}, "GET")
                if probe.exchange(request)[0] == 200:
                    probe.close()
                    return
            probe.close()
            time.sleep(0.2)
        raise RuntimeError("kurir api did not become ready")

    def _cpu(self, process: subprocess.Popen[bytes]) -> float:
        with contextlib.suppress(psutil.Error):
            return float(sum(psutil.Process(process.pid).cpu_times()[:2]))
        return 0.0

    def kill_worker(self, rng: random.Random) -> int:
        """SIGKILL a random worker (its whole process group) and start a new one."""
        index = rng.randrange(len(self.workers))
        victim = self.workers[index]
        self.worker_cpu_s += self._cpu(victim)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        self.workers[index] = self._spawn("worker")
        self.incarnations += 1
        return victim.pid

    def start_up_cpu_s(self) -> float:
        """CPU a worker spends starting (imports, connections): read on the first workers
        once they sit idle, before anything is published."""
        time.sleep(3.0)
        return sum(self._cpu(w) for w in self.workers) / max(1, len(self.workers))

    def stop(self) -> None:
        for worker in self.workers:
            self.worker_cpu_s += self._cpu(worker)
        stop_groups([*self.workers, self.scheduler, self.api])
        self.log_file.close()


# ---------------------------------------------------------------------------- publishing


class Publisher:
    """Publishes through the API from a few threads, paced; retries an event (same
    Idempotency-Key) until the API answers 2xx with its id."""

    def __init__(
        self,
        api_url: str,
        token: str,
        endpoints: int,
        events: int,
        seconds: float,
        threads: int = 4,
    ) -> None:
        self.api_url = api_url
        self.token = token
        self.endpoints = endpoints
        self.events = events
        self.seconds = seconds
        self.threads = threads
        self.published: dict[str, int] = {}  # event id -> endpoint index
        self.retries = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        origin = time.monotonic()
        for k in range(self.threads):
            thread = threading.Thread(target=self._run, args=(k, origin), daemon=True)
            thread.start()
            self._workers.append(thread)

    def join(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for thread in self._workers:
            thread.join(max(0.1, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._workers)

    def _request(self, i: int) -> bytes:
        index = i % self.endpoints
        body = json.dumps(
            {"type": TYPE_NAME, "version": 1, "data": {"n": i, "order_id": f"ord_{i:07d}"}}
        ).encode()
        return rawhttp.request_bytes(
            f"{self.api_url}/v1/partners/p{index:02d}/events",
            body,
            {
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "Idempotency-Key": f"chaos-{i}",
            },
        )

    def _run(self, k: int, origin: float) -> None:
        connection = rawhttp.Connection(self.api_url, timeout_s=30)
        try:
            for i in range(k, self.events, self.threads):
                delay = origin + i * self.seconds / self.events - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                request = self._request(i)
                deadline = time.monotonic() + 300
                while True:
                    try:
                        status, body = connection.exchange(request)
                    except OSError:
                        connection.close()
                        status, body = -1, b""
                    if 200 <= status < 300:
                        with self._lock:
                            self.published[json.loads(body)["id"]] = i % self.endpoints
                        break
                    if status in (400, 401, 403, 404, 422) or time.monotonic() > deadline:
                        with self._lock:
                            self.failures.append(f"event {i}: {status} {body[:200]!r}")
                        break
                    with self._lock:
                        self.retries += 1
                    time.sleep(0.2)
        finally:
            connection.close()


# ---------------------------------------------------------------------------- the run


@dataclass
class ChaosConfig:
    events: int = 10_000
    endpoints: int = 20
    backend: str = "postgresql"
    database_url: str = DEFAULT_DB
    workers: int = 2
    publish_seconds: float = 40.0
    failure_rate: float = 0.10
    kill_every_s: tuple[float, float] = (2.0, 5.0)
    drain_timeout_s: float = 600.0
    seed: int = 0
    work_dir: Path | None = None


@dataclass
class ChaosReport:
    backend: str
    published: int = 0
    publish_failures: int = 0
    publish_retries: int = 0
    delivered: int = 0
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)
    dead_letters: int = 0
    duplicates: int = 0
    unexpected: int = 0
    requests: int = 0
    failed_answers: int = 0
    attempts: int = 0
    faults: list[tuple[float, str]] = field(default_factory=list)
    kills: int = 0
    redis_restarts: int = 0
    backends_terminated: int = 0
    drain_after_last_fault_s: float | None = None
    drain_after_last_publish_s: float | None = None
    publish_s: float = 0.0
    elapsed_s: float = 0.0
    worker_cpu_ms_per_delivery: float = 0.0
    worker_incarnations: int = 0
    worker_start_up_cpu_s: float = 0.0
    worker_cpu_ms_per_delivery_after_start_up: float = 0.0
    delivery_states: dict[str, int] = field(default_factory=dict)

    @property
    def duplicate_share(self) -> float:
        return self.duplicates / self.delivered if self.delivered else 0.0

    def text(self) -> str:
        drain = (
            "never"
            if self.drain_after_last_fault_s is None
            else f"{self.drain_after_last_fault_s:.1f} s after the last fault, "
            f"{self.drain_after_last_publish_s:.1f} s after the last publish"
        )
        lines = [
            f"chaos on {self.backend}: {self.kills} workers SIGKILLed, {self.redis_restarts} "
            f"Redis restarts (one after FLUSHALL), {self.backends_terminated} PostgreSQL "
            f"backends terminated; receivers failed {self.failed_answers} of "
            f"{self.requests} requests",
            f"  published     {self.published:>7}  (publish retries {self.publish_retries}, "
            f"gave up {self.publish_failures})",
            f"  delivered     {self.delivered:>7}  (pairs with a 2xx receipt)",
            f"  lost          {self.lost:>7}  (no 2xx and no open dead letter; must be 0)",
            f"  dead letters  {self.dead_letters:>7}",
            f"  duplicates    {self.duplicates:>7}  ({self.duplicate_share:.2%} of delivered)",
            f"  unexpected    {self.unexpected:>7}  (2xx for events never acknowledged)",
            f"  drained       {drain}; publishing took {self.publish_s:.1f} s, the whole run "
            f"{self.elapsed_s:.1f} s",
            f"  attempts      {self.attempts / max(1, self.published):.2f} per delivery",
            f"  worker CPU    {self.worker_cpu_ms_per_delivery:.2f} ms per delivery over "
            f"{self.worker_incarnations} worker processes; "
            f"{self.worker_cpu_ms_per_delivery_after_start_up:.2f} ms without their start-ups "
            f"({self.worker_start_up_cpu_s:.2f} s CPU each)",
            f"  delivery states {self.delivery_states}",
        ]
        if self.lost_examples:
            lines.append(f"  lost, first few: {self.lost_examples}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["duplicate_share"] = round(self.duplicate_share, 5)
        return data


def terminate_backends(url: str) -> int:
    """Terminate every backend of this database but our own; how many."""
    from sqlalchemy import text

    from app.config import normalise_database_url
    from app.db import Database

    db = Database(normalise_database_url(url), pool_size=1)
    try:
        with db.engine.begin() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).all()
            )
    finally:
        db.dispose()


def store_figures(url: str) -> tuple[dict[str, int], int, int]:
    """(deliveries by state, open dead letters, attempts), retried through an outage."""
    from sqlalchemy import func, select

    from app.config import normalise_database_url
    from app.db import Database
    from app.models import DL_OPEN, Attempt, DeadLetter, Delivery

    db = Database(normalise_database_url(url), pool_size=1)
    try:
        with db.begin() as session:
            states = dict(
                session.execute(select(Delivery.state, func.count()).group_by(Delivery.state)).all()
            )
            dead = (
                session.scalar(
                    select(func.count()).select_from(DeadLetter).where(DeadLetter.state == DL_OPEN)
                )
                or 0
            )
            attempts = session.scalar(select(func.count()).select_from(Attempt)) or 0
        return states, int(dead), int(attempts)  # type: ignore[return-value]
    finally:
        db.dispose()


def settled(url: str) -> bool:
    """No delivery is pending, retrying or in flight (False while the store is unreachable)."""
    try:
        states, _, _ = store_figures(url)
    except Exception:  # noqa: BLE001 - an outage only means "not yet"
        return False
    return not set(states) - {"succeeded", "dead"}


def open_dead_letter_pairs(url: str) -> set[str]:
    from sqlalchemy import select

    from app.config import normalise_database_url
    from app.db import Database
    from app.models import DL_OPEN, DeadLetter

    db = Database(normalise_database_url(url), pool_size=1)
    try:
        with db.begin() as session:
            return set(
                session.scalars(select(DeadLetter.event_id).where(DeadLetter.state == DL_OPEN))
            )
    finally:
        db.dispose()


class Faults:
    """The fault schedule, run in a thread while publishing; records when each happened."""

    def __init__(
        self,
        config: ChaosConfig,
        kurir: Kurir,
        own_redis: OwnRedis,
        database_url: str,
        rng: random.Random,
        origin: float,
        progress: Callable[[], float],
    ) -> None:
        self.config = config
        self.progress = progress
        self.kurir = kurir
        self.redis = own_redis
        self.database_url = database_url
        self.rng = rng
        self.origin = origin
        self.log: list[tuple[float, str]] = []
        self.kills = 0
        self.redis_restarts = 0
        self.terminated = 0
        self.stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> float:
        return time.monotonic() - self.origin

    def record(self, what: str) -> None:
        self.log.append((round(self.now(), 2), what))
        log(what)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        # Placed by how much has been published, so that however slowly publishing goes,
        # the faults fall inside it; the kills go on until it ends.
        planned: list[tuple[float, Callable[[], None]]] = [
            (0.25, self._restart_redis_keeping_data),
            (0.75, self._restart_redis_after_flushall),
        ]
        if self.config.backend == "postgresql":
            planned.append((0.5, self._terminate_backends))
        planned.sort(key=lambda item: item[0])
        next_kill = self.now() + self.rng.uniform(*self.config.kill_every_s)
        while not self.stop.wait(max(0.0, min(0.1, next_kill - self.now()))):
            try:
                if planned and planned[0][0] <= self.progress():
                    planned.pop(0)[1]()
                elif next_kill <= self.now():
                    pid = self.kurir.kill_worker(self.rng)
                    self.kills += 1
                    self.record(f"SIGKILL worker {pid}")
                    next_kill = self.now() + self.rng.uniform(*self.config.kill_every_s)
            except Exception as exc:  # noqa: BLE001 - a fault that failed is reported, not fatal
                self.errors.append(f"{type(exc).__name__}: {exc}")
                log(f"fault failed: {exc}")

    def _restart_redis_keeping_data(self) -> None:
        self.redis.stop(save=True)
        self.record("Redis stopped (data saved)")
        time.sleep(1.0)
        self.redis.start()
        self.redis_restarts += 1
        self.record("Redis started again with its data")

    def _restart_redis_after_flushall(self) -> None:
        self.redis.flushall()
        self.redis.stop(save=False)
        self.record("Redis FLUSHALL and stopped")
        time.sleep(1.0)
        self.redis.start()
        self.redis_restarts += 1
        self.record("Redis started again, empty")

    def _terminate_backends(self) -> None:
        self.terminated = terminate_backends(self.database_url)
        self.record(f"terminated {self.terminated} PostgreSQL backends")


def run(config: ChaosConfig) -> ChaosReport:
    """One chaos run; everything started here is stopped here."""
    rng = random.Random(config.seed or int(time.time()))
    own_dir = config.work_dir is None
    work_dir = Path(tempfile.mkdtemp(prefix="kurir-chaos-")) if own_dir else Path(config.work_dir)  # type: ignore[arg-type]
    work_dir.mkdir(parents=True, exist_ok=True)
    if config.backend == "sqlite":
        database_url = f"sqlite:///{work_dir / 'chaos.db'}"
        (work_dir / "chaos.db").unlink(missing_ok=True)
    else:
        database_url = config.database_url
        fresh_database(database_url)
    report = ChaosReport(config.backend)
    own_redis = OwnRedis(work_dir)
    own_redis.start()
    receivers = Receivers(config.endpoints, config.failure_rate, rng.randrange(2**31))
    kurir = Kurir(database_url, own_redis.url, work_dir, config.workers, work_dir / "kurir.log")
    try:
        token = kurir.setup(receivers.urls)
        kurir.start()
        start_up_s = kurir.start_up_cpu_s()
        log(
            f"{config.backend}: publishing {config.events} events over {config.endpoints} "
            f"endpoints in {config.publish_seconds:.0f} s; logs in {work_dir / 'kurir.log'}"
        )
        origin = time.monotonic()
        started = time.time()
        publisher = Publisher(
            kurir.api_url, token, config.endpoints, config.events, config.publish_seconds
        )
        faults = Faults(
            config,
            kurir,
            own_redis,
            database_url,
            rng,
            origin,
            lambda: len(publisher.published) / config.events,
        )
        publisher.start()
        faults.start()
        publisher.join(config.publish_seconds + 600)
        last_publish = time.monotonic() - origin
        faults.join()
        last_fault = max((at for at, _ in faults.log), default=0.0)
        published = len(publisher.published)
        log(f"published {published}; waiting for every event to be delivered")
        deadline = time.monotonic() + config.drain_timeout_s
        while time.monotonic() < deadline:
            if receivers.stats()["ok_pairs"] >= published:
                break
            time.sleep(0.25)
        # Every pair has its 2xx; what a killed worker sent but could not record is retried
        # once its lease expires (a duplicate, counted below): wait for the store to settle.
        while time.monotonic() < deadline and not settled(database_url):
            time.sleep(0.5)
        report.elapsed_s = round(time.time() - started, 1)
        kurir.stop()
        records = receivers.dump()
        states, dead, attempts = store_figures(database_url)
        dead_events = open_dead_letter_pairs(database_url)

        expected = {(event_id, index) for event_id, index in publisher.published.items()}
        ok = Counter((msg_id, index) for msg_id, index, status, _ in records if 200 <= status < 300)
        first_ok: dict[tuple[str, int], float] = {}
        for msg_id, index, status, at in records:
            if 200 <= status < 300 and (msg_id, index) not in first_ok:
                first_ok[(msg_id, index)] = at
        missing = sorted(pair for pair in expected if pair not in ok)
        report.published = published
        report.publish_failures = len(publisher.failures)
        report.publish_retries = publisher.retries
        report.delivered = sum(1 for pair in expected if pair in ok)
        report.lost = sum(1 for event_id, _ in missing if event_id not in dead_events)
        report.lost_examples = [f"{e}@{i}" for e, i in missing[:5]]
        report.dead_letters = dead
        report.duplicates = sum(count - 1 for pair, count in ok.items() if pair in expected)
        report.unexpected = sum(count for pair, count in ok.items() if pair not in expected)
        report.requests = len(records)
        report.failed_answers = sum(1 for r in records if r[2] >= 500)
        report.attempts = attempts
        report.faults = faults.log
        report.kills = faults.kills
        report.redis_restarts = faults.redis_restarts
        report.backends_terminated = faults.terminated
        report.delivery_states = states
        if first_ok and not missing:
            drained_at = max(first_ok[pair] for pair in expected) - started
            report.drain_after_last_fault_s = round(max(0.0, drained_at - last_fault), 1)
            report.drain_after_last_publish_s = round(max(0.0, drained_at - last_publish), 1)
        report.publish_s = round(last_publish, 1)
        report.worker_cpu_ms_per_delivery = round(
            kurir.worker_cpu_s * 1000 / max(1, report.delivered), 3
        )
        report.worker_incarnations = kurir.incarnations
        report.worker_start_up_cpu_s = round(start_up_s, 2)
        report.worker_cpu_ms_per_delivery_after_start_up = round(
            max(0.0, kurir.worker_cpu_s - kurir.incarnations * start_up_s)
            * 1000
            / max(1, report.delivered),
            3,
        )
        if faults.errors or publisher.failures:
            log(f"fault errors: {faults.errors}; publish failures: {publisher.failures[:5]}")
        return report
    finally:
        with contextlib.suppress(Exception):
            kurir.stop()
        receivers.close()
        own_redis.stop(save=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--events", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=20)
    parser.add_argument("--backend", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--publish-seconds", type=float, default=40.0)
    parser.add_argument("--failure-rate", type=float, default=0.10)
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    config = ChaosConfig(
        events=args.events,
        endpoints=args.endpoints,
        backend=args.backend,
        database_url=args.database_url,
        workers=args.workers,
        publish_seconds=args.publish_seconds,
        failure_rate=args.failure_rate,
        drain_timeout_s=args.drain_timeout,
        seed=args.seed,
    )
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; run id "
        f"{uuid.uuid4().hex[:8]}",
        flush=True,
    )
    report = run(config)
    print(report.text(), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2, default=str))
    return 1 if report.lost or report.delivered < report.published else 0


if __name__ == "__main__":
    raise SystemExit(main())
