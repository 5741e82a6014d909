"""Event contracts: named, versioned JSON Schemas that every published `data` must satisfy.

A published version never changes its schema (registering it again with another schema is a
conflict), so a compiled validator can be cached for the life of the process, keyed by the
event type's row id. Only the `deprecated` flag and the sunset can change, and they are
re-read on every publish.

A version N may declare how to make version N-1 from it: `downgrade`, a JMESPath expression
over N's `data` (declared, not coded: nothing runs but the expression). It is checked at
registration against N's `examples`, whose results must satisfy N-1's schema, and it is as
immutable as the schema. Chains compose: 3 -> 2 -> 1, at most `MAX_DOWNGRADE_HOPS` links.
`produce` makes every version a publish needs, from the publisher's renditions first, then the
chain. Every expression runs under the bounds of `app.downgrades` (static limits at
registration, a work and size budget on every run), and every version it makes is at most
`KURIR_MAX_PAYLOAD_BYTES` of JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jmespath.parser import ParsedResult
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from sqlalchemy import Connection, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import downgrades
from app.clock import utcnow
from app.config import Settings
from app.errors import Conflict, NotFound, ValidationFailed
from app.models import EventType
from app.schema_example import example_for

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
MAX_VERSION = 2**31 - 1
MAX_ERRORS = 50
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
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


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


# Bound of the validator cache (one per contract version published to): at the bound it is
# emptied and each validator compiled again on its next use.
VALIDATORS_MAX = 4096


class _ValidatorCache:
    """Compiled validators by event-type row id; safe because a version's schema is frozen."""

    def __init__(self, max_size: int = VALIDATORS_MAX) -> None:
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


def register(session: Session, body: dict[str, Any], *,
             max_bytes: int = Settings.max_payload_bytes) -> Registered:
    """Publish a contract version; registering the identical schema again changes nothing
    but the description, when one is given. `max_bytes` bounds what the downgrade may make
    from an example (`KURIR_MAX_PAYLOAD_BYTES`).

    Raises:
        ValidationFailed: a field or the schema is invalid.
        Conflict: the version exists with another schema (versions are immutable).
    """
    unknown = sorted(set(body) - {"name", "version", "schema", "description", "downgrade",
                                  "examples"})
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
    examples = _check_examples(body.get("examples"), schema)
    downgrade = body.get("downgrade")
    if downgrade is not None:
        _check_downgrade(session, name, version, downgrade, examples, schema, max_bytes)

    existing = find(session, name, version)
    if existing is None:
        row = EventType(name=name, version=version, schema=schema, description=description,
                        downgrade=downgrade, examples=examples)
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
    if (canonical_json(existing.schema) != canonical_json(schema)
            or existing.downgrade != downgrade
            or canonical_json(existing.examples) != canonical_json(examples)):
        raise Conflict(f"{name} v{version} is already published with a different schema, "
                       "downgrade or examples; publish a new version instead",
                       code="event_type_version_exists",
                       details={"name": name, "version": version})
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
        raise ValidationFailed(f"examples must be a list of at most {MAX_EXAMPLES} objects",
                               code="invalid_field", details={"field": "examples"})
    validator = compile_schema(schema)
    for index, example in enumerate(examples):
        if not isinstance(example, dict):
            raise ValidationFailed(f"examples[{index}] must be a JSON object",
                                   code="invalid_example", details={"example": index})
        errors = data_errors(validator, example)
        if errors:
            raise ValidationFailed(f"examples[{index}] does not match this version's schema",
                                   code="invalid_example",
                                   details={"example": index, "errors": errors})
    return examples


def compile_downgrade(expression: str) -> ParsedResult:
    """Parse a stored expression (its bounds are enforced when it runs).

    Raises:
        ValueError: the expression is not JMESPath.
    """
    return downgrades.compile_expression(expression)


def _refused(message: str, **details: Any) -> ValidationFailed:
    return ValidationFailed(message, code="invalid_downgrade",
                            details={"field": "downgrade", **details})


