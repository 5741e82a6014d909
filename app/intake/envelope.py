"""The publish envelope: what a publish request may carry, checked before anything is read;
what a publish answers; and the exact body every attempt of the event sends.

Only the envelope is judged here: `data` is judged by its contract when the publish is
planned (`app.intake.plan`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app import event_types
from app.clock import isoformat, parse_rfc3339
from app.errors import ValidationFailed, reject_unknown_fields
from sender import ordering

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
MAX_TEXT = 200
MAX_BIGINT = 2**63 - 1
ACCEPTED = 202


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
    reject_unknown_fields(body, PUBLISH_FIELDS)
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
