"""Self-healing endpoints: probes of failure-disabled endpoints, recovery and ordered replay,
against a real receiver on 127.0.0.1, on both databases, with an injected clock."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import func, select
from standardwebhooks.webhooks import Webhook

from app.clock import isoformat, utcnow
from app.models import (
    Attempt,
    AuditRecord,
    DeadLetter,
    Delivery,
    Endpoint,
    EndpointProbe,
    Event,
    OperationalEvent,
    ResendJob,
)
from app.recovery import due, jobs
from app.recovery.probe import PROBE_EVENT, send_probe
from app.registry.endpoints import disable_endpoint
from app.vocabulary import DeadLetterReason
from dlq import resend
from sender import health
from sender.dispatch import enqueue_now
from sender.park import park
from tests.support.factories import (
    Receiver,
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)

DISABLED = DeadLetterReason.ENDPOINT_DISABLED


class Switch:
    """A receiver's answer: 500 until `fixed`, then 200; records what it was sent."""

    def __init__(self) -> None:
        self.fixed = threading.Event()

    def __call__(self, received, count):
        return (200, {}, b"ok") if self.fixed.is_set() else (500, {}, b"down")


def _types(receiver: Receiver, path: str) -> list[str]:
    return [r.json["type"] for r in receiver.on(path)]


def _disabled_endpoint(rt, url: str, **fields):
    """An endpoint Kurir disabled after failures, as the delivery engine does it."""
    with rt.db.begin() as session:
        partner = make_partner(session)
        endpoint = make_endpoint(session, partner, url, rt.secret_box, **fields)
        endpoint_id, secret = endpoint.id, endpoint.test_secret
    now = utcnow()
    with rt.db.begin() as session:
        assert health.disable(session, endpoint_id, "failing", now, probe=True)
    return endpoint_id, secret, now


def _endpoint(rt, endpoint_id: str) -> Endpoint:
    with rt.db.begin() as session:
        endpoint = session.get_one(Endpoint, endpoint_id)
        session.expunge(endpoint)
        return endpoint


def test_only_endpoints_disabled_for_failures_are_probed(make_rt):
    rt = make_rt()
    now = utcnow()
    with rt.db.begin() as session:
        partner = make_partner(session)
        ids = {
            name: make_endpoint(session, partner, "http://127.0.0.1:9/h", rt.secret_box).id
            for name in ("failing", "gone", "operator", "partner", "enabled")
        }
    with rt.db.begin() as session:
        health.disable(session, ids["failing"], "failing", now, probe=True)
        health.disable(session, ids["gone"], "gone: the endpoint answered 410", now)
        health.disable(session, ids["partner"], "failing", now, probe=True)
        disable_endpoint(session, session.get_one(Endpoint, ids["operator"]), "maintenance", now)
        # The partner disables it itself: no longer Kurir's to probe.
        disable_endpoint(session, session.get_one(Endpoint, ids["partner"]), by="partner")
    with rt.db.begin() as session:
        assert due.due(session, now + timedelta(minutes=4), 100) == []
        assert due.due(session, now + timedelta(minutes=5), 100) == [ids["failing"]]
        # A claimed endpoint is not due again while its probe job runs.
        later = now + timedelta(minutes=5)
        assert due.claim(session, later, 100, rt.settings.probe_days) == [ids["failing"]]
        assert due.claim(session, later, 100, rt.settings.probe_days) == []
    for name in ("gone", "operator", "partner", "enabled"):
        assert send_probe(rt, ids[name]) is None
    with rt.db.begin() as session:
        assert session.scalar(select(func.count()).select_from(EndpointProbe)) == 0


