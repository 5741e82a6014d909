"""The API's JSON shapes, in one place so every view (and the OpenAPI test) agrees."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app import headers as header_rules
from app.clock import isoformat
from app.models import ApiKey, Attempt, Delivery, Endpoint, Event, EventType, Partner
from app.services import endpoints as endpoint_service
from app.services import filters, verification
from app.services.audit import Shown
from app.services.deliveries import delivered_version
from app.services.endpoints import BlockedKey
from app.services.feed import Lag
from app.vocabulary import EndpointMode, EndpointState, SignatureKind


def event_type_json(row: EventType) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "version": row.version,
        "schema": row.schema,
        "description": row.description,
        "deprecated": bool(row.deprecated),
        "deprecated_at": isoformat(row.deprecated_at),
        "sunset_at": isoformat(row.sunset_at),
        "downgrade": row.downgrade,
        "examples": row.examples or [],
        "created_at": isoformat(row.created_at),
    }


def partner_json(partner: Partner) -> dict[str, Any]:
    return {
        "id": partner.id,
        "uid": partner.uid,
        "name": partner.name,
        "operational_events": partner.operational_events,
        "created_at": isoformat(partner.created_at),
        "updated_at": isoformat(partner.updated_at),
    }


def lag_json(lag: Lag, acked_at: datetime | None, now: datetime) -> dict[str, Any]:
    """A pull endpoint's backlog: events not acknowledged, the age of the oldest, and how
    many of them lie past retention (reads without a cursor answer 410 until skipped)."""
    oldest = lag.oldest_at
    return {
        "events": lag.events,
        "oldest_unacknowledged_at": isoformat(oldest),
        "oldest_unacknowledged_age_s": (
            None if oldest is None else round(max(0.0, (now - oldest).total_seconds()), 3)
        ),
        "acknowledged_at": isoformat(acked_at),
        "expired_events": lag.expired,
    }


def endpoint_json(
    endpoint: Endpoint,
    partner_uid: str,
    secret: str | None = None,
    lag: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`secret` is given only by create, rotate and GET …/secret (of an HMAC endpoint).

    Custom header values are write-only: `headers` names every header, with its value only
    when it is listed in `public_headers` (null otherwise; sending null back keeps it).
    An Ed25519 endpoint shows its public key (`public_key`), and every key that signs now
    (`public_keys`: after a rotation, the previous one until its overlap ends).
    """
    body: dict[str, Any] = {
        "id": endpoint.id,
        "partner": partner_uid,
        "url": header_rules.redact_url(endpoint.url) if endpoint.url else None,
        "mode": endpoint.mode or EndpointMode.PUSH.value,
        "event_types": endpoint.event_types,
        "description": endpoint.description,
        "headers": header_rules.redact_custom(endpoint.headers or {}, endpoint.public_headers),
        "public_headers": list(endpoint.public_headers or []),
        "versions": dict(endpoint.versions or {}),
        "timeout_s": endpoint.timeout_s,
        "rate_limit_per_s": endpoint.rate_limit_per_s,
        "ordering": endpoint.ordering or "none",
        "on_dead": endpoint.on_dead or "skip",
        "send_traceparent": bool(endpoint.send_traceparent),
        "filter": endpoint.filter,
        "signature": endpoint.signature or SignatureKind.HMAC.value,
        "public_key": None,
        "public_keys": [],
        "state": endpoint.state,
        "verify": bool(endpoint.verify),
        "verified_at": isoformat(endpoint.verified_at),
        "verification": verification_json(endpoint),
        "disabled_reason": endpoint.disabled_reason,
        "disabled_at": isoformat(endpoint.disabled_at),
        "disabled_by": endpoint.disabled_by if endpoint.state == EndpointState.DISABLED else None,
        "consecutive_failures": endpoint.consecutive_failures or 0,
        "last_success_at": isoformat(endpoint.last_success_at),
        "last_failure_at": isoformat(endpoint.last_failure_at),
        "auto_recover": endpoint.auto_recover is not False,
        "probe_next_at": isoformat(endpoint.probe_next_at),
        "probe_count": endpoint.probe_count or 0,
        "created_at": isoformat(endpoint.created_at),
        "updated_at": isoformat(endpoint.updated_at),
    }
    if body["signature"] == SignatureKind.ED25519:  # an HMAC endpoint loads no keys
        body["public_key"] = endpoint_service.public_key(endpoint)
        body["public_keys"] = [
            {
                "public_key": row.public_key,
                "created_at": isoformat(row.created_at),
                "expires_at": isoformat(row.expires_at),
            }
            for row in endpoint_service.public_keys(endpoint)
        ]
    if secret is not None:
        body["secret"] = secret
    if lag is not None:
        body["lag"] = lag
    return body


