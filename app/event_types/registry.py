"""The registry of event types: register a version (schema, examples, downgrade), read,
deprecate; and the cheap lookups publishing makes on every event."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jmespath.parser import ParsedResult
from jsonschema.protocols import Validator
from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.config import Settings
from app.errors import Conflict, NotFound, ValidationFailed, reject_unknown_fields
from app.event_types import downgrades
from app.event_types.examples import example_for
from app.event_types.schema import (
    canonical_json,
    check_schema,
    compile_schema,
    data_errors,
    validators,
)
from app.models import EventType
from app.vocabulary import OperationalEventType

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
MAX_VERSION = 2**31 - 1
MAX_DESCRIPTION = 4000
MAX_EXAMPLES = 20
MAX_DOWNGRADE = 4000
MAX_DOWNGRADE_HOPS = downgrades.MAX_HOPS

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
    "examples": [
        {
            "message": "This is a test event from Kurir.",
            "endpoint": "ep_…",
            "sent_by": "portal:acme",
        }
    ],
}
TEST_EVENT_DESCRIPTION = (
    "A test event, sent on request to one endpoint only (never "
    "published by services), to check that the endpoint receives and "
    "verifies webhooks."
)


def is_reserved(name: Any) -> bool:
    return isinstance(name, str) and name.lower().startswith(RESERVED_PREFIX)


_OPERATIONAL = frozenset(t.value for t in OperationalEventType)


def is_operational(name: Any) -> bool:
    """One of Kurir's operational event types: endpoints subscribe to them, but only Kurir
    registers and publishes them."""
    return isinstance(name, str) and name.lower() in _OPERATIONAL


# ---------------------------------------------------------------------------- registry


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValidationFailed(
            "name must be 1-200 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            code="invalid_field",
            details={"field": "name"},
        )
    return name


def _check_version(version: Any) -> int:
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not (1 <= version <= MAX_VERSION)
    ):
        raise ValidationFailed(
            "version must be a positive integer", code="invalid_field", details={"field": "version"}
        )
    return version


@dataclass(frozen=True)
class Registered:
    event_type: EventType
    created: bool


def register(
    session: Session, body: dict[str, Any], *, max_bytes: int = Settings.max_payload_bytes
) -> Registered:
    """Publish a contract version; registering the identical schema again changes nothing
    but the description, when one is given. `max_bytes` bounds what the downgrade may make
    from an example (`KURIR_MAX_PAYLOAD_BYTES`).

    Raises:
        ValidationFailed: a field or the schema is invalid.
        Conflict: the version exists with another schema (versions are immutable).
    """
    reject_unknown_fields(
        body, {"name", "version", "schema", "description", "downgrade", "examples"}
    )
    name = _check_name(body.get("name"))
    if is_reserved(name):
        raise ValidationFailed(
            f"event type names starting with {RESERVED_PREFIX!r} belong to Kurir",
            code="reserved_event_type",
            details={"field": "name"},
        )
    if is_operational(name):
        raise ValidationFailed(
            f"{name} is one of Kurir's operational event types: Kurir registers its versions",
            code="reserved_event_type",
            details={"field": "name"},
        )
    version = _check_version(body.get("version"))
    if "schema" not in body:
        raise ValidationFailed(
            "schema is required", code="invalid_field", details={"field": "schema"}
        )
    schema = body["schema"]
    check_schema(schema)
    description = body.get("description")
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_DESCRIPTION
    ):
        raise ValidationFailed(
            f"description must be a string of at most {MAX_DESCRIPTION} characters",
            code="invalid_field",
            details={"field": "description"},
        )
    examples = _check_examples(body.get("examples"), schema)
    downgrade = body.get("downgrade")
    if downgrade is not None:
        _check_downgrade(session, name, version, downgrade, examples, schema, max_bytes)

    existing = find(session, name, version)
    if existing is None:
        row = EventType(
            name=name,
            version=version,
            schema=schema,
            description=description,
            downgrade=downgrade,
            examples=examples,
        )
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
    if (
        canonical_json(existing.schema) != canonical_json(schema)
        or existing.downgrade != downgrade
        or canonical_json(existing.examples) != canonical_json(examples)
    ):
        raise Conflict(
            f"{name} v{version} is already published with a different schema, "
            "downgrade or examples; publish a new version instead",
            code="event_type_version_exists",
            details={"name": name, "version": version},
        )
    if "description" in body and existing.description != description:
        # The description documents the contract, it is not part of it: re-registering the
        # same schema with a new description updates it rather than dropping it silently.
        existing.description = description
        session.flush()
    return Registered(existing, created=False)


def _check_examples(examples: Any, schema: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Sample `data` of the version: each must satisfy the version's own schema."""
    if examples is None:
        return None
    if not isinstance(examples, list) or len(examples) > MAX_EXAMPLES:
        raise ValidationFailed(
            f"examples must be a list of at most {MAX_EXAMPLES} objects",
            code="invalid_field",
            details={"field": "examples"},
        )
    validator = compile_schema(schema)
    for index, example in enumerate(examples):
        if not isinstance(example, dict):
            raise ValidationFailed(
                f"examples[{index}] must be a JSON object",
                code="invalid_example",
                details={"example": index},
            )
        errors = data_errors(validator, example)
        if errors:
            raise ValidationFailed(
                f"examples[{index}] does not match this version's schema",
                code="invalid_example",
                details={"example": index, "errors": errors},
            )
    return examples


