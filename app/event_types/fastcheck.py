"""A quick yes for documents that plainly match a simple schema, so that a publish skips
jsonschema's walk (~45 µs a document, a tenth of a publish's Python; docs/benchmarks.md
"Where a publish's time goes").

A schema made only of the keywords below compiles to nested closures; any other keyword
(`format`, `pattern`, `$ref`, `anyOf`, …) and the schema gets no closure at all. A closure
answers True only where jsonschema would find no error — each keyword is checked exactly as
jsonschema does, or more strictly (an integral float is not taken for an integer, an `enum`
matches only a value of the very same type) — and False otherwise: False decides nothing,
jsonschema then judges the document and writes the errors. So a document is refused exactly
when jsonschema refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

# Keywords that never change whether a document is valid.
_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "title",
        "description",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_SUPPORTED = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
}
_SCALARS = (str, int, float, bool, type(None))


def _is_type(name: str, value: Any) -> bool:
    kind = type(value)
    if name == "object":
        return kind is dict
    if name == "array":
        return kind is list
    if name == "string":
        return kind is str
    if name == "integer":
        return kind is int
    if name == "number":
        return kind is int or kind is float
    if name == "boolean":
        return kind is bool
    if name == "null":
        return value is None
    return False


def _same(a: Any, b: Any) -> bool:
    """Equal, and of one type: stricter than JSON Schema's equality (1 and 1.0 are equal
    there, True and 1 are not), never looser."""
    return type(a) is type(b) and isinstance(a, _SCALARS) and a == b


# The drafts whose meaning of the keywords above is the one judged here (older drafts read
# `exclusiveMinimum`, `items` and `required` otherwise).
_DRAFTS = (
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
)


def compile_document_check(schema: Any) -> Check | None:
    """The closure for a contract's whole schema, or None (see `compile_check`)."""
    if isinstance(schema, dict) and schema.get("$schema", _DRAFTS[0]).rstrip("#") not in _DRAFTS:
        return None
    return compile_check(schema)


def compile_check(schema: Any) -> Check | None:
    """The closure for `schema`, or None when it uses a keyword this module does not judge."""
    if schema is True:
        return lambda _value: True
    if not isinstance(schema, dict) or not set(schema) <= _SUPPORTED:
        return None
    checks: list[Check] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not all(isinstance(n, str) for n in names):
            return None
        types = tuple(names)

        def typed(v: Any) -> bool:
            return any(_is_type(n, v) for n in types)

        checks.append(typed)
    if "enum" in schema:
        if not isinstance(schema["enum"], list):
            return None
        checks.append(_one_of(tuple(schema["enum"])))
    if "const" in schema:
        checks.append(_one_of((schema["const"],)))
    if not _strings(schema, checks) or not _numbers(schema, checks):
        return None
    if not _objects(schema, checks) or not _arrays(schema, checks):
        return None
    if len(checks) == 1:
        return checks[0]
    return lambda value: all(check(value) for check in checks)


def _one_of(allowed: tuple[Any, ...]) -> Check:
    def listed(v: Any) -> bool:
        return any(_same(v, o) for o in allowed)

    return listed


def _count(schema: dict[str, Any], name: str) -> int | None:
    value = schema.get(name)
    return value if type(value) is int and value >= 0 else None


def _strings(schema: dict[str, Any], checks: list[Check]) -> bool:
    low, high = _count(schema, "minLength"), _count(schema, "maxLength")
    if ("minLength" in schema and low is None) or ("maxLength" in schema and high is None):
        return False
    if low is not None or high is not None:
        lo, hi = low or 0, high

        def lengths(v: Any) -> bool:
            if type(v) is not str:
                return True
            return lo <= len(v) and (hi is None or len(v) <= hi)

        checks.append(lengths)
    return True


def _numbers(schema: dict[str, Any], checks: list[Check]) -> bool:
    bounds = {}
    for name in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if name in schema:
            if type(schema[name]) not in (int, float):
                return False
            bounds[name] = schema[name]
    if bounds:

        def within(v: Any) -> bool:
            if type(v) not in (int, float):
                return True
            return (
                ("minimum" not in bounds or v >= bounds["minimum"])
                and ("maximum" not in bounds or v <= bounds["maximum"])
                and ("exclusiveMinimum" not in bounds or v > bounds["exclusiveMinimum"])
                and ("exclusiveMaximum" not in bounds or v < bounds["exclusiveMaximum"])
            )

        checks.append(within)
    return True


def _objects(schema: dict[str, Any], checks: list[Check]) -> bool:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list):
        return False
    if not all(isinstance(name, str) for name in required):
        return False
    subs: dict[str, Check] = {}
    for name, sub in properties.items():
        compiled = compile_check(sub)
        if compiled is None:
            return False
        subs[name] = compiled
    extra_check: Check | bool | None = None  # None: any other member is allowed
    if extra is False:
        extra_check = False
    elif extra is not True:
        extra_check = compile_check(extra)
        if extra_check is None:
            return False
    if not subs and not required and extra_check is None:
        return True
    names = tuple(required)

    def members(v: Any) -> bool:
        if type(v) is not dict:
            return True
        for name in names:
            if name not in v:
                return False
        for key, item in v.items():
            sub = subs.get(key)
            if sub is not None:
                if not sub(item):
                    return False
            elif extra_check is False or (callable(extra_check) and not extra_check(item)):
                return False
        return True

    checks.append(members)
    return True


def _arrays(schema: dict[str, Any], checks: list[Check]) -> bool:
    low, high = _count(schema, "minItems"), _count(schema, "maxItems")
    if ("minItems" in schema and low is None) or ("maxItems" in schema and high is None):
        return False
    item_check = None
    if "items" in schema:
        item_check = compile_check(schema["items"])
        if item_check is None:
            return False
    if item_check is None and low is None and high is None:
        return True
    lo, hi = low or 0, high

    def elements(v: Any) -> bool:
        if type(v) is not list:
            return True
        if len(v) < lo or (hi is not None and len(v) > hi):
            return False
        return item_check is None or all(item_check(item) for item in v)

    checks.append(elements)
    return True
