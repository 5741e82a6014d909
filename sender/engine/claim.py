"""The claim: turn due delivery ids into rows this process owns, with a lease.

One conditional UPDATE claims every delivery among the ids that is due and whose endpoint is
enabled (or that an operator forced to a disabled one): `delivering`, with a lease. The guard
for the rest reads them again: final, in flight elsewhere, not yet due (due within
`LOOKAHEAD_S`: a local timer), due for a disabled endpoint (parked as a dead letter), or due
for an endpoint waiting for verification (held until it is verified: `sender.verification`). An
ordered delivery is claimed only once the one before it in its key is released
(`sender.ordering.ready`); until then it is left alone, and woken when that one is recorded.

The lease (`lease_expires_at`) is the database's truth about who owns a delivery; every later
write is fenced on it. For rows that are not `delivering`, a lease in the future means
"someone holds a timer for it": a claimed delivery this process will not send yet is given
back (`unclaim`) with such a hold, `HOLD_GRACE_S` past the moment its timer fires, after which
the sweeper takes over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, case, or_, select, update
from sqlalchemy.orm import Session

from app import telemetry
from app.db import Database
from app.db_direct import Held
from app.models import DELIVERING, PENDING, RETRYING, Delivery, Endpoint, EndpointSecret, Event
from app.vocabulary import DeadLetterReason, EndpointState
from sender import ordering
from sender.bodies import BodyKey, payload_column
from sender.engine.sql import chunks, ids_in, table
from sender.engine.targets import target_columns
from sender.park import park

log = logging.getLogger(__name__)

# A job may carry deliveries due this soon; they wait on a local timer instead of a new job.
LOOKAHEAD_S = 5.0
# A held delivery's lease outlives its local timer by this much; then the sweeper takes over.
HOLD_GRACE_S = 15.0


@dataclass(frozen=True)
class Claimed:
    """Rows claimed with `lease`; on PostgreSQL their payloads came back with the claim, and
    with `claim_with_targets` their endpoints' target rows too (`targets.target_columns`)."""

    rows: list[Any]
    bodies: dict[BodyKey, bytes] | None
    lease: datetime
    targets: list[Any] | None = None


def lease_seconds(
    timeout_s: float, *, floor_s: float, local_wait_s: float, horizon_s: float
) -> float:
    """Long enough to wait for a thread, wait locally and send, twice over the timeout."""
    return max(floor_s, 2 * timeout_s + local_wait_s + horizon_s + 5)


def _claim_statement(postgres: bool, traced: bool = False, ordered: bool = True) -> Any:
    """The claim's UPDATE for one chunk of ids, built once per dialect: SQLAlchemy then finds
    its compiled form in its cache without building or keying a statement per claim.

    `traced` (tracing on, `app.telemetry`) returns each event's `trace_context` too: on
    PostgreSQL from the events row the claim joins anyway, on SQLite by its primary key.
    `ordered=False` claims only unnumbered deliveries, without the ordering gate (see
    `claim_with_targets`).
    """
    deliveries = table(Delivery)
    enabled = select(Endpoint.id).where(
        Endpoint.state == EndpointState.ENABLED, Endpoint.deleted_at.is_(None)
    )
    live = select(Endpoint.id).where(Endpoint.deleted_at.is_(None))
    columns: list[Any] = [
        deliveries.c.id,
        deliveries.c.event_id,
        deliveries.c.endpoint_id,
        deliveries.c.attempt_count,
        deliveries.c.run_attempts,
        deliveries.c.version,
        deliveries.c.ordering_seq,
        deliveries.c.previous_event_id,
    ]
    stmt = (
        update(deliveries)
        .where(
            ids_in(deliveries.c.id, "b_ids", postgres),
            # Not IN (...): a literal list is rendered afresh at every execution.
            or_(deliveries.c.state == PENDING, deliveries.c.state == RETRYING),
            or_(
                deliveries.c.next_attempt_at.is_(None),
                deliveries.c.next_attempt_at <= bindparam("b_due"),
            ),
            or_(
                deliveries.c.endpoint_id.in_(enabled),
                and_(deliveries.c.forced.is_(True), deliveries.c.endpoint_id.in_(live)),
            ),
            # An ordered delivery waits for the one before it in its key.
            ordering.ready(deliveries) if ordered else deliveries.c.ordering_seq.is_(None),
        )
        .values(
            state=DELIVERING, lease_expires_at=bindparam("b_lease"), updated_at=bindparam("b_now")
        )
    )
    events = table(Event)
    if not postgres:
        if traced:
            columns.append(
                select(events.c.trace_context)
                .where(events.c.id == deliveries.c.event_id)
                .scalar_subquery()
                .label("trace_context")
            )
        return stmt.returning(*columns)
    if traced:
        columns.append(events.c.trace_context)
    # The body as `sender.bodies` defines it, which the pages that show it read too.
    payload = payload_column(deliveries, events).label("payload")
    return stmt.where(events.c.id == deliveries.c.event_id).returning(*columns, payload)


