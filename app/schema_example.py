"""An example `data` for a JSON Schema, for partners reading the event catalog.

A contract's own example wins (the schema's `examples` keyword); otherwise one is made up from
the schema: `const`, `default`, `enum` and `examples` of each property first, then a plain
value of its type and format. Local `$ref`s are followed (contracts allow no other kind); a
recursive schema stops at a small depth. The result is a readable sketch, not a promise that
every generated value validates (a `pattern` is not reverse-engineered).
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 6
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
    """The schema's first example, or one made from it."""
    if isinstance(schema, dict) and isinstance(schema.get("examples"), list) \
            and schema["examples"]:
        return schema["examples"][0]
    return _make(schema, schema, 0)


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


def _make(node: Any, root: Any, depth: int) -> Any:
    if not isinstance(node, dict) or depth > MAX_DEPTH:
        return None
    if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
        return _make(_resolve(root, node["$ref"]), root, depth + 1)
    for key in ("const", "default"):
        if key in node:
            return node[key]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return node["enum"][0]
    if isinstance(node.get("examples"), list) and node["examples"]:
        return node["examples"][0]
    for key in ("oneOf", "anyOf", "allOf"):
        options = node.get(key)
        if isinstance(options, list) and options:
            if key == "allOf":
                merged: dict[str, Any] = {}
                for option in options:
                    part = _make(option, root, depth + 1)
                    if isinstance(part, dict):
                        merged.update(part)
                if merged:
                    return merged
            return _make(options[0], root, depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in node else ("array" if "items" in node else None)
    if kind == "object":
        properties = node.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: _make(sub, root, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        item = _make(node.get("items", {}), root, depth + 1)
        count = max(1, int(node.get("minItems", 1) or 1))
        return [item] * min(count, 3)
    if kind == "string":
        text = _FORMATS.get(str(node.get("format", "")), "string")
        minimum = int(node.get("minLength", 0) or 0)
        return text if len(text) >= minimum else text + "x" * (minimum - len(text))
    if kind == "integer":
        return _number(node, 1)
    if kind == "number":
        return _number(node, 1.5)
    if kind == "boolean":
        return True
    return None


def _number(node: dict[str, Any], fallback: float) -> Any:
    for key in ("minimum", "exclusiveMinimum"):
        if isinstance(node.get(key), int | float) and not isinstance(node.get(key), bool):
            value = node[key] + (1 if key == "exclusiveMinimum" else 0)
            return int(value) if isinstance(fallback, int) else value
    maximum = node.get("maximum")
    if isinstance(maximum, int | float) and not isinstance(maximum, bool) and maximum < fallback:
        return maximum
    return fallback
