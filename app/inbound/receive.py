"""Receiving a callback: verify the raw bytes, store, then answer.

The order is the guarantee:

1. the size is checked, then the signature over the body *exactly as received*, before any
   parsing: a forged or replayed request is refused with nothing stored (401);
2. the body is parsed and the source's field mapping applied; a genuine but unusable body
   is refused (400) and kept as a ``failed`` row, so an operator can see what the partner sent;
3. the event is inserted, unique on (source, event id), with status ``received``; a duplicate
   answers 200 and is not processed again;
4. only after the commit is processing enqueued, and only then is 202 returned. A database
   that cannot be reached answers 503, so the partner retries, and nothing is half-stored.

Redis being down does not fail the request: the event is committed, and the inbound sweeper
(:func:`app.inbound.process.sweep`) enqueues every event left ``received``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from app import headers as header_rules
from app import jsonstrict, telemetry
from app.clock import utcnow
from app.db import Database
from app.errors import BadRequest, PayloadTooLarge, Unauthorized, Unavailable
from app.ids import new_id
from app.inbound import mapping as field_mapping
from app.inbound.process import process_jobs
from app.inbound.sources import VerificationConfig, verification_config
from app.inbound.verify import SignatureError, verify
from app.models import InboundEvent
from app.queues import try_enqueue_many
from app.runtime import Runtime
from app.vocabulary import InboundStatus

log = logging.getLogger(__name__)
# Core table for the conditional statements (typed as a Table for mypy).
_EVENTS = cast(Table, InboundEvent.__table__)

REQUIRED_FIELDS = ("event_id", "event_type")
# Column widths of inbound_events: longer values are refused, not truncated or 5xx'd.
_TEXT_LIMITS = {
    "event_id": 255,
    "event_type": 200,
    "resource_id": 255,
    "resource_type": 200,
    "status": 200,
}
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Receipt:
    """What the receiver answers: 202 stored now, 200 already stored."""

    status_code: int
    inbound_event_id: str
    event_status: str
    duplicate: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.inbound_event_id,
            "status": self.event_status,
            "duplicate": self.duplicate,
        }


class StoreUnavailable(Unavailable):
    """The event could not be stored; the partner should retry (503 + Retry-After)."""

    def __init__(self, message: str = "the inbound store is unavailable; retry later") -> None:
        super().__init__(
            message, code="store_unavailable", details={"retry_after_s": RETRY_AFTER_S}
        )


def headers_for_storage(
    headers: Sequence[tuple[str, str]], scheme: str | None = None
) -> dict[str, Any]:
    """Headers as {lower-case name: value}, a repeated header as a list of its values.

    The caller's credentials and the scheme's signature are kept by name only (see
    `app.headers`): whoever reads stored events must not be able to replay or impersonate.
    """
    redacted = header_rules.inbound_redacted(scheme)
    stored: dict[str, Any] = {}
    for name, value in headers:
        key = name.lower()
        if key in redacted:
            value = header_rules.REDACTED
        if key in stored:
            previous = stored[key]
            stored[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            stored[key] = value
    return stored


def headers_from_storage(stored: dict[str, Any]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for name, value in (stored or {}).items():
        for item in value if isinstance(value, list) else [value]:
            pairs.append((name, str(item)))
    return pairs


def synthetic_event_id(body: bytes) -> str:
    """The id of an unusable body: the same bad body sent again dedupes to the same row."""
    return "invalid:" + hashlib.sha256(body).hexdigest()


def parse_and_extract(
    config_mapping: field_mapping.FieldMapping, headers: Sequence[tuple[str, str]], body: bytes
) -> field_mapping.Extracted:
    """JSON-decode and map a verified body; every refusal is a MappingError with a reason.

    Raises:
        field_mapping.MappingError: not strict JSON (:mod:`app.jsonstrict`: no NaN, no lone
            surrogate), a field of the wrong kind, a required field missing, or a value that
            does not fit its column.
    """
    try:
        document = jsonstrict.loads(body)
    except jsonstrict.InvalidJSON as exc:
        raise field_mapping.MappingError(f"invalid_json: {exc}") from None
    extracted = field_mapping.extract(config_mapping, headers, document)
    check_fits(extracted)
    field_mapping.require(extracted, REQUIRED_FIELDS)
    if (
        extracted.resource_id is not None
        and extracted.resource_version is None
        and extracted.occurred_at is None
    ):
        raise field_mapping.MappingError(
            "missing field(s): resource_version or occurred_at (needed to order events of "
            f"resource {extracted.resource_id[:60]!r})"
        )
    return extracted


def check_fits(extracted: field_mapping.Extracted) -> None:
    """PostgreSQL refuses NUL in text and over-long varchars: refuse them here, as a 400."""
    for name, limit in _TEXT_LIMITS.items():
        value = getattr(extracted, name)
        if value is None:
            continue
        if "\x00" in value:
            raise field_mapping.MappingError(f"{name} contains a NUL character")
        if len(value) > limit:
            raise field_mapping.MappingError(f"{name} is longer than {limit} characters")


def receive(
    runtime: Runtime,
    source_name: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    *,
    now: float | None = None,
) -> Receipt:
    """Verify, store and enqueue one callback.

    With tracing on, this is the `kurir.inbound.receive` span, a child of the caller's
    `traceparent`; the stored event keeps its context, which the apply span joins.

    Args:
        headers: the raw (name, value) pairs as received.
        body: the raw request body.
        now: Unix seconds for the timestamp tolerance (the wall clock by default).

    Raises:
        PayloadTooLarge: the body exceeds KURIR_MAX_PAYLOAD_BYTES (413).
        NotFound: no such source (404).
        Unauthorized: the signature does not verify (401, code ``invalid_signature``).
        BadRequest: a genuine body that cannot be used (400, code ``invalid_payload``);
            it has been stored as a ``failed`` row.
        StoreUnavailable: the database cannot be reached (503).
    """
    with telemetry.span(
        "kurir.inbound.receive",
        parent=telemetry.header_value(headers),
        kind=telemetry.SERVER,
        attributes={"kurir.inbound.source": source_name},
    ) as span:
        receipt = _receive(runtime, source_name, headers, body, now, telemetry.traceparent())
        if span.is_recording():
            span.set_attributes(
                {
                    "kurir.inbound.event.id": receipt.inbound_event_id,
                    "kurir.inbound.duplicate": receipt.duplicate,
                    "http.response.status_code": receipt.status_code,
                }
            )
        return receipt


def _receive(
    runtime: Runtime,
    source_name: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    now: float | None,
    trace_context: str | None,
) -> Receipt:
    limit = runtime.settings.max_payload_bytes
    if len(body) > limit:
        raise PayloadTooLarge.over(limit)
    try:
        config = verification_config(runtime.db.Session, runtime.secret_box, source_name)
    except SQLAlchemyError as exc:
        log.warning(
            "inbound store unreachable reading source %s: %s", source_name, type(exc).__name__
        )
        raise StoreUnavailable() from None
    try:
        verify(
            config.scheme,
            config.secrets,
            headers,
            body,
            time.time() if now is None else now,
            config.tolerance_s,
        )
    except SignatureError as exc:
        log.info("inbound signature refused", extra={"source": source_name, "reason": exc.reason})
        raise Unauthorized(
            f"signature verification failed: {exc}",
            code="invalid_signature",
            details={"reason": exc.reason},
        ) from None
    stored_headers = headers_for_storage(headers, config.scheme)
    try:
        extracted = parse_and_extract(config.mapping, headers, body)
    except field_mapping.MappingError as exc:
        raise _audit_unusable(runtime, config, body, stored_headers, headers, str(exc)) from None
    values = _row_values(config, extracted, body, stored_headers, trace_context)
    try:
        if runtime.db.is_postgres:
            receipt = _store_direct(runtime.db, config, values)
        else:
            # A Core connection, not an ORM session: one INSERT and a commit.
            with runtime.db.engine.begin() as connection:
                receipt = _store(connection, config, values)
    except SQLAlchemyError as exc:
        log.warning(
            "inbound store unreachable, answering 503",
            extra={"source": source_name, "error": type(exc).__name__},
        )
        raise StoreUnavailable() from None
    if not receipt.duplicate:
        # Committed: now a worker may see it. Redis down is survivable (the sweeper resends).
        try_enqueue_many(runtime.redis, process_jobs([receipt.inbound_event_id]))
    return receipt


# Built once: the values travel as parameters, so SQLAlchemy does not coerce them into a new
# statement (and a new cache key) on every callback.
_INSERTS = {
    name: maker(_EVENTS)
    .on_conflict_do_nothing(index_elements=["source_id", "event_id"])
    .returning(_EVENTS.c.id)
    for name, maker in (("postgresql", pg_insert), ("sqlite", sqlite_insert))
}


# PostgreSQL's hot path: every column a parameter (the defaults filled in by
# `_store_direct`), run on the driver in autocommit (app.db_direct): the INSERT is the whole
# transaction, one round trip where BEGIN, INSERT, COMMIT were three.
_DIRECT_INSERT = (
    pg_insert(_EVENTS)
    .values({c.name: bindparam(f"v_{c.name}", type_=c.type) for c in _EVENTS.columns})
    .on_conflict_do_nothing(index_elements=["source_id", "event_id"])
    .returning(_EVENTS.c.id)
)
_NO_VALUES: dict[str, Any] = {f"v_{c.name}": None for c in _EVENTS.columns}


def _insert(connection: Connection, values: dict[str, Any]) -> str | None:
    """INSERT … ON CONFLICT (source, event id) DO NOTHING RETURNING id: None for a duplicate."""
    return connection.execute(_INSERTS[connection.dialect.name], values).scalar_one_or_none()


def _existing(connection: Connection, source_id: str, event_id: str) -> tuple[str, str]:
    row = connection.execute(
        select(_EVENTS.c.id, _EVENTS.c.status).where(
            _EVENTS.c.source_id == source_id, _EVENTS.c.event_id == event_id
        )
    ).one()
    return row[0], row[1]


def _row_values(
    config: VerificationConfig,
    extracted: field_mapping.Extracted,
    body: bytes,
    stored_headers: dict[str, Any],
    trace_context: str | None,
) -> dict[str, Any]:
    """The inbound_events row of a verified, usable callback (defaults left out)."""
    assert extracted.event_id is not None  # noqa: S101 - checked by parse_and_extract
    values: dict[str, Any] = {
        "source_id": config.source_id,
        "event_id": extracted.event_id,
        "event_type": extracted.event_type,
        "resource_type": extracted.resource_type,
        "resource_id": extracted.resource_id,
        "resource_version": extracted.resource_version,
        "occurred_at": extracted.occurred_at,
        "resource_status": extracted.status,
        "status": InboundStatus.RECEIVED,
        "raw_body": body,
        "headers": stored_headers,
    }
    if trace_context is not None:
        # Only while tracing is on: the statement stays the one it always was when it is off.
        values["trace_context"] = trace_context
    return values


def _store(connection: Connection, config: VerificationConfig, values: dict[str, Any]) -> Receipt:
    row_id = _insert(connection, values)
    if row_id is None:
        return _duplicate(connection, config, values["event_id"])
    return Receipt(202, row_id, InboundStatus.RECEIVED, duplicate=False)


def _store_direct(db: Database, config: VerificationConfig, values: dict[str, Any]) -> Receipt:
    """`_store` on PostgreSQL: one autocommit statement (a duplicate reads the row after)."""
    now = utcnow()
    params = dict(_NO_VALUES)
    params.update({f"v_{name}": value for name, value in values.items()})
    params.update(v_id=new_id("ine"), v_attempts=0, v_received_at=now, v_updated_at=now)
    rows = db.direct(_DIRECT_INSERT).rows(params)
    if rows:
        return Receipt(202, rows[0][0], InboundStatus.RECEIVED, duplicate=False)
    with db.engine.connect() as connection:
        return _duplicate(connection, config, values["event_id"])


def _duplicate(connection: Connection, config: VerificationConfig, event_id: str) -> Receipt:
    existing_id, status = _existing(connection, config.source_id, event_id)
    return Receipt(200, existing_id, status, duplicate=True)


def _safe_fields(
    headers: Sequence[tuple[str, str]], body: bytes, config: VerificationConfig
) -> dict[str, Any]:
    """Whatever can still be read from an unusable body, for the audit row.

    Parsed leniently on purpose (the body was just refused as strict JSON, and its own event
    id is still worth keeping), so each value is checked again for what the row can hold.
    """
    try:
        document: object = json.loads(body)
    except (ValueError, RecursionError):
        document = None  # fields mapped to headers (a provider's delivery id) still count
    try:
        extracted = field_mapping.extract(config.mapping, headers, document)
    except (ValueError, RecursionError):  # MappingError is a ValueError
        try:
            extracted = field_mapping.extract(config.mapping, headers, None)
        except ValueError:
            return {}
    fields: dict[str, Any] = {}
    for name, column in (
        ("event_id", "event_id"),
        ("event_type", "event_type"),
        ("resource_id", "resource_id"),
        ("resource_type", "resource_type"),
        ("status", "resource_status"),
    ):
        value = getattr(extracted, name)
        if (
            value is not None
            and "\x00" not in value
            and len(value) <= _TEXT_LIMITS[name]
            and not jsonstrict.has_lone_surrogate(value)
        ):
            fields[column] = value
    if isinstance(extracted.resource_version, int):
        fields["resource_version"] = extracted.resource_version
    if isinstance(extracted.occurred_at, datetime):
        fields["occurred_at"] = extracted.occurred_at
    return fields


def _audit_unusable(
    runtime: Runtime,
    config: VerificationConfig,
    body: bytes,
    stored_headers: dict[str, Any],
    headers: Sequence[tuple[str, str]],
    reason: str,
) -> BadRequest:
    """Keep a genuine but unusable callback as a ``failed`` row; returns the 400 to raise."""
    fields = _safe_fields(headers, body, config)
    event_id = fields.pop("event_id", None) or synthetic_event_id(body)
    try:
        with runtime.db.engine.begin() as connection:
            row_id = _insert(
                connection,
                {
                    **fields,
                    "source_id": config.source_id,
                    "event_id": event_id,
                    "status": InboundStatus.FAILED,
                    "reason": f"invalid_payload: {reason}"[:2000],
                    "raw_body": body,
                    "headers": stored_headers,
                },
            )
            if row_id is None:
                row_id, _ = _existing(connection, config.source_id, event_id)
    except SQLAlchemyError as exc:
        # Answering 400 now would make the partner give up on a callback we never recorded.
        log.warning(
            "inbound store unreachable while auditing a bad payload: %s", type(exc).__name__
        )
        raise StoreUnavailable() from None
    log.warning(
        "inbound payload refused",
        extra={"source": config.name, "reason": reason, "inbound_event_id": row_id},
    )
    return BadRequest(
        f"the payload cannot be used: {reason}",
        code="invalid_payload",
        details={"reason": reason, "id": row_id},
    )