def _check_downgrade(session: Session, name: str, version: int, expression: Any,
                     examples: list[dict[str, Any]] | None, schema: dict[str, Any],
                     max_bytes: int) -> None:
    """The expression is within the static bounds, the previous version exists, and every
    example comes out as data the previous version's schema accepts, within the budgets; so
    does an example made from the schema, for size alone (one exists even when the publisher
    gave none)."""
    if not isinstance(expression, str) or not expression.strip() or len(
            expression) > MAX_DOWNGRADE:
        raise _refused(f"downgrade must be a JMESPath expression of at most {MAX_DOWNGRADE} "
                       "characters", bound="length", limit=MAX_DOWNGRADE)
    try:
        compiled = downgrades.compile_checked(expression)
    except downgrades.Refused as exc:
        raise _refused(f"downgrade {exc}", bound=exc.bound, limit=exc.limit) from None
    previous = find(session, name, version - 1)
    if previous is None:
        raise ValidationFailed(
            f"downgrade makes {name} v{version - 1} from v{version}, and v{version - 1} is "
            "not registered", code="invalid_downgrade",
            details={"field": "downgrade", "missing_version": version - 1})
    validator = compile_schema(previous.schema)
    # One budget for the whole registration: the examples together are one request's worth.
    meter = downgrades.Meter(max_bytes)
    for index, example in enumerate(examples or ()):
        try:
            result = apply_downgrade(compiled, example, meter)
        except downgrades.TooLarge as exc:
            raise _refused(f"downgrade of examples[{index}] is too large: {exc}",
                           example=index, reason=exc.reason, limit=exc.limit) from None
        except downgrades.Failed as exc:
            raise _refused(f"downgrade fails on examples[{index}]: {exc}",
                           example=index) from None
        errors = ([{"path": "/", "message": "the result is not a JSON object",
                    "keyword": "type"}] if not isinstance(result, dict)
                  else data_errors(validator, result))
        if errors:
            raise ValidationFailed(
                f"downgrade of examples[{index}] does not match {name} v{version - 1}'s schema",
                code="invalid_downgrade",
                details={"example": index, "version": version - 1, "errors": errors})
    made = example_for(schema)
    if isinstance(made, dict):
        try:
            apply_downgrade(compiled, made, meter)
        except downgrades.TooLarge as exc:
            raise _refused(f"downgrade of an example made from the schema is too large: {exc}",
                           input="schema_example", reason=exc.reason, limit=exc.limit) from None
        except downgrades.Failed:
            pass  # a made-up example need not suit the expression; only size is judged here


def apply_downgrade(compiled: ParsedResult, data: dict[str, Any],
                    meter: downgrades.Meter) -> Any:
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
    if not 1 <= version <= MAX_VERSION:
        return None  # no such version can exist; PostgreSQL would refuse the comparison
    return session.scalar(select(EventType).where(EventType.name == name,
                                                  EventType.version == version))


def get(session: Session, name: str, version: int) -> EventType:
    row = find(session, name, version)
    if row is None:
        raise NotFound(f"event type {name} v{version} does not exist",
                       details={"name": name, "version": version})
    return row


def deprecate(session: Session, name: str, version: int,
              sunset_at: datetime | None = None) -> EventType:
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
    return {(n, v) for n, v in session.execute(
        select(EventType.name, EventType.version).where(EventType.name.in_(names)))}


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


def lookup_columns(name: Any, version: Any) -> tuple[Any, Any, Any]:
    """Scalar subqueries (row id, deprecated, sunset) of a contract, to ride along another
    query.

    `name` and `version` may be values or bind parameters.
    """
    table = EventType.__table__
    where = (table.c.name == name) & (table.c.version == version)
    return (select(table.c.id).where(where).scalar_subquery().label("contract_id"),
            select(table.c.deprecated).where(where).scalar_subquery().label("deprecated"),
            select(table.c.sunset_at).where(where).scalar_subquery().label("sunset_at"))


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


# ---------------------------------------------------------------------------- versions


@dataclass(frozen=True)
class Version:
    """One registered version of a type, ready to validate and to downgrade from."""

    id: str
    version: int
    deprecated: bool
    sunset_at: datetime | None
    validator: Validator
    downgrade: ParsedResult | None


class _DowngradeCache:
    """Compiled downgrade expressions by event-type row id (they are immutable)."""

    def __init__(self, max_size: int = 4096) -> None:
        self._items: dict[str, ParsedResult] = {}
        self._lock = threading.Lock()
        self._max = max_size

    def get(self, key: str, expression: str) -> ParsedResult:
        found = self._items.get(key)
        if found is None:
            found = compile_downgrade(expression)
            with self._lock:
                if len(self._items) >= self._max:
                    self._items.clear()
                self._items[key] = found
        return found


compiled_downgrades = _DowngradeCache()


def versions_of(session: Session | Connection, name: str) -> dict[int, Version]:
    """Every registered version of the type `name`, by number (one query)."""
    rows = session.execute(
        select(EventType.id, EventType.version, EventType.deprecated, EventType.sunset_at,
               EventType.downgrade).where(EventType.name == name)).all()
    found: dict[int, Version] = {}
    for type_id, version, deprecated, sunset_at, downgrade in rows:
        validator = validators.get(type_id)
        if validator is None:
            schema = session.scalar(select(EventType.schema).where(EventType.id == type_id))
            validator = compile_schema(schema or {})
            validators.put(type_id, validator)
        compiled = compiled_downgrades.get(type_id, downgrade) if downgrade else None
        found[version] = Version(type_id, version, bool(deprecated), sunset_at, validator,
                                 compiled)
    return found


class VersionUnavailable(Exception):
    """No rendition and no chain of downgrades makes this version from the published one."""

    def __init__(self, version: int) -> None:
        super().__init__(f"version {version} cannot be produced")
        self.version = version


