"""Redis memory per 1,000 queued deliveries: how much Redis a backlog needs.

    .venv/bin/python bench/redis_memory.py [-n 100000] [--url redis://host:port/db]

Redis only carries the ids of work to do, so a backlog (workers stopped, or slower than
publishing) costs Redis memory in proportion to the deliveries waiting. Each layout is
written the way Kurir writes it and measured as the growth of INFO memory's `used_memory`,
from an empty server, with N deliveries queued:

  1. bare list: the delivery ids alone, RPUSHed on one list (the floor for any queue of ids);
  2. one delivery per job: `sender.dispatch.job_specs` of one id each through
     `app.queues.enqueue_many` (an RQ job hash and a queue entry per delivery);
  3. 50 deliveries per job: the same with the publish path's batches (`dispatch.BATCH_SIZE`).

Without --url it starts its own Redis server (the one `kurir up` embeds) in a temporary
directory, so nothing else writes to it and FLUSHALL between layouts harms nobody. With --url
it measures that server's database after FLUSHDB: only a server nothing else is using gives
clean figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.embedded_redis import EmbeddedRedis  # noqa: E402
from app.ids import new_id  # noqa: E402
from app.queues import DELIVERIES, enqueue_many  # noqa: E402
from sender.dispatch import BATCH_SIZE, job_specs  # noqa: E402

CHUNK = 5_000  # deliveries per pipeline


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def bare_list(client: redis.Redis, ids: list[str]) -> None:
    for start in range(0, len(ids), CHUNK):
        client.rpush("bench:bare", *ids[start : start + CHUNK])


def jobs_of(size: int) -> Callable[[redis.Redis, list[str]], None]:
    def enqueue(client: redis.Redis, ids: list[str]) -> None:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            specs = [
                spec
                for batch in range(0, len(chunk), size)
                for spec in job_specs(chunk[batch : batch + size])
            ]
            enqueue_many(client, specs)

    return enqueue


LAYOUTS: tuple[tuple[str, Callable[[redis.Redis, list[str]], None]], ...] = (
    ("bare list of ids", bare_list),
    ("1 delivery per job", jobs_of(1)),
    (f"{BATCH_SIZE} deliveries per job", jobs_of(BATCH_SIZE)),
)


def measure(client: redis.Redis, n: int) -> list[tuple[str, int]]:
    """(layout, bytes per 1,000 deliveries) for each layout."""
    figures = []
    for name, write in LAYOUTS:
        client.flushdb()
        ids = [new_id("dlv") for _ in range(n)]
        before = used_memory(client)
        write(client, ids)
        after = used_memory(client)
        queued = client.llen(f"rq:queue:{DELIVERIES}") or client.llen("bench:bare")
        assert queued > 0, name
        figures.append((name, round((after - before) * 1000 / n)))
    client.flushdb()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=100_000, help="deliveries queued per layout")
    parser.add_argument("--url", help="an idle Redis to measure (default: start one)")
    args = parser.parse_args()
    server: EmbeddedRedis | None = None
    with tempfile.TemporaryDirectory(prefix="kurir-redis-memory-") as tmp:
        url = args.url
        if url is None:
            server = EmbeddedRedis(Path(tmp))
            url = server.start()
        client = redis.Redis.from_url(url)
        try:
            version = client.info("server")["redis_version"]
            figures = measure(client, args.n)
        finally:
            client.close()
            if server is not None:
                server.stop()
    print(f"Redis {version}, {args.n:,} deliveries queued per layout (INFO memory used_memory)")
    print(f"{'layout':<28} {'per 1,000 deliveries':>22} {'per delivery':>14}")
    for name, per_thousand in figures:
        print(f"{name:<28} {per_thousand / 1024:>18.1f} KiB {per_thousand / 1000:>12.0f} B")


if __name__ == "__main__":
    main()
