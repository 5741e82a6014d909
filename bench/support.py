"""What several benches share and the tests do not: reading requests off a raw socket buffer,
and the start of every bench that times queries over a seeded PostgreSQL database.

(Stopping a child's process group is shared with the tests: tests/support/processes.py.)
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

if TYPE_CHECKING:
    from app.db import Database

_HEAD_END = b"\r\n\r\n"


class RawRequest(NamedTuple):
    method: str
    path: str
    webhook_id: str


def take_requests(buffer: bytes) -> tuple[list[RawRequest], bytes]:
    """The complete requests at the start of `buffer`, and the bytes after them (a request
    still arriving). Enough HTTP/1.1 for our own senders (Content-Length bodies, keep-alive),
    and cheap: the receivers of a throughput bench share the CPU with what they measure."""
    taken: list[RawRequest] = []
    while (end := buffer.find(_HEAD_END)) >= 0:
        head = buffer[:end].decode("latin-1").split("\r\n")
        length, webhook_id = 0, ""
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "webhook-id":
                webhook_id = value.strip()
        if len(buffer) < end + 4 + length:
            break
        buffer = buffer[end + 4 + length:]
        method, path = head[0].split(" ")[:2]
        taken.append(RawRequest(method, path, webhook_id))
    return taken, buffer


Names = TypeVar("Names")


@dataclass
class SeededBench(Generic[Names]):
    args: argparse.Namespace
    db: Database
    rng: random.Random
    names: Names


def seeded_bench(description: str | None, *, default_url: str, rows: int, rng_seed: int, noun: str,
                 seed: Callable[[Database, int, random.Random], Names],
                 options: Callable[[argparse.ArgumentParser], None] | None = None,
                 ) -> SeededBench[Names]:
    """Parse --rows and --repeat (and the bench's own `options`), wipe and migrate the
    PostgreSQL database of BENCH_DATABASE_URL (default `default_url`), then `seed` it with
    --rows rows, saying how long that took. Another database is refused (exit status 2):
    the seeds load hundreds of thousands of rows with PostgreSQL's COPY.

    The application is imported here, not at the top: bench/deliver.py's receiver process
    imports this module for `take_requests` and starts with the standard library only."""
    from app.config import normalise_database_url
    from app.db import Database
    from bench.fresh_db import fresh_database

    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
