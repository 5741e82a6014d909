"""Words from `app.vocabulary` reach both databases and JSON columns as their plain text.

The enums are `str` subclasses: the drivers must bind them as text (not as an enum's name),
and a row read back must hold a plain `str` equal to the member.
"""

from __future__ import annotations

from collections import Counter

from sqlalchemy import text

from app.models import ResendJob
from app.registry.endpoints import disable_endpoint
from app.runtime import Runtime
from app.vocabulary import (
    DeadLetterReason,
    DeadLetterState,
    DeliveryState,
    EndpointState,
    ResendJobState,
    ResendSkip,
)
from tests.support.dlq_factories import make_dead_letter, make_endpoint, make_event, make_partner


def test_enum_members_are_stored_as_their_text(runtime: Runtime) -> None:
    with runtime.db.begin() as session:
        partner = make_partner(session)
        endpoint, _ = make_endpoint(session, runtime.secret_box, partner)
        disable_endpoint(session, endpoint)
        letter = make_dead_letter(
            session,
            endpoint,
            make_event(session, partner),
            reason=DeadLetterReason.ENDPOINT_DISABLED,
        )
        job = ResendJob(
            kind="resend",
            actor="test",
            state=ResendJobState.RUNNING,
            params={"skipped": dict(Counter([ResendSkip.ENDPOINT_DISABLED]))},
        )
        session.add(job)
        session.flush()
        ids = endpoint.id, letter.id, letter.delivery_id, job.id
    with runtime.db.engine.connect() as connection:
        row = connection.execute(
            text(
                "SELECT e.state, l.reason, l.state, d.state, b.state, CAST(b.params AS TEXT) "
                "FROM endpoints e, dead_letters l, deliveries d, bulk_operations b "
                "WHERE e.id = :e AND l.id = :l AND d.id = :d AND b.id = :b"
            ),
            dict(zip("eldb", ids, strict=True)),
        ).one()
    assert tuple(row[:5]) == ("disabled", "endpoint_disabled", "open", "dead", "running")
    assert all(type(value) is str for value in row)
    assert row[5].replace(" ", "") == '{"skipped":{"endpoint_disabled":1}}'
    assert (row[0], row[1], row[2], row[3]) == (
        EndpointState.DISABLED,
        DeadLetterReason.ENDPOINT_DISABLED,
        DeadLetterState.OPEN,
        DeliveryState.DEAD,
    )
