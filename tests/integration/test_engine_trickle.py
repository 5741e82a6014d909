"""The engine's one-statement paths on PostgreSQL: the claim with its targets, and the
record of a batch of successes, keep the claim's guard and the lease fence."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import event, select, update

from app.clock import utcnow
from app.db import Database
from app.ids import new_id
from app.models import DELIVERING, SUCCEEDED, Attempt, Delivery
from app.processes.worker import DeliveryConsumer
from app.registry.secrets import add_secret
from app.runtime import Runtime
from app.signing import generate_secret
from sender.dispatch import enqueue_now
from sender.engine import Engine, claim, rowsets
from sender.engine.targets import TargetReader
from sender.jobs import engine_for, shutdown_engine
from tests.support.factories import Receiver, make_endpoint, make_events, make_partner, wait_for


@pytest.fixture
def pg_only(backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("the one-statement paths are PostgreSQL's")


def test_claim_with_targets_claims_once_and_reads_every_live_secret(runtime, pg_only):
    with runtime.db.begin() as session:
        partner = make_partner(session)
        endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/x", runtime.secret_box)
        add_secret(session, endpoint, generate_secret(), runtime.secret_box)
        ids = make_events(session, partner, [endpoint], 2)
    now = utcnow()
    lease = now + timedelta(seconds=60)
    got = claim.claim_with_targets(runtime.db, ids, now, lease)
    again = claim.claim_with_targets(runtime.db, ids, now, lease)
    assert sorted(r.id for r in got.rows) == sorted(ids)
    assert again.rows == []  # claimed already: the guard holds
    assert got.bodies is not None and len(got.bodies) == 2
    targets, broken = TargetReader(lambda: runtime.secret_box, 15).build(got.targets or [], now)
    assert broken == {}
    assert len(targets[endpoint.id].secrets) == 2  # one row per delivery and secret, deduplicated
    with runtime.db.begin() as session:
        states = session.scalars(select(Delivery.state).where(Delivery.id.in_(ids))).all()
    assert set(states) == {DELIVERING}


def test_the_claim_takes_unnumbered_and_ready_ordered_deliveries_and_keeps_the_gate(
    runtime, pg_only
):
    """Unnumbered deliveries are claimed by the statement without the ordering gate; the
    numbered ones are left to the one with it, which still holds the second of a key back
    while the first is unreleased."""
    with runtime.db.begin() as session:
        partner = make_partner(session)
        endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/x", runtime.secret_box)
        plain, first, second = make_events(session, partner, [endpoint], 3)
        for delivery_id, seq in ((first, 1), (second, 2)):
            session.execute(
                update(Delivery)
                .where(Delivery.id == delivery_id)
                .values(ordering_key="order-1", ordering_seq=seq)
            )
    now = utcnow()
    lease = now + timedelta(seconds=60)
    got = claim.claim_with_targets(runtime.db, [second, first, plain], now, lease)
    assert sorted(r.id for r in got.rows) == sorted([plain, first])
    assert got.bodies is not None and len(got.bodies) == 2
    assert {t.endpoint_id for t in got.targets or []} == {endpoint.id}
    with runtime.db.begin() as session:
        state = dict(
            session.execute(
                select(Delivery.id, Delivery.state).where(Delivery.id.in_([plain, first, second]))
            ).all()
        )
    assert state == {plain: DELIVERING, first: DELIVERING, second: "pending"}


def test_successes_written_in_one_statement_are_fenced_on_the_lease(runtime, pg_only):
    with runtime.db.begin() as session:
        partner = make_partner(session)
        endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/x", runtime.secret_box)
        kept, lost = make_events(session, partner, [endpoint], 2)
    now = utcnow()
    lease = now + timedelta(seconds=60)
    claim.claim_with_targets(runtime.db, [kept, lost], now, lease)
    with runtime.db.begin() as session:  # another owner took `lost` over
        session.execute(
            update(Delivery)
            .where(Delivery.id == lost)
            .values(lease_expires_at=lease + timedelta(seconds=1))
        )

    def attempt(delivery_id: str) -> dict:
        return {
            "id": new_id("att"),
            "delivery_id": delivery_id,
            "n": 1,
            "started_at": now,
            "duration_ms": 3,
            "url": "http://127.0.0.1:9/x",
            "request_headers": {"webhook-id": "evt"},
            "response_status": 200,
            "response_body": b"ok",
            "response_headers": None,
            "error": None,
            "created_at": now,
        }

    def success(delivery_id: str) -> dict:
        return {
            "b_id": delivery_id,
            "b_lease": lease,
            "b_n": 1,
            "b_run_n": 1,
            "b_status": 200,
            "b_at": now,
            "b_now": now,
        }

    rowsets.write_successes(
        runtime.db,
        [attempt(kept), attempt(lost), attempt(kept)],  # a repeat: the last one wins
        [success(kept), success(lost)],
    )
    with runtime.db.begin() as session:
        state = dict(
            session.execute(
                select(Delivery.id, Delivery.state).where(Delivery.id.in_([kept, lost]))
            ).all()
        )
        attempts = session.scalars(select(Attempt).where(Attempt.delivery_id.in_([kept, lost])))
        bodies = {a.delivery_id: a.response_body for a in attempts}
    assert state == {kept: SUCCEEDED, lost: DELIVERING}  # the lost lease wrote no state...
    assert bodies == {kept: b"ok", lost: b"ok"}  # ...but its attempt is recorded


def test_while_jobs_flow_claims_and_writes_keep_their_connections_and_give_them_back_at_rest(
    runtime, pg_only, redis_client
):
    """A trickle claims and records one delivery at a time: the claim and the writer each
    keep one pooled connection between statements (no checkout per statement), and give it
    back once no job comes (the consumer's empty pop; the writer after `WRITER_REST_S`). The
    writer's count of checkouts is not pinned: an endpoint's "last success" is written at
    most once a second, in a transaction of its own."""
    checkouts: list[str] = []
    pool_engine = runtime.db.engine
    listener = lambda *_: checkouts.append(threading.current_thread().name)  # noqa: E731
    event.listen(pool_engine, "checkout", listener)
    engine = engine_for(runtime)
    consumer = DeliveryConsumer(engine, redis_client, threading.Event(), block_s=0.1)
    try:
        with Receiver() as receiver:
            with runtime.db.begin() as session:
                partner = make_partner(session)
                endpoint = make_endpoint(session, partner, f"{receiver.url}/h", runtime.secret_box)
                ids = make_events(session, partner, [endpoint], 6)
            checkouts.clear()
            for n, delivery_id in enumerate(ids, start=1):
                enqueue_now(redis_client, [delivery_id])
                assert consumer.step() == 1
                wait_for(lambda n=n: engine.counters["attempts"] >= n, timeout_s=30)
            # Six claims (run by this thread's steps) on one checkout.
            assert checkouts.count(threading.current_thread().name) == 1
            assert pool_engine.pool.checkedout() >= 1
            assert consumer.step() == 0  # nothing came: the claim's connection goes back
            wait_for(lambda: pool_engine.pool.checkedout() == 0, timeout_s=30)
        with runtime.db.begin() as session:
            states = session.scalars(select(Delivery.state).where(Delivery.id.in_(ids))).all()
        assert set(states) == {SUCCEEDED}
        assert len(receiver.requests) == len(ids)
    finally:
        event.remove(pool_engine, "checkout", listener)
        consumer.close()
        shutdown_engine()


def test_a_claim_that_needs_a_transaction_and_a_flush_that_does_never_hold_two_connections(
    settings, migrated, pg_only
):
    """The claim's and the writer's kept connections go back to the pool before either
    opens a transaction: with a pool of one connection, a claim that must look at an id it
    could not take (not yet due) and the first success of an endpoint (its "last success" is
    written in a transaction) both go through instead of waiting for a second connection."""
    db = Database(migrated.url, pool_size=1, pool_timeout_s=5)
    rt = Runtime(settings, database=db)
    engine = Engine(rt, fast_threads=2, slow_threads=1).start()
    try:
        with Receiver() as receiver:
            with db.begin() as session:
                partner = make_partner(session)
                endpoint = make_endpoint(session, partner, f"{receiver.url}/h", rt.secret_box)
                due, later = make_events(session, partner, [endpoint], 2)
                session.execute(
                    update(Delivery)
                    .where(Delivery.id == later)
                    .values(next_attempt_at=utcnow() + timedelta(hours=1))
                )
            assert engine.submit([due, later]) == 1
            assert engine.wait_idle(timeout_s=30)
            assert len(receiver.requests) == 1
        with db.begin() as session:
            states = dict(
                session.execute(
                    select(Delivery.id, Delivery.state).where(Delivery.id.in_([due, later]))
                ).all()
            )
        assert states == {due: SUCCEEDED, later: "pending"}
    finally:
        engine.stop()
        rt.close()
        db.dispose()
