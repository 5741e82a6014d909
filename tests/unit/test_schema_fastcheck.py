"""The quick yes of app.event_types.fastcheck never accepts what jsonschema refuses, and
`data_errors` answers exactly what jsonschema answers."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from app.event_types import compile_schema, data_errors
from app.event_types.fastcheck import compile_check, compile_document_check

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-5, 5, allow_nan=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
types = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null"])


def _schemas(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keyword = st.one_of(
        st.tuples(st.just("type"), types | st.lists(types, min_size=1, max_size=2)),
        st.tuples(st.just("enum"), st.lists(json_values, min_size=1, max_size=3)),
        st.tuples(st.just("const"), json_values),
        st.tuples(st.sampled_from(["minLength", "maxLength", "minItems", "maxItems"]),
                  st.integers(0, 3)),
        st.tuples(st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
                  st.integers(-3, 3) | st.floats(-3, 3, allow_nan=False)),
        st.tuples(st.just("required"), st.lists(st.sampled_from("abc"), max_size=2, unique=True)),
        st.tuples(st.just("properties"),
                  st.dictionaries(st.sampled_from("abc"), inner, max_size=2)),
        st.tuples(st.just("additionalProperties"), st.booleans() | inner),
        st.tuples(st.just("items"), inner),
        st.tuples(st.just("description"), st.text(max_size=3)),
    )  # fmt: skip
    return st.lists(keyword, max_size=4).map(dict)


schemas = st.recursive(st.just({}) | st.just(True), _schemas, max_leaves=6)


@settings(max_examples=1500, deadline=None)
@given(schemas, json_values)
def test_a_quick_yes_is_always_jsonschemas_yes(schema, document):
    check = compile_check(schema)
    assert check is not None  # every keyword generated is one it judges
    if check(document):
        assert Draft202012Validator(schema).is_valid(document), (schema, document)


@settings(max_examples=300, deadline=None)
@given(schemas.filter(lambda s: isinstance(s, dict)), json_values)
def test_data_errors_are_jsonschemas_errors(schema, document):
    validator = compile_schema(schema)
    expected = sorted(e.message for e in Draft202012Validator(schema).iter_errors(document))
    assert sorted(e["message"] for e in data_errors(validator, document)) == expected


def test_what_it_does_not_judge_gets_no_quick_yes():
    assert compile_document_check({"type": "string", "format": "email"}) is None
    assert compile_document_check({"properties": {"a": {"pattern": "^x"}}}) is None
    assert compile_document_check({"$ref": "#/$defs/a", "$defs": {"a": {}}}) is None
    older = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}
    assert compile_document_check(older) is None


def test_an_integral_float_is_left_to_jsonschema_which_takes_it_for_an_integer():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert compile_check(schema)({"n": 1.0}) is False
    assert data_errors(compile_schema(schema), {"n": 1.0}) == []
    errors = data_errors(compile_schema(schema), {"n": "1"})
    assert [(e["path"], e["keyword"]) for e in errors] == [("/n", "type")]
