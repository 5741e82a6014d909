"""JSON Schemas of event-type versions: checked at registration, compiled once per process.

A version's schema never changes, so its compiled validator is cached for the life of the
process, keyed by the row id."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from app.errors import ValidationFailed
from app.event_types.fastcheck import Check, compile_document_check

# Most schema errors reported for one document: enough to fix it, bounded for a hostile one.
MAX_ERRORS = 50


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
        raise ValidationFailed(
            f"schema is not valid JSON Schema: {exc.message}",
            code="invalid_schema",
            details=[{"path": "/" + path, "message": exc.message}],
        ) from None
    remote = sorted({ref for ref in _refs(schema) if not ref.startswith("#")})
    if remote:
        raise ValidationFailed(
            "schema may only use local references ($ref: '#/...')",
            code="invalid_schema",
            details=[{"path": "", "message": f"remote reference {ref!r}"} for ref in remote],
        )


# A quick yes per compiled validator (by id, the validator kept beside it so an id is never
# mistaken for another's), for the schemas app.event_types.fastcheck can judge.
_quick_checks: dict[int, tuple[Validator, Check]] = {}
_checks_lock = threading.Lock()


def compile_schema(schema: dict[str, Any]) -> Validator:
    cls = validator_for(schema, default=Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    check = compile_document_check(schema)
    if check is not None:
        with _checks_lock:
            if len(_quick_checks) >= VALIDATORS_MAX:
                _quick_checks.clear()  # those validators are judged by jsonschema alone
            _quick_checks[id(validator)] = (validator, check)
    return validator


def data_errors(validator: Validator, data: Any) -> list[dict[str, str]]:
    """Every way `data` breaks the schema, as `{path, message, keyword}` (JSON Pointer paths)."""
    quick = _quick_checks.get(id(validator))
    if quick is not None and quick[0] is validator and quick[1](data):
        return []  # plainly valid (app.event_types.fastcheck): jsonschema would find nothing
    errors = sorted(
        validator.iter_errors(data), key=lambda e: ([str(p) for p in e.absolute_path], e.message)
    )
    return [
        {
            "path": "/" + "/".join(str(p) for p in error.absolute_path),
            "message": error.message,
            "keyword": str(error.validator),
        }
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
