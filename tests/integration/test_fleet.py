"""Kurir as a fleet: 2 `kurir api`, 3 `kurir worker` and 2 `kurir scheduler`, each in its own
process and data dir, on one PostgreSQL and one Redis.

2,000 events are published alternately to both APIs while one worker and the active scheduler
are SIGKILLed (and not started again): every event is delivered, none is lost, and the
duplicates (allowed: delivery is at least once) are printed. The deliveries the killed worker
held come back through the sweeper once their claim runs out; a claim lasts longer than the
time between the two kills, so by then the sweeper runs in the scheduler that stood by.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import func, select

from app import event_types
from app.accounts import create_api_key
from app.config import Settings
from app.models import Delivery
from app.ports import free_port
from app.processes import lease
from app.registry import endpoints as registry
from app.registry import partners as partner_registry
from app.runtime import Runtime
from tests.support.factories import wait_for
from tests.support.fast_receiver import ReceiverProcess
from tests.support.processes import stop_groups
from tests.support.scheduler_process import (
    SECRET_KEY,
    SchedulerProcess,
    Spawned,
    kurir_env,
    overlapping_runs,
)

pytestmark = pytest.mark.slow

EVENTS = 2000
PARTNERS = ("north", "south")  # one endpoint each: few endpoints, many events
PUBLISH_THREADS = 4
WORKER_KILL_AT, SCHEDULER_KILL_AT = 0.3, 0.5  # shares of the events published


def _setup(database_url: str, redis_url: str, receiver_url: str, data_dir: Path) -> str:
    """The contract, one endpoint per partner and an admin key; the key."""
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        redis_url=redis_url,
        secret_key=SECRET_KEY,
        allow_private_targets=True,
    )
    runtime = Runtime(settings)
    try:
        with runtime.db.begin() as session:
            event_types.register(
                session, {"name": "order.paid", "version": 1, "schema": {"type": "object"}}
            )
            for uid in PARTNERS:
                partner = partner_registry.create_partner(session, {"uid": uid, "name": uid})
                registry.create_endpoint(
                    session, partner, {"url": f"{receiver_url}/{uid}"}, settings, runtime.secret_box
                )
            _, token = create_api_key(session, "fleet", ["admin"])
    finally:
        runtime.close()
    return token


class Publisher:
    """Publishes event i to API i % 2 from a few threads, each event with its own
    Idempotency-Key, retried until an API answers 202 with its id."""

    def __init__(self, api_urls: list[str], token: str) -> None:
        self.api_urls = api_urls
        self.token = token
        self.published: dict[str, int] = {}  # event id -> i
        self.by_api: Counter[int] = Counter()
        self.retries = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(k,), daemon=True)
            for k in range(PUBLISH_THREADS)
        ]

    def progress(self) -> float:
        with self.lock:
            return len(self.published) / EVENTS

    def _run(self, k: int) -> None:
        sessions = [requests.Session() for _ in self.api_urls]
        headers = {"Authorization": f"Bearer {self.token}"}
        for i in range(k, EVENTS, PUBLISH_THREADS):
            api = i % len(self.api_urls)
            partner = PARTNERS[(i // len(self.api_urls)) % len(PARTNERS)]
            url = f"{self.api_urls[api]}/v1/partners/{partner}/events"
            body = {"type": "order.paid", "version": 1, "data": {"n": i}}
            deadline = time.monotonic() + 60
            while True:
                try:
                    answer = sessions[api].post(
                        url,
                        json=body,
                        headers={**headers, "Idempotency-Key": f"fleet-{i}"},
                        timeout=30,
                    )
                    status, text = answer.status_code, answer.text
                except requests.RequestException as exc:
                    status, text = -1, str(exc)
                if status == 202:
                    with self.lock:
                        self.published[answer.json()["id"]] = i
                        self.by_api[api] += 1
                    break
                if time.monotonic() > deadline or 400 <= status < 500:
                    with self.lock:
                        self.failures.append(f"event {i} at API {api}: {status} {text[:200]}")
                    break
                with self.lock:
                    self.retries += 1
                time.sleep(0.1)
        for session in sessions:
            session.close()


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_fleet_delivers_every_event_through_kills_of_a_worker_and_the_active_scheduler(
    migrated: Any, redis_client: Any, redis_url: str, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    receiver = ReceiverProcess()
    token = _setup(migrated.url, redis_url, receiver.url, tmp_path / "setup")

    def env(name: str) -> dict[str, str]:
        return kurir_env(
            migrated.url,
            redis_url,
            tmp_path / name,
            KURIR_ALLOW_PRIVATE_TARGETS="1",
            KURIR_SWEEP_INTERVAL_SECONDS="1",
            KURIR_DELIVERY_LEASE_SECONDS="5",
            KURIR_RETRY_SCHEDULE="1,1,2,2,3,3,5,5",
            KURIR_LOG_LEVEL="warning",
        )

    ports = [free_port(), free_port()]
    apis = [
        Spawned(
            f"api-{n}",
            ["api", "--port", str(port), "--workers", "1", "--threads", "4"],
            env(f"api-{n}"),
            logs,
        )
        for n, port in enumerate(ports)
    ]
    workers = [Spawned(f"worker-{n}", ["worker"], env(f"worker-{n}"), logs) for n in range(3)]
    schedulers = [SchedulerProcess(f"scheduler-{n}", env(f"scheduler-{n}"), logs) for n in (0, 1)]
    api_urls = [f"http://127.0.0.1:{port}" for port in ports]
    everything = [*(p.process for p in apis + workers), *(s.process for s in schedulers)]
    try:

        def fleet_up() -> bool:
            for process in everything:
                assert process.poll() is None, f"a process exited: {process.args!r}"
            for url in api_urls:
                try:
                    if requests.get(f"{url}/readyz", timeout=5).status_code != 200:
                        return False
                except requests.RequestException:
                    return False
            return lease.current(migrated.db) is not None and all(s.holder() for s in schedulers)

        wait_for(fleet_up, timeout_s=120, interval_s=0.3, message="the fleet to come up")

        publisher = Publisher(api_urls, token)
        began = time.monotonic()
        for thread in publisher.threads:
            thread.start()

        wait_for(lambda: publisher.progress() >= WORKER_KILL_AT, timeout_s=120, message="30 %")
        workers[0].kill()
        wait_for(lambda: publisher.progress() >= SCHEDULER_KILL_AT, timeout_s=120, message="50 %")
        row = lease.current(migrated.db)
        assert row is not None
        active = next(s for s in schedulers if s.holder() == row.holder)
        standby = next(s for s in schedulers if s is not active)
        killed_at = active.kill()

        for thread in publisher.threads:
            thread.join(300)
        published_s = time.monotonic() - began
        assert publisher.failures == []
        assert len(publisher.published) == EVENTS

        received: Counter[str] = Counter()

        def all_received() -> bool:
            received.update(webhook_id for webhook_id, _path, _at in receiver.dump())
            return set(publisher.published) <= set(received)

        wait_for(all_received, timeout_s=120, interval_s=0.5, message="every event delivered")
        drained_s = time.monotonic() - began
        lost = set(publisher.published) - set(received)
        unexpected = set(received) - set(publisher.published)
        duplicates = {event_id: n for event_id, n in received.items() if n > 1}
        takeover = [r.started - killed_at for r in standby.runs() if r.started > killed_at]
        print(
            f"\nfleet: {EVENTS} events published ({dict(publisher.by_api)} per API, "
            f"{publisher.retries} retries) in {published_s:.1f} s, all received after "
            f"{drained_s:.1f} s; lost {len(lost)}, unexpected {len(unexpected)}, "
            f"duplicates {len(duplicates)}: {duplicates}; standby's first job "
            f"{takeover[0] if takeover else float('nan'):.2f} s after the active scheduler's "
            f"SIGKILL"
        )
        assert lost == set()
        assert unexpected == set()

        # The store agrees: every delivery succeeded, under the scheduler that stood by.
        def settled() -> bool:
            with migrated.db.begin() as session:
                states = dict(
                    session.execute(
                        select(Delivery.state, func.count()).group_by(Delivery.state)
                    ).all()
                )
            return states == {"succeeded": EVENTS}

        wait_for(settled, timeout_s=60, interval_s=0.5, message="every delivery succeeded")
        row = lease.current(migrated.db)
        assert row is not None and row.holder == standby.holder()
        assert overlapping_runs(active.runs() + standby.runs()) == []
    finally:
        stop_groups(everything)
        receiver.close()
