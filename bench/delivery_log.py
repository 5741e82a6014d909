"""Seed deliveries on PostgreSQL and time the delivery log (UI, portal, GET /v1/deliveries).

    BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/bench_portal_log \\
        .venv/bin/python bench/delivery_log.py [--rows 200000] [--repeat 30]

The database named by BENCH_DATABASE_URL is WIPED (schema dropped, migrated afresh). Rows go in
with COPY: one event per delivery, 40 partners with 5 endpoints each, one partner's first
endpoint taking 40 % of all traffic (a hot endpoint) and one endpoint almost none (a rare one),
states mostly `succeeded`. Every query runs through `app.services.deliveries.page`, the code
path of every face, first page of 50. Beside each figure: the process CPU per query (the
client's share of the work), and a bare `SELECT 1` round trip measured in the same run.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text  # noqa: E402

from app.db import Database  # noqa: E402
from app.services import deliveries  # noqa: E402
from app.services.actor import Actor  # noqa: E402
from bench.support import (  # noqa: E402
    EVENT_COLUMNS,
    TYPES,
    copy_partners_and_endpoints,
    copy_rows,
    p95,
    seeded_bench,
    ulid_at,
)

STATES = ["succeeded"] * 90 + ["dead"] * 4 + ["retrying"] * 4 + ["pending"] * 2
STATUSES = {"succeeded": 200, "dead": 500, "retrying": 503, "pending": None}


def seed(db: Database, rows: int, rng: random.Random) -> dict[str, list[str]]:
    now = datetime.now(UTC)
    partners = [
        (ulid_at("ptn", now - timedelta(days=90), rng), f"partner-{i:03d}") for i in range(40)
    ]
    endpoints = [
        (ulid_at("ep", now - timedelta(days=60), rng), partners[i // 5][0]) for i in range(200)
    ]
    hot, rare = endpoints[0][0], endpoints[-1][0]
    raw = db.engine.raw_connection()
    try:
        cur = raw.cursor()
        copy_partners_and_endpoints(cur, partners, endpoints, now)
        partner_of = dict(endpoints)
        events: list[tuple[object, ...]] = []
        rows_out: list[tuple[object, ...]] = []
        for _ in range(rows):
            created = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
            pick = rng.random()
            eid = hot if pick < 0.4 else endpoints[rng.randrange(1, len(endpoints) - 1)][0]
            if pick > 0.9995:
                eid = rare
            event_id = ulid_at("evt", created, rng)
            state = rng.choice(STATES)
            events.append(
                (event_id, partner_of[eid], rng.choice(TYPES), 1, "{}", "{}", created, created)
            )
            rows_out.append(
                (
                    ulid_at("dlv", created, rng),
                    event_id,
                    eid,
                    state,
                    1,
                    1,
                    1,
                    STATUSES[state],
                    created,
                    created,
                )
            )
        copy_rows(cur, "events", EVENT_COLUMNS, events)
        copy_rows(
            cur,
            "deliveries",
            (
                "id",
                "event_id",
                "endpoint_id",
                "state",
                "attempt_count",
                "run_attempts",
                "run",
                "last_status_code",
                "created_at",
                "updated_at",
            ),
            rows_out,
        )
        raw.commit()
    finally:
        raw.close()
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return {
        "partners": [u for _, u in partners],
        "partner_ids": [p for p, _ in partners],
        "hot": [hot],
        "rare": [rare],
        "endpoints": [e for e, _ in endpoints],
    }


def scenarios(
    names: dict[str, list[str]], rng: random.Random
) -> dict[str, tuple[Callable[[], deliveries.DeliveryFilter], Callable[[], Actor]]]:
    now = datetime.now(UTC)
    operator = Actor.operator("bench@example.com")
    hot_partner = (names["partner_ids"][0], names["partners"][0])
    some = rng.randrange(1, len(names["partners"]))

    def partner_actor() -> Actor:
        return Actor.portal(names["partner_ids"][some], names["partners"][some])

    def hot_actor() -> Actor:
        return Actor.portal(*hot_partner)

    F = deliveries.DeliveryFilter  # noqa: N806
    return {
        "operator: all, first page": (lambda: F(), lambda: operator),
        "operator: state dead": (lambda: F(state="dead"), lambda: operator),
        "operator: type + status 500": (
            lambda: F(type=rng.choice(TYPES), status_code=500),
            lambda: operator,
        ),
        "operator: last 24 h": (lambda: F(since=now - timedelta(days=1)), lambda: operator),
        "operator: window 10-12 days ago": (
            lambda: F(since=now - timedelta(days=12), until=now - timedelta(days=10)),
            lambda: operator,
        ),
        "operator: partner": (lambda: F(partner=rng.choice(names["partners"])), lambda: operator),
        "portal: all of its endpoints": (lambda: F(), partner_actor),
        "portal: hot endpoint": (lambda: F(endpoint=names["hot"][0]), hot_actor),
        "portal: hot endpoint, dead": (
            lambda: F(endpoint=names["hot"][0], state="dead"),
            hot_actor,
        ),
        "portal: rare endpoint": (
            lambda: F(endpoint=names["rare"][0]),
            lambda: Actor.portal(names["partner_ids"][-1], names["partners"][-1]),
        ),
        "portal: one endpoint, by type": (
            lambda: F(endpoint=rng.choice(names["endpoints"][1:-1]), type=rng.choice(TYPES)),
            lambda: operator,
        ),
    }


def main() -> int:
    bench = seeded_bench(
        __doc__,
        rows=200_000,
        rng_seed=14,
        noun="deliveries",
        seed=seed,
        default_url="postgresql://postgres@127.0.0.1:5432/bench_portal_log",
    )
    args, db, rng, names = bench.args, bench.db, bench.rng, bench.names

    baseline_wall: list[float] = []
    baseline_cpu: list[float] = []
    for _ in range(args.repeat):
        with db.Session() as session:
            w0, c0 = time.perf_counter(), time.process_time()
            session.execute(text("SELECT 1"))
            baseline_wall.append((time.perf_counter() - w0) * 1000)
            baseline_cpu.append((time.process_time() - c0) * 1000)
    print(f"{'query':34} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'cpu ms':>8}")
    print(
        f"{'baseline: SELECT 1':34} {statistics.median(baseline_wall):8.2f} "
        f"{p95(baseline_wall):8.2f} {max(baseline_wall):8.2f} "
        f"{statistics.median(baseline_cpu):8.2f}"
    )
    for name, (make, actor) in scenarios(names, rng).items():
        wall: list[float] = []
        cpu: list[float] = []
        for _ in range(args.repeat):
            flt, who = make(), actor()
            with db.Session() as session:
                w0, c0 = time.perf_counter(), time.process_time()
                deliveries.page(session, who, flt, limit=50, cursor=None)
                wall.append((time.perf_counter() - w0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
                session.rollback()
        print(
            f"{name:34} {statistics.median(wall):8.1f} {p95(wall):8.1f} {max(wall):8.1f} "
            f"{statistics.median(cpu):8.1f}"
        )
    db.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
