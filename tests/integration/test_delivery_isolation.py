"""No head-of-line blocking: a hanging endpoint never delays the healthy ones."""

from __future__ import annotations

from sqlalchemy import func, select

from app.models import SUCCEEDED, Attempt, Delivery
from sender.dispatch import enqueue_now
from tests.support.factories import (
    SweeperThread,
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)
from tests.support.fast_receiver import ReceiverProcess

EVENTS = 200
HEALTHY = 5


def test_hanging_endpoint_does_not_delay_healthy_ones(runtime):
    """1 hanging + 5 healthy endpoints, 200 events to each, every job mixing them: the healthy
    1,000 all arrive while the hanging endpoint has had only a few of its 200 (1 s) attempts.

    Head-of-line blocking would make a healthy delivery wait for the hanging one queued before
    it, so the hanging endpoint's 200 attempts would all have started before the last healthy
    delivery arrived. The proof is in that order of events at the receiver, not in the clock.
    """
    rt = runtime
    # The receiver runs in its own process (asyncio): it never answers /hang.
    with ReceiverProcess() as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            hanging = make_endpoint(
                session, partner, receiver.url + "/hang", rt.secret_box, timeout_s=1
            )
            healthy = [
                make_endpoint(session, partner, f"{receiver.url}/ok{i}", rt.secret_box, timeout_s=1)
                for i in range(HEALTHY)
            ]
            jobs = []
            # Every event goes to all six endpoints, the hanging one first, so every job mixes
            # hanging and healthy deliveries, as a publish does.
            for i in range(EVENTS):
                _, deliveries = make_event_with_deliveries(
                    session, partner, [hanging, *healthy], data={"n": i}
                )
                jobs.append([d.id for d in deliveries])
        for ids in jobs:
            enqueue_now(rt.redis, ids)
        records: list[tuple[str, str, float]] = []

        def healthy_arrived() -> bool:
            records.extend(receiver.dump())  # /_dump hands over what arrived since last time
            return sum(1 for _, path, _ in records if path != "/hang") >= EVENTS * HEALTHY

        with WorkerThread(rt), SweeperThread(rt):
            wait_for(
                healthy_arrived, timeout_s=120, interval_s=0.1, message="the healthy deliveries"
            )
            with rt.db.begin() as session:
                hanging_delivered = session.scalar(
                    select(func.count())
                    .select_from(Delivery)
                    .where(Delivery.endpoint_id == hanging.id, Delivery.state == SUCCEEDED)
                )
                hanging_attempts = session.scalar(
                    select(func.count())
                    .select_from(Attempt)
                    .join(Delivery)
                    .where(Delivery.endpoint_id == hanging.id)
                )
            # Stop the receiver first: the hanging requests then end at once, not at timeout.
            receiver.close()
    for i in range(HEALTHY):
        assert len({m for m, path, _ in records if path == f"/ok{i}"}) == EVENTS
    last_healthy = max(at for _, path, at in records if path != "/hang")
    hanging_before = sum(1 for _, path, at in records if path == "/hang" and at <= last_healthy)
    assert 0 < hanging_before < EVENTS / 2, hanging_before
    assert hanging_delivered == 0  # still hanging: none got through
    assert hanging_attempts < EVENTS / 2  # each one a 1 s timeout, recorded as failed
