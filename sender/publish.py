"""Publishing: validate against the contract, then write the event and its whole fan-out at once.

The event, one delivery per subscribed endpoint and the idempotency record are written in the
caller's one transaction; the deliveries are put on the queue only after it commits (SPEC §7).
A 202 therefore always means "committed", and a lost enqueue is found again by the sweeper.

The hot path stays lean on purpose, because every round trip costs a thread its turn at the
GIL: one query reads the partner, its endpoints and the contract (whose compiled validator is
cached per process); on PostgreSQL one statement writes the event with its first delivery,
and the rest of a fan-out goes as one executemany. Statements are built once, at import.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import redis
from sqlalchemy import Table, and_, bindparam, delete, insert, literal_column, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from app import contracts
from app.clock import isoformat, parse_time, utcnow
from app.config import Settings
from app.errors import BadRequest, Conflict, NotFound, ValidationFailed
from app.ids import new_id
from app.models import DEAD, PENDING, Delivery, Endpoint, Event, IdempotencyKey, Partner
from dlq.park import park
from sender.dispatch import enqueue_after_commit

log = logging.getLogger(__name__)

PUBLISH_FIELDS = frozenset({"type", "version", "data", "occurred_at", "resource",
                            "correlation_id"})
RESOURCE_FIELDS = frozenset({"type", "id", "version"})
MAX_IDEMPOTENCY_KEY = 255
MAX_TEXT = 200
MAX_BIGINT = 2**63 - 1
ACCEPTED = 202
REASON_ENDPOINT_DISABLED = "endpoint_disabled"
# How long a keyed request waits behind an unfinished twin (PostgreSQL) before answering 409.
IN_FLIGHT_WAIT_MS = 5000
_PG_LOCK_NOT_AVAILABLE = "55P03"
_PG_UNIQUE_VIOLATION = "23505"


@dataclass(frozen=True)
class PublishRequest:
    type: str
    version: int
    data: dict[str, Any]
    occurred_at: datetime | None
    resource: dict[str, Any] | None
    correlation_id: str | None


@dataclass
class PublishResult:
    status: int
    body: dict[str, Any]
    replayed: bool = False
    enqueued: list[str] = field(default_factory=list)


def _invalid(field_: str, message: str) -> ValidationFailed:
    return ValidationFailed(message, code="invalid_field", details={"field": field_})


def _text(value: Any, field_: str, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise _invalid(field_, f"{field_} must be a non-empty string of at most {MAX_TEXT} "
                               "characters")
    return value


def _int(value: Any, field_: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
            minimum <= value <= MAX_BIGINT):
        raise _invalid(field_, f"{field_} must be an integer >= {minimum}")
    return value


def parse_request(body: dict[str, Any]) -> PublishRequest:
    """Check the envelope (not yet `data`, which the contract judges).

    Raises:
        ValidationFailed: an unknown, missing or malformed field.
    """
    unknown = sorted(set(body) - PUBLISH_FIELDS)
    if unknown:
        raise ValidationFailed(f"unknown field(s): {', '.join(unknown)}", code="unknown_field",
                               details={"fields": unknown})
    type_ = str(_text(body.get("type"), "type", required=True))
    if "version" not in body:
        raise _invalid("version", "version is required")
    version = _int(body["version"], "version", 1)
    if "data" not in body or not isinstance(body["data"], dict):
        raise _invalid("data", "data is required and must be a JSON object")
    occurred_at = None
    raw_time = body.get("occurred_at")
    if raw_time is not None:
        if not isinstance(raw_time, str):
            raise _invalid("occurred_at", "occurred_at must be an RFC 3339 timestamp")
        try:
            occurred_at = parse_time(raw_time)
        except ValueError:
            raise _invalid("occurred_at", "occurred_at must be an RFC 3339 timestamp") from None
    resource = body.get("resource")
    if resource is not None:
        if not isinstance(resource, dict):
            raise _invalid("resource", "resource must be an object {type, id, version?}")
        extra = sorted(set(resource) - RESOURCE_FIELDS)
        if extra:
            raise ValidationFailed(f"unknown resource field(s): {', '.join(extra)}",
                                   code="unknown_field", details={"fields": extra})
        version_ = resource.get("version")
        resource = {
            "type": _text(resource.get("type"), "resource.type", required=True),
            "id": _text(resource.get("id"), "resource.id", required=True),
            "version": None if version_ is None else _int(version_, "resource.version", 0),
        }
    correlation_id = _text(body.get("correlation_id"), "correlation_id", required=False)
    return PublishRequest(type_, version, body["data"], occurred_at, resource, correlation_id)


def request_hash(partner_uid: str, body: dict[str, Any]) -> str:
    """Same key + same (canonical) body + same partner is a retry; anything else is reuse."""
    material = partner_uid + "\n" + contracts.canonical_json(body)
    return hashlib.sha256(material.encode()).hexdigest()


def check_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise BadRequest(f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
                         code="invalid_idempotency_key")
    return key


def payload_json(event_id: str, req: PublishRequest, partner_uid: str,
                 occurred_at: datetime) -> str:
    """The exact body every attempt (and every resend) of this event sends (SPEC §3)."""
    body = {
        "id": event_id,
        "type": req.type,
        "version": req.version,
        "occurred_at": isoformat(occurred_at),
        "partner": partner_uid,
        "resource": req.resource,
        "correlation_id": req.correlation_id,
        "data": req.data,
    }
    # json escapes every control character even with ensure_ascii=False, so no raw NUL
    # reaches PostgreSQL text, and non-ASCII stays searchable in dead letters.
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def _stored_response(session: Session, api_key_id: str, key: str, digest: str,
                     now: datetime) -> PublishResult | None:
    row = session.execute(
        select(IdempotencyKey.request_hash, IdempotencyKey.response_status,
               IdempotencyKey.response_body, IdempotencyKey.expires_at, IdempotencyKey.id)
        .where(IdempotencyKey.api_key_id == api_key_id, IdempotencyKey.key == key)).first()
    if row is None:
        return None
    stored_hash, status, body, expires_at, row_id = row
    if expires_at <= now:
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.id == row_id))
        return None
    if stored_hash != digest:
        raise ValidationFailed(
            "this Idempotency-Key was already used with a different request body",
            code="idempotency_key_reused", details={"idempotency_key": key})
    return PublishResult(status=status, body=body, replayed=True)


_PARTNERS = cast(Table, Partner.__table__)
_ENDPOINTS = cast(Table, Endpoint.__table__)
_EVENTS = cast(Table, Event.__table__)
_DELIVERIES = cast(Table, Delivery.__table__)
_IDEMPOTENCY = cast(Table, IdempotencyKey.__table__)


def _typed(table: Any, prefix: str) -> dict[str, Any]:
    """`column: bindparam` for every column, typed so JSON and UTC times are converted."""
    return {c.name: bindparam(f"{prefix}{c.name}", type_=c.type) for c in table.columns}


# The hot path's statements are built once: constructing a select/insert per request costs
# more CPU than executing it.
_TARGETS_SQL = (
    select(_PARTNERS.c.id, _ENDPOINTS.c.id, _ENDPOINTS.c.state, _ENDPOINTS.c.event_types,
           *contracts.lookup_columns(bindparam("type_name"), bindparam("type_version")))
    .select_from(_PARTNERS.outerjoin(_ENDPOINTS, and_(
        _ENDPOINTS.c.partner_id == _PARTNERS.c.id, _ENDPOINTS.c.deleted_at.is_(None))))
    .where(_PARTNERS.c.uid == bindparam("uid"))
    .order_by(_ENDPOINTS.c.id))
_EVENT_COLUMNS = tuple(c.name for c in _EVENTS.columns)


def _event_with_first_delivery() -> Any:
    """PostgreSQL: the event and its first delivery in one statement (a DML CTE).

    The delivery reuses the event's binds (id, time) and takes its constants as literals:
    every bind parameter costs client CPU to adapt, on the path every publish takes.
    """
    event = _typed(_EVENTS, "e_")
    fresh: dict[str, Any] = {
        "state": literal_column(f"'{PENDING}'"), "attempt_count": literal_column("0"),
        "run_attempts": literal_column("0"), "run": literal_column("1")}
    delivery = {"id": bindparam("d_id", type_=_DELIVERIES.c.id.type),
                "endpoint_id": bindparam("d_endpoint_id", type_=_DELIVERIES.c.endpoint_id.type),
                "event_id": event["id"], "next_attempt_at": event["created_at"],
                "created_at": event["created_at"], "updated_at": event["created_at"], **fresh}
    return (insert(_DELIVERIES).values(**delivery)
            .add_cte(insert(_EVENTS).values(**event).cte("new_event")))


_EVENT_WITH_DELIVERY_SQL = _event_with_first_delivery()
_EVENT_SQL = insert(_EVENTS)
_DELIVERY_SQL = insert(_DELIVERIES)


@dataclass(frozen=True)
class _Targets:
    partner_id: str
    endpoints: list[tuple[str, str, list[str] | None]]
    contract: contracts.Contract | None


def _targets(session: Session, partner_uid: str, type_: str, version: int) -> _Targets:
    """The partner, its live endpoints and the contract, in one round trip.

    The outer join keeps a partner without endpoints; the contract rides along as two
    uncorrelated scalar subqueries (evaluated once).
    """
    rows = session.connection().execute(
        _TARGETS_SQL, {"uid": partner_uid, "type_name": type_, "type_version": version}).all()
    if not rows:
        raise NotFound(f"partner {partner_uid!r} does not exist", details={"uid": partner_uid})
    first = rows[0]
    return _Targets(
        partner_id=first[0],
        endpoints=[(row[1], row[2], row[3]) for row in rows if row[1] is not None],
        contract=contracts.contract_from(session, first[4], first[5], type_, version))


def publish(session: Session, redis_client: redis.Redis, settings: Settings, *,
            partner_uid: str, body: dict[str, Any], api_key_id: str,
            idempotency_key: str | None = None, now: datetime | None = None) -> PublishResult:
    """Validate and write one event with its deliveries; enqueue them once the caller commits.

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
        stored = _stored_response(session, api_key_id, key, digest, now)
        if stored is not None:
            return stored

    req = parse_request(body)
    targets = _targets(session, partner_uid, req.type, req.version)
    partner_id, endpoints, contract = targets.partner_id, targets.endpoints, targets.contract
    if contract is None:
        raise ValidationFailed(f"unknown event type {req.type} v{req.version}",
                               code="unknown_event_type",
                               details={"type": req.type, "version": req.version})
    errors = contracts.data_errors(contract.validator, req.data)
    if errors:
        raise ValidationFailed(f"data does not match the schema of {req.type} v{req.version}",
                               code="schema_validation_failed", details=errors)

    event_id = new_id("evt")
    occurred_at = req.occurred_at or now
    payload = payload_json(event_id, req, partner_uid, occurred_at)
    resource = req.resource or {}
    event_values = {
        "id": event_id, "partner_id": partner_id, "type": req.type, "version": req.version,
        "data": req.data, "payload": payload, "occurred_at": occurred_at,
        "resource_type": resource.get("type"), "resource_id": resource.get("id"),
        "resource_version": resource.get("version"), "correlation_id": req.correlation_id,
        "created_at": now,
    }
    pending_rows: list[dict[str, Any]] = []
    parked: list[tuple[str, str]] = []
    answer: list[dict[str, str]] = []
    for endpoint_id, state, subscribed in endpoints:
        if subscribed is not None and req.type not in subscribed:
            continue
        delivery_id = new_id("dlv")
        if state == "enabled":
            pending_rows.append({"id": delivery_id, "event_id": event_id,
                                 "endpoint_id": endpoint_id, "state": PENDING,
                                 "attempt_count": 0, "run_attempts": 0, "run": 1,
                                 "next_attempt_at": now, "created_at": now, "updated_at": now})
            answer.append({"id": delivery_id, "endpoint": endpoint_id, "state": PENDING})
        else:
            parked.append((delivery_id, endpoint_id))
            answer.append({"id": delivery_id, "endpoint": endpoint_id, "state": DEAD})

    warnings = []
    if contract.deprecated:
        warnings.append({"code": "deprecated_event_type",
                         "message": f"{req.type} v{req.version} is deprecated; "
                                    "publish a newer version"})
    response = {"id": event_id, "type": req.type, "version": req.version,
                "deliveries": answer, "warnings": warnings}

    if key is not None:
        # First write of the transaction: a concurrent twin blocks here on the unique index
        # (PostgreSQL) or never gets this far (SQLite's single writer), before doing any work.
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text(f"SET LOCAL lock_timeout = {int(IN_FLIGHT_WAIT_MS)}"))
        try:
            with session.begin_nested():
                session.execute(insert(_IDEMPOTENCY), [{
                    "id": new_id("idk"), "api_key_id": api_key_id, "key": key,
                    "request_hash": digest, "response_status": ACCEPTED,
                    "response_body": response, "event_id": event_id, "created_at": now,
                    "expires_at": now + timedelta(seconds=settings.idempotency_ttl_seconds)}])
        except (IntegrityError, OperationalError) as exc:
            if not (_lock_timed_out(exc) or _unique_violation(exc)):
                raise
            stored = _stored_response(session, api_key_id, key, digest, now)
            if stored is not None:
                return stored
            raise Conflict("a request with this Idempotency-Key is still in flight; retry",
                           code="idempotency_key_in_flight",
                           details={"idempotency_key": key}) from None

    _insert_event_and_deliveries(session, event_values, pending_rows)
    if parked:
        _park_for_disabled(session, Event(**event_values), parked, now)
    enqueued = [row["id"] for row in pending_rows]
    enqueue_after_commit(session, redis_client, enqueued)
    log.debug("event published", extra={"event_id": event_id, "partner": partner_uid,
                                        "event_type": req.type, "deliveries": len(answer),
                                        "correlation_id": req.correlation_id})
    return PublishResult(status=ACCEPTED, body=response, enqueued=enqueued)


