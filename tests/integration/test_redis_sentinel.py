"""Redis Sentinel: a forced failover in the middle of publishing and delivering loses nothing.

A real master, its replica and three sentinels run on 127.0.0.1; Kurir is given only the
sentinels (`REDIS_URL=redis+sentinel://…/kurir/0`). Events are published through the API in a
loop while a real `kurir worker` and `kurir scheduler` deliver them, and `SENTINEL FAILOVER`
promotes the replica. Every publish must answer 202 (the event is committed before its job is
put on Redis; a job that could not be, or that went to the old master and never reached the
new one, is enqueued again by the sweep), every event must arrive, and the worker must carry
on against the new master by itself. The test prints how long the failover affected
publishing and delivery.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app import event_types, redis_client
from app import runtime as runtime_mod
from app.accounts import create_api_key
from app.runtime import Runtime
from app.web import create_app
from app.web.auth import clear_cache
from tests.support.factories import Receiver, WorkerProcess, make_endpoint, make_partner, wait_for
from tests.support.sentinel import SentinelGroup

pytestmark = pytest.mark.slow


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    servers = SentinelGroup(tmp_path / "redis")
    try:
        yield servers.start()
    finally:
        servers.stop()


@pytest.fixture
def rt(settings: Any, migrated: Any, group: SentinelGroup) -> Iterator[Runtime]:
    runtime = Runtime(settings.with_overrides(redis_url=group.url), database=migrated.db)
    runtime_mod.install(runtime)
    yield runtime
    runtime.close()
    runtime_mod.install(None)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Published:
    started: float  # time.time(), comparable with Received.at
    seconds: float
    status: int
    event_id: str | None
    body: Any


class Publisher:
    """Publishes events through the API, one after another, until stopped."""

    def __init__(self, app: Any, token: str) -> None:
        self.client = app.test_client()
        self.headers = {"Authorization": f"Bearer {token}"}
        self.results: list[Published] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            started = time.time()
            response = self.client.post(
                "/v1/partners/acme/events",
                headers=self.headers,
                json={"type": "order.paid", "version": 1, "data": {"n": n}},
            )
            body = response.get_json()
            event_id = body.get("id") if response.status_code == 202 else None
            self.results.append(
                Published(started, time.time() - started, response.status_code, event_id, body)
            )
            n += 1
            self.stop.wait(0.01)  # pacing, so the worker keeps up on a small machine

    def after(self, moment: float) -> list[Published]:
        return [p for p in list(self.results) if p.started >= moment]

    def __enter__(self) -> Publisher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def test_a_forced_failover_mid_run_loses_nothing(
    rt: Runtime, group: SentinelGroup, tmp_path: Path, backend: str
) -> None:
    with Receiver() as receiver:
        with rt.db.begin() as session:
            event_types.register(
                session, {"name": "order.paid", "version": 1, "schema": {"type": "object"}}
            )
            partner = make_partner(session, "acme")
            # A rate limit, so the limiter's Redis calls go through the failover too.
            make_endpoint(
                session, partner, receiver.url + "/h", rt.secret_box, rate_limit_per_s=500
            )
            _, token = create_api_key(session, "svc", ["events:write"])
        clear_cache()
        app = create_app(runtime=rt)

        def arrived(published: list[Published]) -> bool:
            seen = set(receiver.event_ids())
            return all(p.event_id in seen for p in published)

        worker = WorkerProcess(rt.settings, tmp_path / "worker.log")
        scheduler = WorkerProcess(
            rt.settings, tmp_path / "scheduler.log", "scheduler", KURIR_SWEEP_INTERVAL_SECONDS="1"
        )
        with worker, scheduler, Publisher(app, token) as publisher:
            wait_for(lambda: len(receiver.requests) >= 30, 90, message="deliveries to flow")
            assert worker.process is not None
            worker_pid = worker.process.pid
            failover_at = time.time()
            group.failover()
            wait_for(
                lambda: group.master_seen_by_all() == group.replica_port,
                60,
                0.05,
                message="every sentinel to name the replica as the master",
            )
            switched_at = time.time()
            wait_for(
                lambda: group.role(group.master_port) == "slave",
                90,
                0.05,
                message="the old master to be demoted",
            )
            demoted_at = time.time()
            wait_for(
                lambda: group.replication_up(group.master_port),
                90,
                0.05,
                message="the old master to follow the new one",
            )
            synced_at = time.time()
            # The worker goes on against the new master by itself: what is published from
            # now on is delivered.
            wait_for(
                lambda: (
                    len(publisher.after(demoted_at)) >= 30 and arrived(publisher.after(demoted_at))
                ),
                120,
                message="events published after the failover to arrive",
            )
            publisher.stop.set()
            publisher.thread.join(60)
            published = list(publisher.results)
            wait_for(lambda: arrived(published), 120, message="every published event to arrive")
            # The same worker process did it all: nothing restarted it.
            assert worker.process.poll() is None, worker.log()[-3000:]
            assert worker.process.pid == worker_pid

    refused = [(p.status, p.body) for p in published if p.status != 202]
    assert not refused, refused[:5]
    counts = Counter(receiver.event_ids())
    assert {p.event_id for p in published} <= set(counts)

    # The figures: how long the failover affected publishing and delivery.
    first_at: dict[str, float] = {}
    for received in receiver.requests:
        event_id = received.headers["webhook-id"]
        first_at[event_id] = min(first_at.get(event_id, received.at), received.at)
    waits = [first_at[str(p.event_id)] - (p.started + p.seconds) for p in published]
    receipts = sorted(first_at.values())
    gaps = [b - a for a, b in zip(receipts, receipts[1:], strict=False) if b >= failover_at]
    print(  # noqa: T201 - the figures this test exists to measure
        f"\nsentinel failover on {backend}: the sentinels named the new master "
        f"{switched_at - failover_at:.1f}s after SENTINEL FAILOVER, the old master was demoted "
        f"after {demoted_at - failover_at:.1f}s and in sync after {synced_at - failover_at:.1f}s; "
        f"{len(published)} published, all 202, publish time median "
        f"{median(p.seconds for p in published) * 1000:.0f}ms, max "
        f"{max(p.seconds for p in published) * 1000:.0f}ms; publish-to-delivery median "
        f"{median(waits) * 1000:.0f}ms, max {max(waits):.2f}s; longest pause in deliveries "
        f"after the failover began {max(gaps, default=0):.2f}s; "
        f"{sum(1 for c in counts.values() if c > 1)} events delivered twice"
    )


def test_a_blocked_read_on_the_demoted_master_is_retried_on_the_new_one(
    group: SentinelGroup,
) -> None:
    """The worker's consumers wait in BLPOP. When the old master is demoted it unblocks them
    with an error; the client's one retry must ask the sentinels again and wait on the new
    master, not reconnect to the old address (a replica now, which refuses BLPOP)."""
    client = redis_client.connect(
        group.url, socket_timeout=90, socket_connect_timeout=5, retry=Retry(NoBackoff(), 1)
    )
    outcome: list[object] = []

    def wait_for_job() -> None:
        try:
            outcome.append(client.blpop(["jobs"], timeout=60))
        except redis.RedisError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=wait_for_job, daemon=True)
    old_master = group.client(group.master_port)
    new_master = group.client(group.replica_port)
    try:
        reader.start()
        wait_for(
            lambda: old_master.info("clients")["blocked_clients"] == 1,
            message="the reader to wait on the master",
        )
        group.failover()
        wait_for(lambda: group.role(group.master_port) == "slave", 90, message="the demotion")
        wait_for(
            lambda: outcome or new_master.info("clients")["blocked_clients"] == 1,
            30,
            message="the reader to wait again",
        )
        new_master.rpush("jobs", "job-1")
        reader.join(30)
        assert outcome == [(b"jobs", b"job-1")]
    finally:
        for connection in (client, old_master, new_master):
            connection.close()
