"""Producing older contract versions: renditions first, then chains of downgrades (pure)."""

from __future__ import annotations

import pytest

from app.event_types import (
    MAX_DOWNGRADE_HOPS,
    Version,
    VersionInvalid,
    VersionTooLarge,
    VersionUnavailable,
    compile_downgrade,
    compile_schema,
    produce,
    reachable,
)

V1 = {
    "type": "object",
    "required": ["amount"],
    "properties": {"amount": {"type": "integer"}},
    "additionalProperties": False,
}
V2 = {
    "type": "object",
    "required": ["amount", "currency"],
    "properties": {"amount": {"type": "integer"}, "currency": {"type": "string"}},
    "additionalProperties": False,
}
V3 = {
    "type": "object",
    "required": ["amount_minor", "currency"],
    "properties": {
        "amount_minor": {"type": "integer"},
        "currency": {"type": "string"},
        "fx": {"type": "number"},
    },
}


def family(
    v3_downgrade: str | None = "{amount: amount_minor, currency: currency}",
    v2_downgrade: str | None = "{amount: amount}",
) -> dict[int, Version]:
    def version(n: int, schema: dict, downgrade: str | None) -> Version:
        return Version(
            f"ety_{n}",
            n,
            False,
            None,
            compile_schema(schema),
            compile_downgrade(downgrade) if downgrade else None,
        )

    return {
        1: version(1, V1, None),
        2: version(2, V2, v2_downgrade),
        3: version(3, V3, v3_downgrade),
    }


DATA = {"amount_minor": 1250, "currency": "EUR", "fx": 1.1}


def test_a_chain_of_downgrades_makes_every_older_version():
    made = produce(family(), 3, DATA, {}, {1, 2, 3})
    assert made == {
        2: ({"amount": 1250, "currency": "EUR"}, "downgrade"),
        1: ({"amount": 1250}, "downgrade"),
    }


def test_a_rendition_wins_over_the_transform_and_feeds_the_chain_below_it():
    rendition = {"amount": 7, "currency": "USD"}
    made = produce(family(), 3, DATA, {2: rendition}, {1, 2})
    assert made == {2: (rendition, "rendition"), 1: ({"amount": 7}, "downgrade")}
    # A rendition nobody pins is kept too (validated), for whoever pins it later.
    assert produce(family(), 3, DATA, {2: rendition}, set()) == {2: (rendition, "rendition")}


def test_a_missing_link_or_an_upgrade_is_unavailable():
    with pytest.raises(VersionUnavailable) as info:
        produce(family(v2_downgrade=None), 3, DATA, {}, {1})
    assert info.value.version == 1
    with pytest.raises(VersionUnavailable):
        produce(family(), 2, {"amount": 1, "currency": "EUR"}, {}, {3})  # no up-conversion
    with pytest.raises(VersionUnavailable):
        produce(family(), 3, DATA, {}, {9})  # not registered


def test_an_upper_version_exists_as_an_explicit_rendition():
    upper = {"amount_minor": 1, "currency": "EUR"}
    made = produce(family(), 2, {"amount": 1, "currency": "EUR"}, {3: upper}, {3})
    assert made == {3: (upper, "rendition")}


def test_a_transform_that_breaks_the_older_schema_names_the_version():
    with pytest.raises(VersionInvalid) as info:
        produce(family(v3_downgrade="{amount: currency, currency: currency}"), 3, DATA, {}, {2})
    assert info.value.version == 2 and info.value.source == "downgrade"
    assert info.value.errors[0]["path"] == "/amount"
    with pytest.raises(VersionInvalid) as info:
        produce(family(v3_downgrade="amount_minor"), 3, DATA, {}, {2})  # not an object
    assert info.value.version == 2


def test_every_rendition_is_validated_even_when_no_endpoint_needs_it():
    with pytest.raises(VersionInvalid) as info:
        produce(family(), 3, DATA, {1: {"amount": "lots"}}, set())
    assert (info.value.version, info.value.source) == (1, "rendition")


def test_a_bad_expression_does_not_compile():
    with pytest.raises(ValueError, match="."):
        compile_downgrade("{amount: ")


def test_a_version_too_large_to_make_names_itself():
    loose = {
        1: Version("ety_1", 1, False, None, compile_schema({"type": "object"}), None),
        2: Version(
            "ety_2",
            2,
            False,
            None,
            compile_schema({"type": "object"}),
            compile_downgrade("{a: @, b: @} | {a: @, b: @}"),
        ),
    }
    data = {"note": "n" * 3000}
    assert produce(loose, 2, data, {}, {1}, max_bytes=16_000)[1][0]["a"]["b"] == data
    with pytest.raises(VersionTooLarge) as info:
        produce(loose, 2, data, {}, {1}, max_bytes=10_000)
    assert (info.value.version, info.value.reason, info.value.limit) == (1, "bytes", 10_000)


def test_a_chain_is_at_most_the_hop_bound_long_and_a_rendition_restarts_it():
    newest = MAX_DOWNGRADE_HOPS + 2
    chain = {v: v > 1 for v in range(1, newest + 1)}
    reach = reachable(chain, newest, set())
    assert 1 not in reach and reach[2] == MAX_DOWNGRADE_HOPS and reach[newest] == 0
    assert reachable(chain, newest, {5})[1] == 4  # counted from the rendition
    assert 3 not in reachable({**chain, 4: False}, newest, set())  # a missing link
    assert newest not in reachable(chain, newest - 1, set())  # never upwards
    # Far apart version numbers are not walked one by one.
    assert reachable({1: False, 2**31 - 1: True}, 2**31 - 1, set()) == {2**31 - 1: 0}
