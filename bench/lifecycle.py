"""Retention with the system live: publish latency while the purge runs, against without.

    python -m bench.lifecycle [--days 10] [--per-day 3000] [--publishes 400] [--rate 100]

Loads `--days` days of synthetic finished history (every event delivered once, one attempt
each, plus audit rows) dated before the retention horizon, into a fresh database
(BENCH_DATABASE_URL: a PostgreSQL URL, or by default SQLite in a temporary directory), then
publishes `--publishes` events through the API at `--rate` a second (in-process Flask app)
twice: once alone, once while `app.lifecycle.purge.run` purges the history. Prints the row
counts, publish p50/p99/max in each phase, the purge's wall and CPU time, its batches, and
table sizes before and after. REDIS_URL (optional): where publishes enqueue; without Redis a
publish still answers 202.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from app import runtime as runtime_mod
from app.accounts import create_api_key
from app.clock import utcnow
from app.config import Settings
from app.ids import id_at
from app.lifecycle import purge, stats
from app.models import Attempt, AuditRecord, Delivery, Endpoint, Event, Partner
from app.runtime import Runtime
from bench.fresh_db import fresh_database

ORDER_SCHEMA = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}},
}


def _load(rt: Runtime, endpoint_id: str, partner_id: str, days: int, per_day: int) -> None:
    """`days` × `per_day` finished events (one delivery and one attempt each) and as many
    audit rows, dated 40 days back and earlier, in chunks of 2,000."""
    start = utcnow() - timedelta(days=40 + days)
    step = timedelta(days=1) / per_day
    chunk = 2000
    total = days * per_day
    for base in range(0, total, chunk):
        events, deliveries, attempts, audits = [], [], [], []
        for i in range(base, min(total, base + chunk)):
            at = start + i * step
            event_id, delivery_id = id_at("evt", at), id_at("dlv", at)
            events.append(
                {
                    "id": event_id,
                    "partner_id": partner_id,
                    "type": "order.created",
                    "version": 1,
                    "data": {"order_id": f"h-{i}"},
                    "payload": json.dumps(
                        {"type": "order.created", "data": {"order_id": f"h-{i}"}}
                    ),
                    "occurred_at": at,
                    "created_at": at,
                    "feed_seq": i + 1,
                }
            )
            deliveries.append(
                {
                    "id": delivery_id,
                    "event_id": event_id,
                    "endpoint_id": endpoint_id,
                    "state": "succeeded",
                    "attempt_count": 1,
                    "run_attempts": 1,
                    "run": 1,
                    "forced": False,
                    "succeeded_at": at,
                    "created_at": at,
                    "updated_at": at,
                }
            )
            attempts.append(
                {
                    "id": id_at("att", at),
                    "delivery_id": delivery_id,
                    "n": 1,
                    "started_at": at,
                    "duration_ms": 12,
                    "url": "http://127.0.0.1:9/hook",
                    "request_headers": {},
                    "response_status": 200,
                    "response_body": b"ok",
                    "created_at": at,
                }
            )
            audits.append(
                {
                    "id": id_at("aud", at - timedelta(days=400)),
                    "actor": "bench",
                    "action": "x",
                    "subject_type": "x",
                    "subject_id": str(i),
                    "details": {},
                    "created_at": at - timedelta(days=400),
                }
            )
        with rt.db.begin() as session:
            session.execute(insert(Event), events)
            session.execute(insert(Delivery), deliveries)
            session.execute(insert(Attempt), attempts)
            session.execute(insert(AuditRecord), audits)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _publish_phase(client: Any, auth: dict[str, str], n: int, rate: float, tag: str) -> list[float]:
    """`n` publishes paced at `rate` a second; each one's latency in ms."""
    latencies = []
    interval = 1.0 / rate
    started = time.perf_counter()
    for i in range(n):
        due = started + i * interval
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        sent = time.perf_counter()
        answer = client.post(
            "/v1/partners/acme/events",
            headers=auth,
            json={"type": "order.created", "version": 1, "data": {"order_id": f"{tag}-{i}"}},
        )
        latencies.append((time.perf_counter() - sent) * 1000.0)
        if answer.status_code != 202:
            raise SystemExit(f"publish failed: {answer.status_code} {answer.get_data()!r}")
    return latencies


def _show(label: str, latencies: list[float]) -> None:
    print(
        f"  {label:<24} n={len(latencies)}  p50 {_pct(latencies, 0.5):6.2f} ms  "
        f"p99 {_pct(latencies, 0.99):6.2f} ms  max {max(latencies):6.2f} ms  "
        f"mean {statistics.fmean(latencies):6.2f} ms"
    )


