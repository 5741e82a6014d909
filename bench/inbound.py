"""Inbound: callbacks acknowledged/s by `kurir api`, and events processed/s by `kurir worker`.

    .venv/bin/python bench/inbound.py [-n 6000] [--clients 8] [--workers 2] [--proc 2]
                                      [--in-order] [--no-bare] [--sustained N]

The script owns BENCH_DATABASE_URL (default: the `kurir_inbound_bench` database, which it
WIPES and migrates) and BENCH_REDIS_URL (default db 6, which it FLUSHES). It creates one
Standard Webhooks source, signs every callback the way a provider would (fresh timestamp,
HMAC-SHA256 over ``{id}.{timestamp}.{body}``), starts `kurir api` (its default server) and
measures, in one run:

  1. ack rate: N callbacks from C concurrent clients in a closed loop (threads, one
     kept-alive socket each, prebuilt requests: bench/rawhttp.py) → acknowledged/s, p50/p99
     time-to-202 (every 202 means stored and committed) and CPU ms per callback; in
     --ack-rounds turns with the bare ack (`bare_app`: verify the HMAC, INSERT, 202, in
     plain Flask under the same granian settings), whose rows are deleted after each turn.
     The API's CPU per callback over the bare ack's is printed turn by turn (target
     <= 1.15); --ack-only stops here;
  2. open loop at --paced-rate callbacks/s → p50/p99 counted from each request's due time;
  3. bare processing ceiling: --proc processes with raw psycopg apply the same stored events
     with the least SQL any correct processor needs (per 100 events one transaction: one
     statement that creates the missing states and locks them all in key order, one
     conditional UPDATE per event, pipelined, one UPDATE of the events' statuses per outcome;
     no Redis, no claim, no fencing, no handlers). Then the events and states are reset;
  4. processing: --proc `kurir worker` processes drain the backlog the receiver queued
     (started on a held-back queue, so their start-up is not timed) → events/s, CPU ms per
     event (workers, PostgreSQL backends, Redis), and a check that every resource ended at
     its highest version;
  5. sustained (--sustained N callbacks, default N): the workers keep running while the
     clients send again; both rates over the same seconds, the backlog left when sending
     stops, and how long it takes to drain.

CPU time is process time of the process trees involved (psutil), so on a shared machine the
per-event costs say what the rates would be on an idle one. The callbacks go to --resources
resources, shuffled (most events then arrive after a newer one and are ignored as stale) or,
with --in-order, in version order (every event is applied); --duplicates of them are sent
twice (answered 200, not processed again).

Targets on this 2-core machine: ack >= 800/s with p99 <= 30 ms; processing with 2 workers
>= the ack rate of the same run and never below 800 events/s.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import requests  # noqa: E402

from app.ports import free_port  # noqa: E402
from bench import rawhttp  # noqa: E402
from tests.support.processes import stop_group, stop_groups  # noqa: E402

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_inbound_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/6"
SECRET = "whsec_" + base64.b64encode(b"kurir-inbound-bench-secret-32b!").decode()
SOURCE = "bench-psp"
INBOUND_QUEUE_KEY = "rq:queue:kurir-inbound"
HELD_QUEUE_KEY = "bench:held:kurir-inbound"
BARE_BATCH = 100


# ---------------------------------------------------------------------------- callbacks


@dataclass
class Callback:
    body: bytes
    event_id: str
    resource_id: str
    version: int


def make_callbacks(n: int, resources: int, seed: int, *, in_order: bool = False) -> list[Callback]:
    """n distinct events over `resources` resources, versions 1..k each; shuffled, or in
    version order (each resource's versions rise, resources interleaved)."""
    rng = random.Random(seed)
    events = []
    now = time.time()
    for i in range(n):
        resource = f"pay_{seed}_{i % resources:05d}"
        version = i // resources + 1
        event_id = f"evt_{seed}_{i:07d}"
        doc = {
            "id": event_id,
            "type": "payment.updated",
            "version": 1,
            "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "partner": "bench",
            "resource": {"type": "payment", "id": resource, "version": version},
            "data": {"status": f"s{version}", "amount": 1000 + i % 977, "currency": "EUR"},
        }
        events.append(Callback(json.dumps(doc).encode(), event_id, resource, version))
    if not in_order:
        rng.shuffle(events)
    return events


def signed_headers(callback: Callback, key: bytes) -> dict[str, str]:
    timestamp = str(int(time.time()))
    mac = hmac.new(
        key, f"{callback.event_id}.{timestamp}.".encode() + callback.body, hashlib.sha256
    ).digest()
    return {
        "content-type": "application/json",
        "webhook-id": callback.event_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


def with_duplicates(
    batch: list[Callback], share: float, seed: int, *, keep_order: bool
) -> list[Callback]:
    rng = random.Random(seed)
    resend = rng.sample(batch, int(len(batch) * share))
    if keep_order:
        # A re-send arrives a little after its original, as a provider's retry would.
        stream = list(batch)
        for callback in resend:
            index = stream.index(callback)
            stream.insert(min(len(stream), index + rng.randint(1, 50)), callback)
        return stream
    stream = batch + resend
    rng.shuffle(stream)
    return stream


# ---------------------------------------------------------------------------- CPU


class CpuMeter:
    """CPU seconds of process trees, of this database's PostgreSQL backends and of Redis.

    A backend's CPU is counted while it lives, so a phase is read before its processes end.
    """

    def __init__(self, database: str, redis_port: int) -> None:
        self.database = database
        self.redis_port = str(redis_port)

    def snapshot(self, trees: dict[str, list[int]]) -> dict[str, float]:
        totals: dict[str, float] = {name: 0.0 for name in trees}
        for name, pids in trees.items():
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(pid)
                    for proc in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            totals[name] += sum(proc.cpu_times()[:2])
        totals["postgres"] = 0.0
        totals["redis"] = 0.0
        for proc in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                cmdline = " ".join(proc.info["cmdline"] or ())
                if proc.info["name"] == "redis-server" and f":{self.redis_port}" in cmdline:
                    totals["redis"] += sum(proc.cpu_times()[:2])
                elif cmdline.startswith("postgres: ") and f" {self.database} " in cmdline:
                    totals["postgres"] += sum(proc.cpu_times()[:2])
        return totals


def per_unit_ms(before: dict[str, float], after: dict[str, float], units: int) -> dict[str, float]:
    per = {k: round((after[k] - before[k]) * 1000 / max(1, units), 3) for k in before}
    per["total"] = round(sum(per.values()), 3)
    return per


def cpu_text(per: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in per.items())


# ---------------------------------------------------------------------------- receiving


@dataclass
class Result:
    label: str
    count: int
    statuses: dict[int, int]
    seconds: float
    latencies_ms: list[float]
    cpu_ms: dict[str, float] = field(default_factory=dict)

    @property
    def acked(self) -> int:
        return sum(v for k, v in self.statuses.items() if 200 <= k < 300)

    @property
    def rate(self) -> float:
        return self.acked / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]

    def line(self) -> str:
        text = (
            f"{self.label:<30} {self.rate:7.0f} acked/s  p50 {self.pct(50):6.1f} ms  "
            f"p99 {self.pct(99):6.1f} ms  max {max(self.latencies_ms or [0]):7.1f} ms  "
            f"statuses {dict(sorted(self.statuses.items()))}"
        )
        if self.cpu_ms:
            text += f"\n{'':<32}cpu ms/callback: {cpu_text(self.cpu_ms)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "acked_per_s": round(self.rate, 1),
            "p50_ms": round(self.pct(50), 2),
            "p99_ms": round(self.pct(99), 2),
            "max_ms": round(max(self.latencies_ms or [0]), 2),
            "statuses": self.statuses,
            "cpu_ms_per_callback": self.cpu_ms,
        }


