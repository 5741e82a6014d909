"""Event contracts: named, versioned JSON Schemas that every published `data` must satisfy.

A published version never changes its schema (registering it again with another schema is a
conflict), so a compiled validator can be cached for the life of the process, keyed by the
event type's row id. Only the `deprecated` flag can change, and it is re-read on every publish.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.errors import Conflict, NotFound, ValidationFailed
from app.models import EventType

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
MAX_VERSION = 2**31 - 1
MAX_ERRORS = 50
MAX_DESCRIPTION = 4000

# Event types whose name starts with this belong to Kurir itself: publishers can neither
# register nor publish them, and endpoints do not subscribe to them.
RESERVED_PREFIX = "kurir."
TEST_EVENT = "kurir.test"
TEST_EVENT_VERSION = 1
TEST_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["message", "endpoint", "sent_by"],
    "properties": {
        "message": {"type": "string", "description": "what this event is for"},
        "endpoint": {"type": "string", "description": "the endpoint it was sent to"},
        "sent_by": {"type": "string", "description": "who asked for it, e.g. portal:acme"},
    },
    "additionalProperties": False,
    "examples": [{"message": "This is a test event from Kurir.", "endpoint": "ep_…",
                  "sent_by": "portal:acme"}],
}
TEST_EVENT_DESCRIPTION = ("A test event, sent on request to one endpoint only (never "
                          "published by services), to check that the endpoint receives and "
                          "verifies webhooks.")


def is_reserved(name: Any) -> bool:
    return isinstance(name, str) and name.lower().startswith(RESERVED_PREFIX)


def canonical_json(value: Any) -> str:
    """One spelling per JSON value, so equal schemas (and bodies) hash equal."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def schema_digest(schema: Any) -> str:
    return hashlib.sha256(canonical_json(schema).encode()).hexdigest()


# ---------------------------------------------------------------------------- schemas


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def check_schema(schema: Any) -> None:
    """Refuse anything that is not a self-contained JSON Schema object.

    Remote `$ref`s are refused: validating an event must never fetch a URL.

    Raises:
        ValidationFailed: code `invalid_schema`, with the metaschema's complaint in `details`.
    """
    if not isinstance(schema, dict):
        raise ValidationFailed("schema must be a JSON Schema object", code="invalid_schema")
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path)
        raise ValidationFailed(f"schema is not valid JSON Schema: {exc.message}",
                               code="invalid_schema",
                               details=[{"path": "/" + path, "message": exc.message}]) from None
    remote = sorted({ref for ref in _refs(schema) if not ref.startswith("#")})
    if remote:
        raise ValidationFailed("schema may only use local references ($ref: '#/...')",
                               code="invalid_schema",
                               details=[{"path": "", "message": f"remote reference {ref!r}"}
                                        for ref in remote])


def compile_schema(schema: dict[str, Any]) -> Validator:
    cls = validator_for(schema, default=Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)  # type: ignore[no-any-return]


def data_errors(validator: Validator, data: Any) -> list[dict[str, str]]:
    """Every way `data` breaks the schema, as `{path, message, keyword}` (JSON Pointer paths)."""
    errors = sorted(validator.iter_errors(data),
                    key=lambda e: ([str(p) for p in e.absolute_path], e.message))
    return [
        {"path": "/" + "/".join(str(p) for p in error.absolute_path),
         "message": error.message,
         "keyword": str(error.validator)}
        for error in errors[:MAX_ERRORS]
    ]


class _ValidatorCache:
    """Compiled validators by event-type row id; safe because a version's schema is frozen."""

    def __init__(self, max_size: int = 4096) -> None:
        self._items: dict[str, Validator] = {}
        self._lock = threading.Lock()
        self._max = max_size

    def get(self, key: str) -> Validator | None:
        return self._items.get(key)

    def put(self, key: str, validator: Validator) -> None:
        with self._lock:
            if len(self._items) >= self._max:
                self._items.clear()
            self._items[key] = validator

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


validators = _ValidatorCache()


# ---------------------------------------------------------------------------- registry


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValidationFailed(
            "name must be 1-200 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit", code="invalid_field", details={"field": "name"})
    return name


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not (
            1 <= version <= MAX_VERSION):
        raise ValidationFailed("version must be a positive integer", code="invalid_field",
                               details={"field": "version"})
    return version


@dataclass(frozen=True)
class Registered:
    event_type: EventType
    created: bool


