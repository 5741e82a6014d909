"""Inbound receiver: acknowledged callbacks/s and time-to-202 of `kurir api`, then processing.

    .venv/bin/python bench/inbound.py [-n 6000] [--workers 2] [--threads 8] [--proc 2]

The script owns BENCH_DATABASE_URL (default: the `kurir_inbound_bench` database, which it
WIPES and migrates) and BENCH_REDIS_URL (default db 6, which it FLUSHES). It creates one
Standard Webhooks source, signs every callback the way a provider would (fresh timestamp,
HMAC-SHA256 over ``{id}.{timestamp}.{body}``), starts `kurir api` under gunicorn and measures:

  1. closed loop: N callbacks from C concurrent clients (threads, one kept-alive socket each,
     prebuilt requests: bench/rawhttp.py; `requests` would spend ~1 ms of CPU per POST on
     this same machine) → acknowledged/s, p50/p99 time-to-202 (every 202 means stored and
     committed);
  2. open loop at --paced-rate callbacks/s → p50/p99 counted from each request's due time;
  3. processing: --proc `kurir worker --burst` processes drain the inbound queue → processed
     events/s, and a check that every resource ended at its highest version.

The callbacks are shuffled across --resources resources with --duplicates re-sends (answered
200, not processed again). Targets on this 2-core machine: >= 800/s, p99 <= 30 ms.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402

from bench import rawhttp  # noqa: E402

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_inbound_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/6"
SECRET = "whsec_" + base64.b64encode(b"kurir-inbound-bench-secret-32b!").decode()
SOURCE = "bench-psp"


# ---------------------------------------------------------------------------- callbacks


@dataclass
class Callback:
    body: bytes
    event_id: str
    resource_id: str
    version: int


def make_callbacks(n: int, resources: int, seed: int) -> list[Callback]:
    """n distinct events over `resources` resources, versions 1..k each, shuffled."""
    rng = random.Random(seed)
    events = []
    now = time.time()
    for i in range(n):
        resource = f"pay_{i % resources:05d}"
        version = i // resources + 1
        event_id = f"evt_{seed}_{i:07d}"
        doc = {"id": event_id, "type": "payment.updated", "version": 1,
               "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
               "partner": "bench",
               "resource": {"type": "payment", "id": resource, "version": version},
               "data": {"status": f"s{version}", "amount": 1000 + i % 977, "currency": "EUR"}}
        events.append(Callback(json.dumps(doc).encode(), event_id, resource, version))
    rng.shuffle(events)
    return events


def signed_headers(callback: Callback, key: bytes) -> dict[str, str]:
    timestamp = str(int(time.time()))
    mac = hmac.new(key, f"{callback.event_id}.{timestamp}.".encode() + callback.body,
                   hashlib.sha256).digest()
    return {"content-type": "application/json", "webhook-id": callback.event_id,
            "webhook-timestamp": timestamp,
            "webhook-signature": "v1," + base64.b64encode(mac).decode()}


# ---------------------------------------------------------------------------- measurement


@dataclass
class Result:
    label: str
    count: int
    statuses: dict[int, int]
    seconds: float
    latencies_ms: list[float]

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
        return (f"{self.label:<34} {self.rate:7.0f} acked/s  p50 {self.pct(50):6.1f} ms  "
                f"p99 {self.pct(99):6.1f} ms  max {max(self.latencies_ms or [0]):7.1f} ms  "
                f"statuses {dict(sorted(self.statuses.items()))}")

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "acked_per_s": round(self.rate, 1),
                "p50_ms": round(self.pct(50), 2), "p99_ms": round(self.pct(99), 2),
                "max_ms": round(max(self.latencies_ms or [0]), 2), "statuses": self.statuses}


def _send_all(url: str, callbacks: list[Callback], key: bytes, clients: int,
              rate: float | None) -> tuple[list[float], dict[int, int], float]:
    """Sign every callback now (a run lasts seconds, the tolerance is minutes), then send them
    as prebuilt requests on kept-alive sockets (bench/rawhttp.py)."""
    prebuilt = [rawhttp.request_bytes(url, cb.body, signed_headers(cb, key))
                for cb in callbacks]
    due = None if rate is None else (lambda i: i / rate)
    latencies, statuses, elapsed = rawhttp.run_clients(url, prebuilt, clients, due=due)
    merged: dict[int, int] = {}
    for status in statuses:
        merged[status] = merged.get(status, 0) + 1
    return latencies, merged, elapsed


def closed_loop(label: str, url: str, callbacks: list[Callback], key: bytes,
                clients: int) -> Result:
    latencies, statuses, elapsed = _send_all(url, callbacks, key, clients, None)
    return Result(label, len(latencies), statuses, elapsed, latencies)


def paced(label: str, url: str, callbacks: list[Callback], key: bytes, rate: float,
          senders: int) -> Result:
    latencies, statuses, elapsed = _send_all(url, callbacks, key, senders, rate)
    return Result(label, len(latencies), statuses, elapsed, latencies)


# ---------------------------------------------------------------------------- processes


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def api_server(env: dict[str, str], port: int, workers: int, threads: int) -> Iterator[str]:
    args = [sys.executable, "-m", "app.cli", "api", "--port", str(port), "--workers",
            str(workers), "--threads", str(threads)]
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
        yield base
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def prepare(url: str, redis_url: str) -> Any:
    """Wipe and migrate the bench database, flush Redis, create the source."""
    import redis
    from sqlalchemy import text

    from app import migrate
    from app.config import Settings, normalise_database_url
    from app.db import Database
    from app.inbound import sources
    from app.runtime import Runtime

    admin = Database(normalise_database_url(url.rsplit("/", 1)[0] + "/postgres"), pool_size=1)
    name = url.rsplit("/", 1)[1]
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if not connection.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                  {"n": name}).scalar():
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    db = Database(normalise_database_url(url), pool_size=2)
    with db.engine.begin() as connection:
        connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        connection.execute(text("CREATE SCHEMA public"))
    migrate.upgrade(normalise_database_url(url))
    redis.Redis.from_url(redis_url).flushdb()
    runtime = Runtime(Settings(database_url=url, redis_url=redis_url,
                               secret_key=os.environ.get("KURIR_SECRET_KEY", "bench-secret-key"),
                               data_dir=ROOT / "var" / "bench"), database=db)
    with db.begin() as session:
        sources.create_source(session, runtime.secret_box, runtime.settings, name=SOURCE,
                              scheme="standard-webhooks", secrets=[SECRET])
    return db


def counts(db: Any) -> dict[str, int]:
    from sqlalchemy import func, select

    from app.models import InboundEvent

    with db.begin() as session:
        return dict(session.execute(select(InboundEvent.status, func.count())
                                    .group_by(InboundEvent.status)).all())  # type: ignore[arg-type]


def process_all(env: dict[str, str], db: Any, expected: int, procs: int) -> dict[str, Any]:
    started = time.perf_counter()
    workers = [subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--burst"],
                                env=env, cwd=ROOT, start_new_session=True)
               for _ in range(procs)]
    done = 0
    try:
        while True:
            seen = counts(db)
            done = seen.get("applied", 0) + seen.get("ignored", 0) + seen.get("quarantined", 0) \
                + seen.get("failed", 0)
            if done >= expected or all(w.poll() is not None for w in workers):
                break
            time.sleep(0.1)
        elapsed = time.perf_counter() - started
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(30)
    return {"processed": done, "seconds": round(elapsed, 2),
            "per_s": round(done / elapsed, 1) if elapsed else 0.0, "statuses": counts(db)}


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


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--events", type=int, default=6000)
    parser.add_argument("--resources", type=int, default=500)
    parser.add_argument("--duplicates", type=float, default=0.05,
                        help="fraction of callbacks sent a second time")
    parser.add_argument("--clients", default="8,16")
    parser.add_argument("--paced-rate", type=float, default=800.0)
    parser.add_argument("--paced-seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=8, help="threads per gunicorn worker")
    parser.add_argument("--proc", type=int, default=2, help="`kurir worker` processes")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL",
                                                                 DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    from app.inbound.verify import standard_webhooks_key

    key = standard_webhooks_key(SECRET)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; gunicorn "
          f"{args.workers} x {args.threads} threads; PostgreSQL {args.database_url}", flush=True)
    db = prepare(args.database_url, args.redis_url)
    env = dict(os.environ, DATABASE_URL=args.database_url, REDIS_URL=args.redis_url,
               KURIR_SECRET_KEY=os.environ.get("KURIR_SECRET_KEY", "bench-secret-key"),
               KURIR_DATA_DIR=str(ROOT / "var" / "bench"), KURIR_LOG_LEVEL="warning",
               PYTHONPATH=str(ROOT))
    figures: dict[str, Any] = {"cpus": os.cpu_count(), "events": args.events,
                               "gunicorn": f"{args.workers}x{args.threads}",
                               "load_average_before": os.getloadavg()}
    results: list[Result] = []
    seed = int(time.time())
    all_sent: list[Callback] = []
    with api_server(env, free_port(), args.workers, args.threads) as base:
        url = f"{base}/inbound/{SOURCE}"
        warm = make_callbacks(500, 50, seed - 1)
        closed_loop("warm-up", url, warm, key, 8)
        all_sent += warm
        for n, clients in enumerate(int(c) for c in args.clients.split(",")):
            batch = make_callbacks(args.events, args.resources, seed + n)
            rng = random.Random(seed + n)
            resend = rng.sample(batch, int(len(batch) * args.duplicates))
            stream = batch + resend
            rng.shuffle(stream)
            result = closed_loop(f"closed loop, {clients} clients", url, stream, key, clients)
            print("  " + result.line(), flush=True)
            results.append(result)
            all_sent += batch
        paced_batch = make_callbacks(int(args.paced_rate * args.paced_seconds), args.resources,
                                     seed + 100)
        result = paced(f"paced {args.paced_rate:.0f}/s", url, paced_batch, key,
                       args.paced_rate, senders=32)
        print("  " + result.line(), flush=True)
        results.append(result)
        all_sent += paced_batch
    figures["receive"] = [r.to_dict() for r in results]
    stored = sum(counts(db).values())
    print(f"stored events: {stored} (distinct callbacks sent: {len(all_sent)})", flush=True)

    print(f"processing with {args.proc} x `kurir worker --burst` ...", flush=True)
    processing = process_all(env, db, stored, args.proc)
    good, total = check_states(db, all_sent)
    processing["resources_at_highest_version"] = f"{good}/{total}"
    figures["processing"] = processing
    print(f"  processed {processing['processed']} events in {processing['seconds']} s = "
          f"{processing['per_s']}/s; statuses {processing['statuses']}; resources at their "
          f"highest version: {good}/{total}", flush=True)
    figures["load_average_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    db.dispose()
    return 0 if good == total and stored == len(all_sent) else 1


if __name__ == "__main__":
    raise SystemExit(main())