_CLAIM = {
    (postgres, traced): _claim_statement(postgres, traced)
    for postgres in (True, False)
    for traced in (False, True)
}


def _claim_with_targets_statement(traced: bool, ordered: bool = True) -> Any:
    """PostgreSQL: the claim's UPDATE as a CTE, joined to what `targets` reads of each claimed
    delivery's endpoint and secrets: one row per claimed delivery and secret."""
    claimed = _claim_statement(True, traced, ordered).cte("claimed")
    endpoints, secrets = table(Endpoint), table(EndpointSecret)
    return select(claimed, *target_columns()).select_from(
        claimed.join(endpoints, endpoints.c.id == claimed.c.endpoint_id).outerjoin(
            secrets, secrets.c.endpoint_id == endpoints.c.id
        )
    )


_CLAIM_WITH_TARGETS = {
    (traced, ordered): _claim_with_targets_statement(traced, ordered)
    for traced in (False, True)
    for ordered in (False, True)
}


def claim_with_targets(
    db: Database, ids: list[str], now: datetime, lease: datetime, held: Held | None = None
) -> Claimed:
    """PostgreSQL: `claim_due` and the claimed endpoints' target rows in one statement, run
    on the driver in autocommit (`Database.direct`): one round trip where a transaction took
    four (BEGIN, the claim, the targets, COMMIT), and none of SQLAlchemy's per-execution
    work, which at a trickle (a claim per delivery) cost the claim more CPU than its round
    trip. The statement is atomic on its own; the same snapshot reads the endpoints, so a
    target is as fresh as with a read in the claim's transaction.

    Unnumbered deliveries are claimed first, by a statement without the ordering gate: the
    gate looks up each numbered delivery's predecessor by its key, which no partition bound
    narrows, so PostgreSQL plans that lookup over every daily partition of `deliveries` at
    every execution (with 30 days kept, 4.5 ms of server CPU a claim, against 0.7 ms without
    it; docs/delivery.md). Only ids left unclaimed (numbered ones, or ones not due) go through
    the statement with the gate: a second round trip where ordering is used. Both run on
    `held`'s connection when given (a claimer that claims again and again).
    """
    traced = telemetry.enabled()
    found = _claim_chunks(db, _CLAIM_WITH_TARGETS[(traced, False)], ids, now, lease, held)
    taken = {r.id for r in found}
    rest = [i for i in ids if i not in taken]
    if rest:
        found += _claim_chunks(db, _CLAIM_WITH_TARGETS[(traced, True)], rest, now, lease, held)
    rows = list({r.id: r for r in found}.values())
    bodies = {
        (r.event_id, r.version): r.payload.encode("utf-8") for r in rows if r.payload is not None
    }
    return Claimed(rows, bodies, lease, found)


def _claim_chunks(
    db: Database,
    statement: Any,
    ids: list[str],
    now: datetime,
    lease: datetime,
    held: Held | None,
) -> list[Any]:
    direct = db.direct(statement)
    found: list[Any] = []
    for chunk in chunks(ids):
        found += direct.records(
            {"b_ids": list(chunk), "b_due": now, "b_lease": lease, "b_now": now}, held
        )
    return found


def claim_due(session: Session, ids: list[str], now: datetime, lease: datetime) -> Claimed:
    """Claim every due delivery among `ids` whose endpoint is enabled (or that an operator
    forced to a disabled one).

    On PostgreSQL the payloads come back with the claim (UPDATE ... FROM events RETURNING),
    sparing a query; with tracing on, each row has its event's `trace_context` too. A Core
    statement on the session's connection: none of the ORM's per-execution work.
    """
    postgres = session.get_bind().dialect.name == "postgresql"
    statement = _CLAIM[(postgres, telemetry.enabled())]
    connection = session.connection()
    rows: list[Any] = []
    for chunk in chunks(ids):
        rows += connection.execute(
            statement, {"b_ids": list(chunk), "b_due": now, "b_lease": lease, "b_now": now}
        ).all()
    if not postgres:
        return Claimed(rows, None, lease)
    return Claimed(
        rows,
        {(r.event_id, r.version): r.payload.encode("utf-8") for r in rows if r.payload is not None},
        lease,
    )


