"""The bounds of downgrade expressions: the static screen and the metered run (pure)."""

from __future__ import annotations

import json

import pytest

from app.event_types import downgrades
from app.event_types.downgrades import (
    Meter,
    Refused,
    TooLarge,
    compile_checked,
    compile_expression,
    run,
)

LIMIT = 64 * 1024


def refused_bound(expression: str) -> str:
    with pytest.raises(Refused) as info:
        compile_checked(expression)
    return info.value.bound


@pytest.mark.parametrize(
    "expression",
    [
        "{amount: amount_minor, currency: currency}",
        "merge(@, {amount: amount_minor})",
        "items[*].{sku: sku, quantity: qty}",
        "{a: x, b: x.y, c: x.y.z}",  # nested parts: three copies of x.y.z
        "{" + ", ".join(f"f{i}: data.f{i}" for i in range(300)) + "}",  # wide but disjoint
        "sort_by(items, &price)[0].{sku: sku}",
        "{a: @, b: @} | {a: @, b: @}",  # four copies: the most allowed
        "join(', ', tags)",
    ],
)
def test_ordinary_downgrades_pass_the_static_screen(expression):
    compile_checked(expression)


def test_blowups_are_refused_naming_the_bound():
    assert refused_bound("|".join(["{a: @, b: @}"] * 30)) == "pipes"
    assert refused_bound("|".join(["{a: @, b: @}"] * 3)) == "copies"
    assert refused_bound("{a: x, b: x, c: x, d: x, e: x}") == "copies"
    assert refused_bound("|".join(["to_string([@, @, @, @, @, @, @, @, @, @])"] * 5)) == "copies"
    assert refused_bound("items[*].[@, @, @] | [][*].[@, @]") == "copies"  # stages multiply
    assert refused_bound("map(&[@, @, @], items) | [*].[@, @]") == "copies"
    assert refused_bound("(" * 1000 + "@" + ")" * 1000) == "depth"  # no RecursionError
    assert refused_bound("{a: " * 40 + "@" + "}" * 40) == "depth"
    assert refused_bound("system(@)") == "functions"
    assert refused_bound("{amount: ") == "syntax"


def test_a_parse_error_names_the_problem_briefly():
    with pytest.raises(Refused) as info:
        compile_checked("`[" + "0," * 1500 + "0]`.`1`")
    assert len(str(info.value)) < 300


def test_a_shared_value_is_sized_as_json_writes_it():
    """Thirty stages of doubling build 31 objects and would write 2^30: stopped at once."""
    meter = Meter(LIMIT)
    with pytest.raises(TooLarge) as info:
        run(compile_expression("|".join(["{a: @, b: @}"] * 30)), {"x": 1}, meter)
    assert (info.value.reason, info.value.limit) == ("bytes", LIMIT)
    assert meter.work < 10_000


@pytest.mark.parametrize(
    ("expression", "data"),
    [
        # Copies nothing from its input (no static count sees it): 600 x 10 x 10 zeros.
        (
            "map(&map(&`[0,0,0,0,0,0,0,0,0,0]`, `[0,0,0,0,0,0,0,0,0,0]`), "
            "`[" + ",".join(["0"] * 600) + "]`) | [*][*][*]",
            {},
        ),
        ("|".join(["join('', [@, @, @, @])"] * 8), "x" * 100),  # sized before it is joined
        ("to_string(" + "|".join(["[@, @]"] * 20) + ")", {"x": 1}),  # sized before it is written
        ("[" + ", ".join(["items[]"] * 12) + "][][][]", {"items": list(range(3000))}),
    ],
)
def test_materialising_functions_are_stopped_before_they_build(expression, data):
    with pytest.raises(TooLarge) as info:
        run(compile_expression(expression), data, Meter(LIMIT))
    assert info.value.reason == "bytes"


def test_work_is_bounded_even_when_every_value_is_small():
    body = "{" + ", ".join(f"k{i}: `1`" for i in range(50)) + "}"
    meter = Meter(10**9, max_work=100_000)
    with pytest.raises(TooLarge) as info:
        run(compile_expression(f"items[*].{body}"), {"items": list(range(10_000))}, meter)
    assert (info.value.reason, info.value.limit) == ("work", 100_000)
    assert 100_000 < meter.work < 100_100  # stopped at the first excess


def test_equality_of_two_built_values_is_charged():
    doubled = "(" + "|".join(["{a: @, b: @}"] * 12) + ")"
    meter = Meter(10**9, max_work=10**9)
    assert run(compile_expression(f"{doubled} == {doubled}"), {"x": "y"}, meter) is True
    assert meter.work > 2**12  # the walk over 4096 leaves is paid for


def test_results_are_the_plain_jmespath_results():
    data = {
        "amount_minor": 1250,
        "currency": "EUR",
        "items": [{"sku": "a", "price": 2}, {"sku": "b", "price": 1}],
    }
    for expression in (
        "{amount: amount_minor, currency: currency}",
        "sort_by(items, &price)[*].sku",
        "to_string(items[0])",
        "items[?price > `1`].sku | [0]",
        "join('-', items[*].sku)",
    ):
        parsed = compile_expression(expression)
        assert run(parsed, data, Meter(LIMIT)) == parsed.search(data)


def test_a_type_error_is_a_failure_not_a_crash():
    with pytest.raises(downgrades.Failed):
        run(compile_expression("abs(currency)"), {"currency": "EUR"}, Meter(LIMIT))


def test_encoded_size_is_the_exact_utf8_json_length():
    value = {"note": "é", "n": [1, 2.5, None]}
    assert downgrades.encoded_size(value) == len(
        json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    )