def test_a_failing_probe_is_recorded_and_backs_off_until_the_window_ends(make_rt):
    rt = make_rt(probe_days=2)
    with Receiver(lambda r, c: (503, {}, b"still down")) as receiver:
        endpoint_id, secret, t0 = _disabled_endpoint(rt, receiver.url + "/h")
        assert _endpoint(rt, endpoint_id).probe_next_at == t0 + timedelta(minutes=5)
        now = t0 + timedelta(minutes=5)
        expected = [timedelta(minutes=15), timedelta(hours=1), timedelta(hours=6)]
        for n, delay in enumerate(expected, start=1):
            sent = send_probe(rt, endpoint_id, now=now)
            assert sent is not None and not sent.recovered
            endpoint = _endpoint(rt, endpoint_id)
            assert (endpoint.probe_count, endpoint.state) == (n, "disabled")
            assert endpoint.probe_next_at == now + delay
            now = endpoint.probe_next_at
        # Every 6 hours from then on, until two days after the disable.
        while (endpoint := _endpoint(rt, endpoint_id)).probe_next_at is not None:
            now = endpoint.probe_next_at
            send_probe(rt, endpoint_id, now=now)
        assert now <= t0 + timedelta(days=2) < now + timedelta(hours=6)
        assert _endpoint(rt, endpoint_id).state == "disabled"
        probes = len(receiver.on("/h"))
    # A probe is signed like a delivery and carries the probe envelope.
    first = receiver.on("/h")[0]
    Webhook(secret).verify(first.body, first.headers)
    assert first.json["type"] == PROBE_EVENT and first.json["data"]["endpoint"] == endpoint_id
    assert first.headers["webhook-id"] == first.json["id"]
    with rt.db.begin() as session:
        rows = session.scalars(select(EndpointProbe).order_by(EndpointProbe.n)).all()
        assert [r.n for r in rows] == list(range(1, probes + 1))
        assert {(r.status_code, r.ok, r.recovered) for r in rows} == {(503, False, False)}
        # Never a delivery: no event, delivery, attempt or dead letter, health untouched.
        for model in (Event, Delivery, Attempt, DeadLetter):
            assert session.scalar(select(func.count()).select_from(model)) == 0
        assert session.get_one(Endpoint, endpoint_id).consecutive_failures == 0


def test_a_window_past_its_days_is_not_claimed(make_rt):
    rt = make_rt(probe_days=1)
    endpoint_id, _, t0 = _disabled_endpoint(rt, "http://127.0.0.1:9/h")
    with rt.db.begin() as session:
        assert due.claim(session, t0 + timedelta(days=1, minutes=1), 10, 1) == []
    assert _endpoint(rt, endpoint_id).probe_next_at is None
    assert send_probe(rt, endpoint_id) is None


def test_auto_recover_off_records_the_probe_and_stays_disabled(make_rt):
    for rt, fields in ((make_rt(), {"auto_recover": False}), (make_rt(auto_recover=False), {})):
        with Receiver() as receiver:
            endpoint_id, _, t0 = _disabled_endpoint(rt, receiver.url + "/h", **fields)
            sent = send_probe(rt, endpoint_id, now=t0 + timedelta(minutes=5))
            assert sent is not None and sent.probe.ok and not sent.recovered
            assert _types(receiver, "/h") == [PROBE_EVENT]
        endpoint = _endpoint(rt, endpoint_id)
        assert endpoint.state == "disabled" and endpoint.probe_count == 1
        assert endpoint.probe_next_at == t0 + timedelta(minutes=20)


