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

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import redis
from sqlalchemy import Connection, Table, delete, insert, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from app import event_types, telemetry
from app.clock import isoformat, parse_rfc3339, utcnow
from app.config import Settings
from app.db import Database
from app.errors import BadRequest, Conflict, NotFound, ValidationFailed
from app.ids import new_id
from app.intake import sql
from app.models import DEAD, PENDING, Delivery, Endpoint, Event, IdempotencyKey
from app.queues import enqueue_after_commit
from app.vocabulary import DeadLetterReason, EndpointMode, EndpointState, Ordering
from sender import ordering
from sender.dispatch import enqueue_now, job_specs
from sender.park import park

log = logging.getLogger(__name__)

PUBLISH_FIELDS = frozenset(
    {
        "type",
        "version",
        "data",
        "occurred_at",
        "resource",
        "correlation_id",
        "renditions",
        "ordering_key",
    }
)
RESOURCE_FIELDS = frozenset({"type", "id", "version"})
MAX_IDEMPOTENCY_KEY = 255
MAX_TEXT = 200
MAX_BIGINT = 2**63 - 1
ACCEPTED = 202
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
    # The same event in other versions, as the publisher wrote them (they win over downgrades).
    renditions: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Events of one key reach ordered endpoints in publish-commit order (sender.ordering).
    ordering_key: str | None = None


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
        raise _invalid(
            field_, f"{field_} must be a non-empty string of at most {MAX_TEXT} characters"
        )
    return value