def send_all(
    url: str, callbacks: list[Callback], key: bytes, clients: int, rate: float | None, label: str
) -> Result:
    """Sign every callback now (a run lasts seconds, the tolerance is minutes), then send them
    as prebuilt requests on kept-alive sockets (bench/rawhttp.py)."""
    prebuilt = [rawhttp.request_bytes(url, cb.body, signed_headers(cb, key)) for cb in callbacks]
    due = None if rate is None else (lambda i: i / rate)
    latencies, statuses, elapsed = rawhttp.run_clients(url, prebuilt, clients, due=due)
    merged: dict[int, int] = {}
    for status in statuses:
        merged[status] = merged.get(status, 0) + 1
    return Result(label, len(latencies), merged, elapsed, latencies)


@contextmanager
def api_server(
    env: dict[str, str], port: int, workers: int, threads: int
) -> Iterator[tuple[str, int]]:
    args = [
        sys.executable,
        "-m",
        "app.cli",
        "api",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--threads",
        str(threads),
    ]
    process = subprocess.Popen(args, env=env, cwd=ROOT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        else:
            raise SystemExit("bench: kurir api did not become ready")
        yield base, process.pid
    finally:
        stop_group(process)


# ---------------------------------------------------------------------------- bare ack

BARE_SOURCE = "bench-bare"


def bare_app() -> Any:
    """`bench.inbound:bare_app` (a factory): the ceiling for an ack. Verify the Standard
    Webhooks HMAC over the raw body, parse it, INSERT the inbound_events row (ON CONFLICT DO
    NOTHING: a retried callback is no error), commit, answer 202 — in plain Flask and
    SQLAlchemy Core, as an endpoint written for one provider would be."""
    from flask import Flask, request
    from sqlalchemy.dialects.postgresql import insert

    from app.clock import parse_rfc3339, utcnow
    from app.config import normalise_database_url
    from app.db import make_engine
    from app.ids import new_id
    from app.inbound.verify import standard_webhooks_key
    from app.models import InboundEvent

    engine = make_engine(normalise_database_url(os.environ["BARE_DATABASE_URL"]), pool_size=10)
    source_id = os.environ["BARE_SOURCE_ID"]
    key = standard_webhooks_key(SECRET)
    table = InboundEvent.__table__
    app = Flask(__name__)

    @app.post("/bare/inbound")
    def receive() -> tuple[str, int, dict[str, str]]:
        body = request.get_data()
        msg_id = request.headers.get("webhook-id", "")
        stamp = request.headers.get("webhook-timestamp", "0")
        if not stamp.isdigit() or abs(time.time() - int(stamp)) > 300:
            return '{"error":"stale"}', 401, {"Content-Type": "application/json"}
        mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
        expected = base64.b64encode(mac).decode()
        offered = request.headers.get("webhook-signature", "").split()
        if not any(hmac.compare_digest(expected, sig.partition(",")[2]) for sig in offered):
            return '{"error":"signature"}', 401, {"Content-Type": "application/json"}
        doc = json.loads(body)
        resource = doc.get("resource") or {}
        now = utcnow()
        row_id = new_id("ine")
        with engine.begin() as connection:
            stored = connection.execute(
                insert(table)
                .values(
                    id=row_id,
                    source_id=source_id,
                    event_id=doc["id"],
                    event_type=doc["type"],
                    resource_type=resource.get("type"),
                    resource_id=resource.get("id"),
                    resource_version=resource.get("version"),
                    occurred_at=parse_rfc3339(doc["occurred_at"]),
                    resource_status=(doc.get("data") or {}).get("status"),
                    status="received",
                    raw_body=body,
                    headers={k.lower(): v for k, v in request.headers.items()},
                    attempts=0,
                    received_at=now,
                    updated_at=now,
                )
                .on_conflict_do_nothing(index_elements=["source_id", "event_id"])
                .returning(table.c.id)
            ).first()
        answer = json.dumps({"id": row_id, "status": "received", "duplicate": stored is None})
        return answer, 202 if stored else 200, {"Content-Type": "application/json"}

    return app


@contextmanager
def bare_server(
    env: dict[str, str], url: str, source_id: str, workers: int, threads: int
) -> Iterator[tuple[str, int]]:
    """The bare ack under granian with `kurir api`'s settings (bench/wsgi_servers.py)."""
    from bench import wsgi_servers

    port = free_port()
    command = wsgi_servers.command("granian", "bench.inbound:bare_app", port, workers, threads)
    bare_env = dict(env, BARE_DATABASE_URL=url, BARE_SOURCE_ID=source_id)
    process = subprocess.Popen(command, env=bare_env, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.1)
        else:
            raise SystemExit("bench: the bare ack server did not come up")
        yield f"http://127.0.0.1:{port}/bare/inbound", process.pid
    finally:
        stop_group(process)


def bare_source_id(db: Any) -> str:
    """The bare ack's own source row (made by `prepare`): its rows are deleted after each
    turn, so that they are neither processed nor counted."""
    from sqlalchemy import select

    from app.models import InboundSource

    with db.begin() as session:
        return str(
            session.scalar(select(InboundSource.id).where(InboundSource.name == BARE_SOURCE))
        )


def forget_bare_rows(db: Any, source_id: str) -> None:
    from sqlalchemy import text

    with db.begin() as session:
        session.execute(text("DELETE FROM inbound_events WHERE source_id = :s"), {"s": source_id})


# ---------------------------------------------------------------------------- database


def prepare(url: str, redis_url: str) -> Any:
    """Wipe and migrate the bench database, flush Redis, create the source."""
    import redis

    from app.config import Settings
    from app.db import Database
    from app.inbound import sources
    from app.runtime import Runtime
    from bench.fresh_db import fresh_database

    db = Database(fresh_database(url), pool_size=2)
    redis.Redis.from_url(redis_url).flushdb()
    runtime = Runtime(
        Settings(
            database_url=url,
            redis_url=redis_url,
            secret_key=os.environ.get("KURIR_SECRET_KEY", "bench-secret-key"),
            data_dir=ROOT / "var" / "bench",
        ),
        database=db,
    )
    with db.begin() as session:
        for name in (SOURCE, BARE_SOURCE):
            sources.create_source(
                session,
                runtime.secret_box,
                runtime.settings,
                name=name,
                scheme="standard-webhooks",
                secrets=[SECRET],
            )
    return db


def counts(db: Any) -> dict[str, int]:
    from sqlalchemy import func, select

    from app.models import InboundEvent

    with db.begin() as session:
        return dict(
            session.execute(
                select(InboundEvent.status, func.count()).group_by(InboundEvent.status)
            ).all()
        )  # type: ignore[arg-type]


def unfinished(db: Any) -> int:
    """Events not yet final (an index-only count on (status, id))."""
    from sqlalchemy import text

    with db.engine.connect() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM inbound_events WHERE status IN ('received', 'processing')"
                )
            ).scalar_one()
        )


