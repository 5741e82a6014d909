"""Filters without loops run as closures: every result is JMESPath's own."""

from __future__ import annotations

import jmespath
import pytest

from app.event_types import filters

EXPRESSIONS = [
    "data.amount > `1000` && data.currency == 'EUR'",
    "data.amount >= `5` || data.missing",
    "!data.flag",
    "!data.zero",
    "!data.empty",
    "data.items[0]",
    "data.items[-1] == `3`",
    "data.items[9]",
    "data.nested.deep.value == 'x'",
    "data.amount < data.limit",
    "data.currency < 'F'",
    "data.flag == `true`",
    "data.zero == `false`",
    "data.one != `true`",
    "resource.type == 'order' && version == `2`",
    "type",
    "data.amount | @ > `3`",
    "data.nested.deep",
    "data.missing.deeper",
    "data.items.a",
    "`0`",
    "`[]` || 'fallback'",
]
DATA = [
    {
        "amount": 5000,
        "currency": "EUR",
        "items": [1, 2, 3],
        "flag": False,
        "zero": 0,
        "empty": [],
        "one": 1,
        "limit": 6000,
        "nested": {"deep": {"value": "x"}},
    },
    {
        "amount": 3,
        "currency": "USD",
        "items": "not a list",
        "flag": True,
        "zero": 0.0,
        "empty": {},
        "one": True,
        "limit": "nope",
        "nested": {"deep": None},
    },
    {},
]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_a_straight_filter_answers_what_jmespath_answers(expression):
    compiled = filters.check(expression)
    assert compiled.straight is not None, expression
    for data in DATA:
        event = filters.envelope("order.created", 2, data, {"type": "order", "id": "o-1"})
        try:
            expected = jmespath.search(expression, event)
        except TypeError:  # JMESPath's own `<` between a number and a string
            with pytest.raises(TypeError):
                compiled.straight(event)
            assert filters.evaluate(compiled, event).matched is False
            continue
        assert compiled.straight(event) == expected, (expression, data)
        assert filters.evaluate(compiled, event).matched == filters.truthy(expected)


@pytest.mark.parametrize(
    "expression", ["data.items[*].a", "length(data.items) > `1`", "data.items[?@ > `1`]"]
)
def test_loops_and_functions_run_metered(expression):
    assert filters.check(expression).straight is None


def test_an_ordering_between_a_string_and_a_number_does_not_match():
    compiled = filters.check("data.a < data.b")
    outcome = filters.evaluate(compiled, filters.envelope("t", 1, {"a": "x", "b": 1}, None))
    assert outcome.matched is False
