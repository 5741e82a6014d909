"""End-to-end delivery throughput and latency, against the bare `requests.Session` ceiling.

    .venv/bin/python bench/deliver.py [--workers 2] [-n 10000] [--endpoints 10]
                                      [--db postgresql://...] [--redis redis://...]
    .venv/bin/python bench/deliver.py --through-api --endpoints 5 --publishers 4 [...]

The script owns its database (default: the `kurir_delivery_bench` PostgreSQL database, which
it WIPES and migrates) and Redis db (default 4, flushed). It starts a minimal asyncio HTTP
receiver in its own process that answers 200 and records when each webhook arrived, then, in
one run (issue 4, item 11):

  1. the ceilings: N processes each POSTing the same signed bodies to the same receiver in a
     bare `requests.Session` loop, then in a bare urllib3 pool loop (what Kurir's transport
     is built on: the lower ceiling); one connection per process, nothing else;
  2. Kurir's engine: N `kurir worker` processes delivering a committed backlog of 1,000 events
     x 10 endpoints = 10,000 deliveries, enqueued at once (deliveries / (last receipt -
     enqueue)): the figure to hold against the ceiling; then the same backlog again to
     endpoints with `ordering: "key"`, the events spread over 100 ordering keys (each key's
     deliveries one at a time, in publish order), with the workers' CPU time per delivery
     beside both;
  3. Kurir end to end: events published with `app.intake.publish.publish_in_transaction`
     (validation, one-transaction fan-out, after-commit enqueue: the code the API runs) from
     --publishers threads while the workers deliver, plus the sweeper in this process.
     Throughput = deliveries / (last receipt - first publish); latency = receipt - publish
     commit, per delivery (a backlog builds when publishing outruns delivery). With
     --through-api the events are published over HTTP instead: `kurir api` (granian, 2 x 8)
     and --publishers processes posting to it on kept-alive connections, the API's CPU per
     event beside the workers' per delivery (latency then counts from the 202);
  4. p50/p99 publish -> receipt at a paced 100 events/s (one endpoint, open loop);
  5. one event fanned out to 1,000 endpoints: time until the last one is received.

Beside every rate it prints the worker processes' CPU time per delivery (user + system, every
thread, until the outcome is recorded) and its ratio to each bare loop's CPU time per POST,
measured in the same run (again right before the end-to-end phase): on a shared machine rates
move with the load, the ratio much less.

Around the two drains (delivering only: enqueue, claim, send, record) and the end-to-end phase
(publishing as well) it measures what the phase cost PostgreSQL and Redis per delivery
(`bench/db_cost.py`, whose docstring has the method): commits, and writing commits (the ones
that wait for a WAL flush); this database's WAL bytes and records, read back with
pg_walinspect (the server-wide `pg_stat_wal` and LSN difference beside them); rows inserted,
updated and deleted; B-tree index entries inserted, per index; the server backends' CPU; Redis
commands. Then it divides stated capacities by that: the deliveries per second one PostgreSQL
carries at --pg-commits-per-s writing commits/s and --pg-wal-mb-per-s of WAL (defaults 20,000
and 200 MB/s, an NVMe disk), and one Redis at --redis-commands-per-s (100,000, one core): where
a fleet stops growing by adding workers. Each snapshot waits about 11 s for PostgreSQL's
statistics to settle, and the JSON line carries it all (`<phase>_per_delivery`).

Targets on a 2-core machine: >= 1,000 deliveries/s end-to-end, >= 60 % of the bare ceiling with
the same number of processes, p99 <= 100 ms at 100/s, 1,000-endpoint fan-out within 2 s; worker
CPU per delivery <= 1.3 x the bare POST on PostgreSQL, <= 1.5 x on SQLite; the ordered drain
>= 50 % of the unordered one. `--drain-only` stops after the two drains.
Run it on an otherwise idle machine: everything (receiver, PostgreSQL, Redis, workers) shares
the cores.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.db_cost import Capacity, CostMeter, report, rounded  # noqa: E402
from bench.support import wait_for_workers  # noqa: E402
from tests.support.fast_receiver import ReceiverProcess  # noqa: E402

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_delivery_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/4"
SECRET_KEY = "bench-secret-key"  # noqa: S105 - a throwaway bench database
TYPE_NAME = "order.paid"
SCHEMA = {
    "type": "object",
    "required": ["order_id", "amount"],
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
}


# ---------------------------------------------------------------------------- the ceiling


def _bare_main(url: str, count: int, body: bytes, barrier: Any, out: Any, client: str) -> None:
    """POST `count` signed bodies over one kept-alive connection of `client`: "requests" (a
    bare `requests.Session`) or "urllib3" (the connection pool Kurir's transport is built on)."""
    from urllib.parse import urlsplit

    import requests
    import urllib3

    from app.signing import generate_secret
    from sender.deliver import request_headers

    if client == "urllib3":
        parts = urlsplit(url)
        pool = urllib3.HTTPConnectionPool(parts.hostname, parts.port, maxsize=1)

        def post(headers: dict[str, str]) -> None:
            pool.urlopen("POST", parts.path, body=body, headers=headers, retries=False)

    else:
        session = requests.Session()

        def post(headers: dict[str, str]) -> None:
            session.post(url, data=body, headers=headers, timeout=15)

    secret = generate_secret()
    barrier.wait()
    started = time.perf_counter()
    cpu = time.process_time()
    for i in range(count):
        post(request_headers(f"evt_bare_{os.getpid()}_{i}", body, [secret], {}, int(time.time())))
    out.put((time.perf_counter() - started, time.process_time() - cpu))


def bare_ceiling(
    url: str, processes: int, total: int, body: bytes, client: str = "requests"
) -> tuple[float, float]:
    """Deliveries per second of N processes in a bare POST loop (`client`: a requests.Session
    or a urllib3 pool), and the CPU time (user + system, ms) each POST cost its process."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes)
    out = ctx.Queue()
    per = total // processes
    procs = [
        ctx.Process(target=_bare_main, args=(url + "/bare", per, body, barrier, out, client))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    finished = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    elapsed = max(wall for wall, _ in finished)
    # Every process's own CPU time (time.process_time(): user + system, all its threads).
    cpu_s = sum(cpu for _, cpu in finished)
    return per * processes / elapsed, cpu_s * 1000 / (per * processes)


# ---------------------------------------------------------------------------- Kurir


class Kurir:
    """Settings, a runtime for publishing from this process, and N worker processes."""

    def __init__(self, db_url: str, redis_url: str, workers: int, data_dir: Path) -> None:
        from app.config import load_settings
        from app.runtime import Runtime

        self.env = dict(
            os.environ,
            DATABASE_URL=db_url,
            REDIS_URL=redis_url,
            KURIR_DATA_DIR=str(data_dir),
            KURIR_SECRET_KEY=SECRET_KEY,
            KURIR_ALLOW_PRIVATE_TARGETS="1",
            KURIR_LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "warning"),
        )
        self.settings = load_settings(self.env)
        self.runtime = Runtime(self.settings)
        self.runtime.redis.flushdb()
        self.workers_n = workers
        self.workers: list[subprocess.Popen[bytes]] = []
        # Transactions this process made in the database while waiting for outcomes: not
        # the deliveries' cost, so the cost meter subtracts them.
        self.polls = 0
        self.stop_sweeper = threading.Event()
        with self.runtime.db.begin() as session:
            from app import event_types
            from app.accounts import create_api_key

            event_types.register(session, {"name": TYPE_NAME, "version": 1, "schema": SCHEMA})
            key, self.token = create_api_key(session, "bench", ["admin"])
            self.api_key_id = key.id

    def start(self) -> None:
        from sender.sweeper import sweep

        sweep(self.runtime)  # as in a running deployment: Redis is known to be whole

        for _ in range(self.workers_n):
            self.workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "app.cli", "worker"], env=self.env, cwd=ROOT
                )
            )
        wait_for_workers(self.runtime.redis, self.workers_n)
        self.start_sweeper()

    def worker_cpu_s(self) -> float:
        """CPU time (user + system, every thread) the worker processes have used so far."""
        import psutil

        total = 0.0
        for proc in self.workers:
            times = psutil.Process(proc.pid).cpu_times()
            total += times.user + times.system
        return total

    def wait_recorded(self, succeeded: int, timeout_s: float = 120.0) -> bool:
        """Wait until `succeeded` deliveries are recorded as such: a worker's CPU per delivery
        includes writing its outcome, which happens after the receipt."""
        from sqlalchemy import func, select

        from app.models import SUCCEEDED, Delivery

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.polls += 1
            with self.runtime.db.begin() as session:
                done = session.scalar(
                    select(func.count()).select_from(Delivery).where(Delivery.state == SUCCEEDED)
                )
            if done is not None and done >= succeeded:
                return True
            time.sleep(0.05)
        return False

    def start_sweeper(self) -> None:
        self.stop_sweeper = threading.Event()
        threading.Thread(target=self._sweeper, daemon=True).start()

    def publish_quietly(self, uid: str, events: int, keys: int = 0) -> list[str]:
        """Publish with enqueueing switched off (a Redis that refuses): the delivery ids."""
        import logging

        import redis as redis_lib
        from redis.backoff import NoBackoff
        from redis.retry import Retry
        from sqlalchemy import select

        from app.intake.publish import publish_in_transaction
        from app.models import Delivery

        dead = redis_lib.Redis(
            unix_socket_path="/nonexistent/kurir-bench.sock", retry=Retry(NoBackoff(), 0)
        )
        logging.getLogger("app.queues").setLevel(logging.ERROR)
        ids: list[str] = []
        for start in range(0, events, 100):
            with self.runtime.db.begin() as session:
                event_ids = [
                    publish_in_transaction(
                        session,
                        dead,
                        self.settings,
                        partner_uid=uid,
                        body=self._body(i, keys),
                        api_key_id=self.api_key_id,
                    ).body["id"]
                    for i in range(start, min(events, start + 100))
                ]
                ids += session.scalars(
                    select(Delivery.id)
                    .where(Delivery.event_id.in_(event_ids))
                    .order_by(Delivery.id)
                )
        logging.getLogger("app.queues").setLevel(logging.NOTSET)
        return ids

    def publish_concurrently(
        self, uid: str, events: int, threads: int, published: dict[str, float]
    ) -> float:
        """Publish `events` from `threads` threads; fills event id -> commit time."""
        started = time.time()
        counter = iter(range(events))
        lock = threading.Lock()

        def publisher() -> None:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                event_id, at = self.publish(uid, i)
                published[event_id] = at

        pool = [threading.Thread(target=publisher) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        return time.time() - started

    @staticmethod
    def _body(i: int, keys: int = 0) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": TYPE_NAME,
            "version": 1,
            "data": {"order_id": f"ord_{i:08d}", "amount": 1000 + i},
            "correlation_id": f"bench-{i}",
        }
        if keys:
            body["ordering_key"] = f"order:{i % keys}"
        return body

    def _sweeper(self) -> None:
        from sender.sweeper import sweep

        while not self.stop_sweeper.wait(self.settings.sweep_interval_seconds):
            try:
                sweep(self.runtime)
            except Exception as exc:  # noqa: BLE001 - keep sweeping, like the scheduler
                print(f"sweep failed: {exc}", file=sys.stderr)

    def stop(self) -> None:
        self.stop_sweeper.set()
        for proc in self.workers:
            proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.runtime.close()

    def partner(self, uid: str, urls: list[str], **fields: Any) -> None:
        from app.registry import endpoints as service
        from app.registry import partners

        with self.runtime.db.begin() as session:
            partner = partners.create_partner(session, {"uid": uid, "name": uid})
            for url in urls:
                service.create_endpoint(
                    session, partner, {"url": url, **fields}, self.settings, self.runtime.secret_box
                )

    def publish(self, uid: str, i: int) -> tuple[str, float]:
        """Publish one event; returns its id and the time its transaction committed."""
        from app.intake.publish import publish_in_transaction

        with self.runtime.db.begin() as session:
            result = publish_in_transaction(
                session,
                self.runtime.redis,
                self.settings,
                partner_uid=uid,
                body=self._body(i),
                api_key_id=self.api_key_id,
            )
        return str(result.body["id"]), time.time()


# ---------------------------------------------------------------------------- through the API


def _api_publisher(url: str, token: str, bodies: list[bytes], barrier: Any, out: Any) -> None:
    """POST `bodies` to `kurir api` back to back on one kept-alive connection (prebuilt
    requests, bench/rawhttp.py: ~0.05 ms of client CPU each); sends back (event id, time
    its 202 arrived) per event and the count of other answers."""
    from bench import rawhttp

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    prebuilt = [rawhttp.request_bytes(url, body, headers) for body in bodies]
    connection = rawhttp.Connection(url)
    published: list[tuple[str, float]] = []
    errors = 0
    barrier.wait()
    for request in prebuilt:
        status, answer = connection.exchange(request)
        if status == 202:
            published.append((json.loads(answer)["id"], time.time()))
        else:
            errors += 1
    connection.close()
    out.put((published, errors))


class ApiPublishers:
    """`kurir api` (its default server, 2 workers x 8 threads, as bench/publish.py runs it)
    and publisher processes posting to it: the end-to-end phase through HTTP, where every
    publish costs the API's CPU on the cores the workers deliver from."""

    def __init__(self, env: dict[str, str], token: str) -> None:
        import requests

        from app.ports import free_port

        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.token = token
        self.errors = 0
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "api", "--port", str(port),
             "--workers", "2", "--threads", "8"],
            env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.base}/readyz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.close()
        raise RuntimeError("kurir api did not become ready")

    def cpu_s(self) -> float:
        """CPU time (user + system) of the API's process tree so far."""
        import psutil

        total = 0.0
        root = psutil.Process(self.process.pid)
        for proc in [root, *root.children(recursive=True)]:
            times = proc.cpu_times()
            total += times.user + times.system
        return total

    def publish(
        self, uid: str, events: int, processes: int, published: dict[str, float]
    ) -> tuple[float, float]:
        """Publish `events` from `processes` processes; fills event id -> 202 time. Returns
        (when the publishers started, seconds until the last 202)."""
        url = f"{self.base}/v1/partners/{uid}/events"
        bodies = [json.dumps(Kurir._body(i)).encode() for i in range(events)]
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(processes + 1)
        out = ctx.Queue()
        procs = [
            ctx.Process(
                target=_api_publisher, args=(url, self.token, bodies[k::processes], barrier, out)
            )
            for k in range(processes)
        ]
        for proc in procs:
            proc.start()
        barrier.wait()  # imports and prebuilt requests are done: the clock starts
        started = time.time()
        finished = [out.get(timeout=600) for _ in procs]
        elapsed = time.time() - started
        for proc in procs:
            proc.join()
        for got, errors in finished:
            published.update(got)
            self.errors += errors
        return started, elapsed

    def close(self) -> None:
        from tests.support.processes import stop_group

        stop_group(self.process)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def latencies(published: dict[str, float], records: list[tuple[str, str, float]]) -> list[float]:
    return [(at - published[msg_id]) * 1000 for msg_id, _, at in records if msg_id in published]


