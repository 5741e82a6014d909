"""Field mapping: where a source keeps the event id, type, resource, version and time.

A *path* names where one field lives in a verified callback:

- a JSON pointer into the parsed body (RFC 6901): ``/data/object/id``, ``/items/0/sku``,
  ``/a~1b`` for the key ``a/b`` and ``/m~0n`` for the key ``m~n``;
- ``header:NAME`` for a request header, matched case-insensitively (``header:X-GitHub-Delivery``);
- several of the above separated by ``" | "`` (space, bar, space): the first that yields a
  value wins, e.g. ``header:webhook-id | /id``. A body key containing ``" | "`` therefore
  cannot be addressed.

A path that finds nothing yields None; a value of the wrong kind raises :class:`MappingError`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = [
    "ALTERNATIVE_SEPARATOR",
    "PRESETS",
    "Extracted",
    "FieldMapping",
    "MappingError",
    "extract",
    "merge",
    "require",
    "validate_path",
]

ALTERNATIVE_SEPARATOR = " | "
HEADER_PREFIX = "header:"

# RFC 9110 token characters: what a header field name may be made of.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_POINTER_ESCAPE = re.compile(r"~(?![01])")
_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]*")
_UNSIGNED = re.compile(r"[0-9]{1,19}")
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")
# Versions land in a signed 64-bit column.
_MAX_VERSION = 2**63 - 1


class MappingError(ValueError):
    """A verified callback whose fields cannot be read as the source's mapping says."""


@dataclass(frozen=True)
class FieldMapping:
    """Where each field of an inbound event is found; None means the source does not have it."""

    event_id: str | None
    event_type: str | None
    resource_id: str | None
    resource_version: str | None
    occurred_at: str | None
    status: str | None
    resource_type: str | None = None


@dataclass
class Extracted:
    """The fields of one callback, typed, ready for deduplication and ordering."""

    event_id: str | None
    event_type: str | None
    resource_id: str | None
    resource_version: int | None
    occurred_at: datetime | None
    status: str | None
    resource_type: str | None


FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(FieldMapping))

PRESETS: dict[str, FieldMapping] = {
    # Kurir's own outbound shape, so one Kurir can receive from another; Svix
    # senders use the svix- headers, and bodies that carry their own id fall back to it.
    "standard-webhooks": FieldMapping(
        event_id="header:webhook-id | header:svix-id | /id",
        event_type="/type",
        resource_id="/resource/id",
        resource_version="/resource/version",
        occurred_at="/occurred_at",
        status="/data/status",
        resource_type="/resource/type",
    ),
    # Stripe events have no resource version: ordering falls back to the event's `created`.
    # `data.object.object` ("payment_intent", "charge") keeps ids of different kinds apart.
    "stripe": FieldMapping(
        event_id="/id",
        event_type="/type",
        resource_id="/data/object/id",
        resource_version=None,
        occurred_at="/created",
        status="/data/object/status",
        resource_type="/data/object/object",
    ),
    # GitHub payloads are keyed by event kind; the event name (X-GitHub-Event) is the resource
    # type, the first object present is the resource. No version: ordering uses updated_at.
    "github": FieldMapping(
        event_id="header:X-GitHub-Delivery",
        event_type="header:X-GitHub-Event",
        resource_id=(
            "/pull_request/id | /issue/id | /check_run/id | /check_suite/id"
            " | /workflow_run/id | /workflow_job/id | /deployment/id | /release/id"
            " | /repository/id"
        ),
        resource_version=None,
        occurred_at=(
            "/pull_request/updated_at | /issue/updated_at | /check_run/completed_at"
            " | /check_run/started_at | /check_suite/updated_at | /workflow_run/updated_at"
            " | /workflow_job/completed_at | /workflow_job/started_at"
            " | /deployment/updated_at | /release/published_at | /head_commit/timestamp"
        ),
        status=(
            "/pull_request/state | /issue/state | /check_run/status | /check_suite/status"
            " | /workflow_run/status | /workflow_job/status | /action"
        ),
        resource_type="header:X-GitHub-Event",
    ),
    # Shopify bodies are the resource itself; its topic (orders/updated) names the event.
    # No resource_type: a topic would split one order across orders/paid and orders/updated.
    "shopify": FieldMapping(
        event_id="header:X-Shopify-Webhook-Id",
        event_type="header:X-Shopify-Topic",
        resource_id="/id",
        resource_version=None,
        occurred_at="/updated_at | header:X-Shopify-Triggered-At",
        status="/financial_status | /status",
        resource_type=None,
    ),
}


def validate_path(path: str) -> None:
    """Refuse a path at configuration time rather than at the first callback.

    Raises:
        ValueError: ``path`` is neither JSON pointers nor ``header:NAME`` alternatives.
    """
    if not isinstance(path, str) or not path:
        raise ValueError("a path must be a non-empty string")
    for alternative in path.split(ALTERNATIVE_SEPARATOR):
        if alternative.startswith(HEADER_PREFIX):
            name = alternative[len(HEADER_PREFIX) :]
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{alternative!r}: not a valid header name")
        elif alternative.startswith("/"):
            if _POINTER_ESCAPE.search(alternative):
                raise ValueError(f"{alternative!r}: '~' must be followed by 0 or 1 (RFC 6901)")
        else:
            raise ValueError(
                f"{alternative!r}: expected a JSON pointer starting with '/' or header:NAME"
            )


