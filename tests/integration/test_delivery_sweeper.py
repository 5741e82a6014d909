"""The sweeper and the job guard on an injected clock: what is re-enqueued, when, and why."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.clock import utcnow
from app.models import DEAD, DELIVERING, PENDING, RETRYING, SUCCEEDED, Attempt, Delivery
from sender import sweeper
from sender.dispatch import enqueue_now
from sender.jobs import Engine
from tests.support.factories import (
    Receiver,
    SweeperThread,
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)

QUEUE = "rq:queue:kurir-deliveries"


def _one(runtime, **fields):
    with runtime.db.begin() as session:
        partner = make_partner(session)
        endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/h", runtime.secret_box)
        _, [delivery] = make_event_with_deliveries(session, partner, [endpoint])
        row = session.get(Delivery, delivery.id)
        for name, value in fields.items():
            setattr(row, name, value)
        return delivery.id


def _enqueued(runtime):
    """Delivery ids in the queued jobs (and empty the queue)."""
    from rq.job import Job

    ids = []
    for job_id in runtime.redis.lrange(QUEUE, 0, -1):
        ids += Job.fetch(job_id.decode(), connection=runtime.redis).args[0]
    runtime.redis.delete(QUEUE)
    return ids


def _mark_redis_whole(runtime):
    runtime.redis.set(sweeper.MARKER_KEY, "1")


def test_fresh_publish_is_left_to_its_own_job_then_picked_up_after_the_grace(runtime):
    now = utcnow()
    delivery_id = _one(runtime, updated_at=now)
    _mark_redis_whole(runtime)
    assert sweeper.sweep(runtime, clock=lambda: now).enqueued == 0
    later = now + timedelta(seconds=sweeper.FRESH_GRACE_S + 1)
    result = sweeper.sweep(runtime, clock=lambda: later)
    assert result.enqueued == 1 and _enqueued(runtime) == [delivery_id]
    # Reserved: the next passes leave it alone while its job waits in the queue ...
    assert sweeper.sweep(runtime, clock=lambda: later + timedelta(seconds=5)).enqueued == 0
    # ... until the reservation passes (the job was lost after all).
    again = later + timedelta(seconds=sweeper.REQUEUE_AFTER_S + 10)
    assert sweeper.sweep(runtime, clock=lambda: again).enqueued == 1


def test_a_redis_that_lost_its_data_gets_every_due_delivery_at_once(runtime):
    now = utcnow()
    fresh = _one(runtime, updated_at=now)
    held = _one(runtime, lease_expires_at=now + timedelta(seconds=60))
    future = _one(runtime, next_attempt_at=now + timedelta(hours=1))
    done = _one(runtime, state=SUCCEEDED)
    result = sweeper.sweep(runtime, clock=lambda: now)  # no marker: Redis was flushed
    assert result.redis_lost
    assert sorted(_enqueued(runtime)) == sorted([fresh, held])
    assert future and done
    assert not sweeper.sweep(runtime, clock=lambda: now).redis_lost  # marker set again


def test_a_retry_due_soon_is_enqueued_ahead_and_one_far_off_is_not(runtime):
    now = utcnow()
    _mark_redis_whole(runtime)
    soon = _one(runtime, state=RETRYING, next_attempt_at=now + timedelta(seconds=1))
    _one(runtime, state=RETRYING, next_attempt_at=now + timedelta(minutes=10))
    assert sweeper.sweep(runtime, clock=lambda: now).enqueued == 1
    assert _enqueued(runtime) == [soon]


def test_an_expired_lease_records_a_lost_attempt_and_makes_the_delivery_due(runtime):
    now = utcnow()
    _mark_redis_whole(runtime)
    delivery_id = _one(
        runtime,
        state=DELIVERING,
        attempt_count=2,
        run_attempts=2,
        lease_expires_at=now - timedelta(seconds=1),
    )
    alive = _one(runtime, state=DELIVERING, lease_expires_at=now + timedelta(seconds=30))
    result = sweeper.sweep(runtime, clock=lambda: now)
    assert result.recovered == 1
    assert _enqueued(runtime) == [delivery_id]
    with runtime.db.begin() as session:
        row = session.get(Delivery, delivery_id)
        assert (row.state, row.attempt_count, row.run_attempts, row.last_error) == (
            RETRYING,
            3,
            3,
            "worker_lost",
        )
        assert row.next_attempt_at <= now
        [attempt] = session.scalars(select(Attempt)).all()
        assert (attempt.delivery_id, attempt.n, attempt.error) == (delivery_id, 3, "worker_lost")
        assert session.get(Delivery, alive).state == DELIVERING


def test_a_lost_last_attempt_parks_the_delivery(runtime):
    now = utcnow()
    max_attempts = len(runtime.settings.retry_schedule) + 1
    delivery_id = _one(
        runtime,
        state=DELIVERING,
        attempt_count=max_attempts - 1,
        run_attempts=max_attempts - 1,
        lease_expires_at=now - timedelta(seconds=1),
    )
    sweeper.sweep(runtime, clock=lambda: now)
    with runtime.db.begin() as session:
        row = session.get(Delivery, delivery_id)
        assert row.state == DEAD and row.attempt_count == max_attempts
        assert row.last_error == "worker_lost"


def test_the_guard_skips_final_in_flight_and_far_future_deliveries(runtime):
    now = utcnow()
    ids = [
        _one(runtime, state=SUCCEEDED),
        _one(runtime, state=DEAD),
        _one(runtime, state=DELIVERING, lease_expires_at=now + timedelta(seconds=30)),
        _one(runtime, state=PENDING, next_attempt_at=now + timedelta(hours=1)),
        "dlv_does_not_exist",
    ]
    engine = Engine(runtime).start()
    try:
        assert engine.submit(ids) == 0
        assert engine.wait_idle(30)
        assert engine.stats()["timers"] == 0
    finally:
        engine.stop()
    with runtime.db.begin() as session:
        assert session.scalars(select(Attempt)).all() == []


def test_a_retry_no_worker_holds_is_found_by_the_sweeper_and_sent_when_due(runtime, settings):
    """A retry no worker holds a timer for (none was enqueued): the sweeper, at its normal
    interval (KURIR_SWEEP_INTERVAL_SECONDS=2), finds it and it is sent once, never early."""
    with Receiver() as receiver:
        due = utcnow() + timedelta(seconds=3)
        with runtime.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", runtime.secret_box)
            make_event_with_deliveries(
                session, partner, [endpoint], state=RETRYING, next_attempt_at=due
            )
        _mark_redis_whole(runtime)
        with (
            WorkerThread(runtime),
            SweeperThread(runtime, interval_s=settings.sweep_interval_seconds),
        ):
            wait_for(lambda: receiver.requests, timeout_s=30, message="the retry")
        [received] = receiver.requests
    assert received.at >= due.timestamp()


def test_a_job_that_comes_early_is_held_on_a_local_timer_and_sent_when_due(runtime):
    """The job arrives before its delivery is due (the sweeper enqueues ahead): the worker
    keeps it on its own timer and sends it when due, never before. No sweeper runs, so
    nothing else could send it."""
    with Receiver() as receiver:
        with WorkerThread(runtime):
            due = utcnow() + timedelta(seconds=3)  # within the claim's look-ahead
            with runtime.db.begin() as session:
                partner = make_partner(session)
                endpoint = make_endpoint(session, partner, receiver.url + "/h", runtime.secret_box)
                _, [delivery] = make_event_with_deliveries(
                    session, partner, [endpoint], state=RETRYING, next_attempt_at=due
                )
            enqueue_now(runtime.redis, [delivery.id])
            wait_for(lambda: receiver.requests, timeout_s=30, message="the held delivery")
        [received] = receiver.requests
    assert received.at >= due.timestamp()