def register(session: Session, body: dict[str, Any]) -> Registered:
    """Publish a contract version; registering the identical schema again changes nothing
    but the description, when one is given.

    Raises:
        ValidationFailed: a field or the schema is invalid.
        Conflict: the version exists with another schema (versions are immutable).
    """
    unknown = sorted(set(body) - {"name", "version", "schema", "description"})
    if unknown:
        raise ValidationFailed(f"unknown field(s): {', '.join(unknown)}", code="unknown_field",
                               details={"fields": unknown})
    name = _check_name(body.get("name"))
    if is_reserved(name):
        raise ValidationFailed(f"event type names starting with {RESERVED_PREFIX!r} belong to "
                               "Kurir", code="reserved_event_type", details={"field": "name"})
    version = _check_version(body.get("version"))
    if "schema" not in body:
        raise ValidationFailed("schema is required", code="invalid_field",
                               details={"field": "schema"})
    schema = body["schema"]
    check_schema(schema)
    description = body.get("description")
    if description is not None and (not isinstance(description, str)
                                    or len(description) > MAX_DESCRIPTION):
        raise ValidationFailed(f"description must be a string of at most {MAX_DESCRIPTION} "
                               "characters", code="invalid_field",
                               details={"field": "description"})

    existing = find(session, name, version)
    if existing is None:
        row = EventType(name=name, version=version, schema=schema, description=description)
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            # A concurrent registration won the race; judge against what it stored.
            existing = find(session, name, version)
            if existing is None:
                raise
        else:
            return Registered(row, created=True)
    if canonical_json(existing.schema) != canonical_json(schema):
        raise Conflict(f"{name} v{version} is already published with a different schema; "
                       "publish a new version instead", code="event_type_version_exists",
                       details={"name": name, "version": version})
    if "description" in body and existing.description != description:
        # The description documents the contract, it is not part of it: re-registering the
        # same schema with a new description updates it rather than dropping it silently.
        existing.description = description
        session.flush()
    return Registered(existing, created=False)


def ensure_test_contract(session: Session) -> EventType:
    """Kurir's own `kurir.test` contract, registered on first use (race-safe)."""
    row = find(session, TEST_EVENT, TEST_EVENT_VERSION)
    if row is not None:
        return row
    row = EventType(name=TEST_EVENT, version=TEST_EVENT_VERSION, schema=TEST_EVENT_SCHEMA,
                    description=TEST_EVENT_DESCRIPTION)
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        found = find(session, TEST_EVENT, TEST_EVENT_VERSION)
        if found is None:
            raise
        return found
    return row


def find(session: Session, name: str, version: int) -> EventType | None:
    return session.scalar(select(EventType).where(EventType.name == name,
                                                  EventType.version == version))


def get(session: Session, name: str, version: int) -> EventType:
    row = find(session, name, version)
    if row is None:
        raise NotFound(f"event type {name} v{version} does not exist",
                       details={"name": name, "version": version})
    return row


def deprecate(session: Session, name: str, version: int) -> EventType:
    """Mark a version deprecated: still accepted, but publishers are warned."""
    row = get(session, name, version)
    if not row.deprecated:
        row.deprecated = True
        row.deprecated_at = utcnow()
        session.flush()
    return row


def existing_names(session: Session, names: list[str]) -> set[str]:
    if not names:
        return set()
    return set(session.scalars(select(EventType.name).where(EventType.name.in_(names))
                               .distinct()))


@dataclass(frozen=True)
class Contract:
    """What publishing needs to know about (type, version): its row id, flag and validator."""

    id: str
    name: str
    version: int
    deprecated: bool
    validator: Validator


def lookup_columns(name: Any, version: Any) -> tuple[Any, Any]:
    """Scalar subqueries (row id, deprecated) of a contract, to ride along another query.

    `name` and `version` may be values or bind parameters.
    """
    table = EventType.__table__
    where = (table.c.name == name) & (table.c.version == version)
    return (select(table.c.id).where(where).scalar_subquery().label("contract_id"),
            select(table.c.deprecated).where(where).scalar_subquery().label("deprecated"))


def contract_for(session: Session, name: str, version: int) -> Contract | None:
    """Look up a contract cheaply: the schema is loaded and compiled once per process."""
    row = session.execute(
        select(EventType.id, EventType.deprecated)
        .where(EventType.name == name, EventType.version == version)).first()
    if row is None:
        return None
    return contract_from(session, row[0], row[1], name, version)


def contract_from(session: Session | Connection, type_id: str | None, deprecated: Any, name: str,
                  version: int) -> Contract | None:
    """The Contract for a row id found by `lookup_columns` (None: no such contract)."""
    if type_id is None:
        return None
    validator = validators.get(type_id)
    if validator is None:
        schema = session.scalar(select(EventType.schema).where(EventType.id == type_id))
        validator = compile_schema(schema or {})
        validators.put(type_id, validator)
    return Contract(type_id, name, version, bool(deprecated), validator)
