"""Hostile endpoints cost one bounded, failed attempt and never stall the healthy ones.

Every endpoint of tests/support/hostile.py is delivered to through the real engine (`run_worker`
in a thread, real Redis, both databases) with a 2-second endpoint timeout. Each attempt must end
as a failed attempt with an error class that says what happened, keep at most 4 KiB of what
was answered, and last no longer than the timeout plus a second: the deadline is our own
watchdog's, so this bounds the code, not the machine. Healthy deliveries sent in the same
jobs all arrive. Rates, the p99 of the healthy ones and RSS over 100 attempts per kind are
measured by bench/hostile.py.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from sqlalchemy import select

from app import runtime as runtime_mod
from app.models import RETRYING, SUCCEEDED, Attempt, Delivery, Endpoint
from app.net.guard import GuardPolicy
from app.net.http import MAX_BODY_BYTES, Transport
from app.runtime import Runtime
from sender.dispatch import enqueue_now
from tests.support.factories import (
    Receiver,
    WorkerThread,
    make_endpoint,
    make_events,
    make_partner,
    wait_for,
)
from tests.support.hostile import HostileServer

TIMEOUT_S = 2
# What each hostile endpoint's attempt must record: (response status, error class).
EXPECTED: dict[str, tuple[int | None, str | None]] = {
    "/trickle": (None, "timeout"),  # one byte a second: the total deadline cuts it
    "/huge": (500, None),  # 1 GiB body: 4 KiB kept, the rest never read
    "/gzip-bomb": (500, None),  # kept as sent, never inflated
    "/many-headers": (None, "protocol_error"),
    "/huge-header": (None, "protocol_error"),
    "/silent": (None, "timeout"),
    "/garbage": (None, "protocol_error"),
    "/redirect-loop": (302, None),  # not followed: a 3xx is a failed attempt
    "/close-mid": (200, "connection_error"),  # a 2xx cut short is not a delivery
}
# A 2xx is a delivery whatever follows it: the body is cut at 4 KiB and the rest unread.
DELIVERED_ANYWAY = ("/huge?status=200", "/gzip-bomb?status=200")
HEALTHY_ENDPOINTS = 3
HEALTHY_EVENTS = 40


@pytest.fixture
def rt(settings: Any, migrated: Any, redis_client: Any) -> Iterator[Runtime]:
    # One attempt per delivery within the test: the first retry is an hour away.
    runtime = Runtime(settings.with_overrides(retry_schedule=(3600,)), database=migrated.db)
    runtime_mod.install(runtime)
    yield runtime
    runtime.close()


def _path(url: str) -> str:
    """The path (and query) of an endpoint URL: which hostile behaviour it points at."""
    return "/" + url.split("/", 3)[3]


def _attempts_by_path(rt: Runtime) -> dict[str, list[Attempt]]:
    with rt.db.begin() as session:
        rows = session.execute(
            select(Attempt, Endpoint.url)
            .join(Delivery, Delivery.id == Attempt.delivery_id)
            .join(Endpoint, Endpoint.id == Delivery.endpoint_id)
        ).all()
    out: dict[str, list[Attempt]] = {}
    for attempt, url in rows:
        out.setdefault(_path(url), []).append(attempt)
    return out


def test_each_hostile_endpoint_costs_one_bounded_failed_attempt(rt: Runtime) -> None:
    with HostileServer() as hostile, Receiver() as healthy_receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            hostile_eps = [
                make_endpoint(
                    session, partner, hostile.url + path, rt.secret_box, timeout_s=TIMEOUT_S
                )
                for path in [*EXPECTED, *DELIVERED_ANYWAY]
            ]
            healthy_eps = [
                make_endpoint(
                    session,
                    partner,
                    f"{healthy_receiver.url}/ok{i}",
                    rt.secret_box,
                    timeout_s=TIMEOUT_S,
                )
                for i in range(HEALTHY_ENDPOINTS)
            ]
            # The first event goes everywhere, as one publish would fan it out: hostile and
            # healthy deliveries share its job. The rest go to the healthy endpoints only.
            mixed = make_events(session, partner, [*hostile_eps, *healthy_eps], 1)
            healthy = make_events(session, partner, healthy_eps, HEALTHY_EVENTS - 1)
        enqueue_now(rt.redis, mixed)
        for start in range(0, len(healthy), 30):
            enqueue_now(rt.redis, healthy[start : start + 30])
        with WorkerThread(rt):
            wait_for(
                lambda: len(healthy_receiver.requests) >= HEALTHY_ENDPOINTS * HEALTHY_EVENTS,
                timeout_s=60,
                message="every healthy delivery",
            )
            wait_for(
                lambda: len(_attempts_by_path(rt)) == len(hostile_eps) + HEALTHY_ENDPOINTS,
                timeout_s=60,
                message="one attempt at every hostile endpoint",
            )
            hostile.stop()
    by_path = _attempts_by_path(rt)
    problems = []
    for path, (status, error) in EXPECTED.items():
        [attempt] = by_path[path]
        got = (attempt.response_status, attempt.error)
        if got != (status, error):
            problems.append(f"{path}: recorded {got}, expected {(status, error)}")
        if attempt.duration_ms > (TIMEOUT_S + 1) * 1000:
            problems.append(f"{path}: took {attempt.duration_ms} ms")
        if len(attempt.response_body or b"") > MAX_BODY_BYTES:
            problems.append(f"{path}: kept {len(attempt.response_body or b'')} bytes")
    for path in DELIVERED_ANYWAY:
        [attempt] = by_path[path]
        if (attempt.response_status, attempt.error) != (200, None):
            problems.append(f"{path}: recorded {(attempt.response_status, attempt.error)}")
        if len(attempt.response_body or b"") != MAX_BODY_BYTES:
            problems.append(f"{path}: kept {len(attempt.response_body or b'')} bytes")
    assert problems == []
    with rt.db.begin() as session:
        states = {
            _path(url): state
            for url, state in session.execute(
                select(Endpoint.url, Delivery.state).join(
                    Endpoint, Endpoint.id == Delivery.endpoint_id
                )
            )
        }
    assert {states[p] for p in EXPECTED} == {RETRYING}
    assert {states[p] for p in DELIVERED_ANYWAY} == {SUCCEEDED}
    assert len(healthy_receiver.event_ids()) == HEALTHY_ENDPOINTS * HEALTHY_EVENTS


@pytest.mark.parametrize(
    "path", ["/huge", "/gzip-bomb", "/huge-header", "/many-headers", "/garbage", "/close-mid"]
)
def test_memory_stays_flat_over_repeated_hostile_answers(path: str) -> None:
    """60 answers of the memory-heavy kinds leave the sender's RSS within 50 MB.

    The transport is what reads an answer; it is driven directly here, without the engine or
    a database, so the figure is not diluted by anything else the test process holds.
    """
    process = psutil.Process()
    policy = GuardPolicy(allow_private=True)
    with HostileServer() as hostile, Transport() as transport:
        transport.post(hostile.url + path, b"{}", {}, TIMEOUT_S, policy)  # warm pools, caches
        gc.collect()
        before = process.memory_info().rss
        peak = before
        for _ in range(60):
            result = transport.post(hostile.url + path, b"{}", {}, TIMEOUT_S, policy)
            assert not result.ok and len(result.body) <= MAX_BODY_BYTES
            with contextlib.suppress(psutil.Error):
                peak = max(peak, process.memory_info().rss)
    assert peak - before < 50 * 1024 * 1024, f"RSS grew {(peak - before) >> 20} MiB"
