"""What several benches share and the tests do not: for the benches that time queries over a
seeded PostgreSQL database, their start and the pieces their seeds are made of.

(Shared with the tests: stopping a child's process group, tests/support/processes.py; the fast
receiver and its request parser, tests/support/fast_receiver.py.)
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from app.ids import _encode  # the ids' own base32; app.ids needs the standard library only

if TYPE_CHECKING:
    from app.db import Database

Names = TypeVar("Names")


@dataclass
class SeededBench(Generic[Names]):
    """What `seeded_bench` made: the options, the database, the random source (seeded, so
    two runs ask the same queries) and what the bench's `seed` returned."""

    args: argparse.Namespace
    db: Database
    rng: random.Random
    names: Names


def api_env(database_url: str, redis_url: str) -> dict[str, str]:
    """The environment a bench starts `kurir api` (and its bare apps) with: its own database
    and Redis, private targets allowed, a throwaway secret and data dir, quiet logs."""
    root = Path(__file__).resolve().parent.parent
    return dict(
        os.environ,
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        KURIR_ALLOW_PRIVATE_TARGETS="1",
        KURIR_SECRET_KEY=os.environ.get("KURIR_SECRET_KEY", "bench-secret-key"),
        KURIR_DATA_DIR=str(root / "var" / "bench"),
        KURIR_LOG_LEVEL="warning",
        PYTHONPATH=str(root),
    )


def seeded_bench(
    description: str | None,
    *,
    default_url: str,
    rows: int,
    rng_seed: int,
    noun: str,
    seed: Callable[[Database, int, random.Random], Names],
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> SeededBench[Names]:
    """Parse --rows and --repeat (and the bench's own `options`), wipe and migrate the
    PostgreSQL database of BENCH_DATABASE_URL (default `default_url`), then `seed` it with
    --rows rows, saying how long that took. Another database is refused (exit status 2):
    the seeds load hundreds of thousands of rows with PostgreSQL's COPY.

    The database layer is imported here, not at the top: bench/deliver.py's receiver process
    imports this module for `take_requests`, and should start without SQLAlchemy."""
    from app.config import normalise_database_url
    from app.db import Database
    from bench.fresh_db import fresh_database

    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--repeat", type=int, default=30)
    if options is not None:
        options(parser)
    args = parser.parse_args()
    url = normalise_database_url(os.environ.get("BENCH_DATABASE_URL", default_url))
    if not url.startswith("postgresql"):
        print("BENCH_DATABASE_URL must be a PostgreSQL URL", file=sys.stderr)
        raise SystemExit(2)
    rng = random.Random(rng_seed)
    fresh_database(url)
    db = Database(url, pool_size=2)
    started = time.perf_counter()
    names = seed(db, args.rows, rng)
    print(f"seeded {args.rows:,} {noun} in {time.perf_counter() - started:.1f} s")
    return SeededBench(args, db, rng, names)


# ---------------------------------------------------------------------------- seeding

TYPES = [
    "order.created",
    "order.paid",
    "order.shipped",
    "invoice.paid",
    "invoice.voided",
    "payment.succeeded",
    "payment.failed",
    "refund.created",
    "customer.updated",
    "subscription.renewed",
]
EVENT_COLUMNS = (
    "id",
    "partner_id",
    "type",
    "version",
    "data",
    "payload",
    "occurred_at",
    "created_at",
)


def ulid_at(prefix: str, moment: datetime, rng: random.Random) -> str:
    """An id as Kurir makes them, but for a moment in the past: seeded rows spread over
    weeks sort by time the way real ones do."""
    millis = int(moment.timestamp() * 1000)
    return f"{prefix}_{_encode(millis, 10)}{_encode(rng.getrandbits(80), 16)}"


def copy_rows(cur: Any, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """Load `rows` into `table` with one COPY (a psycopg cursor): seeding a bench's
    hundreds of thousands of rows in seconds, not minutes."""
    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)


def copy_partners_and_endpoints(
    cur: Any,
    partners: list[tuple[str, str]],
    endpoints: list[tuple[str, str]],
    now: datetime,
    disabled: Callable[[int], bool] = lambda _: False,
) -> None:
    """COPY partners, as (id, uid), and endpoints, as (id, partner id): the i-th endpoint
    posts to https://hooks{i}.example.com/kurir, disabled where `disabled(i)`."""
    with cur.copy("COPY partners (id, uid, name, created_at, updated_at) FROM STDIN") as cp:
        for pid, uid in partners:
            cp.write_row((pid, uid, uid.title(), now, now))
    with cur.copy(
        "COPY endpoints (id, partner_id, url, headers, timeout_s, state, "
        "consecutive_failures, created_at, updated_at) FROM STDIN"
    ) as cp:
        for i, (eid, pid) in enumerate(endpoints):
            state = "disabled" if disabled(i) else "enabled"
            cp.write_row(
                (eid, pid, f"https://hooks{i}.example.com/kurir", "{}", 15, state, 0, now, now)
            )


def wait_for_workers(redis: Any, count: int, timeout_s: float = 30.0) -> None:
    """Until `count` RQ workers have registered with `redis` (they were just started)."""
    from rq import Worker

    deadline = time.monotonic() + timeout_s
    while Worker.count(connection=redis) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not start")
        time.sleep(0.1)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