class VersionInvalid(Exception):
    """A produced version breaks its own schema."""

    def __init__(self, version: int, source: str, errors: list[dict[str, str]]) -> None:
        super().__init__(f"version {version} ({source}) does not match its schema")
        self.version = version
        self.source = source
        self.errors = errors


class VersionTooLarge(Exception):
    """Making this version went past a budget (`reason`: `bytes` or `work`)."""

    def __init__(self, version: int, reason: str, limit: int) -> None:
        super().__init__(f"version {version} is too large to produce ({reason} over {limit})")
        self.version = version
        self.reason = reason
        self.limit = limit


def reachable(downgradable: dict[int, bool], published: int,
              renditions: set[int]) -> dict[int, int]:
    """Version -> downgrades needed to make it, for every version a publish of `published`
    with these renditions can make; `downgradable` says, per registered version, whether it
    declares a downgrade. Structural only: nothing runs.

    A link v+1 -> v needs both registered and v+1's downgrade; transforms never go up; a
    version more than `MAX_DOWNGRADE_HOPS` links below its nearest source is out of reach.
    """
    found: dict[int, int] = {}
    for version in sorted(downgradable, reverse=True):
        if version == published or (version in renditions):
            found[version] = 0
        elif version < published and version + 1 in found and downgradable.get(version + 1):
            hops = found[version + 1] + 1
            if hops <= MAX_DOWNGRADE_HOPS:
                found[version] = hops
    return found


def produce(versions: dict[int, Version], published: int, data: dict[str, Any],
            renditions: dict[int, dict[str, Any]], wanted: set[int], *,
            max_bytes: int = Settings.max_payload_bytes,
            ) -> dict[int, tuple[dict[str, Any], str]]:
    """`data` in every wanted version other than the published one, and in every rendition,
    with how it was made.

    A publisher's rendition wins over a transform; otherwise version v comes from v+1 (itself
    a rendition or produced) through v+1's downgrade, at most `MAX_DOWNGRADE_HOPS` links.
    Transforms never go up: a wanted version above the published one exists only as a
    rendition. Every rendition and every version made on the way is validated against its own
    schema; the downgrades made for one event share one work budget, and each version they
    make is at most `max_bytes` of JSON.

    Raises:
        VersionUnavailable: a wanted version cannot be made.
        VersionInvalid: a made version breaks its schema, or its downgrade does not apply.
        VersionTooLarge: making a version went past the size or work budget.
    """
    made: dict[int, tuple[dict[str, Any], str]] = {}
    reach = reachable({v: row.downgrade is not None for v, row in versions.items()}, published,
                      set(renditions) & set(versions))
    meter = downgrades.Meter(max_bytes)

    def make(version: int) -> dict[str, Any]:
        if version in made:
            return made[version][0]
        if version == published:
            return data
        if version not in versions or version not in reach:
            raise VersionUnavailable(version)
        if version in renditions:
            result, source = renditions[version], "rendition"
        else:
            expression = versions[version + 1].downgrade
            if expression is None:  # `reachable` rules this out
                raise VersionUnavailable(version)
            source = "downgrade"
            try:
                result = apply_downgrade(expression, make(version + 1), meter)
            except downgrades.TooLarge as exc:
                raise VersionTooLarge(version, exc.reason, exc.limit) from None
            except downgrades.Failed as exc:
                raise VersionInvalid(version, source, [{
                    "path": "/", "message": f"the downgrade does not apply: {exc}",
                    "keyword": "downgrade"}]) from None
            if not isinstance(result, dict):
                raise VersionInvalid(version, source, [{
                    "path": "/", "message": "the downgrade did not produce a JSON object",
                    "keyword": "type"}])
        errors = data_errors(versions[version].validator, result)
        if errors:
            raise VersionInvalid(version, source, errors)
        made[version] = (result, source)
        return result

    for version in sorted(set(wanted) | set(renditions), reverse=True):
        make(version)
    return {v: made[v] for v in set(wanted) | set(renditions) if v != published}


# ---------------------------------------------------------------------------- pins


def unreachable_pins(session: Session, pins: dict[str, int]) -> list[dict[str, Any]]:
    """The pins `{type: version}` that a publish of the type's newest version could not
    serve through downgrades alone: `[{type, version, newest}]`, by type name."""
    if not pins:
        return []
    downgradable: dict[str, dict[int, bool]] = {}
    for name, version, has_downgrade in session.execute(
            select(EventType.name, EventType.version, EventType.downgrade.is_not(None))
            .where(EventType.name.in_(list(pins)))):
        downgradable.setdefault(name, {})[int(version)] = bool(has_downgrade)
    problems = []
    for name, version in sorted(pins.items()):
        family = downgradable.get(name, {})
        if not family:
            continue  # an unknown type is another refusal
        newest = max(family)
        if version not in reachable(family, newest, set()):
            problems.append({"type": name, "version": version, "newest": newest})
    return problems
