"""Example payloads for the portal's event catalog, made from a contract's JSON Schema."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from app import headers
from app.event_types.examples import MAX_BYTES, MAX_NODES, example_for

ORDER = {
    "type": "object",
    "required": ["order_id", "amount", "lines"],
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": "integer", "minimum": 0},
        "currency": {"type": "string", "enum": ["EUR", "USD"]},
        "placed_at": {"type": "string", "format": "date-time"},
        "email": {"type": ["string", "null"], "format": "email"},
        "lines": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/line"}},
        "gift": {"type": "boolean", "default": False},
    },
    "$defs": {
        "line": {
            "type": "object",
            "properties": {
                "sku": {"type": "string", "examples": ["SKU-1"]},
                "quantity": {"type": "integer", "exclusiveMinimum": 0},
            },
        }
    },
}


def test_a_schemas_own_example_wins():
    assert example_for({**ORDER, "examples": [{"order_id": "o-1"}]}) == {"order_id": "o-1"}


def test_an_example_is_made_from_the_schema_and_validates():
    made = example_for(ORDER)
    assert made == {
        "order_id": "string",
        "amount": 0,
        "currency": "EUR",
        "placed_at": "2026-01-31T12:00:00Z",
        "email": "someone@example.com",
        "lines": [{"sku": "SKU-1", "quantity": 1}] * 2,
        "gift": False,
    }
    assert not list(Draft202012Validator(ORDER).iter_errors(made))


def test_recursive_and_odd_schemas_end():
    tree = {"type": "object", "properties": {"child": {"$ref": "#"}}}
    made = example_for(tree)
    depth = 0
    while isinstance(made, dict) and made.get("child") is not None:
        made, depth = made["child"], depth + 1
    assert 0 < depth < 10
    assert example_for({"$ref": "#/nowhere"}) is None
    assert example_for({"anyOf": [{"type": "integer", "maximum": -5}, {"type": "string"}]}) == -5
    assert example_for(True) is None


def _values(value):
    if isinstance(value, dict):
        return 1 + sum(_values(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_values(v) for v in value)
    return 1


def test_a_ref_met_again_below_itself_is_not_followed_again():
    tree = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
        },
        "$defs": {"node": {"$ref": "#"}},
    }
    assert example_for(tree) == {"name": "string", "children": [{"name": "string", "children": []}]}
    # A ref used twice side by side is not a recursion: both are shown.
    address = {"type": "object", "properties": {"city": {"type": "string"}}}
    twice = {
        "type": "object",
        "$defs": {"address": address},
        "properties": {
            "billing": {"$ref": "#/$defs/address"},
            "shipping": {"$ref": "#/$defs/address"},
        },
    }
    assert example_for(twice) == {"billing": {"city": "string"}, "shipping": {"city": "string"}}


@pytest.mark.parametrize("properties", [50, 120, 2000])
def test_a_self_referencing_schema_makes_a_small_example(properties):
    """Without the budget 50 properties made 6.4 million values; 120 took the process down."""
    schema = {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(properties)}}
    made = example_for(schema)
    assert _values(made) <= MAX_NODES + 2 * properties
    assert set(made) == set(schema["properties"])


def test_lists_and_long_strings_are_charged_as_written():
    nested = {
        "type": "array",
        "minItems": 3,
        "items": {"type": "array", "minItems": 3, "items": {"type": "string", "minLength": 4000}},
    }
    made = example_for({"type": "object", "properties": {f"k{i}": nested for i in range(10)}})
    assert len(json.dumps(made)) <= MAX_BYTES + 1000
    assert example_for({"type": "string", "minLength": 10**9}) is None


def test_response_headers_hide_credentials():
    shown = headers.redact_response({"Set-Cookie": "sid=1", "X-Request-Id": "r", "X-Api-Key": "k"})
    assert shown == {"Set-Cookie": "[redacted]", "X-Request-Id": "r", "X-Api-Key": "[redacted]"}
    assert headers.redact_response(None) is None
