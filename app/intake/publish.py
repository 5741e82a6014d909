"""Publishing: validate against the contract, then write the event and its whole fan-out at once.

The event, one delivery per subscribed endpoint and the idempotency record are written
atomically; the deliveries are put on the queue only after that commit. A 202
therefore always means "committed", and a lost enqueue is found again by the sweeper.

The hot path stays lean on purpose, because every round trip costs a thread its turn at the
GIL and the database a wake-up. One query reads the partner, its endpoints and the contract
(whose compiled validator is cached per process); on PostgreSQL one statement writes the event
with every delivery. When that statement is the whole write (no Idempotency-Key, no disabled
endpoint to park) it runs in autocommit, from targets cached per process and re-checked by the
statement itself: one database round trip and one Redis round trip per publish.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import redis
from sqlalchemy import Connection, insert, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from app import event_types
from app.clock import utcnow
from app.config import Settings
from app.db import Database
from app.errors import Conflict
from app.ids import new_id
from app.intake import sql
from app.intake.envelope import ACCEPTED, PublishResult, parse_request
from app.intake.idempotency import (
    IDEMPOTENCY_KEYS,
    IN_FLIGHT_WAIT_MS,
    check_idempotency_key,
    lock_timed_out,
    request_hash,
    stored_response,
    unique_violation,
)
from app.intake.plan import (
    Plan,
    Planned,
    contract_of,
    filtered_out,
    make_plan,
    published_warnings,
    wanted_versions,
)
from app.intake.targets import read_targets, targets_cache
from app.models import DEAD, PENDING, Delivery, Endpoint, Event
from app.queues import enqueue_after_commit
from app.vocabulary import DeadLetterReason
from sender import ordering
from sender.dispatch import enqueue_now, job_specs
from sender.park import park

log = logging.getLogger(__name__)


def publish(
    db: Database,
    redis_client: redis.Redis,
    settings: Settings,
    *,
    partner_uid: str,
    body: dict[str, Any],
    api_key_id: str,
    idempotency_key: str | None = None,
    now: datetime | None = None,
) -> PublishResult:
    """Publish with as few round trips as the guarantees allow, then enqueue: the entry point
    (it picks the one-statement fast path or `publish_in_transaction`).

    On PostgreSQL, a publish without an Idempotency-Key whose subscribed endpoints are all
    enabled is one atomic statement on an autocommit connection (no BEGIN, no COMMIT), made
    from cached targets; a stale cache costs one more read. Everything else, and SQLite,
    goes through `publish_in_transaction` in one transaction, and raises what it raises.
    """
    if idempotency_key is None and db.is_postgres:
        result = _publish_in_one_statement(db, partner_uid, body, now or utcnow())
        if result is not None:
            enqueue_now(redis_client, result.enqueued)
            return result
    with db.begin() as session:
        return publish_in_transaction(
            session,
            redis_client,
            settings,
            partner_uid=partner_uid,
            body=body,
            api_key_id=api_key_id,
            idempotency_key=idempotency_key,
            now=now,
        )


def _publish_in_one_statement(
    db: Database, partner_uid: str, body: dict[str, Any], now: datetime
) -> PublishResult | None:
    """The PostgreSQL hot path; None when the publish needs a transaction after all
    (endpoints to park, or endpoints that keep changing under it).
    """
    req = parse_request(body)
    key = (partner_uid, req.type, req.version)
    targets = targets_cache.get(key)
    from_cache = targets is not None
    while True:
        if targets is None:
            with db.autocommit() as connection:
                targets = read_targets(
                    connection, partner_uid, req.type, req.version, with_digest=True
                )
            if targets.contract is not None:
                targets_cache.put(key, targets)
        excluded = filtered_out(targets, req)
        if req.renditions or wanted_versions(targets, req, excluded):
            return None  # other versions to make and store: a transaction
        # No version is made here (the return above), so no size budget is needed.
        plan = make_plan(
            targets, req, partner_uid, now, _no_versions, max_bytes=0, excluded=excluded
        )
        if plan.parked or plan.ordered or plan.held:
            # Dead letters and audit rows, sequence numbers or held deliveries take a
            # transaction.
            return None
        params = sql.event_params(plan.event_values, plan.pending)
        params["digest"] = targets.digest
        params["type_id"] = contract_of(targets, req).id
        # On the driver (app.db_direct): the statement is the whole transaction.
        ((written, deprecated, sunset_at),) = db.direct(sql.GUARDED_EVENT_WITH_DELIVERIES).rows(
            params
        )
        if written:
            plan.response["warnings"] = published_warnings(req, bool(deprecated), sunset_at)
            _log_published(plan, partner_uid)
            return PublishResult(status=ACCEPTED, body=plan.response, enqueued=plan.enqueued)
        # The endpoints changed since the plan was made: nothing was written.
        targets_cache.drop(key)
        if not from_cache:
            return None  # changing under a fresh read too: let a transaction decide
        targets, from_cache = None, False


def _no_versions(name: str) -> dict[int, event_types.Version]:
    """The hot path publishes only the version sent: asking for others is a bug."""
    raise AssertionError(f"the one-statement publish was asked for the versions of {name}")


def publish_in_transaction(
    session: Session,
    redis_client: redis.Redis,
    settings: Settings,
    *,
    partner_uid: str,
    body: dict[str, Any],
    api_key_id: str,
    idempotency_key: str | None = None,
    now: datetime | None = None,
) -> PublishResult:
    """Validate and write one event with its deliveries in the caller's transaction; enqueue
    them once the caller commits. (`publish` picks this or the one-statement fast path.)

    Raises:
        NotFound: the partner does not exist.
        ValidationFailed: a bad envelope, unknown (type, version), `data` breaking the schema
            (errors in `details`), or `idempotency_key_reused`.
        Conflict: `idempotency_key_in_flight`, another request with this key is unfinished.
    """
    now = now or utcnow()
    key = check_idempotency_key(idempotency_key)
    digest = request_hash(partner_uid, body) if key is not None else ""
    if key is not None:
        stored = stored_response(session, api_key_id, key, digest, now)
        if stored is not None:
            return stored

    req = parse_request(body)
    connection = session.connection()
    plan = make_plan(
        read_targets(connection, partner_uid, req.type, req.version),
        req,
        partner_uid,
        now,
        lambda name: event_types.versions_of(connection, name),
        max_bytes=settings.max_payload_bytes,
    )
    if key is not None:
        # First write of the transaction: a concurrent twin blocks here on the unique index
        # (PostgreSQL) or never gets this far (SQLite's single writer), before doing any work.
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text(f"SET LOCAL lock_timeout = {int(IN_FLIGHT_WAIT_MS)}"))
        try:
            with session.begin_nested():
                session.execute(
                    insert(IDEMPOTENCY_KEYS),
                    [
                        {
                            "id": new_id("idk"),
                            "api_key_id": api_key_id,
                            "key": key,
                            "request_hash": digest,
                            "response_status": ACCEPTED,
                            "response_body": plan.response,
                            "event_id": plan.event_values["id"],
                            "created_at": now,
                            "expires_at": now + timedelta(seconds=settings.idempotency_ttl_seconds),
                        }
                    ],
                )
        except (IntegrityError, OperationalError) as exc:
            if not (lock_timed_out(exc) or unique_violation(exc)):
                raise
            stored = stored_response(session, api_key_id, key, digest, now)
            if stored is not None:
                return stored
            raise Conflict(
                "a request with this Idempotency-Key is still in flight; retry",
                code="idempotency_key_in_flight",
                details={"idempotency_key": key},
            ) from None

    write_plan(session, redis_client, plan)
    _log_published(plan, partner_uid)
    return PublishResult(status=ACCEPTED, body=plan.response, enqueued=plan.enqueued)


def write_plan(session: Session, redis_client: redis.Redis, plan: Plan) -> None:
    """Write a planned event with its deliveries in the caller's transaction (numbered for
    ordered endpoints, parked for disabled ones); enqueue them once the caller commits."""
    places: dict[str, ordering.Place] = {}
    if plan.ordered:
        places = ordering.assign(
            session.connection(),
            plan.ordered,
            str(plan.event_values["ordering_key"]),
            plan.event_values["id"],
        )
    _insert_event_and_deliveries(
        session.connection(), plan.event_values, plan.pending, plan.versions, places
    )
    if plan.held:
        _hold(session.connection(), plan.held)
    if plan.parked:
        _park_for_disabled(
            session,
            Event(**plan.event_values),
            plan.parked,
            plan.event_values["created_at"],
            places,
        )
    enqueue_after_commit(session, redis_client, job_specs(plan.enqueued))


def _log_published(plan: Plan, partner_uid: str) -> None:
    if log.isEnabledFor(logging.DEBUG):
        event = plan.event_values
        log.debug(
            "event published",
            extra={
                "event_id": event["id"],
                "partner": partner_uid,
                "event_type": event["type"],
                "deliveries": len(plan.response["deliveries"]),
                "correlation_id": event["correlation_id"],
            },
        )


def _insert_event_and_deliveries(
    connection: Connection,
    event_values: dict[str, Any],
    deliveries: list[Planned],
    versions: list[dict[str, Any]],
    places: dict[str, ordering.Place],
) -> None:
    """Write the event, its other versions and its pending deliveries: on PostgreSQL as one
    statement, whatever the fan-out, when there is only the published version and nothing
    is numbered; otherwise (and on SQLite: local, no round trips) statement by statement.
    """
    if connection.dialect.name == "postgresql" and not versions and not places:
        connection.execute(sql.EVENT_WITH_DELIVERIES, sql.event_params(event_values, deliveries))
        return
    connection.execute(sql.EVENT, [event_values])
    if versions:
        connection.execute(sql.EVENT_VERSION, versions)
    if deliveries:
        now = event_values["created_at"]
        connection.execute(
            sql.DELIVERY,
            [
                {
                    "id": delivery_id,
                    "event_id": event_values["id"],
                    "endpoint_id": endpoint_id,
                    "state": PENDING,
                    "version": version,
                    "attempt_count": 0,
                    "run_attempts": 0,
                    "run": 1,
                    "next_attempt_at": now,
                    "created_at": now,
                    "updated_at": now,
                    **_place_values(places.get(endpoint_id), event_values["ordering_key"]),
                }
                for delivery_id, endpoint_id, version in deliveries
            ],
        )


def _hold(connection: Connection, delivery_ids: list[str]) -> None:
    """Deliveries to an endpoint waiting for verification wait with it: no `next_attempt_at`,
    so nothing offers them to a worker until the verification releases them."""
    connection.execute(
        update(Delivery)
        .where(Delivery.id.in_(delivery_ids))
        .values(next_attempt_at=None)
        .execution_options(synchronize_session=False)
    )


def _place_values(place: ordering.Place | None, key: str | None) -> dict[str, Any]:
    """A delivery's ordering columns: all None when it is not numbered."""
    if place is None:
        return {"ordering_key": None, "ordering_seq": None, "previous_event_id": None}
    return {
        "ordering_key": key,
        "ordering_seq": place.sequence,
        "previous_event_id": place.previous_event_id,
    }


def _park_for_disabled(
    session: Session,
    event: Event,
    parked: list[Planned],
    now: datetime,
    places: dict[str, ordering.Place],
) -> None:
    """A disabled endpoint's new events become dead letters at once, resendable (with the
    version the endpoint is pinned to)."""
    endpoints = {
        e.id: e
        for e in session.scalars(
            select(Endpoint).where(Endpoint.id.in_([endpoint_id for _, endpoint_id, _ in parked]))
        )
    }
    for delivery_id, endpoint_id, version in parked:
        delivery = Delivery(
            id=delivery_id,
            event_id=event.id,
            endpoint_id=endpoint_id,
            state=DEAD,
            version=version,
            attempt_count=0,
            run_attempts=0,
            run=1,
            created_at=now,
            updated_at=now,
            **_place_values(places.get(endpoint_id), event.ordering_key),
        )
        session.add(delivery)
        park(session, delivery, event, endpoints[endpoint_id], DeadLetterReason.ENDPOINT_DISABLED)
