"""Per-endpoint rate limit: honoured across workers (Redis), deliveries delayed not dropped."""

from __future__ import annotations

import pytest

from app.models import SUCCEEDED
from bench.deliver import ReceiverProcess
from sender.dispatch import enqueue_now
from sender.ratelimit import RateLimiter
from tests.factories import (
    SweeperThread,
    WorkerProcess,
    make_endpoint,
    make_events,
    make_partner,
    wait_for,
)


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
    rate, events = 10, 30
    with ReceiverProcess() as receiver:
        with runtime.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/limited",
                                     runtime.secret_box, rate_limit_per_s=rate)
            ids = make_events(session, partner, [endpoint], events)
        for i in range(0, len(ids), 3):
            enqueue_now(runtime.redis, ids[i:i + 3])
        with (WorkerProcess(settings, tmp_path / "w1.log"),
              WorkerProcess(settings, tmp_path / "w2.log"), SweeperThread(runtime)):
            wait_for(lambda: receiver.count() >= events, timeout_s=40, interval_s=0.1,
                     message="every rate-limited delivery")
            wait_for(lambda: _all_succeeded(runtime, ids), timeout_s=10, message="recorded")
        records = receiver.dump()
    times = sorted(at for _, _, at in records)
    assert len({m for m, _, _ in records}) == events  # none dropped
    assert len(records) == events  # none sent twice
    # No one-second window holds more than rate + 1 sends (slots are 1/rate apart).
    worst = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert worst <= rate + 1, worst
    assert times[-1] - times[0] >= (events - 1) / rate * 0.9


def _all_succeeded(runtime, ids):
    from sqlalchemy import func, select

    from app.models import Delivery

    with runtime.db.begin() as session:
        done = session.scalar(select(func.count()).select_from(Delivery).where(
            Delivery.id.in_(ids), Delivery.state == SUCCEEDED))
    return done == len(ids)