def _sizes(rt: Runtime, label: str) -> None:
    with rt.db.begin() as session:
        found = {t.table: t for t in stats.tables(session)}
    shown = ("events", "deliveries", "attempts", "audit_records", "feed_purges")
    parts = []
    for name in shown:
        t = found[name]
        size = "" if t.bytes is None else f" ({t.bytes / 1e6:.1f} MB)"
        parts.append(f"{name} {t.rows:,}{size}")
    print(f"{label}: " + ", ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=10)
    parser.add_argument("--per-day", type=int, default=3000)
    parser.add_argument("--publishes", type=int, default=400)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--batch-ms", type=int, default=50)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="kurir-lifecycle-"))
    url = os.environ.get("BENCH_DATABASE_URL") or f"sqlite:///{tmp / 'kurir.db'}"
    url = fresh_database(url)
    settings = Settings(
        data_dir=tmp / "data",
        database_url=url,
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:1/0"),
        secret_key="bench-secret-key",  # noqa: S106 - a throwaway database
        allow_private_targets=True,
        retention_batch_ms=args.batch_ms,
    )
    rt = Runtime(settings)
    runtime_mod.install(rt)
    from app.web import create_app

    app = create_app(runtime=rt)
    client = app.test_client()
    with rt.db.begin() as session:
        _, token = create_api_key(session, "bench", ["admin"])
    auth = {"Authorization": f"Bearer {token}"}
    assert client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": "order.created", "version": 1, "schema": ORDER_SCHEMA},
    ).status_code in (200, 201)
    assert (
        client.post("/v1/partners", headers=auth, json={"uid": "acme", "name": "Acme"}).status_code
        == 201
    )
    assert (
        client.post(
            "/v1/partners/acme/endpoints", headers=auth, json={"url": "http://127.0.0.1:9/hook"}
        ).status_code
        == 201
    )
    with rt.db.begin() as session:
        partner_id = session.query(Partner.id).filter(Partner.uid == "acme").scalar()
        endpoint_id = session.query(Endpoint.id).filter(Endpoint.partner_id == partner_id).scalar()

    print(f"database: {rt.db.engine.dialect.name}; cpu count {os.cpu_count()}")
    started, cpu = time.perf_counter(), time.process_time()
    _load(rt, endpoint_id, partner_id, args.days, args.per_day)
    rows = args.days * args.per_day
    print(
        f"loaded {args.days} days × {args.per_day:,}/day: {rows:,} events, {rows:,} deliveries, "
        f"{rows:,} attempts, {rows:,} audit rows in {time.perf_counter() - started:.1f} s "
        f"(cpu {time.process_time() - cpu:.1f} s)"
    )
    _sizes(rt, "before")

    # Warm the app's caches, then publish alone.
    _publish_phase(client, auth, 20, args.rate, "warm")
    cpu = time.process_time()
    alone = _publish_phase(client, auth, args.publishes, args.rate, "alone")
    alone_cpu = time.process_time() - cpu

    # The same while retention runs (in a thread of this process, as the scheduler would in
    # its own process: sharing the GIL makes this the harder case for the publishes).
    report: list[purge.Report] = []
    purge_times: list[float] = []

    def retain() -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        report.append(purge.run(rt))
        purge_times.extend([time.perf_counter() - t0, time.thread_time() - c0])

    worker = threading.Thread(target=retain)
    cpu = time.process_time()
    worker.start()
    during = _publish_phase(client, auth, args.publishes, args.rate, "during")
    overlap_done = not worker.is_alive()
    worker.join()
    during_cpu = time.process_time() - cpu

    print(f"publish latency (in-process API, paced at {args.rate:.0f}/s):")
    _show("without retention", alone)
    _show("while retention runs", during)
    print(f"  process cpu: {alone_cpu:.2f} s alone, {during_cpu:.2f} s with retention")
    done = report[0]
    batches = done.batches
    busy = [b for b in batches if b.examined]
    print(
        f"retention: {done.total:,} rows purged in {purge_times[0]:.1f} s wall, "
        f"{purge_times[1]:.1f} s cpu (its thread); {len(batches)} batches, "
        f"longest {max(b.elapsed_ms for b in busy):.1f} ms, "
        f"p99 {_pct([b.elapsed_ms for b in busy], 0.99):.1f} ms "
        f"(budget {args.batch_ms} ms); largest batch {max(b.examined for b in busy):,} rows"
        + ("" if not overlap_done else "; finished before the publishes did")
    )
    for b in sorted(busy, key=lambda b: -b.elapsed_ms)[:3]:
        print(f"  slowest: {b.source} {b.examined} rows {b.elapsed_ms:.1f} ms")
    for kind, n in done.purged.items():
        print(f"  {kind.value:<14} {n:,}")
    _sizes(rt, "after")
    rt.close()


if __name__ == "__main__":
    main()
