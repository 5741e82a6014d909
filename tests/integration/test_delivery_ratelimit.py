"""Per-endpoint rate limit: honoured across workers (Redis), deliveries delayed not dropped."""

from __future__ import annotations

import re

import pytest

from app.models import SUCCEEDED
from sender.dispatch import enqueue_now
from sender.ratelimit import RateLimiter
from tests.support.factories import (
    WorkerProcess,
    make_endpoint,
    make_events,
    make_partner,
    wait_for,
)
from tests.support.fast_receiver import ReceiverProcess


def test_slots_are_spaced_and_shared_between_limiters(redis_client):
    first, second = RateLimiter(redis_client), RateLimiter(redis_client)
    now = 1_000_000.0
    grant = first.reserve("ep_a", 5.0, 3, now_ms=now)
    assert grant.granted == 3
    assert grant.offsets_s == pytest.approx((0.0, 0.2, 0.4))
    # Another worker asking at the same moment gets the slots after those, within 1 s.
    grant = second.reserve("ep_a", 5.0, 10, now_ms=now)
    assert grant.granted == 3
    assert grant.offsets_s == pytest.approx((0.6, 0.8, 1.0))
    assert grant.next_free_s == pytest.approx(1.2)
    # Nothing left within the horizon: nothing granted, and when the next slot frees.
    grant = first.reserve("ep_a", 5.0, 1, now_ms=now)
    assert grant.granted == 0 and grant.next_free_s == pytest.approx(1.2)
    # Later, the slots come back; other endpoints are independent.
    assert first.reserve("ep_a", 5.0, 1, now_ms=now + 1200).offsets_s == (0.0,)
    assert second.reserve("ep_b", 5.0, 5, now_ms=now).granted == 5


def test_rate_limit_holds_across_two_worker_processes(runtime, settings, tmp_path):
    """Two `kurir worker` processes share one endpoint's 10/s: the sends are spaced 1/rate
    apart whichever process makes them, none dropped, none doubled."""
    rate, events = 10, 30
    with ReceiverProcess() as receiver:
        with runtime.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(
                session,
                partner,
                receiver.url + "/limited",
                runtime.secret_box,
                rate_limit_per_s=rate,
            )
            ids = make_events(session, partner, [endpoint], events)
        workers = [WorkerProcess(settings, tmp_path / f"w{i}.log") for i in (1, 2)]
        with workers[0], workers[1]:
            for i in range(0, len(ids), 3):
                # Each job goes to the worker that has waited longest for one: with both
                # waiting before every job, the jobs are shared between the two processes.
                wait_for(
                    lambda: _blocked_clients(runtime) >= 4,
                    timeout_s=60,
                    message="both workers waiting for a job",
                )
                enqueue_now(runtime.redis, ids[i : i + 3])
            wait_for(
                lambda: receiver.count() >= events,
                timeout_s=60,
                interval_s=0.1,
                message="every rate-limited delivery",
            )
            wait_for(lambda: _all_succeeded(runtime, ids), timeout_s=30, message="recorded")
        records = receiver.dump()
    assert len({m for m, _, _ in records}) == events  # none dropped
    assert len(records) == events  # none sent twice
    sent = [_attempts_made(worker.log()) for worker in workers]
    assert sum(sent) == events and min(sent) > 0, sent  # both processes sent some
    # Slots are 1/rate apart and a send never goes before its slot, so the k-th send comes at
    # least k/rate after the first one's slot: the run takes (events - 1)/rate at least, and
    # no prefix of it is faster than the rate. Two limiters that did not share their slots
    # would send twice as fast, in two interleaved streams; no limiter, all at once. A stall
    # on a busy machine delays sends (bunching them after it) and never brings one forward:
    # only a late *first* send shortens a prefix, by its lateness (allowed: 1 s).
    times = sorted(at for _, _, at in records)
    assert times[-1] - times[0] >= (events - 1) / rate * 0.9
    early = [
        (k, round(at - times[0], 3)) for k, at in enumerate(times) if at - times[0] < k / rate - 1.0
    ]
    assert not early, early


def _blocked_clients(runtime) -> int:
    """Redis clients blocked in a pop: each idle worker has two (deliveries, other queues).
    Only those on this test's db: CLIENT LIST is server-wide, and other runs share it."""
    db = str(runtime.redis.connection_pool.connection_kwargs.get("db", 0))
    return sum(
        1 for client in runtime.redis.client_list() if "b" in client["flags"] and client["db"] == db
    )


def _attempts_made(log: str) -> int:
    """The attempts a worker recorded, from the counters it logs when it stops."""
    [counters] = re.findall(r"delivery engine stopped .*\battempts=(\d+)", log)
    return int(counters)


def _all_succeeded(runtime, ids):
    from sqlalchemy import func, select

    from app.models import Delivery

    with runtime.db.begin() as session:
        done = session.scalar(
            select(func.count())
            .select_from(Delivery)
            .where(Delivery.id.in_(ids), Delivery.state == SUCCEEDED)
        )
    return done == len(ids)
