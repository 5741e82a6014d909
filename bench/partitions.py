"""PostgreSQL partitioning of deliveries and attempts: what the upgrade costs, what one day's
drop costs, and whether the hot queries keep their plans.

    BENCH_DATABASE_URL=postgresql://… python -m bench.partitions [--days 30] [--per-day 10000]

Wipes the database, migrates it to 0019 (unpartitioned), loads `--days` days of history up
to now (`--per-day` events a day, one delivery and one attempt each; 1 % dead with an open
dead letter, 1 % retrying), then prints: EXPLAIN ANALYZE of the queries of the claim, the
sweeper, the delivery log, the delivery page, the dead-letter search and the feed; the
migration to head (0020 partitions the tables) and its wall time; the same EXPLAINs; the
oldest day and the whole days after it dropped by retention, timed (the oldest is a part of
a day: the load starts at the time of day it runs), the first whole day with its kept rows
copied under the locks and the second swapped for a kept partition (`app.lifecycle.swap`),
or the other way round with `--swap-first`; and the planning time of the delivery log
against 30 daily partitions and 5 weekly ones (daily or weekly: the figure behind the choice
of a day).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, text

from app import migrate
from app.config import Settings
from app.db import Database
from app.ids import id_at, id_floor
from app.lifecycle import drop, partitions, purge, swap
from app.models import Attempt, DeadLetter, Delivery, Endpoint, Event, Partner
from app.runtime import Runtime

DAY = timedelta(days=1)

QUERIES = {
    # sender.engine.claim: UPDATE … FROM events WHERE id IN (…) RETURNING the payload
    "claim": (
        "UPDATE deliveries SET state = 'delivering', lease_expires_at = now() "
        "FROM events WHERE deliveries.id IN :due "
        "AND deliveries.state IN ('pending', 'retrying') AND events.id = deliveries.event_id "
        "RETURNING deliveries.id, events.payload"
    ),
    # sender.sweeper: what is due
    "sweeper due": (
        "SELECT id FROM deliveries WHERE state IN ('pending', 'delivering', 'retrying') "
        "AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT 500"
    ),
    # app.services.deliveries.log: one endpoint's deliveries, newest first
    "delivery log (endpoint)": (
        "SELECT * FROM deliveries WHERE endpoint_id = :endpoint ORDER BY id DESC LIMIT 51"
    ),
    "delivery log (endpoint, state)": (
        "SELECT * FROM deliveries WHERE endpoint_id = :endpoint AND state = 'dead' "
        "ORDER BY id DESC LIMIT 51"
    ),
    # the delivery page: the delivery by id and its attempts
    "delivery page": (
        "SELECT d.*, a.* FROM deliveries d LEFT JOIN attempts a ON a.delivery_id = d.id "
        "WHERE d.id = :delivery"
    ),
    # an event's deliveries (event page, events purge)
    "event's deliveries": "SELECT * FROM deliveries WHERE event_id = :event",
    # dlq.search: open letters newest first, then the versions of their deliveries
    "dead-letter search": (
        "SELECT * FROM dead_letters WHERE state = 'open' ORDER BY id DESC LIMIT 51"
    ),
    "dead-letter search: versions": "SELECT id, version FROM deliveries WHERE id IN :letters",
    # app.feed.read.page
    "feed page": (
        "SELECT feed_seq, id, type, version, payload FROM events WHERE partner_id = :partner "
        "AND feed_seq > :after AND type NOT LIKE 'kurir.%' ORDER BY feed_seq LIMIT 100"
    ),
}


def _wipe(url: str) -> None:
    db = Database(url, pool_size=1)
    with db.engine.begin() as connection:
        connection.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        connection.execute(text("CREATE SCHEMA public"))
    db.dispose()


def _load(db: Database, days: int, per_day: int) -> dict[str, str]:
    now = datetime.now(UTC)
    start = now - days * DAY
    with db.begin() as session:
        partner = Partner(uid="acme", name="Acme")
        session.add(partner)
        session.flush()
        endpoint = Endpoint(partner_id=partner.id, url="http://127.0.0.1:9/hook")
        session.add(endpoint)
        session.flush()
        ids = {"partner": partner.id, "endpoint": endpoint.id}
    total, step, chunk = days * per_day, DAY / per_day, 5000
    for base in range(0, total, chunk):
        events, deliveries, attempts, letters = [], [], [], []
        for i in range(base, min(total, base + chunk)):
            at = start + i * step
            event_id, delivery_id = id_at("evt", at), id_at("dlv", at)
            state = "dead" if i % 100 == 7 else "retrying" if i % 100 == 42 else "succeeded"
            body = json.dumps({"type": "order.created", "data": {"order_id": f"h-{i}"}})
            events.append(
                {
                    "id": event_id,
                    "partner_id": ids["partner"],
                    "type": "order.created",
                    "version": 1,
                    "data": {"order_id": f"h-{i}"},
                    "payload": body,
                    "occurred_at": at,
                    "created_at": at,
                    "feed_seq": i + 1,
                }
            )
            deliveries.append(
                {
                    "id": delivery_id,
                    "event_id": event_id,
                    "endpoint_id": ids["endpoint"],
                    "state": state,
                    "attempt_count": 1,
                    "run_attempts": 1,
                    "run": 1,
                    "forced": False,
                    "next_attempt_at": at + DAY if state == "retrying" else None,
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
                    "response_status": 200 if state == "succeeded" else 500,
                    "response_body": b"ok" * 100,
                    "created_at": at,
                }
            )
            if state == "dead":
                letters.append(
                    {
                        "id": id_at("dl", at),
                        "delivery_id": delivery_id,
                        "event_id": event_id,
                        "endpoint_id": ids["endpoint"],
                        "partner_id": ids["partner"],
                        "event_type": "order.created",
                        "reason": "exhausted",
                        "search_text": body,
                        "state": "open",
                        "created_at": at,
                        "updated_at": at,
                    }
                )
        with db.begin() as session:
            session.execute(insert(Event), events)
            session.execute(insert(Delivery), deliveries)
            session.execute(insert(Attempt), attempts)
            if letters:
                session.execute(insert(DeadLetter), letters)
        ids["delivery"], ids["event"] = deliveries[-1]["id"], events[-1]["id"]
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE"))
    return ids


def _explain(db: Database, ids: dict[str, str], label: str) -> None:
    with db.engine.connect() as connection:
        due = connection.execute(
            text("SELECT id FROM deliveries WHERE state = 'retrying' ORDER BY id DESC LIMIT 20")
        ).scalars()
        letters = connection.execute(
            text(
                "SELECT delivery_id FROM dead_letters WHERE state = 'open' "
                "ORDER BY id DESC LIMIT 51"
            )
        ).scalars()
        # As the code sends them: a list of ids (SQLAlchemy's expanding IN).
        lists = {"due": tuple(due), "letters": tuple(letters)}
    params = {**ids, "after": 1000, **lists}
    print(f"\n## EXPLAIN ANALYZE, {label}")
    for name, sql in QUERIES.items():
        with db.engine.connect() as connection:
            expanding = [bindparam(n, expanding=True) for n in lists if f":{n}" in sql]
            # Planned once first: the figure is a warm connection's, as in a pool.
            connection.execute(text(f"EXPLAIN {sql}").bindparams(*expanding), params)
            statement = text(f"EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) {sql}")
            plan = connection.execute(statement.bindparams(*expanding), params).scalars().all()
            connection.rollback()  # the claim's UPDATE runs for real
        print(f"\n### {name}\n```")
        print("\n".join(_short(line) for line in plan))
        print("```")


def _short(line: str) -> str:
    """Plans of many partitions repeat one line per partition: keep them readable."""
    return line if len(line) < 160 else line[:157] + "..."


def _plan_ms(db: Database, sql: str, params: dict[str, Any], runs: int = 200) -> float:
    """The median planning time of a statement on one warm connection."""
    found = []
    with db.engine.connect() as connection:
        for _ in range(runs):
            lines = connection.execute(text(f"EXPLAIN (SUMMARY ON) {sql}"), params).scalars().all()
            found.append(float(lines[-1].split(":")[1].split()[0]))
    found.sort()
    return found[len(found) // 2]


def _daily_or_weekly(db: Database, endpoint: str) -> None:
    """The same rows under 30 daily and 5 weekly partitions: planning and dropping one."""
    now = partitions.day_start(datetime.now(UTC))
    print("\n## daily or weekly")
    with db.engine.begin() as connection:
        for layout, span, count in (("daily", DAY, 30), ("weekly", 7 * DAY, 5)):
            table = f"plan_{layout}"
            connection.execute(text(f"DROP TABLE IF EXISTS {table}"))
            connection.execute(
                text(
                    f"CREATE TABLE {table} (LIKE deliveries INCLUDING DEFAULTS) "
                    "PARTITION BY RANGE (id)"
                )
            )
            first = now - count * span
            for n in range(count):
                low, high = first + n * span, first + (n + 1) * span
                connection.execute(
                    text(
                        f"CREATE TABLE {table}_{n} PARTITION OF {table} FOR VALUES FROM "
                        f"('{id_floor('dlv', low)}') TO ('{id_floor('dlv', high)}')"
                    )
                )
            connection.execute(text(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT"))
            connection.execute(text(f"INSERT INTO {table} SELECT * FROM deliveries"))  # noqa: S608
            connection.execute(text(f"ALTER TABLE {table} ADD PRIMARY KEY (id)"))
            connection.execute(text(f"CREATE INDEX ON {table} (endpoint_id, state)"))
            connection.execute(text(f"ANALYZE {table}"))
    with db.engine.connect() as connection:
        due = tuple(
            connection.execute(
                text("SELECT id FROM deliveries WHERE state = 'retrying' ORDER BY id LIMIT 20")
            ).scalars()
        )
    for layout, count in (("daily", 30), ("weekly", 5)):
        table = f"plan_{layout}"
        log_sql = f"SELECT * FROM {table} WHERE endpoint_id = :e ORDER BY id DESC LIMIT 51"  # noqa: S608
        claim_sql = f"UPDATE {table} SET state = 'delivering' WHERE id IN {due!r}"  # noqa: S608
        planning = _plan_ms(db, log_sql, {"e": endpoint})
        claim_planning = _plan_ms(db, claim_sql, {})
        started = time.perf_counter()
        with db.engine.begin() as connection:
            rows = connection.execute(text(f"SELECT count(*) FROM plan_{layout}_1")).scalar()  # noqa: S608
            connection.execute(text(f"ALTER TABLE plan_{layout} DETACH PARTITION plan_{layout}_1"))
            connection.execute(text(f"DROP TABLE plan_{layout}_1"))
        dropped_ms = (time.perf_counter() - started) * 1000
        print(
            f"  {layout:<6} {count} partitions: planning (median) delivery log {planning:.3f} ms, "
            f"claim of 20 ids {claim_planning:.3f} ms; "
            f"one partition ({rows:,} rows) detached and dropped in {dropped_ms:.0f} ms"
        )
    with db.engine.begin() as connection:
        connection.execute(text("DROP TABLE plan_daily, plan_weekly"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--per-day", type=int, default=10000)
    parser.add_argument("--swap-first", action="store_true")
    args = parser.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL")
    if not url or not url.startswith("postgresql"):
        raise SystemExit("BENCH_DATABASE_URL: a PostgreSQL database this bench may wipe")
    _wipe(url)
    migrate.upgrade(url, "0019_search")
    db = Database(url, pool_size=2)
    started = time.perf_counter()
    ids = _load(db, args.days, args.per_day)
    rows = args.days * args.per_day
    print(
        f"loaded {rows:,} events, deliveries and attempts ({args.days} days × {args.per_day:,}) "
        f"in {time.perf_counter() - started:.0f} s"
    )
    _explain(db, ids, "before (0019, plain tables)")
    started = time.perf_counter()
    migrate.upgrade(url)
    print(
        f"\n## upgrade to head (0020 partitions): {rows:,} deliveries and {rows:,} attempts "
        f"partitioned in {time.perf_counter() - started:.1f} s"
    )
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM ANALYZE"))
    _explain(db, ids, "after (0020, partitioned by day)")

    settings = Settings(database_url=url, secret_key="bench-secret-key")  # noqa: S106
    rt = Runtime(settings, database=db)
    # The load starts at this time of day `--days` back, so the oldest day is a part of one:
    # the whole days after it are dropped too, each reported: the first with its kept rows
    # copied under the locks, the second swapped (or the other way round).
    with db.engine.connect() as connection:
        days = partitions.partitions(connection, partitions.DELIVERIES)
    ways = ["copied", "swapped"]
    if args.swap_first:
        ways.reverse()
    swap_min_rows = swap.SWAP_MIN_ROWS
    for way, whole in zip(ways, days[1:3], strict=False):
        swap.SWAP_MIN_ROWS = swap_min_rows if way == "swapped" else 2**62
        # In the order a retention run drops them: a deliveries day takes its attempts day.
        for kind in purge.DROP_ORDER:
            for day in drop.run(rt, kind, whole.end):
                print(
                    f"\n## retention drop ({kind.value}) of {day.day:%Y-%m-%d}: "
                    f"{day.purged:,} rows dropped, {day.kept:,} kept, {way if day.kept else ''} "
                    f"in {day.elapsed_ms:.0f} ms (the tables locked for {day.locked_ms:.0f} ms; "
                    f"{day.removed_ms:.0f} ms removing the detached tables' files after)"
                )
    swap.SWAP_MIN_ROWS = swap_min_rows
    _daily_or_weekly(db, ids["endpoint"])
    db.dispose()


if __name__ == "__main__":
    main()