def _int(value: Any, field_: str, minimum: int, maximum: int = MAX_BIGINT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (minimum <= value <= maximum):
        raise _invalid(field_, f"{field_} must be an integer from {minimum} to {maximum}")
    return value


def parse_request(body: dict[str, Any]) -> PublishRequest:
    """Check the envelope (not yet `data`, which the contract judges).

    Raises:
        ValidationFailed: an unknown, missing or malformed field.
    """
    unknown = sorted(set(body) - PUBLISH_FIELDS)
    if unknown:
        raise ValidationFailed(
            f"unknown field(s): {', '.join(unknown)}",
            code="unknown_field",
            details={"fields": unknown},
        )
    type_ = str(_text(body.get("type"), "type", required=True))
    if "version" not in body:
        raise _invalid("version", "version is required")
    # A contract version is an int4, like the registry's (app.event_types.MAX_VERSION).
    version = _int(body["version"], "version", 1, event_types.MAX_VERSION)
    if "data" not in body or not isinstance(body["data"], dict):
        raise _invalid("data", "data is required and must be a JSON object")
    occurred_at = None
    raw_time = body.get("occurred_at")
    if raw_time is not None:
        if not isinstance(raw_time, str):
            raise _invalid("occurred_at", "occurred_at must be an RFC 3339 timestamp")
        try:
            occurred_at = parse_rfc3339(raw_time)
        except ValueError:
            raise _invalid("occurred_at", "occurred_at must be an RFC 3339 timestamp") from None
    resource = body.get("resource")
    if resource is not None:
        if not isinstance(resource, dict):
            raise _invalid("resource", "resource must be an object {type, id, version?}")
        extra = sorted(set(resource) - RESOURCE_FIELDS)
        if extra:
            raise ValidationFailed(
                f"unknown resource field(s): {', '.join(extra)}",
                code="unknown_field",
                details={"fields": extra},
            )
        version_ = resource.get("version")
        resource = {
            "type": _text(resource.get("type"), "resource.type", required=True),
            "id": _text(resource.get("id"), "resource.id", required=True),
            "version": None if version_ is None else _int(version_, "resource.version", 0),
        }
    correlation_id = _text(body.get("correlation_id"), "correlation_id", required=False)
    renditions = _renditions(body.get("renditions"), version)
    return PublishRequest(
        type_,
        version,
        body["data"],
        occurred_at,
        resource,
        correlation_id,
        renditions,
        _ordering_key(body, resource),
    )


def _ordering_key(body: dict[str, Any], resource: dict[str, Any] | None) -> str | None:
    """The key given, none when it is given as null, else the resource's `type:id`."""
    if "ordering_key" not in body:
        return ordering.default_key(resource)
    key = body["ordering_key"]
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > ordering.MAX_ORDERING_KEY:
        raise _invalid(
            "ordering_key",
            "ordering_key must be null or a non-empty string of at "
            f"most {ordering.MAX_ORDERING_KEY} characters",
        )
    return key


def _renditions(raw: Any, published: int) -> dict[int, dict[str, Any]]:
    """`{"1": {...data of v1...}}`: versions as decimal strings (JSON keys), data objects."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _invalid("renditions", 'renditions must be an object {"<version>": {data}}')
    found: dict[int, dict[str, Any]] = {}
    for key, data in raw.items():
        if not key.isdigit() or not 1 <= int(key) <= MAX_BIGINT or str(int(key)) != key:
            raise _invalid("renditions", f"renditions key {key!r} is not a version number")
        if int(key) == published:
            raise _invalid("renditions", f"version {key} is the one published in data")
        if not isinstance(data, dict):
            raise _invalid("renditions", f"renditions[{key}] must be a JSON object")
        found[int(key)] = data
    return found


def request_hash(partner_uid: str, body: dict[str, Any]) -> str:
    """Same key + same (canonical) body + same partner is a retry; anything else is reuse."""
    material = partner_uid + "\n" + event_types.canonical_json(body)
    return hashlib.sha256(material.encode()).hexdigest()


def check_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY:
        raise BadRequest(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters",
            code="invalid_idempotency_key",
        )
    return key


def payload_json(
    event_id: str,
    req: PublishRequest,
    partner_uid: str,
    occurred_at: datetime,
    version: int | None = None,
    data: dict[str, Any] | None = None,
) -> str:
    """The exact body every attempt (and every resend) of this event sends, in the published
    version or in `version` with its `data`."""
    body = {
        "id": event_id,
        "type": req.type,
        "version": req.version if version is None else version,
        "occurred_at": isoformat(occurred_at),
        "partner": partner_uid,
        "resource": req.resource,
        "correlation_id": req.correlation_id,
        "data": req.data if data is None else data,
    }
    # json escapes every control character even with ensure_ascii=False, so no raw NUL
    # reaches PostgreSQL text, and non-ASCII stays searchable in dead letters.
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def _stored_response(
    session: Session, api_key_id: str, key: str, digest: str, now: datetime
) -> PublishResult | None:
    row = session.execute(
        select(
            IdempotencyKey.request_hash,
            IdempotencyKey.response_status,
            IdempotencyKey.response_body,
            IdempotencyKey.expires_at,
            IdempotencyKey.id,
        ).where(IdempotencyKey.api_key_id == api_key_id, IdempotencyKey.key == key)
    ).first()
    if row is None:
        return None
    stored_hash, status, body, expires_at, row_id = row
    if expires_at <= now:
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.id == row_id))
        return None
    if stored_hash != digest:
        raise ValidationFailed(
            "this Idempotency-Key was already used for a different request (another body or "
            "another partner)",
            code="idempotency_key_reused",
            details={"idempotency_key": key},
        )
    return PublishResult(status=status, body=body, replayed=True)


_IDEMPOTENCY = cast(Table, IdempotencyKey.__table__)


@dataclass(frozen=True)
class _Targets:
    """What a publish plan is made from; `digest` (PostgreSQL) fingerprints the endpoints."""

    partner_id: str
    # (endpoint id, state, subscribed types or None, pinned versions or None, mode)
    endpoints: list[tuple[str, str, list[str] | None, dict[str, Any] | None, str]]
    contract: event_types.Contract | None
    digest: str | None = None
    sunset_at: datetime | None = None
    # The endpoints with `ordering: "key"`.
    ordered: frozenset[str] = frozenset()


def _targets(
    connection: Connection, partner_uid: str, type_: str, version: int, *, with_digest: bool = False
) -> _Targets:
    """The partner, its live endpoints and the contract, in one round trip; `with_digest`
    (PostgreSQL only) adds the endpoints' digest a guarded write checks.

    Raises:
        NotFound: the partner does not exist.
    """
    statement = sql.TARGETS_WITH_DIGEST if with_digest else sql.TARGETS
    rows = connection.execute(
        statement, {"uid": partner_uid, "type_name": type_, "type_version": version}
    ).all()
    if not rows:
        raise NotFound(f"partner {partner_uid!r} does not exist", details={"uid": partner_uid})
    first = rows[0]
    return _Targets(
        partner_id=first.partner_id,
        endpoints=[
            (row.endpoint_id, row.state, row.event_types, row.versions, row.mode)
            for row in rows
            if row.endpoint_id is not None
        ],
        contract=event_types.contract_from(
            connection, first.contract_id, first.deprecated, type_, version
        ),
        digest=first.digest if with_digest else None,
        sunset_at=first.sunset_at,
        ordered=frozenset(row.endpoint_id for row in rows if row.ordering == Ordering.KEY),
    )


# Bound of the targets cache, in endpoints held: at the bound it is emptied and each
# (partner, type, version) read again on its next publish.
TARGETS_CACHE_MAX_ENDPOINTS = 100_000


class _TargetsCache:
    """Recent targets per (partner uid, type, version), for the PostgreSQL hot path.

    An entry may be stale: the write it feeds re-checks the endpoints' digest in the same
    statement and writes nothing if they changed, and the entry is then dropped. The contract
    (row id and compiled schema) never changes once published. Bounded by the endpoints it
    holds, since one partner may have thousands.
    """

    def __init__(self, max_endpoints: int = TARGETS_CACHE_MAX_ENDPOINTS) -> None:
        self._items: dict[tuple[str, str, int], _Targets] = {}
        self._held = 0
        self._lock = threading.Lock()
        self._max = max_endpoints

    def get(self, key: tuple[str, str, int]) -> _Targets | None:
        return self._items.get(key)

    def put(self, key: tuple[str, str, int], targets: _Targets) -> None:
        with self._lock:
            if self._held + len(targets.endpoints) + 1 > self._max:
                self._items.clear()
                self._held = 0
            old = self._items.pop(key, None)
            if old is not None:
                self._held -= len(old.endpoints) + 1
            self._items[key] = targets
            self._held += len(targets.endpoints) + 1

    def drop(self, key: tuple[str, str, int]) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._held -= len(old.endpoints) + 1


_targets_cache = _TargetsCache()


Planned = tuple[str, str, int | None]  # (delivery id, endpoint id, version unless published)


@dataclass
class _Plan:
    """One validated publish, ready to write: the event row and what each endpoint gets."""

    event_values: dict[str, Any]
    pending: list[Planned]  # to send
    parked: list[Planned]  # for disabled endpoints
    response: dict[str, Any]
    # The event in other versions (event_versions rows): what pinned endpoints receive, and
    # every rendition the publisher sent.
    versions: list[dict[str, Any]] = field(default_factory=list)
    # Ordered endpoints this event goes to under its ordering key: numbered at write time.
    ordered: list[str] = field(default_factory=list)

    @property
    def enqueued(self) -> list[str]:
        return [delivery_id for delivery_id, _, _ in self.pending]

    @property
    def versioned(self) -> bool:
        return bool(self.versions)


def _contract_of(targets: _Targets, req: PublishRequest) -> event_types.Contract:
    if targets.contract is None:
        raise ValidationFailed(
            f"unknown event type {req.type} v{req.version}",
            code="unknown_event_type",
            details={"type": req.type, "version": req.version},
        )
    return targets.contract


def deprecation_warning(
    type_: str, version: int, sunset_at: datetime | None, endpoints: list[str]
) -> dict[str, Any]:
    """What a publish answers when it sends a deprecated version (published, or pinned)."""
    message = f"{type_} v{version} is deprecated"
    if sunset_at is not None:
        message += f"; its sunset is {isoformat(sunset_at)}"
    if endpoints:
        message += f"; endpoints still on it: {', '.join(endpoints)}"
    return {
        "code": "deprecated_event_type",
        "message": message + "; publish a newer version",
        "type": type_,
        "version": version,
        "sunset_at": isoformat(sunset_at),
        "endpoints": endpoints,
    }


def _warnings(
    req: PublishRequest, deprecated: bool, sunset_at: datetime | None = None
) -> list[dict[str, Any]]:
    if not deprecated:
        return []
    return [deprecation_warning(req.type, req.version, sunset_at, [])]


VersionsLoader = Callable[[str], dict[int, event_types.Version]]


def _wanted_versions(targets: _Targets, req: PublishRequest) -> dict[str, int]:
    """Endpoint id -> the version it is pinned to, for the subscribed endpoints with a pin
    on this type other than the published version."""
    wanted: dict[str, int] = {}
    for endpoint_id, _, subscribed, pins, _mode in targets.endpoints:
        if subscribed is not None and req.type not in subscribed:
            continue
        pinned = (pins or {}).get(req.type)
        if pinned is not None and pinned != req.version:
            wanted[endpoint_id] = int(pinned)
    return wanted


def _produce(
    req: PublishRequest,
    wanted: dict[str, int],
    versions: dict[int, event_types.Version],
    max_bytes: int,
) -> dict[int, tuple[dict[str, Any], str]]:
    """Every version pinned endpoints need, or the 422 that says which cannot be had."""
    try:
        return event_types.produce(
            versions,
            req.version,
            req.data,
            req.renditions,
            set(wanted.values()),
            max_bytes=max_bytes,
        )
    except event_types.VersionTooLarge as exc:
        what = (
            f"JSON larger than {exc.limit} bytes"
            if exc.reason == "bytes"
            else f"more than {exc.limit} units of work"
        )
        raise ValidationFailed(
            f"{req.type} v{exc.version} would take {what} to make from v{req.version} "
            "(KURIR_MAX_PAYLOAD_BYTES bounds every version made); send it as a rendition",
            code="version_too_large",
            details={"version": exc.version, "reason": exc.reason, "limit": exc.limit},
        ) from None
    except event_types.VersionInvalid as exc:
        raise ValidationFailed(
            f"{req.type} v{exc.version} made by {exc.source} does not match its schema",
            code="version_invalid",
            details={"version": exc.version, "source": exc.source, "errors": exc.errors},
        ) from None
    except event_types.VersionUnavailable:
        # Which pins cannot be served is structure alone: nothing is run again per endpoint.
        reach = event_types.reachable(
            {v: row.downgrade is not None for v, row in versions.items()},
            req.version,
            set(req.renditions) & set(versions),
        )
        missing = [
            {"endpoint": endpoint_id, "version": version}
            for endpoint_id, version in sorted(wanted.items())
            if version not in reach
        ]
        unknown = sorted(set(req.renditions) - set(versions))
        if unknown and not missing:
            raise ValidationFailed(
                f"renditions name version(s) of {req.type} that are not registered: "
                f"{', '.join(map(str, unknown))}",
                code="unknown_event_type",
                details={"type": req.type, "versions": unknown},
            ) from None
        raise ValidationFailed(
            f"{req.type} v{req.version} cannot be turned into the version(s) some endpoints "
            "are pinned to (no rendition, no chain of at most "
            f"{event_types.MAX_DOWNGRADE_HOPS} downgrades, and never upwards): "
            + ", ".join(f"{m['endpoint']} needs v{m['version']}" for m in missing),
            code="version_unavailable",
            details={"endpoints": missing},
        ) from None


def _plan(
    targets: _Targets,
    req: PublishRequest,
    partner_uid: str,
    now: datetime,
    load_versions: VersionsLoader,
    *,
    max_bytes: int,
) -> _Plan:
    """Judge `data` by its contract, make the versions pinned endpoints need (each at most
    `max_bytes` of JSON), and lay out the rows to write. Without pins or renditions no other
    version is looked at."""
    contract = _contract_of(targets, req)
    errors = event_types.data_errors(contract.validator, req.data)
    if errors:
        raise ValidationFailed(
            f"data does not match the schema of {req.type} v{req.version}",
            code="schema_validation_failed",
            details=errors,
        )
    wanted = _wanted_versions(targets, req)
    made: dict[int, tuple[dict[str, Any], str]] = {}
    family: dict[int, event_types.Version] = {}
    if wanted or req.renditions:
        family = load_versions(req.type)
        made = _produce(req, wanted, family, max_bytes)

    event_id = new_id("evt")
    occurred_at = req.occurred_at or now
    resource = req.resource or {}
    event_values = {
        "id": event_id,
        "partner_id": targets.partner_id,
        "type": req.type,
        "version": req.version,
        "data": req.data,
        "payload": payload_json(event_id, req, partner_uid, occurred_at),
        "occurred_at": occurred_at,
        "resource_type": resource.get("type"),
        "resource_id": resource.get("id"),
        "resource_version": resource.get("version"),
        "correlation_id": req.correlation_id,
        "ordering_key": req.ordering_key,
        "created_at": now,
        # The publish span's context (None while tracing is off): attempts join its trace.
        "trace_context": telemetry.traceparent(),
    }
    pending: list[Planned] = []
    parked: list[Planned] = []
    answer: list[dict[str, Any]] = []
    for endpoint_id, state, subscribed, _, mode in targets.endpoints:
        if subscribed is not None and req.type not in subscribed:
            continue
        if mode == EndpointMode.PULL:
            # Nothing is pushed to a pull endpoint: it reads the feed. Its pin still counts
            # above, so the version it wants is stored with the event.
            continue
        delivery_id = new_id("dlv")
        enabled = state == EndpointState.ENABLED
        version = wanted.get(endpoint_id)
        (pending if enabled else parked).append((delivery_id, endpoint_id, version))
        answer.append(
            {
                "id": delivery_id,
                "endpoint": endpoint_id,
                "state": PENDING if enabled else DEAD,
                "version": req.version if version is None else version,
            }
        )
    versions = [
        {
            "event_id": event_id,
            "version": version,
            "data": data,
            "source": source,
            "payload": payload_json(event_id, req, partner_uid, occurred_at, version, data),
        }
        for version, (data, source) in sorted(made.items())
    ]
    warnings = (
        _warnings(req, contract.deprecated, targets.sunset_at)
        if not family
        else [
            deprecation_warning(
                req.type,
                number,
                family[number].sunset_at,
                sorted(e for e, v in wanted.items() if v == number),
            )
            for number in sorted({req.version, *wanted.values()}, reverse=True)
            if family[number].deprecated
        ]
    )
    response = {
        "id": event_id,
        "type": req.type,
        "version": req.version,
        "deliveries": answer,
        "warnings": warnings,
    }
    ordered = (
        []
        if req.ordering_key is None
        else [
            endpoint_id for _, endpoint_id, _ in pending + parked if endpoint_id in targets.ordered
        ]
    )
    return _Plan(event_values, pending, parked, response, versions, ordered)


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
    with db.autocommit() as connection:
        targets = _targets_cache.get(key)
        from_cache = targets is not None
        while True:
            if targets is None:
                targets = _targets(connection, partner_uid, req.type, req.version, with_digest=True)
                if targets.contract is not None:
                    _targets_cache.put(key, targets)
            if req.renditions or _wanted_versions(targets, req):
                return None  # other versions to make and store: a transaction
            # No version is made here (the return above), so no size budget is needed.
            plan = _plan(targets, req, partner_uid, now, _no_versions, max_bytes=0)
            if plan.parked or plan.ordered:
                # Dead letters and audit rows, or sequence numbers, take a transaction.
                return None
            params = sql.event_params(plan.event_values, plan.pending)
            params["digest"] = targets.digest
            params["type_id"] = _contract_of(targets, req).id
            written, deprecated, sunset_at = connection.execute(
                sql.GUARDED_EVENT_WITH_DELIVERIES, params
            ).one()
            if written:
                plan.response["warnings"] = _warnings(req, bool(deprecated), sunset_at)
                _log_published(plan, partner_uid)
                return PublishResult(status=ACCEPTED, body=plan.response, enqueued=plan.enqueued)
            # The endpoints changed since the plan was made: nothing was written.
            _targets_cache.drop(key)
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
        stored = _stored_response(session, api_key_id, key, digest, now)
        if stored is not None:
            return stored

    req = parse_request(body)
    connection = session.connection()
    plan = _plan(
        _targets(connection, partner_uid, req.type, req.version),
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
                    insert(_IDEMPOTENCY),
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
            if not (_lock_timed_out(exc) or _unique_violation(exc)):
                raise
            stored = _stored_response(session, api_key_id, key, digest, now)
            if stored is not None:
                return stored
            raise Conflict(
                "a request with this Idempotency-Key is still in flight; retry",
                code="idempotency_key_in_flight",
                details={"idempotency_key": key},
            ) from None

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
    if plan.parked:
        _park_for_disabled(session, Event(**plan.event_values), plan.parked, now, places)
    enqueue_after_commit(session, redis_client, job_specs(plan.enqueued))
    _log_published(plan, partner_uid)
    return PublishResult(status=ACCEPTED, body=plan.response, enqueued=plan.enqueued)


def _log_published(plan: _Plan, partner_uid: str) -> None:
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


def _place_values(place: ordering.Place | None, key: str | None) -> dict[str, Any]:
    """A delivery's ordering columns: all None when it is not numbered."""
    if place is None:
        return {"ordering_key": None, "ordering_seq": None, "previous_event_id": None}
    return {
        "ordering_key": key,
        "ordering_seq": place.sequence,
        "previous_event_id": place.previous_event_id,
    }


def _lock_timed_out(exc: Exception) -> bool:
    return isinstance(exc, OperationalError) and (
        getattr(exc.orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE
    )


def _unique_violation(exc: Exception) -> bool:
    if not isinstance(exc, IntegrityError):
        return False
    return getattr(
        exc.orig, "sqlstate", None
    ) == _PG_UNIQUE_VIOLATION or "UNIQUE constraint failed" in str(exc.orig)


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