def _insert_event_and_deliveries(session: Session, event_values: dict[str, Any],
                                 rows: list[dict[str, Any]]) -> None:
    """Write the event and its deliveries; on PostgreSQL the event and the first delivery
    go in one statement, the rest of a fan-out as one executemany (psycopg pipelines it).
    """
    connection = session.connection()
    if rows and connection.dialect.name == "postgresql":
        params = {f"e_{name}": event_values.get(name) for name in _EVENT_COLUMNS}
        params["d_id"], params["d_endpoint_id"] = rows[0]["id"], rows[0]["endpoint_id"]
        connection.execute(_EVENT_WITH_DELIVERY_SQL, params)
        if len(rows) > 1:
            connection.execute(_DELIVERY_SQL, rows[1:])
        return
    connection.execute(_EVENT_SQL, [event_values])
    if rows:
        connection.execute(_DELIVERY_SQL, rows)


def _lock_timed_out(exc: Exception) -> bool:
    return isinstance(exc, OperationalError) and (
        getattr(exc.orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE)


def _unique_violation(exc: Exception) -> bool:
    if not isinstance(exc, IntegrityError):
        return False
    return (getattr(exc.orig, "sqlstate", None) == _PG_UNIQUE_VIOLATION
            or "UNIQUE constraint failed" in str(exc.orig))


def _park_for_disabled(session: Session, event: Event, parked: list[tuple[str, str]],
                       now: datetime) -> None:
    """A disabled endpoint's new events become dead letters at once (SPEC §5), resendable."""
    endpoints = {e.id: e for e in session.scalars(
        select(Endpoint).where(Endpoint.id.in_([endpoint_id for _, endpoint_id in parked])))}
    for delivery_id, endpoint_id in parked:
        delivery = Delivery(id=delivery_id, event_id=event.id, endpoint_id=endpoint_id,
                            state=DEAD, attempt_count=0, run_attempts=0, run=1,
                            created_at=now, updated_at=now)
        session.add(delivery)
        park(session, delivery, event, endpoints[endpoint_id], REASON_ENDPOINT_DISABLED)
