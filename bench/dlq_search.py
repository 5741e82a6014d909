"""Seed 100,000 dead letters on PostgreSQL and measure the p95 of typical dead-letter searches.

    BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/kurir_bench \\
        .venv/bin/python bench/dlq_search.py [--rows 100000] [--repeat 30]

The database named by BENCH_DATABASE_URL is WIPED (schema dropped, migrated afresh). Rows go in
with COPY; every search runs through `dlq.search.search`, the code path of the API, UI and CLI.
Target (issue 5, item 7): p95 <= 200 ms.
"""

from __future__ import annotations

import argparse
import json
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
from bench.support import (  # noqa: E402
    EVENT_COLUMNS,
    TYPES,
    copy_partners_and_endpoints,
    copy_rows,
    p95,
    seeded_bench,
    ulid_at,
)
from dlq.search import DeadLetterFilter, count, search  # noqa: E402

CITIES = [
    "Oslo",
    "Lima",
    "Zagreb",
    "Nairobi",
    "Osaka",
    "Quito",
    "Porto",
    "Dakar",
    "Hanoi",
    "Tallinn",
    "Accra",
    "Bergen",
    "Cusco",
    "Split",
    "Lagos",
    "Kyoto",
]
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]
FAILURES = [
    (500, "http_500"),
    (502, "http_502"),
    (503, "http_503"),
    (404, "http_404"),
    (None, "timeout"),
    (None, "connection_refused"),
    (410, "http_410"),
    (None, "blocked_address"),
]
REASONS = ["retries_exhausted"] * 7 + ["endpoint_disabled"] * 2 + ["blocked_address"]


def seed(db: Database, rows: int, rng: random.Random) -> dict[str, list[str]]:
    now = datetime.now(UTC)
    partners = [
        (ulid_at("ptn", now - timedelta(days=90), rng), f"partner-{i:03d}") for i in range(50)
    ]
    endpoints = [
        (ulid_at("ep", now - timedelta(days=60), rng), partners[i % 50][0]) for i in range(200)
    ]
    raw = db.engine.raw_connection()
    try:
        cur = raw.cursor()
        copy_partners_and_endpoints(cur, partners, endpoints, now, disabled=lambda i: i % 10 == 0)
        letters: list[tuple[object, ...]] = []
        events: list[tuple[object, ...]] = []
        deliveries: list[tuple[object, ...]] = []
        for n in range(rows):
            created = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
            eid, pid = endpoints[rng.randrange(len(endpoints))]
            uid = next(u for p, u in partners if p == pid)
            event_id = ulid_at("evt", created - timedelta(days=3), rng)
            delivery_id = ulid_at("dlv", created - timedelta(days=3), rng)
            letter_id = ulid_at("dl", created, rng)
            etype = rng.choice(TYPES)
            data = {
                "order_id": f"ord_{rng.getrandbits(40):x}",
                "amount": rng.randrange(100, 10**6),
                "currency": rng.choice(["EUR", "USD", "NOK", "JPY"]),
                "customer": {
                    "name": f"{rng.choice(WORDS)} {rng.choice(WORDS)}",
                    "city": rng.choice(CITIES),
                    "email": f"c{n}@shop{n % 997}.example",
                },
                "items": [
                    {"sku": f"SKU-{rng.randrange(10**5):05d}", "qty": rng.randrange(1, 9)}
                    for _ in range(rng.randrange(1, 4))
                ],
                "tags": rng.sample(WORDS, 3),
            }
            if n % 10_000 == 7:
                data["note"] = "needle-in-haystack"  # a rare word: 10 letters in 100k
            payload = json.dumps(
                {
                    "id": event_id,
                    "type": etype,
                    "version": 1,
                    "occurred_at": created.isoformat(),
                    "partner": uid,
                    "resource": None,
                    "correlation_id": None,
                    "data": data,
                },
                separators=(",", ":"),
            )
            status, error = rng.choice(FAILURES)
            state = rng.choices(["open", "resent", "discarded"], [70, 20, 10])[0]
            events.append((event_id, pid, etype, 1, json.dumps(data), payload, created, created))
            deliveries.append(
                (delivery_id, event_id, eid, "dead", 13, 13, 1, status, error, created, created)
            )
            letters.append(
                (
                    letter_id,
                    delivery_id,
                    event_id,
                    eid,
                    pid,
                    etype,
                    rng.choice(REASONS),
                    status,
                    error,
                    payload,
                    state,
                    created,
                    created,
                    None if state == "open" else created,
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
                "last_error",
                "created_at",
                "updated_at",
            ),
            deliveries,
        )
        copy_rows(
            cur,
            "dead_letters",
            (
                "id",
                "delivery_id",
                "event_id",
                "endpoint_id",
                "partner_id",
                "event_type",
                "reason",
                "last_status_code",
                "last_error",
                "search_text",
                "state",
                "created_at",
                "updated_at",
                "resolved_at",
            ),
            letters,
        )
        raw.commit()
    finally:
        raw.close()
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return {"partners": [u for _, u in partners], "endpoints": [e for e, _ in endpoints]}


