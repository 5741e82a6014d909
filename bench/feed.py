"""The feed's costs: what it adds to a publish, what sequencing and reading cost, and how fast
a polling consumer sees what was published — each beside a bare baseline in the same run.

    .venv/bin/python bench/feed.py --database-url postgresql://…/somedb [-n 4000] [--threads 8]
    .venv/bin/python bench/feed.py --database-url sqlite:////tmp/feed-bench.db

The database is WIPED and migrated. Publishes go through `app.intake.publish.publish` (the
API's own path, without HTTP) to a partner with no endpoint, so the event row — the only part
the feed touches — is as large a share of the work as it can be. CPU is this process's CPU time
(client side: Python, driver); the database server's own CPU is not in it.

It prints:
  1. publish: events/s and CPU ms/event with the feed's partial index on events waiting for a
     position, and without it (dropped for the round: a publish as before the feed) —
     alternating rounds, medians;
  2. sequencing a backlog of N events: events/s, CPU/event, against a bare UPDATE that rewrites
     the same rows;
  3. reading the whole feed in pages of 250: events/s, CPU/event, against bare id-paged reads
     of the same rows (the read that has the polling gap);
  4. 8 publishers with a consumer polling every 50 ms: publish rate beside (1), and the delay
     from a publish's 202 to the consumer holding the event, p50 / p99.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from app.config import Settings  # noqa: E402
from app.db import Database  # noqa: E402
from app.feed.sequencer import sequence  # noqa: E402
from app.intake.publish import publish  # noqa: E402
from app.registry.partners import create_partner  # noqa: E402
from app.runtime import Runtime  # noqa: E402
from app.services import feed  # noqa: E402
from app.services.actor import Actor  # noqa: E402
from bench.fresh_db import fresh_database  # noqa: E402

SCHEMA = {
    "type": "object",
    "required": ["order_id"],
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
}
UNSEQUENCED_INDEX = "ix_events_unsequenced"


def setup(rt: Runtime) -> None:
    from app import event_types

    with rt.db.begin() as session:
        event_types.register(session, {"name": "order.created", "version": 1, "schema": SCHEMA})
        create_partner(session, {"uid": "bench", "name": "Bench"})


def timed(work: Callable[[], int]) -> tuple[int, float, float]:
    """(units, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    units = work()
    return units, time.perf_counter() - wall, time.process_time() - cpu


def publish_round(
    rt: Runtime, n: int, threads: int, tag: str, answered: dict[str, float] | None = None
) -> int:
    per = n // threads

    def run(t: int) -> None:
        for i in range(per):
            result = publish(
                rt.db,
                rt.redis,
                rt.settings,
                partner_uid="bench",
                body={
                    "type": "order.created",
                    "version": 1,
                    "data": {"order_id": f"{tag}-{t}-{i}", "amount": i},
                },
                api_key_id="bench",
            )
            if answered is not None:
                answered[result.body["id"]] = time.perf_counter()

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return per * threads


def set_index(db: Database, present: bool) -> None:
    with db.engine.begin() as connection:
        if present:
            connection.execute(
                text(
                    f"CREATE INDEX IF NOT EXISTS {UNSEQUENCED_INDEX} ON events "
                    "(id) WHERE feed_seq IS NULL"
                )
            )
        else:
            connection.execute(text(f"DROP INDEX IF EXISTS {UNSEQUENCED_INDEX}"))


def line(label: str, units: int, wall: float, cpu: float) -> str:
    return (
        f"  {label:<44} {units / wall:>9,.0f} /s   CPU {cpu / units * 1000:6.3f} ms/event"
        f"   ({units} in {wall:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("-n", type=int, default=4000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    fresh_database(args.database_url)
    rt = Runtime(
        Settings(
            database_url=args.database_url,
            redis_url=args.redis_url,
            secret_key="bench-only-not-a-secret",  # noqa: S106
        )
    )
    setup(rt)
    backend = rt.db.engine.dialect.name
    print(f"feed bench on {backend}: n={args.n}, {args.threads} publisher threads")

    # 1. publish, with and without the feed's index (alternating rounds)
    results: dict[bool, list[tuple[int, float, float]]] = {True: [], False: []}
    for r in range(args.rounds):
        for present in (True, False):
            set_index(rt.db, present)
            sequence(rt.db)  # no backlog carried from one round into the next
            results[present].append(
                timed(
                    lambda p=present, r=r: publish_round(rt, args.n, args.threads, f"r{r}{int(p)}")
                )
            )
    set_index(rt.db, True)
    print("1. publish (median of rounds; every round's rate in brackets)")
    for present, label in (
        (False, "bare: no feed index (publish as before)"),
        (True, "with the feed (waiting-events index)"),
    ):
        rates = sorted(results[present], key=lambda t: t[0] / t[1])
        units, wall, cpu = rates[len(rates) // 2]
        print(
            line(label, units, wall, cpu)
            + "  ["
            + ", ".join(f"{u / w:.0f}" for u, w, _ in results[present])
            + "]"
        )

    # 2. sequencing a backlog
    with rt.db.engine.begin() as connection:
        connection.execute(text("UPDATE events SET feed_seq = NULL"))
    print("2. sequencing a backlog")
    print(line("bare: UPDATE rewriting the same rows", *timed(lambda: _bare_update(rt.db))))
    print(line("sequencer (lock, number in id order)", *timed(lambda: sequence(rt.db))))
    if rt.db.is_postgres:
        # What autovacuum does after a bulk change; without fresh statistics the planner
        # guesses a handful of rows after the cursor and sorts instead of walking the index.
        with rt.db.autocommit() as connection:
            connection.execute(text("VACUUM ANALYZE events"))

    # 3. reading the whole feed
    print("3. reading every event, pages of 250")
    print(line("bare: SELECT … WHERE id > ? ORDER BY id", *timed(lambda: _bare_pages(rt.db))))
    print(line("feed: service read (sequencer check + page)", *timed(lambda: _feed_pages(rt))))

    # 4. publishers with a polling consumer
    answered: dict[str, float] = {}
    seen: dict[str, float] = {}
    done = threading.Event()
    consumer = threading.Thread(target=_consume, args=(rt, seen, done))
    consumer_cursor[0] = _feed_end(rt)
    consumer.start()
    units, wall, cpu = timed(lambda: publish_round(rt, args.n, args.threads, "c", answered))
    done.set()
    consumer.join()
    delays = sorted(seen[i] - answered[i] for i in answered if i in seen)
    missing = len(set(answered) - set(seen))
    extra = len(set(seen) - set(answered))
    print("4. publishers with a consumer polling every 50 ms")
    print(line("publish while the consumer reads", units, wall, cpu))
    print(
        f"  202 -> in the consumer's hands: p50 {statistics.median(delays) * 1000:.0f} ms, "
        f"p99 {delays[int(len(delays) * 0.99) - 1] * 1000:.0f} ms; "
        f"seen {len(seen) - extra} of {len(answered)}, missing {missing}, "
        f"others {extra}"
    )
    rt.close()


def _bare_update(db: Database) -> int:
    with db.engine.begin() as connection:
        return int(
            connection.execute(
                text("UPDATE events SET resource_version = resource_version")
            ).rowcount
            or 0
        )


def _bare_pages(db: Database) -> int:
    count, last = 0, ""
    with db.engine.connect() as connection:
        while True:
            rows = connection.execute(
                text("SELECT id, payload FROM events WHERE id > :last ORDER BY id LIMIT 250"),
                {"last": last},
            ).all()
            if not rows:
                return count
            count += len(rows)
            last = rows[-1][0]


def _feed_pages(rt: Runtime) -> int:
    count, cursor = 0, None
    while True:
        page = feed.read(rt, Actor.cli(), "bench", after=cursor, limit=250)
        if not page.payloads:
            return count
        count += len(page.payloads)
        cursor = page.next_cursor


def _feed_end(rt: Runtime) -> str:
    """A cursor after everything published so far."""
    cursor = None
    while True:
        page = feed.read(rt, Actor.cli(), "bench", after=cursor, limit=250)
        cursor = page.next_cursor
        if not page.payloads:
            return cursor


consumer_cursor: list[str | None] = [None]


def _consume(rt: Runtime, seen: dict[str, float], done: threading.Event) -> None:
    import json

    cursor = consumer_cursor[0]
    while True:
        finished = done.is_set()
        page = feed.read(rt, Actor.cli(), "bench", after=cursor, limit=250)
        now = time.perf_counter()
        for payload in page.payloads:
            seen.setdefault(json.loads(payload)["id"], now)
        cursor = page.next_cursor
        if finished and not page.payloads:
            return
        if not page.payloads:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
