"""A fault that belongs to one endpoint or delivery is recorded against it; the rest of the
batch goes out.

An endpoint whose signing secret cannot be decrypted (KURIR_SECRET_KEY lost the key it was
encrypted under), or whose stored headers or rate limit the API would have refused, cannot be
sent to. Its deliveries get a failed attempt with an error class saying why, and then take the
normal retry, health and dead-letter path, while every other delivery in the same job is
delivered at once. No sweeper runs here: a batch that aborted would wait for the sweeper's
grace (30 s), longer than these tests wait.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, text, update

from app.crypto import SecretBox
from app.models import (
    DEAD,
    RETRYING,
    SUCCEEDED,
    Attempt,
    DeadLetter,
    Delivery,
    Endpoint,
    EndpointSecret,
)
from app.runtime import Runtime
from sender.dispatch import enqueue_now
from tests.support.factories import (
    Receiver,
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)

HEALTHY = 10
# Shorter than the sweeper's grace for a fresh delivery, generous for a slow machine.
DEADLINE_S = 20.0


def _secret_under_another_key(rt: Runtime, endpoint_id: str) -> None:
    with rt.db.begin() as session:
        session.execute(
            update(EndpointSecret)
            .where(EndpointSecret.endpoint_id == endpoint_id)
            .values(secret_encrypted=SecretBox(["a-key-long-gone"]).encrypt("x"))
        )


def _headers_not_an_object(rt: Runtime, endpoint_id: str) -> None:
    with rt.db.begin() as session:
        session.execute(
            update(Endpoint).where(Endpoint.id == endpoint_id).values(headers=["X-Trace", "t1"])
        )


def _headers_not_json(rt: Runtime, endpoint_id: str) -> None:
    """A hand-edited row: SQLite keeps JSON as text and will store anything."""
    if rt.db.is_postgres:
        pytest.skip("a PostgreSQL JSON column cannot hold text that is not JSON")
    with rt.db.begin() as session:
        session.execute(
            text("UPDATE endpoints SET headers = '{not json' WHERE id = :id"), {"id": endpoint_id}
        )


def _rate_limit_below_one(rt: Runtime, endpoint_id: str) -> None:
    with rt.db.begin() as session:
        session.execute(
            update(Endpoint).where(Endpoint.id == endpoint_id).values(rate_limit_per_s=-5)
        )


FAULTS = {
    "secret_under_another_key": (_secret_under_another_key, "secret_undecryptable"),
    "headers_not_an_object": (_headers_not_an_object, "invalid_endpoint_headers"),
    "headers_not_json": (_headers_not_json, "invalid_endpoint_headers"),
    "rate_limit_below_one": (_rate_limit_below_one, "invalid_rate_limit"),
}


def _fan_out(rt: Runtime, receiver: Receiver) -> tuple[str, list[str]]:
    """One broken and HEALTHY healthy endpoints, one event to all of them in one job (as a
    publish enqueues it), the broken endpoint's delivery first; returns its id and all ids."""
    with rt.db.begin() as session:
        partner = make_partner(session)
        broken = make_endpoint(session, partner, receiver.url + "/broken", rt.secret_box)
        healthy = [
            make_endpoint(session, partner, f"{receiver.url}/ok{i}", rt.secret_box)
            for i in range(HEALTHY)
        ]
        _, deliveries = make_event_with_deliveries(session, partner, [broken, *healthy])
        return broken.id, [d.id for d in deliveries]


def _healthy_all_arrive(rt: Runtime, receiver: Receiver, ids: list[str]) -> None:
    wait_for(
        lambda: len({r.path for r in receiver.requests}) == HEALTHY,
        timeout_s=DEADLINE_S,
        message="every healthy endpoint's delivery",
    )
    wait_for(
        lambda: _all_in(rt, ids, SUCCEEDED),
        timeout_s=DEADLINE_S,
        message="the healthy deliveries to be recorded",
    )
    assert sorted(r.path for r in receiver.requests) == sorted(f"/ok{i}" for i in range(HEALTHY))


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_one_broken_endpoint_gets_a_failed_attempt_and_the_rest_of_the_batch_is_delivered(
    make_rt, fault
):
    break_it, error_class = FAULTS[fault]
    rt = make_rt()
    with Receiver() as receiver:
        endpoint_id, [broken, *healthy] = _fan_out(rt, receiver)
        break_it(rt, endpoint_id)
        enqueue_now(rt.redis, [broken, *healthy])
        with WorkerThread(rt):
            _healthy_all_arrive(rt, receiver, healthy)
            wait_for(
                lambda: _all_in(rt, [broken], RETRYING),
                timeout_s=DEADLINE_S,
                message="the broken endpoint's failed attempt",
            )
    with rt.db.begin() as session:
        [attempt] = session.scalars(select(Attempt).where(Attempt.delivery_id == broken)).all()
        assert (attempt.n, attempt.error, attempt.response_status) == (1, error_class, None)
        assert attempt.url == receiver.url + "/broken"
        delivery = session.get_one(Delivery, broken)
        assert (delivery.attempt_count, delivery.last_error) == (1, error_class)
        assert delivery.next_attempt_at is not None  # the schedule's first step
        # (Not the whole row: SQLite's hand-edited headers would not load.)
        assert (
            session.scalar(select(Endpoint.consecutive_failures).where(Endpoint.id == endpoint_id))
            == 1
        )