def scenarios(
    names: dict[str, list[str]], rng: random.Random
) -> dict[str, Callable[[], DeadLetterFilter]]:
    now = datetime.now(UTC)

    def pick(key: str) -> str:
        return rng.choice(names[key])

    return {
        "first page, no filter": lambda: DeadLetterFilter(),
        "open letters": lambda: DeadLetterFilter(state="open"),
        "q common word": lambda: DeadLetterFilter(q=rng.choice(CITIES)),
        "q rare word": lambda: DeadLetterFilter(q="needle-in-haystack"),
        "q no match": lambda: DeadLetterFilter(q=f"zz{rng.randrange(10**6)}qq"),
        "q two words": lambda: DeadLetterFilter(q=f"{rng.choice(CITIES)} {rng.choice(WORDS)}"),
        "q order id prefix": lambda: DeadLetterFilter(q=f"ord_{rng.getrandbits(16):x}"),
        "partner": lambda: DeadLetterFilter(partner=pick("partners")),
        "endpoint": lambda: DeadLetterFilter(endpoint=pick("endpoints")),
        "type + open": lambda: DeadLetterFilter(type=rng.choice(TYPES), state="open"),
        "status_code": lambda: DeadLetterFilter(status_code=rng.choice([500, 502, 404])),
        "reason": lambda: DeadLetterFilter(reason="blocked_address"),
        "error text": lambda: DeadLetterFilter(error=rng.choice(["timeout", "refused"])),
        "last 24 h": lambda: DeadLetterFilter(since=now - timedelta(days=1)),
        "window 10-12 days ago": lambda: DeadLetterFilter(
            since=now - timedelta(days=12), until=now - timedelta(days=10)
        ),
        "combination": lambda: DeadLetterFilter(
            partner=pick("partners"), type=rng.choice(TYPES), state="open", q=rng.choice(CITIES)
        ),
        "combination, no status": lambda: DeadLetterFilter(
            endpoint=pick("endpoints"), status_code=0, since=now - timedelta(days=20)
        ),
    }


def main() -> int:
    def pages(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--pages", type=int, default=5, help="pages walked per paginated run")

    bench = seeded_bench(
        __doc__,
        rows=100_000,
        rng_seed=5,
        noun="dead letters",
        seed=seed,
        default_url="postgresql://postgres@127.0.0.1:5432/kurir_bench",
        options=pages,
    )
    args, db, rng, names = bench.args, bench.db, bench.rng, bench.names

    all_ms: list[float] = []
    print(f"{'search':34} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for name, make in scenarios(names, rng).items():
        samples: list[float] = []
        for _ in range(args.repeat):
            flt = make()
            with db.Session() as session:
                t0 = time.perf_counter()
                page = search(session, flt, limit=50)
                samples.append((time.perf_counter() - t0) * 1000)
                session.rollback()
            del page
        all_ms += samples
        print(
            f"{name:34} {statistics.median(samples):8.1f} {p95(samples):8.1f} {max(samples):8.1f}"
        )
    # Paginated: walk several pages of a broad filter, timing each page.
    paged: list[float] = []
    for _ in range(args.repeat):
        flt = DeadLetterFilter(state="open", q=rng.choice(CITIES))
        cursor = None
        for _ in range(args.pages):
            with db.Session() as session:
                t0 = time.perf_counter()
                page = search(session, flt, limit=50, cursor=cursor)
                paged.append((time.perf_counter() - t0) * 1000)
            cursor = page.next_cursor
            if cursor is None:
                break
    all_ms += paged
    print(
        f"{'paginated (q + open, 5 pages)':34} {statistics.median(paged):8.1f} "
        f"{p95(paged):8.1f} {max(paged):8.1f}"
    )
    # The UI shows how many letters a filter matches before a bulk resend.
    counts: list[float] = []
    for _ in range(args.repeat):
        with db.Session() as session:
            t0 = time.perf_counter()
            count(session, DeadLetterFilter(q=rng.choice(CITIES), state="open"))
            counts.append((time.perf_counter() - t0) * 1000)
    print(
        f"{'count (q + open), not in p95':34} {statistics.median(counts):8.1f} "
        f"{p95(counts):8.1f} {max(counts):8.1f}"
    )
    overall = p95(all_ms)
    verdict = "OK" if overall <= 200 else "OVER TARGET"
    print(
        f"\noverall p95 over {len(all_ms)} searches on {args.rows:,} dead letters: "
        f"{overall:.1f} ms (target <= 200 ms: {verdict})"
    )
    db.dispose()
    return 0 if overall <= 200 else 1


if __name__ == "__main__":
    raise SystemExit(main())
