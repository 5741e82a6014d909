"""Memory stays bounded: `kurir api` fed 256 KiB bodies, a worker draining a backlog.

CI-sized and count-based (no timing): 8 clients x 30 requests of 256 KiB against the real
`kurir api`, and a real `kurir worker` process draining 3,000 deliveries. Every process must
stay under 300 MB RSS, sampled as it works. bench/bounds.py runs the full-size versions
(60 s of 8 clients; a 100,000 backlog) and prints the figures.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import requests
from sqlalchemy import func, select

from app.models import SUCCEEDED, Delivery
from sender.dispatch import enqueue_now
from tests.support.api_process import Api, serve_api
from tests.support.factories import (
    Receiver,
    WorkerProcess,
    make_endpoint,
    make_events,
    make_partner,
)
from tests.support.factories import wait_for as wait_until

LIMIT = 300 * 1024 * 1024
BODY_BYTES = 256 * 1024
CLIENTS = 8
REQUESTS_PER_CLIENT = 30


class PeakRss:
    """The highest RSS each process of a tree reached while this sampler ran."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()

    def sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    rss = proc.memory_info().rss
                    self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), rss)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Api]:
    yield from serve_api(tmp_path_factory, redis_url)  # its defaults: 2 workers x 8 threads


def _bodies(api: Api) -> list[tuple[str, bytes, dict[str, str]]]:
    auth = {"Authorization": f"Bearer {api.admin}", "Content-Type": "application/json"}
    schema = {"type": "object", "properties": {"pad": {"type": "string", "maxLength": 10}}}
    made = requests.post(
        f"{api.url}/v1/event-types",
        headers=auth,
        timeout=30,
        json={"name": "bounds.big", "version": 1, "schema": schema},
    )
    assert made.status_code in (200, 201), made.text
    frame = json.dumps({"type": "bounds.big", "version": 1, "data": {"pad": ""}})
    big = json.dumps(
        {"type": "bounds.big", "version": 1, "data": {"pad": "p" * (BODY_BYTES - len(frame) - 64)}}
    ).encode()
    stored = json.dumps(
        {"type": "bounds.big", "version": 1, "data": {"note": "n" * (BODY_BYTES - len(frame) - 64)}}
    ).encode()
    return [
        ("/v1/partners/acme/events", big, auth),  # parsed whole, then 422
        ("/v1/partners/acme/events", b"x" * (BODY_BYTES + 1), auth),  # 413 unread
        ("/inbound/shop", b"y" * BODY_BYTES, {"X-Hub-Signature-256": "sha256=" + "0" * 64}),
        ("/v1/partners/acme/events", stored, auth),
    ]  # 202, stored


def test_api_processes_stay_under_300_mb_with_8_clients_sending_256_kib(api: Api) -> None:
    bodies = _bodies(api)
    statuses: list[int] = []
    lock = threading.Lock()

    def client(offset: int) -> None:
        with requests.Session() as session:
            for i in range(REQUESTS_PER_CLIENT):
                path, body, headers = bodies[(offset + i) % len(bodies)]
                status = session.post(
                    f"{api.url}{path}", data=body, headers=headers, timeout=120
                ).status_code
                with lock:
                    statuses.append(status)

    with PeakRss(api.pid) as rss:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(set(statuses)) == [202, 401, 413, 422]
    assert len(statuses) == CLIENTS * REQUESTS_PER_CLIENT
    assert len(rss.peak) >= 3  # the master and its two workers were all sampled
    over = {pid: peak >> 20 for pid, peak in rss.peak.items() if peak >= LIMIT}
    assert over == {}, f"MiB: {over}"


def test_a_worker_draining_a_backlog_stays_under_300_mb(
    runtime: Any, settings: Any, tmp_path: Any
) -> None:
    with Receiver() as receiver:
        with runtime.db.begin() as session:
            partner = make_partner(session)
            endpoints = [
                make_endpoint(session, partner, f"{receiver.url}/b{i}", runtime.secret_box)
                for i in range(10)
            ]
            ids = make_events(session, partner, endpoints, 300)
        with WorkerProcess(settings, tmp_path / "worker.log") as worker:
            assert worker.process is not None
            with PeakRss(worker.process.pid) as rss:
                for start in range(0, len(ids), 100):
                    enqueue_now(runtime.redis, ids[start : start + 100])

                def delivered() -> bool:
                    with runtime.db.begin() as session:
                        return session.scalar(
                            select(func.count())
                            .select_from(Delivery)
                            .where(Delivery.state == SUCCEEDED)
                        ) == len(ids)

                wait_until(
                    delivered,
                    timeout_s=180,
                    interval_s=0.2,
                    message=f"the backlog of {len(ids)}\n{worker.log()[-2000:]}",
                )
        assert len(receiver.event_ids()) == len(ids)  # each once
    peak = rss.peak[worker.process.pid]
    assert peak < LIMIT, f"worker peaked at {peak >> 20} MiB"