def verification_json(endpoint: Endpoint) -> dict[str, Any] | None:
    """Where a pending endpoint's challenge stands (None when it waits for nothing)."""
    shown = verification.status(endpoint)
    if shown is None:
        return None
    return {
        "started_at": isoformat(shown.started_at),
        "expires_at": isoformat(shown.expires_at),
        "challenge_sent_at": isoformat(shown.challenge_sent_at),
        "challenge_attempts": shown.challenge_attempts,
        "next_send_at": isoformat(shown.next_send_at),
        "last_error": shown.last_error,
    }


def blocked_key_json(row: BlockedKey) -> dict[str, Any]:
    return {
        "ordering_key": row.ordering_key,
        "sequence": row.sequence,
        "delivery": row.delivery_id,
        "event": row.event_id,
        "dead_letter": row.dead_letter_id,
        "reason": row.reason,
        "waiting": row.waiting,
    }


def attempt_json(attempt: Attempt) -> dict[str, Any]:
    body = attempt.response_body
    return {
        "n": attempt.n,
        "started_at": isoformat(attempt.started_at),
        "duration_ms": attempt.duration_ms,
        "response_status": attempt.response_status,
        "response_body": None if body is None else bytes(body).decode("utf-8", errors="replace"),
        "response_headers": header_rules.redact_response(attempt.response_headers),
        "error": attempt.error,
    }


def delivery_json(delivery: Delivery, with_attempts: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": delivery.id,
        "event": delivery.event_id,
        "endpoint": delivery.endpoint_id,
        "version": delivered_version(delivery, delivery.event.version),
        "state": delivery.state,
        "attempt_count": delivery.attempt_count or 0,
        "next_attempt_at": isoformat(delivery.next_attempt_at),
        "last_status_code": delivery.last_status_code,
        "last_error": delivery.last_error,
        # Set for an ordered endpoint: the key, its sequence number and the event before it.
        "ordering": None
        if delivery.ordering_seq is None
        else {
            "key": delivery.ordering_key,
            "sequence": delivery.ordering_seq,
            "previous_event": delivery.previous_event_id,
        },
        "created_at": isoformat(delivery.created_at),
        "updated_at": isoformat(delivery.updated_at),
    }
    if with_attempts:
        body["attempts"] = [attempt_json(a) for a in delivery.attempts]
    return body


def event_json(
    event: Event, partner_uid: str, *, deliveries: list[Delivery] | None = None
) -> dict[str, Any]:
    """The event as published (the fields of its payload) plus, for one event, its deliveries."""
    resource = None
    if event.resource_type is not None or event.resource_id is not None:
        resource = {
            "type": event.resource_type,
            "id": event.resource_id,
            "version": event.resource_version,
        }
    body: dict[str, Any] = {
        "id": event.id,
        "type": event.type,
        "version": event.version,
        "occurred_at": isoformat(event.occurred_at),
        "partner": partner_uid,
        "resource": resource,
        "correlation_id": event.correlation_id,
        "ordering_key": event.ordering_key,
        "data": event.data,
        "created_at": isoformat(event.created_at),
    }
    if deliveries is not None:
        body["deliveries"] = [delivery_json(d) for d in deliveries]
    return body


def key_json(key: ApiKey, partner_uid: str | None, token: str | None = None) -> dict[str, Any]:
    """An API key as anyone may see it: never the key, nor its hash — except `token`, given
    once, in the answer that created it."""
    body = {
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "scopes": list(key.scopes or []),
        "partner": partner_uid,
        "created_at": isoformat(key.created_at),
        "last_used_at": isoformat(key.last_used_at),
        "revoked_at": isoformat(key.revoked_at),
    }
    if token is not None:
        body["key"] = token
    return body


def audit_record_json(row: Shown) -> dict[str, Any]:
    """An audit row as its reader may see it (`app.services.audit.shown`)."""
    return {
        "id": row.id,
        "actor": row.actor,
        "action": row.action,
        "subject_type": row.subject_type,
        "subject_id": row.subject_id,
        "details": row.details or {},
        "created_at": isoformat(row.created_at),
    }


def filter_test_json(tried: filters.Tried) -> dict[str, Any]:
    return {
        "filter": tried.filter,
        "matched": tried.matched,
        "samples": [
            {
                "source": sample.source,
                "type": sample.type,
                "version": sample.version,
                "event": sample.event,
                "matched": sample.matched,
                "error": sample.error,
            }
            for sample in tried.samples
        ],
    }