def drain_backlog(
    kurir: Kurir,
    receiver: ReceiverProcess,
    meter: CostMeter,
    uid: str,
    events: int,
    *,
    keys: int = 0,
    recorded_before: int,
) -> tuple[float, float, int, dict[str, Any]]:
    """Publish a backlog without enqueueing it, enqueue it at once, and time its delivery:
    (deliveries per second, worker CPU seconds until every outcome is recorded, deliveries,
    what delivering it cost PostgreSQL and Redis: enqueueing, claiming, recording).
    `recorded_before`: deliveries already recorded as succeeded by earlier phases."""
    from sender.dispatch import enqueue_now

    backlog = kurir.publish_quietly(uid, events, keys)
    before = meter.snapshot()
    polls = kurir.polls
    cpu_before = kurir.worker_cpu_s()
    first = time.time()
    enqueue_now(kurir.runtime.redis, backlog)
    if not receiver.wait_for(len(backlog), timeout_s=300):
        print(f"only {receiver.count()} of {len(backlog)} arrived", file=sys.stderr)
    kurir.wait_recorded(recorded_before + len(backlog))
    cpu = kurir.worker_cpu_s() - cpu_before
    records = receiver.dump()
    unique = len({(m, p) for m, p, _ in records})
    cost = meter.cost(before, meter.snapshot(), unique, own_commits=kurir.polls - polls)
    return unique / (max(r[2] for r in records) - first), cpu, unique, cost


