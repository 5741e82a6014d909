"""Partners and their endpoints: validated at the door so a bad URL never reaches a worker.

Every check that can be made before sending is made here, at creation and change: scheme,
SSRF verdict, subscribed event types, custom headers, timeout, secret format.
Secrets are stored only encrypted and are returned to the caller, never logged.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import headers as header_rules
from app.clock import utcnow
from app.config import Settings
from app.crypto import SecretBox
from app.errors import Conflict, NotFound, ValidationFailed
from app.event_types import (
    MAX_DOWNGRADE_HOPS,
    existing_names,
    is_reserved,
    registered_pairs,
    unreachable_pins,
)
from app.feed.sequencer import settled_head
from app.models import DISABLED_BY_OPERATOR, Endpoint, EndpointSecret, Partner
from app.net import guard
from app.net.urls import check_outbound_url
from app.registry import keys
from app.registry.secrets import add_secret, current_secret_row, rotate
from app.vocabulary import EndpointMode, EndpointState, OnDead, Ordering, values

log = logging.getLogger(__name__)

UID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}$")
MAX_NAME_LENGTH = 400
MAX_DESCRIPTION = 1000
MAX_HEADERS = 20
MAX_HEADER_VALUE = 4096
MAX_TIMEOUT_S = 30
MAX_RATE_LIMIT = 100_000
MAX_EVENT_TYPES = 500

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 field-name
_BAD_VALUE_CHARS = re.compile(r"[\r\n\x00]")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")

ENDPOINT_FIELDS = (
    "url",
    "event_types",
    "description",
    "headers",
    "public_headers",
    "timeout_s",
    "rate_limit_per_s",
    "secret",
    keys.FIELD,
    "versions",
    "mode",
    "ordering",
    "on_dead",
)
PATCHABLE_FIELDS = (
    "url",
    "event_types",
    "description",
    "headers",
    "public_headers",
    "timeout_s",
    "rate_limit_per_s",
    "versions",
    "ordering",
    "on_dead",
)


def _invalid(field: str, message: str, code: str = "invalid_field") -> ValidationFailed:
    return ValidationFailed(message, code=code, details={"field": field})


# ---------------------------------------------------------------------------- partners


def create_partner(session: Session, body: dict[str, Any]) -> Partner:
    """Raises ValidationFailed for a bad uid or name, Conflict when the uid is taken."""
    unknown = sorted(set(body) - {"uid", "name"})
    if unknown:
        raise ValidationFailed(
            f"unknown field(s): {', '.join(unknown)}",
            code="unknown_field",
            details={"fields": unknown},
        )
    uid = body.get("uid")
    if not isinstance(uid, str) or not UID_PATTERN.fullmatch(uid):
        raise _invalid(
            "uid",
            "uid must be 1-200 characters of letters, digits, '.', '_', ':' "
            "or '-', starting with a letter or digit",
        )
    name = body.get("name", uid)
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
        raise _invalid(
            "name", f"name must be a non-empty string of at most {MAX_NAME_LENGTH} characters"
        )
    if session.scalar(select(Partner.id).where(Partner.uid == uid)) is not None:
        raise Conflict(
            f"partner {uid!r} already exists", code="partner_exists", details={"uid": uid}
        )
    partner = Partner(uid=uid, name=name.strip())
    try:
        with session.begin_nested():
            session.add(partner)
    except IntegrityError:
        raise Conflict(
            f"partner {uid!r} already exists", code="partner_exists", details={"uid": uid}
        ) from None
    return partner


def get_partner(session: Session, uid: str) -> Partner:
    partner = session.scalar(select(Partner).where(Partner.uid == uid))
    if partner is None:
        raise NotFound(f"partner {uid!r} does not exist", details={"uid": uid})
    return partner


# ---------------------------------------------------------------------------- validation


def check_url(
    url: Any, settings: Settings, resolver: guard.Resolver = guard.default_resolver
) -> str:
    """The outbound URL rule (`app.net.urls`), made here and again at every attempt.

    Raises:
        ValidationFailed: `invalid_url` or `blocked_address`.
    """
    return check_outbound_url(
        url,
        "url",
        settings,
        resolver,
        credentials_hint=(
            'send them in a custom header instead, e.g. headers: {"Authorization": "Basic ..."}'
        ),
    )


def check_headers(headers: Any, current: dict[str, Any] | None = None) -> dict[str, str]:
    """Custom headers may add, never override what Kurir sets, nor smuggle a new line.

    Values are write-only, so a reader cannot send them back: with `current` (a change), a
    header whose value is null keeps its stored value.
    """
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise _invalid("headers", "headers must be an object of name: value strings")
    if current is not None:
        kept = {k.lower(): v for k, v in current.items()}
        missing = [n for n, v in headers.items() if v is None and n.lower() not in kept]
        if missing:
            raise ValidationFailed(
                f"header {missing[0]!r} has no stored value to keep (null keeps a value)",
                code="invalid_header",
                details={"header": missing[0]},
            )
        headers = {n: (kept[n.lower()] if v is None else v) for n, v in headers.items()}
    if len(headers) > MAX_HEADERS:
        raise _invalid("headers", f"at most {MAX_HEADERS} custom headers")
    seen: set[str] = set()
    clean: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if not _TOKEN.fullmatch(name):
            raise ValidationFailed(
                f"header name {name!r} is not a valid HTTP field name",
                code="invalid_header",
                details={"header": name},
            )
        if header_rules.is_reserved(name):
            raise ValidationFailed(
                f"header {name!r} is set by Kurir and cannot be overridden",
                code="reserved_header",
                details={"header": name},
            )
        if lower in seen:
            raise ValidationFailed(
                f"header {name!r} is given twice", code="invalid_header", details={"header": name}
            )
        if not isinstance(value, str):
            raise ValidationFailed(
                f"header {name!r} must have a string value",
                code="invalid_header",
                details={"header": name},
            )
        if _BAD_VALUE_CHARS.search(value):
            raise ValidationFailed(
                f"header {name!r} contains CR, LF or NUL",
                code="invalid_header",
                details={"header": name},
            )
        if not _FIELD_VALUE.fullmatch(value):
            # RFC 9110 field values: visible ASCII, space, tab and Latin-1 bytes; anything else
            # cannot go on the wire, and every delivery would fail before sending.
            raise ValidationFailed(
                f"header {name!r} has characters an HTTP header cannot carry (control "
                "characters or characters beyond Latin-1)",
                code="invalid_header",
                details={"header": name},
            )
        if len(value.encode()) > MAX_HEADER_VALUE:
            raise ValidationFailed(
                f"header {name!r} is longer than {MAX_HEADER_VALUE} bytes",
                code="invalid_header",
                details={"header": name},
            )
        seen.add(lower)
        clean[name] = value
    return clean


def check_public_headers(names: Any, headers: dict[str, str]) -> list[str] | None:
    """Which custom headers a reader may see the value of; each must be one of `headers`."""
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _invalid("public_headers", "public_headers must be a list of header names")
    present = {n.lower(): n for n in headers}
    unknown = [n for n in names if n.lower() not in present]
    if unknown:
        raise ValidationFailed(
            f"public_headers names {unknown[0]!r}, which is not one of the endpoint's headers",
            code="invalid_header",
            details={"field": "public_headers", "header": unknown[0]},
        )
    return sorted({present[n.lower()] for n in names}) or None


def check_event_types(session: Session, event_types: Any) -> list[str] | None:
    """None subscribes to every type; a list must name types that are registered."""
    if event_types is None:
        return None
    if (
        not isinstance(event_types, list)
        or not event_types
        or not all(isinstance(t, str) and t for t in event_types)
    ):
        raise _invalid(
            "event_types",
            "event_types must be a non-empty list of event type names, or null for all types",
        )
    if len(event_types) > MAX_EVENT_TYPES:
        raise _invalid("event_types", f"at most {MAX_EVENT_TYPES} event types")
    names = list(dict.fromkeys(event_types))
    reserved = [n for n in names if is_reserved(n)]
    if reserved:
        raise ValidationFailed(
            f"{reserved[0]} is Kurir's own event type: it reaches an "
            "endpoint only when a test is sent to it, and cannot be "
            "subscribed to",
            code="reserved_event_type",
            details={"field": "event_types", "reserved": reserved},
        )
    missing = sorted(set(names) - existing_names(session, names))
    if missing:
        raise ValidationFailed(
            f"unknown event type(s): {', '.join(missing)}",
            code="unknown_event_type",
            details={"field": "event_types", "unknown": missing},
        )
    return names


def check_versions(session: Session, value: Any) -> dict[str, int] | None:
    """Version pins `{type: version}`: each (type, version) must be registered, and reachable
    from the type's newest version through downgrades alone, so a partner's pin cannot make
    the publisher's publishes of the newest version fail. Null or `{}` pins nothing (every
    type arrives in the version published).

    A version registered later without a downgrade can still cut a pin off: publishing then
    answers `version_unavailable`, which no check here can foresee.
    """
    if value is None or value == {}:
        return None
    if not isinstance(value, dict) or len(value) > MAX_EVENT_TYPES:
        raise _invalid("versions", 'versions must be an object {"<event type>": <version>}')
    for name, version in value.items():
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValidationFailed(
                f"versions[{name!r}] must be a positive integer",
                code="invalid_field",
                details={"field": "versions", "type": name},
            )
    registered = registered_pairs(session, list(value))
    missing = sorted((n, v) for n, v in value.items() if (n, v) not in registered)
    if missing:
        raise ValidationFailed(
            "no such contract version: " + ", ".join(f"{n} v{v}" for n, v in missing),
            code="unknown_event_type",
            details={
                "field": "versions",
                "unknown": [{"type": n, "version": v} for n, v in missing],
            },
        )
    unreachable = unreachable_pins(session, value)
    if unreachable:
        first = unreachable[0]
        raise ValidationFailed(
            "no chain of downgrades makes the pinned version from the newest one (each link "
            f"needs a downgrade, at most {MAX_DOWNGRADE_HOPS} links): "
            + ", ".join(f"{u['type']} v{u['version']} from v{u['newest']}" for u in unreachable),
            code="version_unavailable",
            details={
                "field": "versions",
                "type": first["type"],
                "version": first["version"],
                "unavailable": unreachable,
            },
        )
    return dict(sorted(value.items()))


def check_mode(value: Any) -> str:
    if value not in values(EndpointMode):
        raise _invalid(
            "mode",
            'mode must be "push" (Kurir sends every event) or "pull" '
            "(the partner reads its feed and acknowledges)",
        )
    return str(value)


def check_timeout(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TIMEOUT_S:
        raise _invalid("timeout_s", f"timeout_s must be an integer from 1 to {MAX_TIMEOUT_S}")
    return value


def check_rate_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (1 <= value <= MAX_RATE_LIMIT):
        raise _invalid(
            "rate_limit_per_s",
            f"rate_limit_per_s must be null or an integer from 1 to {MAX_RATE_LIMIT}",
        )
    return value


def check_choice(field: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValidationFailed(
            f"{field} must be one of {', '.join(map(repr, choices))}",
            code="invalid_field",
            details={"field": field, "allowed": list(choices)},
        )
    return str(value)


def check_description(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION:
        raise _invalid(
            "description", f"description must be a string of at most {MAX_DESCRIPTION} characters"
        )
    return value


def reject_unknown(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ValidationFailed(
            f"unknown field(s): {', '.join(unknown)}",
            code="unknown_field",
            details={"fields": unknown},
        )


# ---------------------------------------------------------------------------- endpoints


@dataclass(frozen=True)
class EndpointWithSecret:
    endpoint: Endpoint
    secret: str | None  # None for an Ed25519 endpoint: its private key is never shown


def create_endpoint(
    session: Session,
    partner: Partner,
    body: dict[str, Any],
    settings: Settings,
    box: SecretBox,
    resolver: guard.Resolver = guard.default_resolver,
) -> EndpointWithSecret:
    """Validate everything, then store the endpoint and its (encrypted) first secret."""
    reject_unknown(body, ENDPOINT_FIELDS)
    mode = check_mode(body.get("mode", EndpointMode.PUSH.value))
    if mode == EndpointMode.PULL:
        if body.get("url") is not None:
            raise _invalid(
                "url",
                "a pull endpoint has no url: nothing is sent to it, its "
                "consumer reads the feed (GET /v1/partners/{uid}/feed"
                "?endpoint={id})",
            )
        url = ""
    else:
        url = check_url(body.get("url"), settings, resolver)
    event_types = check_event_types(session, body.get("event_types"))
    headers = check_headers(body.get("headers"))
    public_headers = check_public_headers(body.get("public_headers"), headers)
    versions = check_versions(session, body.get("versions"))
    timeout_s = check_timeout(body.get("timeout_s", settings.default_timeout_s))
    rate_limit = check_rate_limit(body.get("rate_limit_per_s"))
    description = check_description(body.get("description"))
    ordering_ = check_choice(
        "ordering", body.get("ordering", Ordering.NONE.value), values(Ordering)
    )
    on_dead = check_choice("on_dead", body.get("on_dead", OnDead.SKIP.value), values(OnDead))
    signature, secret = keys.first_key(body)
    endpoint = Endpoint(
        partner=partner,
        url=url,
        event_types=event_types,
        headers=headers,
        public_headers=public_headers,
        versions=versions,
        timeout_s=timeout_s,
        rate_limit_per_s=rate_limit,
        description=description,
        state=EndpointState.ENABLED,
        mode=mode,
        ordering=ordering_,
        on_dead=on_dead,
        signature=signature,
    )
    if mode == EndpointMode.PULL:
        # Its feed starts here: what was committed before is not its backlog.
        endpoint.acked_seq = settled_head(session.connection())
    session.add(endpoint)
    add_secret(session, endpoint, secret, box)
    session.flush()
    return EndpointWithSecret(endpoint, keys.shown(secret))


def get_endpoint(session: Session, partner: Partner, endpoint_id: str) -> Endpoint:
    endpoint = session.scalar(
        select(Endpoint).where(
            Endpoint.id == endpoint_id,
            Endpoint.partner_id == partner.id,
            Endpoint.deleted_at.is_(None),
        )
    )
    if endpoint is None:
        raise NotFound(
            f"endpoint {endpoint_id!r} of partner {partner.uid!r} does not exist",
            details={"endpoint": endpoint_id, "partner": partner.uid},
        )
    return endpoint


def live_endpoints_query(partner: Partner) -> Any:
    return select(Endpoint).where(Endpoint.partner_id == partner.id, Endpoint.deleted_at.is_(None))


def update_endpoint(
    session: Session,
    endpoint: Endpoint,
    body: dict[str, Any],
    settings: Settings,
    resolver: guard.Resolver = guard.default_resolver,
) -> Endpoint:
    """Change only the fields given; each is validated as at creation."""
    if "secret" in body:
        raise ValidationFailed(
            "the secret is changed with POST .../secret/rotate",
            code="unknown_field",
            details={"fields": ["secret"]},
        )
    if "mode" in body and body["mode"] != endpoint.mode:
        raise ValidationFailed(
            "an endpoint's mode is fixed at creation; create a new endpoint for the other mode",
            code="mode_immutable",
            details={"field": "mode", "mode": endpoint.mode},
        )
    keys.refuse_change(endpoint, body)
    body = {k: v for k, v in body.items() if k not in ("mode", keys.FIELD)}
    reject_unknown(body, PATCHABLE_FIELDS)
    if "url" in body and endpoint.mode == EndpointMode.PULL:
        raise _invalid("url", "a pull endpoint has no url (its mode is fixed at creation)")
    if "url" in body:
        endpoint.url = check_url(body["url"], settings, resolver)
    if "event_types" in body:
        endpoint.event_types = check_event_types(session, body["event_types"])
    if "headers" in body:
        endpoint.headers = check_headers(body["headers"], current=endpoint.headers or {})
    if "public_headers" in body:
        endpoint.public_headers = check_public_headers(
            body["public_headers"], endpoint.headers or {}
        )
    elif "headers" in body and endpoint.public_headers:
        # A header removed by this change leaves the public list with it.
        present = {h.lower() for h in endpoint.headers or {}}
        endpoint.public_headers = [
            n for n in endpoint.public_headers if n.lower() in present
        ] or None
    if "versions" in body:
        endpoint.versions = check_versions(session, body["versions"])
    if "timeout_s" in body:
        endpoint.timeout_s = check_timeout(body["timeout_s"])
    if "rate_limit_per_s" in body:
        endpoint.rate_limit_per_s = check_rate_limit(body["rate_limit_per_s"])
    if "description" in body:
        endpoint.description = check_description(body["description"])
    # A change applies to deliveries made from now on: those already numbered keep their order.
    if "ordering" in body:
        endpoint.ordering = check_choice("ordering", body["ordering"], values(Ordering))
    if "on_dead" in body:
        endpoint.on_dead = check_choice("on_dead", body["on_dead"], values(OnDead))
    session.flush()
    return endpoint


def delete_endpoint(session: Session, endpoint: Endpoint, now: datetime | None = None) -> None:
    """Soft delete: history (deliveries, dead letters) stays; the endpoint gets nothing new.

    It is also disabled, so a worker that re-reads it before sending stops there.
    """
    now = now or utcnow()
    endpoint.deleted_at = now
    if endpoint.state != EndpointState.DISABLED:
        endpoint.state = EndpointState.DISABLED
        endpoint.disabled_reason = "deleted"
        endpoint.disabled_at = now
    session.flush()


def enable_endpoint(session: Session, endpoint: Endpoint) -> Endpoint:
    """Operator action: deliveries start again; health counters restart from zero."""
    endpoint.state = EndpointState.ENABLED
    endpoint.disabled_reason = None
    endpoint.disabled_at = None
    endpoint.disabled_by = None
    endpoint.consecutive_failures = 0
    endpoint.first_failure_at = None
    session.flush()
    return endpoint


def disable_endpoint(
    session: Session,
    endpoint: Endpoint,
    reason: str | None = None,
    now: datetime | None = None,
    *,
    by: str = DISABLED_BY_OPERATOR,
) -> Endpoint:
    """Disable by hand: new events for the endpoint are parked as dead letters from now on.

    `by` says who (`Endpoint.disabled_by`). An operator disabling an endpoint that is disabled
    already makes it theirs; a partner leaves an operator's disable as it is (who, and why),
    so that it cannot turn it into one it may undo.
    """
    if reason is not None and (
        not isinstance(reason, str) or not reason.strip() or len(reason) > 200
    ):
        raise _invalid("reason", "reason must be a non-empty string of at most 200 characters")
    if endpoint.state != EndpointState.DISABLED:
        endpoint.state = EndpointState.DISABLED
        endpoint.disabled_at = now or utcnow()
        endpoint.disabled_reason = reason.strip() if reason else "manual"
        endpoint.disabled_by = by
    elif by == DISABLED_BY_OPERATOR or endpoint.disabled_by != DISABLED_BY_OPERATOR:
        if reason:
            endpoint.disabled_reason = reason.strip()
        endpoint.disabled_by = by
    session.flush()
    return endpoint


def rotate_secret(
    session: Session,
    endpoint: Endpoint,
    body: dict[str, Any],
    settings: Settings,
    box: SecretBox,
    now: datetime | None = None,
) -> str | None:
    """Make a new key current, of the kind asked (default: the endpoint's); the old ones keep
    signing for the configured overlap. The new HMAC secret, or None for an Ed25519 key."""
    reject_unknown(body, ("secret", keys.FIELD))
    signature, secret = keys.next_key(endpoint, body)
    rotate(
        session, endpoint, secret, box, now or utcnow(), settings.secret_rotation_overlap_seconds
    )
    endpoint.signature = signature
    return keys.shown(secret)


def read_secret(
    endpoint: Endpoint, box: SecretBox, now: datetime | None = None
) -> tuple[EndpointSecret, str]:
    """The current secret's row and its plaintext.

    Raises:
        Conflict: `no_shared_secret` for an Ed25519 key, whose private half is never shown.
    """
    row = current_secret_row(endpoint, now or utcnow())
    keys.require_shared(endpoint, row)
    return row, box.decrypt(row.secret_encrypted)