def vacuum(db: Any) -> None:
    from sqlalchemy import text

    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE inbound_events"))
        connection.execute(text("VACUUM ANALYZE resource_states"))


def reset_processing(db: Any) -> None:
    """Back to "received, nothing applied" after the bare run, for Kurir to process."""
    from sqlalchemy import text

    with db.engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE inbound_events SET status = 'received', reason = NULL,"
                " processed_at = NULL, attempts = 0"
            )
        )
        connection.execute(text("DELETE FROM resource_states"))
    vacuum(db)


def check_states(db: Any, callbacks: list[Callback]) -> tuple[int, int]:
    """(resources at their highest version, resources)."""
    from sqlalchemy import select

    from app.models import ResourceState

    highest: dict[str, int] = {}
    for cb in callbacks:
        highest[cb.resource_id] = max(highest.get(cb.resource_id, 0), cb.version)
    with db.begin() as session:
        found = {s.resource_id: s.last_version for s in session.scalars(select(ResourceState))}
    good = sum(1 for rid, v in highest.items() if found.get(rid) == v)
    return good, len(highest)


# ---------------------------------------------------------------------------- bare ceiling


def _psycopg_url(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(scheme="postgresql").geturl()


def _bare_main(
    url: str, batches: list[list[tuple[Any, ...]]], barrier: Any, out: Any, measured: Any
) -> None:
    """Apply the batches with raw psycopg: the least SQL a correct processor needs."""
    import psycopg

    with psycopg.connect(_psycopg_url(url)) as connection:
        barrier.wait()
        cpu = time.process_time()
        for batch in batches:
            with connection.transaction(), connection.cursor() as cursor:
                # Every state of the batch created if missing and locked, in key order (one
                # statement; without the order two processes deadlock).
                keys = sorted({(row[1], row[2], row[3]) for row in batch})
                values = ", ".join(["(%s, %s, %s, %s, true, now(), now())"] * len(keys))
                upsert = (
                    "INSERT INTO resource_states (id, source_id, resource_type, "  # noqa: S608
                    "resource_id, placeholder, created_at, updated_at) VALUES "
                    + values
                    + " ON CONFLICT (source_id, resource_type, resource_id) "
                    "DO UPDATE SET resource_id = excluded.resource_id"
                )
                cursor.execute(
                    upsert, [v for key in keys for v in ("rst_" + uuid.uuid4().hex[:20], *key)]
                )
                # One conditional UPDATE per event, pipelined, each telling whether it applied.
                cursor.executemany(
                    "UPDATE resource_states SET last_version = %s, status = %s, "
                    "last_event_id = %s, placeholder = false, updated_at = now() "
                    "WHERE source_id = %s AND resource_type = %s AND resource_id = %s "
                    "AND (last_version IS NULL OR last_version < %s) RETURNING 1",
                    [
                        (version, status, event_id, source_id, rtype, rid, version)
                        for event_id, source_id, rtype, rid, version, status in batch
                    ],
                    returning=True,
                )
                applied, ignored = [], []
                for row in batch:
                    (applied if cursor.rowcount else ignored).append(row[0])
                    cursor.nextset()
                for status, ids in (("applied", applied), ("ignored", ignored)):
                    if ids:
                        cursor.execute(
                            "UPDATE inbound_events SET status = %s, processed_at = now(), "
                            "updated_at = now() WHERE id = ANY(%s)",
                            (status, ids),
                        )
        out.put(time.process_time() - cpu)
        measured.wait(60)  # keep the backend (and its CPU count) until it has been read


def bare_processing(db: Any, url: str, processes: int, meter: CpuMeter) -> dict[str, Any]:
    """The stored events, in arrival order, in batches dealt round-robin to N processes."""
    from sqlalchemy import text

    with db.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT id, source_id, coalesce(resource_type, ''), resource_id, resource_version,"
                " resource_status FROM inbound_events WHERE status = 'received' "
                "ORDER BY received_at, id"
            )
        ).all()
    batches = [
        [tuple(r) for r in rows[i : i + BARE_BATCH]] for i in range(0, len(rows), BARE_BATCH)
    ]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    out = ctx.Queue()
    measured = ctx.Event()
    procs = [
        ctx.Process(target=_bare_main, args=(url, batches[n::processes], barrier, out, measured))
        for n in range(processes)
    ]
    for proc in procs:
        proc.start()
    barrier.wait()
    before = meter.snapshot({"bare": [p.pid for p in procs if p.pid]})
    started = time.perf_counter()
    own_cpu = [out.get() for _ in procs]
    elapsed = time.perf_counter() - started
    after = meter.snapshot({"bare": [p.pid for p in procs if p.pid]})
    measured.set()
    for proc in procs:
        proc.join(30)
    cpu = per_unit_ms(before, after, len(rows))
    cpu["bare"] = round(sum(own_cpu) * 1000 / max(1, len(rows)), 3)  # exact, from inside
    cpu["total"] = round(cpu["bare"] + cpu["postgres"] + cpu["redis"], 3)
    return {
        "processed": len(rows),
        "seconds": round(elapsed, 2),
        "per_s": round(len(rows) / elapsed, 1) if elapsed else 0.0,
        "cpu_ms_per_event": cpu,
    }