def extend_lease(session: Session, ids: list[str], lease: datetime, needed: datetime) -> None:
    """Lengthen the lease of rows just claimed with `lease` (a newly seen, slower endpoint)."""
    for chunk in chunks(sorted(ids)):
        session.execute(
            update(Delivery)
            .where(
                Delivery.id.in_(chunk),
                Delivery.state == DELIVERING,
                Delivery.lease_expires_at == lease,
            )
            .values(lease_expires_at=needed)
            .execution_options(synchronize_session=False)
        )


def look_at_unclaimed(
    session: Session, ids: list[str], now: datetime
) -> tuple[list[tuple[str, datetime]], int]:
    """The guard for what the claim skipped: final, in flight, not yet due, or parked.

    Returns the deliveries due within `LOOKAHEAD_S` (for local timers) and how many were
    not due or not ours to send.
    """
    horizon = now + timedelta(seconds=LOOKAHEAD_S)
    later: list[tuple[str, datetime]] = []
    due: list[str] = []
    for chunk in chunks(ids):
        for row in session.execute(
            select(Delivery.id, Delivery.state, Delivery.next_attempt_at).where(
                Delivery.id.in_(chunk)
            )
        ):
            if row.state not in (PENDING, RETRYING):
                continue
            if row.next_attempt_at is not None and row.next_attempt_at > now:
                if row.next_attempt_at <= horizon:
                    later.append((row.id, row.next_attempt_at))
                continue
            due.append(row.id)
    if due:
        # Due yet not claimed: its endpoint is disabled or deleted, or waits for verification.
        park_disabled(session, due)
        hold_unverified(session, due)
    return later, len(ids) - len(due)


def park_disabled(session: Session, ids: list[str]) -> None:
    """A due delivery whose endpoint is disabled or deleted becomes a dead letter."""
    for delivery in session.scalars(
        select(Delivery)
        .join(Endpoint, Endpoint.id == Delivery.endpoint_id)
        .where(
            Delivery.id.in_(ids),
            Delivery.state.in_((PENDING, RETRYING)),
            or_(Endpoint.state == EndpointState.DISABLED, Endpoint.deleted_at.is_not(None)),
        )
    ):
        park(
            session, delivery, delivery.event, delivery.endpoint, DeadLetterReason.ENDPOINT_DISABLED
        )


def hold_unverified(session: Session, ids: list[str]) -> None:
    """A due delivery whose endpoint waits for verification is held (no `next_attempt_at`):
    nothing offers it again until the verification releases it (`sender.verification`)."""
    deliveries = table(Delivery)
    waiting = select(Endpoint.id).where(
        Endpoint.state == EndpointState.PENDING_VERIFICATION, Endpoint.deleted_at.is_(None)
    )
    for chunk in chunks(ids):
        session.execute(
            update(deliveries)
            .where(
                deliveries.c.id.in_(chunk),
                deliveries.c.state.in_((PENDING, RETRYING)),
                deliveries.c.endpoint_id.in_(waiting),
            )
            .values(next_attempt_at=None, lease_expires_at=None)
        )


def unclaim(session: Session, ids: list[str], lease: datetime, hold_until: datetime) -> None:
    """Give back claimed deliveries this process will not send now; it keeps a timer."""
    deliveries = table(Delivery)
    for chunk in chunks(sorted(ids)):
        session.execute(
            update(deliveries)
            .where(
                deliveries.c.id.in_(chunk),
                deliveries.c.state == DELIVERING,
                deliveries.c.lease_expires_at == lease,
            )
            .values(
                state=case((deliveries.c.run_attempts > 0, RETRYING), else_=PENDING),
                lease_expires_at=hold_until,
            )
        )


def forget_holds(db: Database, ids: list[str]) -> None:
    """Locally timed rows go back to the sweeper at once instead of after their hold."""
    try:
        with db.begin() as session:
            for chunk in chunks(ids):
                session.execute(
                    update(Delivery)
                    .where(Delivery.id.in_(chunk), Delivery.state.in_((PENDING, RETRYING)))
                    .values(lease_expires_at=None)
                    .execution_options(synchronize_session=False)
                )
    except Exception:
        log.warning(
            "could not hand %d timed deliveries back to the sweeper", len(ids), exc_info=True
        )