def compile_downgrade(expression: str) -> ParsedResult:
    """Parse a stored expression (its bounds are enforced when it runs).

    Raises:
        ValueError: the expression is not JMESPath.
    """
    return downgrades.compile_expression(expression)


def _refused(message: str, **details: Any) -> ValidationFailed:
    return ValidationFailed(
        message, code="invalid_downgrade", details={"field": "downgrade", **details}
    )


def _check_downgrade(
    session: Session,
    name: str,
    version: int,
    expression: Any,
    examples: list[dict[str, Any]] | None,
    schema: dict[str, Any],
    max_bytes: int,
) -> None:
    """The expression is within the static bounds, the previous version exists, and every
    example comes out as data the previous version's schema accepts, within the budgets; so
    does an example made from the schema, for size alone (one exists even when the publisher
    gave none)."""
    if not isinstance(expression, str) or not expression.strip() or len(expression) > MAX_DOWNGRADE:
        raise _refused(
            f"downgrade must be a JMESPath expression of at most {MAX_DOWNGRADE} characters",
            bound="length",
            limit=MAX_DOWNGRADE,
        )
    try:
        compiled = downgrades.compile_checked(expression)
    except downgrades.Refused as exc:
        raise _refused(f"downgrade {exc}", bound=exc.bound, limit=exc.limit) from None
    previous = find(session, name, version - 1)
    if previous is None:
        raise ValidationFailed(
            f"downgrade makes {name} v{version - 1} from v{version}, and v{version - 1} is "
            "not registered",
            code="invalid_downgrade",
            details={"field": "downgrade", "missing_version": version - 1},
        )
    validator = compile_schema(previous.schema)
    # One budget for the whole registration: the examples together are one request's worth.
    meter = downgrades.Meter(max_bytes)
    for index, example in enumerate(examples or ()):
        try:
            result = apply_downgrade(compiled, example, meter)
        except downgrades.TooLarge as exc:
            raise _refused(
                f"downgrade of examples[{index}] is too large: {exc}",
                example=index,
                reason=exc.reason,
                limit=exc.limit,
            ) from None
        except downgrades.Failed as exc:
            raise _refused(f"downgrade fails on examples[{index}]: {exc}", example=index) from None
        errors = (
            [{"path": "/", "message": "the result is not a JSON object", "keyword": "type"}]
            if not isinstance(result, dict)
            else data_errors(validator, result)
        )
        if errors:
            raise ValidationFailed(
                f"downgrade of examples[{index}] does not match {name} v{version - 1}'s schema",
                code="invalid_downgrade",
                details={"example": index, "version": version - 1, "errors": errors},
            )
    made = example_for(schema)
    if isinstance(made, dict):
        try:
            apply_downgrade(compiled, made, meter)
        except downgrades.TooLarge as exc:
            raise _refused(
                f"downgrade of an example made from the schema is too large: {exc}",
                input="schema_example",
                reason=exc.reason,
                limit=exc.limit,
            ) from None
        except downgrades.Failed:
            pass  # a made-up example need not suit the expression; only size is judged here


