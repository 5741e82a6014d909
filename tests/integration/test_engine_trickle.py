"""The engine's one-statement paths on PostgreSQL: the claim with its targets, and the
record of a batch of successes, keep the claim's guard and the lease fence."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.clock import utcnow
from app.ids import new_id
from app.models import DELIVERING, SUCCEEDED, Attempt, Delivery
from app.registry.secrets import add_secret
from app.signing import generate_secret
from sender.engine import claim, rowsets
from sender.engine.targets import TargetReader
from tests.support.factories import make_endpoint, make_events, make_partner


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
    with runtime.db.autocommit() as connection:
        got = claim.claim_with_targets(connection, ids, now, lease)
        again = claim.claim_with_targets(connection, ids, now, lease)
    assert sorted(r.id for r in got.rows) == sorted(ids)
    assert again.rows == []  # claimed already: the guard holds
    assert got.bodies is not None and len(got.bodies) == 2
    targets, broken = TargetReader(lambda: runtime.secret_box, 15).build(got.targets or [], now)
    assert broken == {}
    assert len(targets[endpoint.id].secrets) == 2  # one row per delivery and secret, deduplicated
    with runtime.db.begin() as session:
        states = session.scalars(select(Delivery.state).where(Delivery.id.in_(ids))).all()
    assert set(states) == {DELIVERING}


def test_successes_written_in_one_statement_are_fenced_on_the_lease(runtime, pg_only):
    with runtime.db.begin() as session:
        partner = make_partner(session)
        endpoint = make_endpoint(session, partner, "http://127.0.0.1:9/x", runtime.secret_box)
        kept, lost = make_events(session, partner, [endpoint], 2)
    now = utcnow()
    lease = now + timedelta(seconds=60)
    with runtime.db.autocommit() as connection:
        claim.claim_with_targets(connection, [kept, lost], now, lease)
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

    with runtime.db.autocommit() as connection:
        rowsets.write_successes(
            connection,
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
