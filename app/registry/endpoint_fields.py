"""An endpoint's fields and the rule for each: checked at the door, so a bad URL never
reaches a worker.

Every check that can be made before sending is made here, at creation and change: scheme,
SSRF verdict, subscribed event types, version pins, custom headers, timeout, rate limit,
secret format. `app.registry.endpoints` applies them.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.orm import Session

from app import headers as header_rules
from app.config import Settings
from app.errors import ValidationFailed
from app.event_types import (
    MAX_DOWNGRADE_HOPS,
    existing_names,
    filters,
    is_reserved,
    registered_pairs,
    unreachable_pins,
)
from app.net import guard
from app.net.urls import check_outbound_url
from app.registry import keys
from app.vocabulary import EndpointMode, values

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
    "send_traceparent",
    "auto_recover",
    "verify",
    "filter",
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
    "send_traceparent",
    "auto_recover",
    "filter",
)


def invalid(field: str, message: str, code: str = "invalid_field") -> ValidationFailed:
    return ValidationFailed(message, code=code, details={"field": field})


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
        raise invalid("headers", "headers must be an object of name: value strings")
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
        raise invalid("headers", f"at most {MAX_HEADERS} custom headers")
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
        raise invalid("public_headers", "public_headers must be a list of header names")
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
        raise invalid(
            "event_types",
            "event_types must be a non-empty list of event type names, or null for all types",
        )
    if len(event_types) > MAX_EVENT_TYPES:
        raise invalid("event_types", f"at most {MAX_EVENT_TYPES} event types")
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
        raise invalid("versions", 'versions must be an object {"<event type>": <version>}')
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
        raise invalid(
            "mode",
            'mode must be "push" (Kurir sends every event) or "pull" '
            "(the partner reads its feed and acknowledges)",
        )
    return str(value)


def check_timeout(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TIMEOUT_S:
        raise invalid("timeout_s", f"timeout_s must be an integer from 1 to {MAX_TIMEOUT_S}")
    return value


def check_rate_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (1 <= value <= MAX_RATE_LIMIT):
        raise invalid(
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


def check_flag(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(field, f"{field} must be true or false")
    return value


def check_description(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION:
        raise invalid(
            "description", f"description must be a string of at most {MAX_DESCRIPTION} characters"
        )
    return value


def check_filter(value: Any) -> str | None:
    """A JMESPath expression over the event (`data`, `type`, `version`, `resource`) under the
    bounds downgrades have (`app.event_types.filters`); null or blank: no filter.

    Raises:
        ValidationFailed: `invalid_filter`, with the parser's message or the bound passed.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise ValidationFailed(
            "filter must be a JMESPath expression (a string), or null for none",
            code="invalid_filter",
            details={"field": "filter", "bound": "type"},
        )
    try:
        filters.check(value)
    except filters.Refused as exc:
        raise ValidationFailed(
            f"filter {exc}",
            code="invalid_filter",
            details={"field": "filter", "bound": exc.bound, "limit": exc.limit},
        ) from None
    return value.strip()