def apply_downgrade(compiled: ParsedResult, data: dict[str, Any], meter: downgrades.Meter) -> Any:
    """The expression's result on `data`, within the meter's budgets and no larger than
    `meter.max_bytes` of JSON.

    Raises:
        downgrades.TooLarge: a budget is spent, or the exact encoding is over the limit.
        downgrades.Failed: the expression does not apply to the data.
    """
    result = downgrades.run(compiled, data, meter)
    if downgrades.encoded_size(result) > meter.max_bytes:
        raise downgrades.TooLarge("bytes", meter.max_bytes)
    return result


def ensure_test_contract(session: Session) -> EventType:
    """Kurir's own `kurir.test` contract, registered on first use (race-safe)."""
    row = find(session, TEST_EVENT, TEST_EVENT_VERSION)
    if row is not None:
        return row
    row = EventType(
        name=TEST_EVENT,
        version=TEST_EVENT_VERSION,
        schema=TEST_EVENT_SCHEMA,
        description=TEST_EVENT_DESCRIPTION,
    )
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
    if not 1 <= version <= MAX_VERSION:
        return None  # no such version can exist; PostgreSQL would refuse the comparison
    return session.scalar(
        select(EventType).where(EventType.name == name, EventType.version == version)
    )


def get(session: Session, name: str, version: int) -> EventType:
    row = find(session, name, version)
    if row is None:
        raise NotFound(
            f"event type {name} v{version} does not exist",
            details={"name": name, "version": version},
        )
    return row


def deprecate(
    session: Session, name: str, version: int, sunset_at: datetime | None = None
) -> EventType:
    """Mark a version deprecated: still accepted, but publishers are warned; `sunset_at` (may
    be moved) says from when endpoints still pinned to it are reported."""
    row = get(session, name, version)
    if not row.deprecated:
        row.deprecated = True
        row.deprecated_at = utcnow()
    if sunset_at is not None and sunset_at != row.sunset_at:
        row.sunset_at = sunset_at
        row.sunset_reported_at = None
    session.flush()
    return row


def registered_pairs(session: Session, names: list[str]) -> set[tuple[str, int]]:
    """The (name, version) pairs registered for these type names."""
    if not names:
        return set()
    return {
        (n, v)
        for n, v in session.execute(
            select(EventType.name, EventType.version).where(EventType.name.in_(names))
        )
    }


def existing_names(session: Session, names: list[str]) -> set[str]:
    if not names:
        return set()
    return set(session.scalars(select(EventType.name).where(EventType.name.in_(names)).distinct()))


@dataclass(frozen=True)
class Contract:
    """What publishing needs to know about (type, version): its row id, flag and validator."""

    id: str
    name: str
    version: int
    deprecated: bool
    validator: Validator


def lookup_columns(name: Any, version: Any) -> tuple[Any, Any, Any]:
    """Scalar subqueries (row id, deprecated, sunset) of a contract, to ride along another
    query.

    `name` and `version` may be values or bind parameters.
    """
    table = EventType.__table__
    where = (table.c.name == name) & (table.c.version == version)
    return (
        select(table.c.id).where(where).scalar_subquery().label("contract_id"),
        select(table.c.deprecated).where(where).scalar_subquery().label("deprecated"),
        select(table.c.sunset_at).where(where).scalar_subquery().label("sunset_at"),
    )


def contract_for(session: Session, name: str, version: int) -> Contract | None:
    """Look up a contract cheaply: the schema is loaded and compiled once per process."""
    row = session.execute(
        select(EventType.id, EventType.deprecated).where(
            EventType.name == name, EventType.version == version
        )
    ).first()
    if row is None:
        return None
    return contract_from(session, row[0], row[1], name, version)


def contract_from(
    session: Session | Connection, type_id: str | None, deprecated: Any, name: str, version: int
) -> Contract | None:
    """The Contract for a row id found by `lookup_columns` (None: no such contract)."""
    if type_id is None:
        return None
    validator = validators.get(type_id)
    if validator is None:
        schema = session.scalar(select(EventType.schema).where(EventType.id == type_id))
        validator = compile_schema(schema or {})
        validators.put(type_id, validator)
    return Contract(type_id, name, version, bool(deprecated), validator)
