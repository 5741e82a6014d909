"""An example `data` for a JSON Schema, for partners reading the event catalog.

A contract's own example wins (the schema's `examples` keyword); otherwise one is made up from
the schema: `const`, `default`, `enum` and `examples` of each property first, then a plain
value of its type and format. Local `$ref`s are followed (contracts allow no other kind). The
result is a readable sketch, not a promise that every generated value validates (a `pattern`
is not reverse-engineered).

Any partner can open the catalog, so making an example must stay cheap whatever the schema: a
`$ref` met again below itself is not followed a second time (a recursive schema shows one
level of its recursion), and making one example follows at most `MAX_NODES` schema nodes and
takes about `MAX_BYTES` bytes of JSON from the schema — past either, each property still to
fill is `null` and a list is `[]`. So an example is at most `MAX_NODES` values plus one `null`
per property of the objects open when the budget ran out: linear in the schema, never
multiplied by it. Without this, `{"properties": {"p0": {"$ref": "#"}, ...}}` grows as its
property count to the depth.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 6
MAX_NODES = 1000
MAX_BYTES = 16 * 1024
SCALAR_BYTES = 5
_FORMATS = {
    "date-time": "2026-01-31T12:00:00Z",
    "date": "2026-01-31",
    "time": "12:00:00Z",
    "email": "someone@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "hostname": "example.com",
}


def example_for(schema: Any) -> Any:
    """The schema's first example, or one made from it within the budget."""
    own = own_example(schema)
    return own if own is not None else made_for(schema)


def own_example(schema: Any) -> Any:
    """The schema's first `examples` entry, if it has one (None otherwise)."""
    if isinstance(schema, dict) and isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    return None


def made_for(schema: Any) -> Any:
    """An example made from the schema within the budget, ignoring its own `examples`."""
    value = _Maker(schema).make(schema, 0, ())
    return None if value is _STOP else value


class _Stop:
    """Nothing more is made here: a `$ref` met again below itself, or the budget spent."""


_STOP: Any = _Stop()


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref.lstrip("#").split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return {}
    return node


class _Maker:
    """One example being made: the schema's root and what is left of the budget."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.nodes = MAX_NODES
        self.bytes = MAX_BYTES

    def _take(self, value: Any) -> Any:
        """Charge a value taken whole from the schema (`const`, `default`, ...)."""
        try:
            size = len(json.dumps(value, ensure_ascii=False))
        except (TypeError, ValueError, RecursionError):
            return None
        if size > self.bytes:
            self.bytes = 0
            return _STOP
        self.bytes -= size
        return value

    def make(self, node: Any, depth: int, refs: tuple[str, ...]) -> Any:
        if self.nodes <= 0 or self.bytes <= 0:
            return _STOP
        self.nodes -= 1
        self.bytes -= SCALAR_BYTES  # what a plain value or a container's brackets write
        if not isinstance(node, dict) or depth > MAX_DEPTH:
            return None
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            if ref in refs:
                return _STOP
            return self.make(_resolve(self.root, ref), depth + 1, (*refs, ref))
        for key in ("const", "default"):
            if key in node:
                return self._take(node[key])
        if isinstance(node.get("enum"), list) and node["enum"]:
            return self._take(node["enum"][0])
        if isinstance(node.get("examples"), list) and node["examples"]:
            return self._take(node["examples"][0])
        for key in ("oneOf", "anyOf", "allOf"):
            options = node.get(key)
            if isinstance(options, list) and options:
                if key == "allOf":
                    merged: dict[str, Any] = {}
                    for option in options:
                        part = self.make(option, depth + 1, refs)
                        if isinstance(part, dict):
                            merged.update(part)
                    if merged:
                        return merged
                return self.make(options[0], depth + 1, refs)
        kind = node.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in node else ("array" if "items" in node else None)
        if kind == "object":
            return self._object(node, depth, refs)
        if kind == "array":
            return self._array(node, depth, refs)
        if kind == "string":
            text = _FORMATS.get(str(node.get("format", "")), "string")
            minimum = node.get("minLength", 0)
            minimum = minimum if isinstance(minimum, int) and not isinstance(minimum, bool) else 0
            return self._take(
                text if len(text) >= minimum else text + "x" * (min(minimum, MAX_BYTES) - len(text))
            )
        if kind == "integer":
            return _number(node, 1)
        if kind == "number":
            return _number(node, 1.5)
        if kind == "boolean":
            return True
        return None

    def _object(self, node: dict[str, Any], depth: int, refs: tuple[str, ...]) -> Any:
        properties = node.get("properties")
        if not isinstance(properties, dict):
            return {}
        made: dict[str, Any] = {}
        for name, sub in properties.items():
            value = self.make(sub, depth + 1, refs)
            made[name] = None if value is _STOP else value
            self.bytes -= len(name) + 4  # "name":,
        return made

    def _array(self, node: dict[str, Any], depth: int, refs: tuple[str, ...]) -> Any:
        before = (self.nodes, self.bytes)
        item = self.make(node.get("items", {}), depth + 1, refs)
        if item is _STOP:
            return []
        minimum = node.get("minItems", 1)
        count = min(max(1, minimum if isinstance(minimum, int) else 1), 3)
        # The copies are one shared object, but each is written out: charge them all.
        nodes, size = before[0] - self.nodes, before[1] - self.bytes
        while count > 1 and (nodes * (count - 1) > self.nodes or size * (count - 1) > self.bytes):
            count -= 1
        self.nodes -= nodes * (count - 1)
        self.bytes -= size * (count - 1)
        return [item] * count


def _number(node: dict[str, Any], fallback: float) -> Any:
    for key in ("minimum", "exclusiveMinimum"):
        if isinstance(node.get(key), int | float) and not isinstance(node.get(key), bool):
            value = node[key] + (1 if key == "exclusiveMinimum" else 0)
            return int(value) if isinstance(fallback, int) else value
    maximum = node.get("maximum")
    if isinstance(maximum, int | float) and not isinstance(maximum, bool) and maximum < fallback:
        return maximum
    return fallback