def test_endpoint_fails_is_disabled_probed_recovered_and_replays_in_order_once(make_rt):
    rt = make_rt(
        retry_schedule=(1,) * 10,
        retry_jitter=0.0,
        disable_after_failures=3,
        disable_after_seconds=0,
    )
    switch = Switch()
    with Receiver(switch) as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            endpoint_id = endpoint.id
            event_ids, delivery_ids = [], []
            for i in range(6):
                event, [delivery] = make_event_with_deliveries(
                    session, partner, [endpoint], data={"n": i}
                )
                event.created_at = utcnow() + timedelta(milliseconds=i)
                event_ids.append(event.id)
                delivery_ids.append(delivery.id)
        enqueue_now(rt.redis, delivery_ids)
        with WorkerThread(rt):
            wait_for(lambda: _open_letters(rt, endpoint_id) == 6, message="every delivery parked")
            endpoint = _endpoint(rt, endpoint_id)
            assert endpoint.state == "disabled" and endpoint.disabled_by == "health"
            assert endpoint.probe_next_at == endpoint.disabled_at + timedelta(minutes=5)
            t0 = endpoint.disabled_at
            # Still down: the scheduler's pass queues a probe; it fails and backs off.
            assert jobs.probe_due(rt, now=t0 + timedelta(minutes=4)) == 0
            assert jobs.probe_due(rt, now=t0 + timedelta(minutes=5)) == 1
            wait_for(lambda: _probes(rt, endpoint_id) == 1, message="the first probe")
            assert _endpoint(rt, endpoint_id).state == "disabled"
            before = len(receiver.on("/h"))
            switch.fixed.set()
            assert jobs.probe_due(rt, now=utcnow() + timedelta(minutes=15)) == 1
            wait_for(lambda: _endpoint(rt, endpoint_id).state == "enabled", message="re-enabled")
            wait_for(
                lambda: _open_letters(rt, endpoint_id) == 0 and _all_succeeded(rt, delivery_ids),
                timeout_s=60,
                message="every parked delivery replayed",
            )
            job = _replay(rt)
            wait_for(lambda: _replay(rt).state == "succeeded", message="the replay job ends")
    after = receiver.on("/h")[before:]
    assert [r.json["type"] for r in after][0] == PROBE_EVENT
    replayed = [r.headers["webhook-id"] for r in after[1:]]
    assert replayed == event_ids  # publish order, each exactly once
    job = _replay(rt)
    assert job.params["ordered"] and job.params["purpose"] == "recovery"
    assert (job.total, job.done, job.failed) == (6, 6, 0)
    with rt.db.begin() as session:
        [recovered] = session.scalars(
            select(OperationalEvent).where(OperationalEvent.kind == "endpoint.recovered")
        ).all()
        assert recovered.subject_id == endpoint_id and recovered.data["replayed"] == 6
        assert recovered.data["reason"] == "probe_succeeded"
        assert recovered.data["disabled_at"] == isoformat(t0)
        [audit] = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "endpoint.recovered")
        ).all()
        assert audit.subject_id == endpoint_id and audit.details["replay"] == job.id
        assert audit.details["parked"] == 6 and audit.details["probes"] == 2
        probes = session.scalars(select(EndpointProbe).order_by(EndpointProbe.n)).all()
        assert [(p.ok, p.recovered) for p in probes] == [(False, False), (True, True)]
        # Probes are not deliveries: six deliveries, and only their attempts.
        assert session.scalar(select(func.count()).select_from(Delivery)) == 6
        endpoint = session.get_one(Endpoint, endpoint_id)
        assert (endpoint.probe_count, endpoint.probe_next_at) == (0, None)


def _open_letters(rt, endpoint_id: str) -> int:
    with rt.db.begin() as session:
        return session.scalar(
            select(func.count())
            .select_from(DeadLetter)
            .where(DeadLetter.endpoint_id == endpoint_id, DeadLetter.state == "open")
        )


def _probes(rt, endpoint_id: str) -> int:
    with rt.db.begin() as session:
        return session.scalar(
            select(func.count())
            .select_from(EndpointProbe)
            .where(EndpointProbe.endpoint_id == endpoint_id)
        )


def _all_succeeded(rt, ids: list[str]) -> bool:
    with rt.db.begin() as session:
        states = session.scalars(select(Delivery.state).where(Delivery.id.in_(ids))).all()
    return len(states) == len(ids) and set(states) == {"succeeded"}


def _replay(rt) -> ResendJob:
    with rt.db.begin() as session:
        [job] = session.scalars(select(ResendJob)).all()
        session.expunge(job)
        return job


def test_ordered_bulk_resend_goes_one_after_the_other_in_publish_order(make_rt):
    rt = make_rt()
    with Receiver() as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoint = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            event_ids, delivery_ids = [], []
            base = utcnow()
            # Created in reverse id order: the publish time, not the id, orders the replay.
            for i in range(4):
                event, [delivery] = make_event_with_deliveries(session, partner, [endpoint])
                event.created_at = base - timedelta(seconds=i)
                event_ids.insert(0, event.id)
                delivery_ids.append(delivery.id)
            session.flush()
            for delivery in session.scalars(select(Delivery)):
                park(session, delivery, delivery.event, endpoint, DISABLED)
        with rt.db.begin() as session:
            job = resend.start_bulk(
                session,
                actor="test",
                flt=resend.DeadLetterFilter(endpoint=endpoint.id),
                ordered=True,
                purpose="test",
            )
            job_id = job.id
        with WorkerThread(rt):
            resend.run_bulk(rt, job_id, settle_s=30)
            wait_for(lambda: _all_succeeded(rt, delivery_ids), message="all delivered")
    assert receiver.event_ids("/h") == event_ids
