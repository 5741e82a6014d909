"""The catalog of Kurir's operational event types: each one's name, version, description
and JSON Schema (with examples), and registering them as ordinary contracts.

Migration 0014 registers version 1 of each; `ensure_registered` adds any that are missing (a
database emptied by hand, or a type added later) before they are published. A version, once
registered, never changes: a new shape is a new version here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import event_types
from app.models import EventType
from app.vocabulary import OperationalEventType

VERSION = 1

_PARTNER = {"type": "string", "description": "uid of the partner the event is about"}
_ENDPOINT = {"type": "string", "description": "id of the endpoint the event is about"}
_URL = {"type": "string", "description": "the endpoint's URL"}
_TIME = {"type": "string", "description": "RFC 3339, UTC"}
_STATUS = {
    "type": ["integer", "null"],
    "description": "HTTP status of the last attempt (null: no answer)",
}
_ERROR = {"type": ["string", "null"], "description": "error class of the last attempt"}


def _schema(
    required: list[str], properties: dict[str, Any], example: dict[str, Any]
) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["partner", "endpoint", *required],
        "properties": {"partner": _PARTNER, "endpoint": _ENDPOINT, **properties},
        "additionalProperties": False,
        "examples": [example],
    }


@dataclass(frozen=True)
class OperationalType:
    name: str
    description: str
    schema: dict[str, Any]

    @property
    def examples(self) -> list[dict[str, Any]]:
        return list(self.schema["examples"])


CATALOG: dict[str, OperationalType] = {
    t.name: t
    for t in (
        OperationalType(
            OperationalEventType.ENDPOINT_DISABLED,
            "Kurir's own: an endpoint was disabled, after failing too long (`disabled_by: "
            "health`), answering 410 Gone, or by hand. Its waiting deliveries became dead "
            "letters (`parked_deliveries`); new events for it are parked until it is enabled.",
            _schema(
                ["reason", "disabled_by", "disabled_at"],
                {
                    "url": _URL,
                    "reason": {"type": "string", "description": "why it was disabled"},
                    "disabled_by": {
                        "type": "string",
                        "enum": ["health", "operator", "partner", "verification"],
                        "description": (
                            "Kurir after failures, an operator, the partner, or an "
                            "unanswered ownership challenge"
                        ),
                    },
                    "disabled_at": _TIME,
                    "parked_deliveries": {
                        "type": "integer",
                        "description": "waiting deliveries made dead letters",
                    },
                    "consecutive_failures": {"type": "integer"},
                    "last_status_code": _STATUS,
                    "last_error": _ERROR,
                    "delivery": {
                        "type": "string",
                        "description": "the delivery whose answer (410) disabled it",
                    },
                },
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "reason": "failing: 8 consecutive failures, none succeeded for 86400 s",
                    "disabled_by": "health",
                    "disabled_at": "2026-12-02T10:00:00Z",
                    "parked_deliveries": 12,
                    "consecutive_failures": 8,
                    "last_status_code": 503,
                    "last_error": "http_status",
                },
            ),
        ),
        OperationalType(
            OperationalEventType.ENDPOINT_RECOVERED,
            "Kurir's own: a disabled endpoint answered a probe and was enabled again; what "
            "was parked since it was disabled is replayed (`replayed`).",
            _schema(
                ["recovered_at"],
                {
                    "url": _URL,
                    "reason": {"type": "string", "description": "how it recovered"},
                    "disabled_at": {"type": ["string", "null"], "description": "RFC 3339, UTC"},
                    "recovered_at": _TIME,
                    "replayed": {
                        "type": "integer",
                        "description": "parked deliveries sent again",
                    },
                },
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "reason": "probe_succeeded",
                    "disabled_at": "2026-12-02T10:00:00Z",
                    "recovered_at": "2026-12-02T11:05:00Z",
                    "replayed": 12,
                },
            ),
        ),
        OperationalType(
            OperationalEventType.ENDPOINT_VERIFICATION_FAILED,
            "Kurir's own: an endpoint that must prove it receives webhooks did not echo its "
            "verification challenge in time, and was disabled with reason `unverified`.",
            _schema(
                ["reason"],
                {
                    "url": _URL,
                    "reason": {"type": "string", "description": "why verification failed"},
                    "requested_at": {
                        "type": ["string", "null"],
                        "description": "when verification was asked for (RFC 3339, UTC)",
                    },
                    "failed_at": _TIME,
                },
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "reason": "unverified",
                    "requested_at": "2026-12-02T10:00:00Z",
                    "failed_at": "2026-12-05T10:00:00Z",
                },
            ),
        ),
        OperationalType(
            OperationalEventType.DELIVERY_EXHAUSTED,
            "Kurir's own: a delivery used up its retries and became a dead letter "
            "(`dead_letter`), which an operator can resend.",
            _schema(
                ["event", "event_type", "delivery", "dead_letter", "reason", "attempts"],
                {
                    "url": _URL,
                    "event": {"type": "string", "description": "id of the event"},
                    "event_type": {"type": "string"},
                    "version": {"type": ["integer", "null"]},
                    "delivery": {"type": "string", "description": "id of the delivery"},
                    "dead_letter": {"type": "string", "description": "id of the dead letter"},
                    "reason": {"type": "string", "description": "why it was parked"},
                    "attempts": {"type": "integer", "description": "attempts made in all"},
                    "last_status_code": _STATUS,
                    "last_error": _ERROR,
                },
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "event": "evt_2Jd…",
                    "event_type": "payment.succeeded",
                    "version": 2,
                    "delivery": "dlv_2Jd…",
                    "dead_letter": "dl_2Jd…",
                    "reason": "retries_exhausted",
                    "attempts": 13,
                    "last_status_code": 500,
                    "last_error": "http_status",
                },
            ),
        ),
        OperationalType(
            OperationalEventType.ORDERING_KEY_BLOCKED,
            "Kurir's own: a delivery of an ordered endpoint with `on_dead: block` became a "
            "dead letter, so the events of its ordering key wait behind it until that letter "
            "is resent or discarded.",
            _schema(
                ["ordering_key", "sequence", "event", "delivery", "dead_letter", "reason"],
                {
                    "url": _URL,
                    "ordering_key": {"type": "string"},
                    "sequence": {"type": "integer", "description": "the blocking delivery's"},
                    "event": {"type": "string"},
                    "delivery": {"type": "string"},
                    "dead_letter": {"type": "string"},
                    "reason": {"type": "string"},
                },
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "ordering_key": "payment:pay_123",
                    "sequence": 7,
                    "event": "evt_2Jd…",
                    "delivery": "dlv_2Jd…",
                    "dead_letter": "dl_2Jd…",
                    "reason": "retries_exhausted",
                },
            ),
        ),
        OperationalType(
            OperationalEventType.EVENT_TYPE_SUNSET_PASSED,
            "Kurir's own: the sunset of a deprecated contract version passed while this "
            "endpoint is still pinned to it. It keeps receiving that version until its pin "
            "changes.",
            _schema(
                ["type", "version", "sunset_at"],
                {
                    "url": _URL,
                    "type": {"type": "string", "description": "the event type"},
                    "version": {"type": "integer", "description": "the version pinned"},
                    "sunset_at": _TIME,
                },
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "type": "payment.succeeded",
                    "version": 1,
                    "sunset_at": "2026-12-31T00:00:00Z",
                },
            ),
        ),
    )
}
NAMES = frozenset(CATALOG)


def ensure_registered(session: Session) -> None:
    """Register every catalog type that is missing (race-safe: a concurrent registration
    wins and is kept)."""
    present = event_types.registered_pairs(session, sorted(NAMES))
    for name, spec in CATALOG.items():
        if (name, VERSION) in present:
            continue
        try:
            with session.begin_nested():
                session.add(
                    EventType(
                        name=name,
                        version=VERSION,
                        schema=spec.schema,
                        description=spec.description,
                        examples=spec.examples,
                    )
                )
        except IntegrityError:
            pass  # registered meanwhile by another process