# ---------------------------------------------------------------------------- Kurir workers


def start_workers(env: dict[str, str], procs: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker"], env=env, cwd=ROOT, start_new_session=True
        )
        for _ in range(procs)
    ]


def wait_started(workers: list[subprocess.Popen[bytes]], quiet_s: float = 1.0) -> None:
    """Until the workers have imported everything and sit idle (their CPU stops rising)."""
    deadline = time.monotonic() + 60
    last = -1.0
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        used = 0.0
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                used += sum(psutil.Process(worker.pid).cpu_times()[:2])
        if used - last < 0.05 * quiet_s * len(workers):
            return
        last = used


def drain(db: Any, deadline_s: float = 600) -> float:
    """Seconds until no event is left unfinished."""
    started = time.perf_counter()
    while unfinished(db) and time.perf_counter() - started < deadline_s:
        time.sleep(0.05)
    return time.perf_counter() - started


def kurir_processing(
    env: dict[str, str], db: Any, redis_url: str, procs: int, meter: CpuMeter
) -> tuple[dict[str, Any], list[subprocess.Popen[bytes]]]:
    """Drain the queued backlog with N `kurir worker` processes started on a held-back queue.

    Returns the figures and the workers, still running, for the sustained phase.
    """
    import redis

    connection = redis.Redis.from_url(redis_url)
    expected = unfinished(db)
    queued = connection.llen(INBOUND_QUEUE_KEY)
    connection.rename(INBOUND_QUEUE_KEY, HELD_QUEUE_KEY)
    workers = start_workers(env, procs)
    wait_started(workers)
    trees = {"workers": [w.pid for w in workers]}
    before = meter.snapshot(trees)
    connection.rename(HELD_QUEUE_KEY, INBOUND_QUEUE_KEY)
    elapsed = drain(db)
    after = meter.snapshot(trees)
    left = unfinished(db)
    done = expected - left
    connection.close()
    return (
        {
            "processed": done,
            "queued_jobs": queued,
            "seconds": round(elapsed, 2),
            "per_s": round(done / elapsed, 1) if elapsed else 0.0,
            "cpu_ms_per_event": per_unit_ms(before, after, done),
            "left": left,
        },
        workers,
    )


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--events", type=int, default=6000)
    parser.add_argument("--resources", type=int, default=500)
    parser.add_argument(
        "--in-order",
        action="store_true",
        help="send each resource's versions in order (all applied)",
    )
    parser.add_argument(
        "--duplicates", type=float, default=0.05, help="fraction of callbacks sent a second time"
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--paced-rate", type=float, default=800.0)
    parser.add_argument("--paced-seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn worker")
    parser.add_argument("--proc", type=int, default=2, help="`kurir worker` processes")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare ceilings")
    parser.add_argument(
        "--ack-rounds", type=int, default=2, help="turns of Kurir's ack and the bare ack"
    )
    parser.add_argument(
        "--ack-only", action="store_true", help="only the ack turns (Kurir against bare)"
    )
    parser.add_argument(
        "--sustained",
        type=int,
        default=None,
        help="callbacks sent while the workers run (default -n; 0 skips)",
    )
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    sustained = args.events if args.sustained is None else args.sustained

    from app.inbound.verify import standard_webhooks_key

    key = standard_webhooks_key(SECRET)
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; gunicorn "
        f"{args.workers} x {args.threads} threads, {args.proc} kurir workers; "
        f"{'in order' if args.in_order else 'shuffled'}; PostgreSQL {args.database_url}",
        flush=True,
    )
    db = prepare(args.database_url, args.redis_url)
    meter = CpuMeter(args.database_url.rsplit("/", 1)[1], urlsplit(args.redis_url).port or 6379)
    env = dict(
        os.environ,
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        KURIR_SECRET_KEY=os.environ.get("KURIR_SECRET_KEY", "bench-secret-key"),
        KURIR_DATA_DIR=str(ROOT / "var" / "bench"),
        KURIR_LOG_LEVEL="warning",
        PYTHONPATH=str(ROOT),
    )
    figures: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "events": args.events,
        "gunicorn": f"{args.workers}x{args.threads}",
        "workers": args.proc,
        "in_order": args.in_order,
        "load_average_before": os.getloadavg(),
    }
    seed = int(time.time())
    all_sent: list[Callback] = []
    workers: list[subprocess.Popen[bytes]] = []
    with api_server(env, free_port(), args.workers, args.threads) as (base, api_pid):
        url = f"{base}/inbound/{SOURCE}"
        warm = make_callbacks(500, 50, seed - 1)
        send_all(url, warm, key, 8, None, "warm-up")
        all_sent += warm

        def measured(
            label: str,
            batch: list[Callback],
            rate: float | None,
            clients: int,
            workers: list[subprocess.Popen[bytes]] | None = None,
        ) -> Result:
            trees = {"api": [api_pid]}
            if workers:
                trees["workers"] = [w.pid for w in workers]
            before = meter.snapshot(trees)
            result = send_all(url, batch, key, clients, rate, label)
            result.cpu_ms = per_unit_ms(before, meter.snapshot(trees), result.acked)
            print("  " + result.line(), flush=True)
            return result

        acks: list[Result] = []
        bare_acks: list[Result] = []
        bare_stack = contextlib.ExitStack()
        bare_id = bare_source_id(db)
        if not args.no_bare:
            bare_url, bare_pid = bare_stack.enter_context(
                bare_server(env, args.database_url, bare_id, args.workers, args.threads)
            )
            send_all(bare_url, make_callbacks(500, 50, seed - 2), key, 8, None, "warm-up")
        with bare_stack:
            # Kurir and the bare ack take turns, each with callbacks of its own (fresh ids),
            # so that the neighbours' load falls on both alike.
            for turn in range(args.ack_rounds):
                batch = make_callbacks(
                    args.events, args.resources, seed + 1000 * turn, in_order=args.in_order
                )
                acks.append(
                    measured(
                        f"ack, {args.clients} clients",
                        with_duplicates(batch, args.duplicates, seed, keep_order=args.in_order),
                        None,
                        args.clients,
                    )
                )
                all_sent += batch
                if args.no_bare:
                    continue
                other = make_callbacks(
                    args.events, args.resources, seed + 1000 * turn + 500, in_order=args.in_order
                )
                trees = {"api": [bare_pid]}
                before = meter.snapshot(trees)
                bare_ack = send_all(
                    bare_url,
                    with_duplicates(other, args.duplicates, seed, keep_order=args.in_order),
                    key,
                    args.clients,
                    None,
                    f"bare ack, {args.clients} clients",
                )
                bare_ack.cpu_ms = per_unit_ms(before, meter.snapshot(trees), bare_ack.acked)
                print("  " + bare_ack.line(), flush=True)
                bare_acks.append(bare_ack)
                forget_bare_rows(db, bare_id)
        ack = sorted(acks, key=lambda r: r.cpu_ms.get("api", 0.0))[len(acks) // 2]
        if bare_acks:
            ratios = [
                k.cpu_ms["api"] / b.cpu_ms["api"] for k, b in zip(acks, bare_acks, strict=True)
            ]
            figures["ack_rounds"] = [
                {"kurir": k.to_dict(), "bare": b.to_dict()}
                for k, b in zip(acks, bare_acks, strict=True)
            ]
            figures["ack_api_cpu_ratio_to_bare"] = [round(r, 3) for r in ratios]
            print(
                "  ack: api CPU per callback / the bare ack's, turn by turn: "
                + ", ".join(f"{r:.2f}" for r in ratios)
                + " (target <= 1.15)",
                flush=True,
            )
        if args.ack_only:
            figures["load_average_after"] = os.getloadavg()
            if args.json:
                Path(args.json).write_text(json.dumps(figures, indent=2))
            db.dispose()
            return 0
        paced_batch = make_callbacks(
            int(args.paced_rate * args.paced_seconds),
            args.resources,
            seed + 100,
            in_order=args.in_order,
        )
        paced = measured(f"paced {args.paced_rate:.0f}/s", paced_batch, args.paced_rate, 32)
        all_sent += paced_batch
        figures["receive"] = [ack.to_dict(), paced.to_dict()]
        stored = sum(counts(db).values())
        print(f"stored events: {stored} (distinct callbacks sent: {len(all_sent)})", flush=True)
        vacuum(db)

        if not args.no_bare:
            bare = bare_processing(db, args.database_url, args.proc, meter)
            figures["bare_processing"] = bare
            print(
                f"  bare processing, {args.proc} raw psycopg processes: {bare['per_s']:,.0f} "
                f"events/s\n{'':<32}cpu ms/event: {cpu_text(bare['cpu_ms_per_event'])}",
                flush=True,
            )
            reset_processing(db)

        try:
            processing, workers = kurir_processing(env, db, args.redis_url, args.proc, meter)
            good, total = check_states(db, all_sent)
            processing["resources_at_highest_version"] = f"{good}/{total}"
            processing["statuses"] = counts(db)
            figures["processing"] = processing
            ratio = (
                (f" ({processing['per_s'] / figures['bare_processing']['per_s']:.0%} of bare)")
                if "bare_processing" in figures
                else ""
            )
            print(
                f"  processing, {args.proc} kurir workers: {processing['per_s']:,.0f} "
                f"events/s{ratio}, {processing['processed']} in {processing['seconds']} s; "
                f"statuses {processing['statuses']}; resources at their highest version: "
                f"{good}/{total}\n{'':<32}cpu ms/event: "
                f"{cpu_text(processing['cpu_ms_per_event'])}",
                flush=True,
            )
            verdict = processing["per_s"] >= ack.rate and processing["per_s"] >= 800
            figures["processing_keeps_up"] = verdict
            print(
                f"processing {processing['per_s']:,.0f}/s vs ack {ack.rate:,.0f}/s "
                f"(target: >= ack and >= 800/s): {'MET' if verdict else 'NOT MET'}",
                flush=True,
            )

            if sustained:
                more = make_callbacks(sustained, args.resources, seed + 200, in_order=args.in_order)
                figures["sustained"] = sustained_phase(measured, db, more, args.clients, workers)
                all_sent += more
        finally:
            stop_groups(workers)
    good, total = check_states(db, all_sent)
    figures["resources_at_highest_version"] = f"{good}/{total}"
    figures["load_average_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    stored = sum(counts(db).values())
    db.dispose()
    return 0 if good == total and stored == len(all_sent) else 1


def sustained_phase(
    measured: Any,
    db: Any,
    batch: list[Callback],
    clients: int,
    workers: list[subprocess.Popen[bytes]],
) -> dict[str, Any]:
    """Receive while the workers run: both rates over the same seconds, and the backlog.

    The CPU line is per acknowledged callback and covers both sides (api, workers, and the
    PostgreSQL backends and Redis they share).
    """
    result: Result = measured(f"ack while processing, {clients} cl.", batch, None, clients, workers)
    backlog = unfinished(db)
    processed = result.acked - backlog
    drain_s = drain(db)
    figures = {
        "ack": result.to_dict(),
        "processed_while_sending": processed,
        "processed_per_s": round(processed / result.seconds, 1),
        "backlog_when_sending_stopped": backlog,
        "drain_s": round(drain_s, 2),
    }
    print(
        f"  sustained: acked {result.rate:,.0f}/s, processed {figures['processed_per_s']:,.0f}"
        f"/s over the same {result.seconds:.1f} s; backlog when sending stopped: {backlog} "
        f"({backlog / max(1, result.acked):.0%} of acked), drained in {drain_s:.1f} s",
        flush=True,
    )
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