def run(args: argparse.Namespace) -> int:
    from bench.fresh_db import fresh_database

    fresh_database(args.db)
    receiver = ReceiverProcess()
    results: dict[str, Any] = {"workers": args.workers}
    capacity = Capacity(
        pg_commits_per_s=args.pg_commits_per_s,
        pg_wal_mb_per_s=args.pg_wal_mb_per_s,
        redis_commands_per_s=args.redis_commands_per_s,
        disk=args.disk,
    )

    def cost_lines(name: str, cost: dict[str, Any]) -> str:
        results[f"{name}_per_delivery"] = rounded(cost, capacity)
        return report(name, cost, capacity)

    try:
        sample = json.dumps(
            {
                "id": "evt_x",
                "type": TYPE_NAME,
                "version": 1,
                "occurred_at": "2026-12-02T10:00:00Z",
                "partner": "bench",
                "resource": None,
                "correlation_id": "bench-1",
                "data": {"order_id": "ord_00000001", "amount": 1001},
            }
        ).encode()
        ceiling, bare_cpu_ms = bare_ceiling(receiver.url, args.workers, args.n, sample)
        receiver.dump()
        # The lower ceiling: urllib3's pool, what Kurir's transport is built on, without
        # requests' sessions, hooks and adapters on top.
        ceiling_u3, bare_u3_ms = bare_ceiling(
            receiver.url, args.workers, args.n, sample, client="urllib3"
        )
        receiver.dump()
        results.update(
            {
                "bare_ceiling_per_s": round(ceiling),
                "bare_cpu_ms_per_post": round(bare_cpu_ms, 3),
                "bare_urllib3_per_s": round(ceiling_u3),
                "bare_urllib3_cpu_ms_per_post": round(bare_u3_ms, 3),
            }
        )
        print(
            f"bare requests.Session loop, {args.workers} processes: {ceiling:,.0f} POST/s, "
            f"CPU {bare_cpu_ms:.3f} ms per POST\n"
            f"bare urllib3 pool loop, {args.workers} processes: {ceiling_u3:,.0f} POST/s, "
            f"CPU {bare_u3_ms:.3f} ms per POST"
        )

        def cpu_line(
            name: str, cpu_s: float, deliveries: int, bare_ms: float, bare_u3: float
        ) -> str:
            per = cpu_s * 1000 / max(deliveries, 1)
            ratio = per / bare_ms
            ratio_u3 = per / bare_u3
            results.update(
                {
                    f"{name}_worker_cpu_ms_per_delivery": round(per, 3),
                    f"{name}_bare_cpu_ms_per_post": round(bare_ms, 3),
                    f"{name}_cpu_ratio_to_bare": round(ratio, 2),
                    f"{name}_bare_urllib3_cpu_ms_per_post": round(bare_u3, 3),
                    f"{name}_cpu_ratio_to_bare_urllib3": round(ratio_u3, 2),
                }
            )
            return (
                f"worker CPU {per:.3f} ms per delivery = {ratio:.2f}x the bare requests "
                f"POST's {bare_ms:.3f} ms, {ratio_u3:.2f}x the bare urllib3 POST's "
                f"{bare_u3:.3f} ms"
            )

        def bare_again() -> tuple[float, float]:
            """Both bare loops' CPU per POST once more, right before a phase: the machine's
            load moves, and a ratio holds best against a baseline taken beside it."""
            _, cpu_ms = bare_ceiling(receiver.url, args.workers, args.n // 2, sample)
            receiver.dump()
            _, u3_ms = bare_ceiling(
                receiver.url, args.workers, args.n // 2, sample, client="urllib3"
            )
            receiver.dump()
            return cpu_ms, u3_ms

        with tempfile.TemporaryDirectory() as tmp:
            kurir = Kurir(args.db, args.redis, args.workers, Path(tmp))
            events_n = args.n // args.endpoints
            kurir.partner("bench", [f"{receiver.url}/e{i}" for i in range(args.endpoints)])
            kurir.partner("drain", [f"{receiver.url}/d{i}" for i in range(args.endpoints)])
            if args.keys:
                kurir.partner(
                    "ordered",
                    [f"{receiver.url}/o{i}" for i in range(args.endpoints)],
                    ordering="key",
                )
            kurir.partner("paced", [f"{receiver.url}/paced"])
            kurir.partner("fanout", [f"{receiver.url}/f{i}" for i in range(1000)])
            kurir.start()
            meter = CostMeter(kurir.settings.resolved_database_url, args.redis)
            try:
                total = events_n * args.endpoints

                # 1. The engine's throughput: a committed backlog, enqueued all at once;
                # then the same backlog to ordered endpoints, over `--keys` ordering keys.
                kurir.stop_sweeper.set()  # nothing but the workers during the drains
                drain, drain_cpu, delivered, drain_cost = drain_backlog(
                    kurir, receiver, meter, "drain", events_n, recorded_before=0
                )
                results.update(
                    {
                        "drain_per_s": round(drain),
                        "drain_share_of_ceiling": round(drain / ceiling, 3),
                    }
                )
                print(
                    f"Kurir delivering a backlog of {delivered:,} over {args.endpoints} "
                    f"endpoints, {args.workers} workers: {drain:,.0f} deliveries/s "
                    f"({drain / ceiling:.0%} of the bare ceiling); "
                    f"{cpu_line('drain', drain_cpu, delivered, bare_cpu_ms, bare_u3_ms)}"
                )
                print(cost_lines("drain", drain_cost))
                if args.keys:
                    ordered, ordered_cpu, ordered_n, ordered_cost = drain_backlog(
                        kurir,
                        receiver,
                        meter,
                        "ordered",
                        events_n,
                        keys=args.keys,
                        recorded_before=delivered,
                    )
                    results.update(
                        {
                            "ordered_drain_per_s": round(ordered),
                            "ordered_share_of_unordered": round(ordered / drain, 3),
                        }
                    )
                    print(
                        f'the same backlog to endpoints with ordering "key", {args.keys} '
                        f"keys: {ordered:,.0f} deliveries/s ({ordered / drain:.0%} of "
                        f"unordered); "
                        + cpu_line(
                            "ordered_drain",
                            ordered_cpu,
                            ordered_n,
                            bare_cpu_ms,
                            bare_u3_ms,
                        )
                    )
                    print(cost_lines("ordered_drain", ordered_cost))
                recorded = delivered + (ordered_n if args.keys else 0)
                if args.drain_only:
                    print(json.dumps(results))
                    return 0

                # 2. End to end: publishing (N threads) while the workers deliver, and the
                # sweeper (paused while the cost meter waits for the counters to settle).
                e2e_bare_ms, e2e_bare_u3 = bare_again()
                published: dict[str, float] = {}
                api = ApiPublishers(kurir.env, kurir.token) if args.through_api else None
                before = meter.snapshot()
                kurir.start_sweeper()
                polls = kurir.polls
                cpu_before = kurir.worker_cpu_s()
                api_cpu_before = api.cpu_s() if api else 0.0
                if api is not None:
                    first, publish_s = api.publish("bench", events_n, args.publishers, published)
                    results["api_cpu_ms_per_event"] = round(
                        (api.cpu_s() - api_cpu_before) * 1000 / max(1, len(published)), 3
                    )
                    results["api_publish_errors"] = api.errors
                    api.close()
                else:
                    first = time.time()
                    publish_s = kurir.publish_concurrently(
                        "bench", events_n, args.publishers, published
                    )
                if not receiver.wait_for(total, timeout_s=300):
                    print(f"only {receiver.count()} of {total} arrived", file=sys.stderr)
                kurir.wait_recorded(recorded + total)
                e2e_cpu = kurir.worker_cpu_s() - cpu_before
                kurir.stop_sweeper.set()
                e2e_cost = meter.cost(
                    before, meter.snapshot(), total, own_commits=kurir.polls - polls
                )
                kurir.start_sweeper()
                records = receiver.dump()
                last = max(at for _, _, at in records)
                rate = len({(m, p) for m, p, _ in records}) / (last - first)
                lat = latencies(published, records)
                dupes = len(records) - len({(m, p) for m, p, _ in records})
                results.update(
                    {
                        "deliveries": total,
                        "received": len(records),
                        "duplicates": dupes,
                        "publishers": args.publishers,
                        "publish_s": round(publish_s, 2),
                        "end_to_end_per_s": round(rate),
                        "share_of_ceiling": round(rate / ceiling, 3),
                        "p50_ms": round(percentile(lat, 50), 1),
                        "p99_ms": round(percentile(lat, 99), 1),
                    }
                )
                publishers = (
                    f"{args.publishers} processes publishing through `kurir api`"
                    f" (API CPU {results['api_cpu_ms_per_event']:.2f} ms per event, "
                    f"{len(published) / publish_s:,.0f} events/s)"
                    if args.through_api
                    else f"{args.publishers} publishing threads"
                )
                results["through_api"] = args.through_api
                print(
                    f"Kurir end to end: {total:,} deliveries over {args.endpoints} endpoints, "
                    f"{args.workers} workers, {publishers}: "
                    f"{rate:,.0f} deliveries/s ({rate / ceiling:.0%} of the bare ceiling); "
                    f"publishing took {publish_s:.2f}s; publish->receipt "
                    f"p50 {percentile(lat, 50):.0f} ms, p99 {percentile(lat, 99):.0f} ms; "
                    f"duplicates {dupes}; "
                    f"{cpu_line('end_to_end', e2e_cpu, len(records), e2e_bare_ms, e2e_bare_u3)}"
                )
                print(cost_lines("end_to_end", e2e_cost))

                # 3. Latency at a paced 100 events/s (open loop).
                published = {}
                paced_n = args.paced_seconds * 100
                start = time.monotonic()
                for i in range(paced_n):
                    delay = start + i / 100 - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    event_id, at = kurir.publish("paced", i)
                    published[event_id] = at
                receiver.wait_for(paced_n, timeout_s=60)
                lat = latencies(published, receiver.dump())
                results.update(
                    {
                        "paced_100_per_s_p50_ms": round(percentile(lat, 50), 1),
                        "paced_100_per_s_p99_ms": round(percentile(lat, 99), 1),
                    }
                )
                print(
                    f"paced 100 events/s for {args.paced_seconds}s: publish->receipt p50 "
                    f"{percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms, "
                    f"max {max(lat):.1f} ms"
                )

                # 4. One event to 1,000 endpoints.
                event_id, at = kurir.publish("fanout", 0)
                ok = receiver.wait_for(1000, timeout_s=30)
                records = receiver.dump()
                spread = max(r[2] for r in records) - at
                results.update({"fanout_1000_s": round(spread, 3), "fanout_complete": ok})
                print(
                    f"one event to 1,000 endpoints: all {len(records)} received "
                    f"{spread:.2f}s after publish"
                )
            finally:
                meter.close()
                kurir.stop()
    finally:
        receiver.close()
    print(json.dumps(results))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="worker processes (and the number of bare-loop processes)",
    )
    parser.add_argument("-n", type=int, default=10_000, help="deliveries in the throughput run")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument(
        "--keys",
        type=int,
        default=100,
        help="ordering keys of the ordered backlog (0: no ordered drain, e.g. "
        "to run this script against a tree without ordering)",
    )
    parser.add_argument(
        "--drain-only", action="store_true", help="stop after the unordered and ordered drains"
    )
    parser.add_argument("--paced-seconds", type=int, default=10)
    parser.add_argument(
        "--publishers",
        type=int,
        default=4,
        help="threads (processes with --through-api) publishing in the end-to-end run",
    )
    parser.add_argument(
        "--through-api",
        action="store_true",
        help="publish end to end over HTTP to `kurir api` from separate processes, not "
        "from threads of this one (e.g. with --endpoints 5)",
    )
    parser.add_argument(
        "--pg-commits-per-s",
        type=float,
        default=20_000,
        help="writing commits/s taken for one PostgreSQL in the ceiling (default: NVMe)",
    )
    parser.add_argument(
        "--pg-wal-mb-per-s",
        type=float,
        default=200,
        help="WAL MB/s taken for one PostgreSQL in the ceiling (default: NVMe)",
    )
    parser.add_argument(
        "--redis-commands-per-s",
        type=float,
        default=100_000,
        help="commands/s taken for one Redis (one core) in the ceiling",
    )
    parser.add_argument("--disk", default="NVMe", help="the disk the capacities above describe")
    parser.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
