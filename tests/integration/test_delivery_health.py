"""Endpoint health in the database: atomic counters, auto-disable, parking on disable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from app.models import (
    DEAD,
    PENDING,
    RETRYING,
    SUCCEEDED,
    DeadLetter,
    Delivery,
    Endpoint,
    OperationalEvent,
)
from sender import health
from tests.support.factories import make_endpoint, make_event_with_deliveries, make_partner

T0 = datetime(2026, 12, 2, 10, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _endpoint(runtime):
    with runtime.db.begin() as session:
        partner = make_partner(session)
        return make_endpoint(session, partner, "http://127.0.0.1:9/h", runtime.secret_box).id


def test_failures_accumulate_and_one_success_resets(runtime):
    endpoint_id = _endpoint(runtime)
    with runtime.db.begin() as session:
        h = health.record(session, endpoint_id, health.tally([(at(1), False), (at(2), False)]))
        assert (h.consecutive_failures, h.first_failure_at) == (2, at(1))
    with runtime.db.begin() as session:  # another worker's failures add up, not overwrite
        h = health.record(session, endpoint_id, health.tally([(at(3), False)]))
        assert (h.consecutive_failures, h.first_failure_at) == (3, at(1))
    with runtime.db.begin() as session:
        h = health.record(session, endpoint_id, health.tally([(at(4), True)]))
        assert (h.consecutive_failures, h.first_failure_at, h.last_success_at) == (0, None, at(4))
    with runtime.db.begin() as session:
        # A success reported late never moves "last success" backwards.
        health.record_successes(session, [(endpoint_id, at(2))])
        assert session.get(Endpoint, endpoint_id).last_success_at == at(4)
        health.record_successes(session, [(endpoint_id, at(9))])
        assert session.get(Endpoint, endpoint_id).last_success_at == at(9)


def test_thresholds_on_an_injected_clock_then_disable_parks_what_waits(runtime):
    endpoint_id = _endpoint(runtime)
    limits = health.Thresholds(failures=3, seconds=3600)
    with runtime.db.begin() as session:
        health.record(session, endpoint_id, health.tally([(at(0), True)]))
        h = health.record(
            session, endpoint_id, health.tally([(at(60 * i), False) for i in range(1, 4)])
        )
        assert not health.should_disable(h, limits, at(600))  # 3 failures, but 10 minutes
        assert health.should_disable(h, limits, at(3600))
        endpoint = session.get(Endpoint, endpoint_id)
        partner = endpoint.partner
        ids = {}
        for state in (PENDING, RETRYING, SUCCEEDED):
            _, [d] = make_event_with_deliveries(session, partner, [endpoint], state=state)
            ids[state] = d.id
    with runtime.db.begin() as session:
        assert health.disable(
            session, endpoint_id, "failing", at(3600), {"consecutive_failures": 3, "why": "x"}
        )
    with runtime.db.begin() as session:
        assert not health.disable(session, endpoint_id, "again", at(3601))
        endpoint = session.get(Endpoint, endpoint_id)
        assert (endpoint.state, endpoint.disabled_reason, endpoint.disabled_at) == (
            "disabled",
            "failing",
            at(3600),
        )
        states = {d.id: d.state for d in session.scalars(select(Delivery))}
        assert states[ids[PENDING]] == states[ids[RETRYING]] == DEAD
        assert states[ids[SUCCEEDED]] == SUCCEEDED
        letters = session.scalars(select(DeadLetter)).all()
        assert {dl.delivery_id for dl in letters} == {ids[PENDING], ids[RETRYING]}
        assert {dl.reason for dl in letters} == {"endpoint_disabled"}
        [event] = session.scalars(select(OperationalEvent)).all()
        assert event.kind == "endpoint.disabled" and event.subject_id == endpoint_id
        assert event.data["parked_deliveries"] == 2 and event.data["consecutive_failures"] == 3
        assert "why" not in event.data  # only what the event type's schema has room for