def test_an_undecryptable_secret_retries_then_opens_a_dead_letter(make_rt):
    rt = make_rt(retry_schedule=(1,), retry_jitter=0.0)
    with Receiver() as receiver:
        endpoint_id, [broken, *healthy] = _fan_out(rt, receiver)
        _secret_under_another_key(rt, endpoint_id)
        enqueue_now(rt.redis, [broken, *healthy])
        with WorkerThread(rt):
            _healthy_all_arrive(rt, receiver, healthy)
            wait_for(
                lambda: _all_in(rt, [broken], DEAD),
                timeout_s=DEADLINE_S,
                message="the broken endpoint's delivery to be parked",
            )
    with rt.db.begin() as session:
        attempts = session.scalars(
            select(Attempt).where(Attempt.delivery_id == broken).order_by(Attempt.n)
        ).all()
        assert [(a.n, a.error) for a in attempts] == [
            (1, "secret_undecryptable"),
            (2, "secret_undecryptable"),
        ]
        [letter] = session.scalars(select(DeadLetter)).all()
        assert (letter.delivery_id, letter.reason, letter.last_error) == (
            broken,
            "retries_exhausted",
            "secret_undecryptable",
        )
        assert session.get_one(Endpoint, endpoint_id).consecutive_failures == 2


def test_a_delivery_whose_event_row_is_gone_does_not_stop_the_batch(make_rt, backend):
    """Foreign keys normally make this impossible; with them off for a moment, it is not."""
    rt = make_rt()
    with Receiver() as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            endpoints = [
                make_endpoint(session, partner, f"{receiver.url}/ok{i}", rt.secret_box)
                for i in range(3)
            ]
            orphan_event, [orphan] = make_event_with_deliveries(session, partner, endpoints[:1])
            _, others = make_event_with_deliveries(session, partner, endpoints)
        _delete_without_cascade(rt, orphan_event.id)
        enqueue_now(rt.redis, [orphan.id, *(d.id for d in others)])
        with WorkerThread(rt):
            wait_for(
                lambda: _all_in(rt, [d.id for d in others], SUCCEEDED),
                timeout_s=DEADLINE_S,
                message="the other deliveries",
            )
            if backend == "sqlite":
                wait_for(
                    lambda: _all_in(rt, [orphan.id], RETRYING),
                    timeout_s=DEADLINE_S,
                    message="the orphan's failed attempt",
                )
    with rt.db.begin() as session:
        errors = session.scalars(
            select(Attempt.error).where(Attempt.delivery_id == orphan.id)
        ).all()
    # PostgreSQL claims with a join on the event, so the orphan is never claimed at all.
    assert errors == (["event_missing"] if backend == "sqlite" else [])
    assert len(receiver.requests) == 3


def _delete_without_cascade(rt: Runtime, event_id: str) -> None:
    raw = rt.db.engine.raw_connection()
    try:
        cursor = raw.cursor()
        if rt.db.is_postgres:
            cursor.execute("SET session_replication_role = replica")  # no FK triggers
            cursor.execute("DELETE FROM events WHERE id = %s", (event_id,))
            cursor.execute("SET session_replication_role = DEFAULT")
        else:
            cursor.execute("PRAGMA foreign_keys=OFF")
            cursor.execute("DELETE FROM events WHERE id = ?", (event_id,))
            raw.commit()
            cursor.execute("PRAGMA foreign_keys=ON")
        raw.commit()
    finally:
        raw.close()


def _all_in(rt: Runtime, ids: list[str], state: str) -> bool:
    with rt.db.begin() as session:
        states = session.scalars(select(Delivery.state).where(Delivery.id.in_(ids))).all()
    return len(states) == len(ids) and set(states) == {state}