def merge(preset: FieldMapping, overrides: Mapping[str, str | None]) -> FieldMapping:
    """Apply a source's own paths over its scheme's preset; None switches a field off.

    Raises:
        ValueError: an unknown field name or an invalid path.
    """
    unknown = sorted(set(overrides) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown mapping field(s): {', '.join(unknown)}")
    for name, path in overrides.items():
        if path is not None:
            try:
                validate_path(path)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from exc
    return dataclasses.replace(preset, **dict(overrides))


def extract(mapping: FieldMapping, headers: Sequence[tuple[str, str]], body: object) -> Extracted:
    """Read every mapped field of a verified callback into typed values.

    Args:
        mapping: where the fields live.
        headers: the raw (name, value) pairs as received.
        body: the parsed JSON body.

    Raises:
        MappingError: a field has the wrong kind (an object as an id, a non-integer version,
            an unreadable time) or a header it reads was sent twice with different values.
    """

    def find(name: str) -> object:
        path = getattr(mapping, name)
        return None if path is None else _resolve(name, path, headers, body)

    return Extracted(
        event_id=_as_text("event_id", find("event_id")),
        event_type=_as_text("event_type", find("event_type")),
        resource_id=_as_text("resource_id", find("resource_id")),
        resource_version=_as_version(find("resource_version")),
        occurred_at=_as_time(find("occurred_at")),
        status=_as_text("status", find("status")),
        resource_type=_as_text("resource_type", find("resource_type")),
    )


def require(extracted: Extracted, fields: Sequence[str] = ("event_id",)) -> None:
    """Refuse a callback that lacks what processing needs, naming every missing field.

    Raises:
        MappingError: one or more of ``fields`` is None.
        ValueError: ``fields`` names something that is not a field.
    """
    if isinstance(fields, str):
        fields = (fields,)
    unknown = [name for name in fields if name not in FIELDS]
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    missing = [name for name in fields if getattr(extracted, name) is None]
    if missing:
        raise MappingError(f"missing field(s): {', '.join(missing)}")


def _resolve(field: str, path: str, headers: Sequence[tuple[str, str]], body: object) -> object:
    """The first alternative of ``path`` that yields a value, or None."""
    for alternative in path.split(ALTERNATIVE_SEPARATOR):
        value: object
        if alternative.startswith(HEADER_PREFIX):
            value = _header(field, alternative[len(HEADER_PREFIX) :], headers)
        else:
            value = _pointer(alternative, body)
        if value is not None and value != "":
            return value
    return None


def _header(field: str, name: str, headers: Sequence[tuple[str, str]]) -> str | None:
    """The value of header ``name``; two different copies make the field ambiguous."""
    wanted = name.lower()
    # Non-ASCII names are skipped: '\u212a'.lower() is 'k', which would forge a match.
    values = {
        value.strip(" \t")
        for key, value in headers
        if isinstance(key, str) and key.isascii() and key.lower() == wanted
    }
    if len(values) > 1:
        raise MappingError(f"{field}: header {name} was sent with different values")
    return values.pop() if values else None


def _pointer(pointer: str, document: object) -> object:
    """Evaluate an RFC 6901 pointer; a step that does not exist yields None."""
    if not pointer.startswith("/"):
        return None
    current = document
    for token in pointer[1:].split("/"):
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(current, Mapping):
            if key not in current:
                return None
            current = current[key]
        elif isinstance(current, list):
            if not _ARRAY_INDEX.fullmatch(key) or int(key) >= len(current):
                return None
            current = current[int(key)]
        else:
            return None
    return current


def _as_text(field: str, value: object) -> str | None:
    """Identifiers and names as strings; numbers are accepted because many ids are numeric."""
    if value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, bool):
        raise MappingError(f"{field} is a boolean, not a string")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    raise MappingError(f"{field} is not a string or an integer")


def _as_version(value: object) -> int | None:
    """Versions are compared as integers: an int or a string of ASCII digits, nothing else."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        version = value
    elif isinstance(value, str) and _UNSIGNED.fullmatch(value.strip()):
        version = int(value.strip())
    else:
        raise MappingError("resource_version is not an integer")
    if not 0 <= version <= _MAX_VERSION:
        raise MappingError("resource_version is out of range (0 to 2**63 - 1)")
    return version


def _as_time(value: object) -> datetime | None:
    """Unix seconds or an RFC 3339 / ISO 8601 string, as an aware UTC datetime.

    A string without an offset is taken as UTC, the convention of every preset provider.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise MappingError("occurred_at is a boolean, not a time")
    if isinstance(value, str):
        text = value.strip()
        if _UNIX_SECONDS.fullmatch(text):
            return _from_unix(float(text) if "." in text else int(text))
        try:
            # RFC 3339 allows lower-case t and z; fromisoformat only takes upper case.
            parsed = datetime.fromisoformat(text.upper())
        except ValueError as exc:
            raise MappingError(f"occurred_at {value[:40]!r} is not an RFC 3339 time") from exc
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC)
        try:
            return parsed.astimezone(UTC)
        except OverflowError as exc:
            raise MappingError("occurred_at is out of range") from exc
    if isinstance(value, int | float):
        return _from_unix(value)
    raise MappingError("occurred_at is neither Unix seconds nor an RFC 3339 string")


def _from_unix(seconds: float) -> datetime:
    """Unix seconds as an aware UTC datetime, refusing values no calendar can hold."""
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise MappingError("occurred_at is not a finite number")
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise MappingError("occurred_at is out of range") from exc
