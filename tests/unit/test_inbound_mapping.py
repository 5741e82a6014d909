"""Field extraction from verified callbacks: JSON pointers, headers, presets and typing."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.inbound.mapping import (
    PRESETS,
    Extracted,
    FieldMapping,
    MappingError,
    extract,
    merge,
    require,
    validate_path,
)
from app.inbound.verify import SCHEMES

EMPTY = FieldMapping(None, None, None, None, None, None)


def only(field: str, path: str | None) -> FieldMapping:
    """A mapping that reads just one field."""
    return dataclasses.replace(EMPTY, **{field: path})


def pick(path: str, body: object, headers: list[tuple[str, str]] | None = None) -> str | None:
    """Extract one text field through ``path``."""
    return extract(only("event_id", path), headers or [], body).event_id


# -- JSON pointers (RFC 6901) ----------------------------------------------------------------

RFC6901_DOC = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("/foo/0", "bar"),
        ("/foo/1", "baz"),
        ("/", "0"),
        ("/a~1b", "1"),
        ("/c%d", "2"),
        ("/e^f", "3"),
        ("/g|h", "4"),
        ("/i\\j", "5"),
        ('/k"l', "6"),
        ("/ ", "7"),
        ("/m~0n", "8"),
    ],
)
def test_rfc6901_examples_resolve(pointer: str, expected: str) -> None:
    validate_path(pointer)
    assert pick(pointer, RFC6901_DOC) == expected


def test_escapes_are_decoded_tilde_one_first() -> None:
    # "~01" is "~1" literally, not "/": decoding ~0 first would get this wrong.
    body = {"~1": "tilde-one", "/": "slash"}
    assert pick("/~01", body) == "tilde-one"
    assert pick("/~1", body) == "slash"


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("/data/object/id", "pi_1"),
        ("/items/0/sku", "A-1"),
        ("/items/1/sku", "B-2"),
        ("/items/2/sku", None),
        ("/items/-/sku", None),
        ("/items/01/sku", None),
        ("/items/x/sku", None),
        ("/items/sku", None),
        ("/data/object/id/deeper", None),
        ("/nope", None),
        ("/data/nope/id", None),
        ("/matrix/1/0", "3"),
        ("/numeric-keys/0", "zero"),
    ],
)
def test_pointers_walk_objects_and_arrays(pointer: str, expected: str | None) -> None:
    body = {
        "data": {"object": {"id": "pi_1"}},
        "items": [{"sku": "A-1"}, {"sku": "B-2"}],
        "matrix": [[1, 2], [3, 4]],
        "numeric-keys": {"0": "zero"},
    }
    assert pick(pointer, body) == expected


@pytest.mark.parametrize("body", [None, "text", 42, [1, 2], True])
def test_pointer_into_a_non_object_body_finds_nothing(body: object) -> None:
    assert pick("/id", body) is None


def test_json_null_and_empty_string_count_as_absent() -> None:
    assert pick("/id", {"id": None}) is None
    assert pick("/id", {"id": ""}) is None
    assert extract(only("resource_version", "/v"), [], {"v": ""}).resource_version is None


# -- headers ---------------------------------------------------------------------------------


def test_header_path_reads_a_header_case_insensitively() -> None:
    headers = [("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")]
    assert pick("header:X-GitHub-Delivery", {}, headers) == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert pick("header:x-github-delivery", {}, [("X-GITHUB-DELIVERY", "d")]) == "d"


def test_missing_header_finds_nothing() -> None:
    assert pick("header:X-GitHub-Delivery", {"id": "body-id"}, [("X-Other", "1")]) is None


def test_header_with_two_different_values_is_ambiguous() -> None:
    headers = [("X-Shopify-Webhook-Id", "a"), ("x-shopify-webhook-id", "b")]
    with pytest.raises(MappingError, match="different values"):
        pick("header:X-Shopify-Webhook-Id", {}, headers)


def test_header_repeated_with_the_same_value_is_fine() -> None:
    headers = [("X-Shopify-Webhook-Id", "a"), ("x-shopify-webhook-id", " a ")]
    assert pick("header:X-Shopify-Webhook-Id", {}, headers) == "a"


def test_non_ascii_lookalike_header_name_does_not_match() -> None:
    # KELVIN SIGN lowercases to 'k'.
    headers = [("X-Shopify-Webhoo\u212a-Id", "forged")]
    assert pick("header:X-Shopify-Webhook-Id", {}, headers) is None


def test_alternatives_take_the_first_that_yields_a_value() -> None:
    path = "header:webhook-id | header:svix-id | /id"
    assert pick(path, {"id": "body"}, [("webhook-id", "std"), ("svix-id", "svix")]) == "std"
    assert pick(path, {"id": "body"}, [("svix-id", "svix")]) == "svix"
    assert pick(path, {"id": "body"}, []) == "body"
    assert pick(path, {}, []) is None
    assert pick("/a | /b", {"a": None, "b": "second"}) == "second"


# -- validate_path ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/id",
        "/",
        "/data/object/id",
        "/a~0b/c~1d",
        "/items/0",
        "header:X-GitHub-Delivery",
        "header:webhook-id | /id",
        "/pull_request/id | /issue/id",
    ],
)
def test_valid_paths_pass(path: str) -> None:
    validate_path(path)


@pytest.mark.parametrize(
    "path",
    [
        "",
        "id",
        "data.object.id",
        "$.data.id",
        "#/id",
        "header:",
        "header:X Bad",
        "header:caf\u00e9",
        "header:a:b",
        "Header:X-Id",
        "/a~2b",
        "/trailing~",
        "/id | ",
        " | /id",
        "/id | data.id",
    ],
)
def test_invalid_paths_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="path|pointer|header|RFC 6901"):
        validate_path(path)


def test_non_string_path_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        validate_path(None)  # type: ignore[arg-type]


# -- presets ---------------------------------------------------------------------------------


def test_there_is_a_preset_for_every_scheme_and_every_path_is_valid() -> None:
    assert set(PRESETS) == set(SCHEMES)
    for preset in PRESETS.values():
        for field in dataclasses.fields(preset):
            path = getattr(preset, field.name)
            if path is not None:
                validate_path(path)
        assert preset.event_id is not None
        assert preset.resource_id is not None


def test_stripe_preset_reads_a_stripe_event() -> None:
    body = {
        "id": "evt_1NG8Du2eZvKYlo2CUI79vXWy",
        "object": "event",
        "type": "payment_intent.succeeded",
        "created": 1686089970,
        "data": {"object": {"id": "pi_3NG8", "object": "payment_intent", "status": "succeeded"}},
    }
    got = extract(PRESETS["stripe"], [("Stripe-Signature", "t=1,v1=x")], body)
    assert got == Extracted(
        event_id="evt_1NG8Du2eZvKYlo2CUI79vXWy",
        event_type="payment_intent.succeeded",
        resource_id="pi_3NG8",
        resource_version=None,
        occurred_at=datetime(2023, 6, 6, 22, 19, 30, tzinfo=UTC),
        status="succeeded",
        resource_type="payment_intent",
    )


def test_github_preset_reads_ids_from_headers_and_the_object_from_the_body() -> None:
    headers = [
        ("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ("X-GitHub-Event", "pull_request"),
    ]
    body = {
        "action": "closed",
        "pull_request": {"id": 1296269, "state": "closed", "updated_at": "2011-01-26T19:01:12Z"},
        "repository": {"id": 35129377, "updated_at": "2010-01-01T00:00:00Z"},
    }
    got = extract(PRESETS["github"], headers, body)
    assert got.event_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert got.event_type == "pull_request"
    assert got.resource_type == "pull_request"
    assert got.resource_id == "1296269"
    assert got.status == "closed"
    assert got.occurred_at == datetime(2011, 1, 26, 19, 1, 12, tzinfo=UTC)
    assert got.resource_version is None


def test_github_preset_falls_back_to_the_repository_and_the_action() -> None:
    headers = [("X-GitHub-Delivery", "d-2"), ("X-GitHub-Event", "star")]
    body = {"action": "created", "repository": {"id": 35129377}}
    got = extract(PRESETS["github"], headers, body)
    assert (got.resource_id, got.status, got.occurred_at) == ("35129377", "created", None)


def test_shopify_preset_reads_an_order_webhook() -> None:
    headers = [
        ("X-Shopify-Webhook-Id", "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
        ("X-Shopify-Topic", "orders/paid"),
        ("X-Shopify-Triggered-At", "2024-05-01T10:00:05Z"),
    ]
    body = {
        "id": 820982911946154508,
        "financial_status": "paid",
        "updated_at": "2024-05-01T06:00:00-04:00",
    }
    got = extract(PRESETS["shopify"], headers, body)
    assert got.event_id == "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"
    assert got.event_type == "orders/paid"
    assert got.resource_id == "820982911946154508"
    assert got.status == "paid"
    assert got.occurred_at == datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
    assert got.resource_type is None


def test_shopify_preset_falls_back_to_the_triggered_at_header_and_status() -> None:
    headers = [("X-Shopify-Webhook-Id", "w"), ("X-Shopify-Triggered-At", "2024-05-01T10:00:05Z")]
    got = extract(PRESETS["shopify"], headers, {"id": 1, "status": "active"})
    assert got.occurred_at == datetime(2024, 5, 1, 10, 0, 5, tzinfo=UTC)
    assert got.status == "active"


def test_standard_webhooks_preset_reads_kurirs_own_outbound_shape() -> None:
    body = {
        "id": "evt_body",
        "type": "payment.succeeded",
        "version": 2,
        "occurred_at": "2026-12-02T10:00:00Z",
        "resource": {"type": "payment", "id": "pay_123", "version": 7},
        "data": {"status": "succeeded"},
    }
    got = extract(PRESETS["standard-webhooks"], [("webhook-id", "evt_hdr")], body)
    assert got == Extracted(
        event_id="evt_hdr",
        event_type="payment.succeeded",
        resource_id="pay_123",
        resource_version=7,
        occurred_at=datetime(2026, 12, 2, 10, 0, tzinfo=UTC),
        status="succeeded",
        resource_type="payment",
    )


def test_standard_webhooks_preset_event_id_falls_back_to_svix_then_the_body() -> None:
    body = {"id": "evt_body"}
    assert extract(PRESETS["standard-webhooks"], [("svix-id", "msg_s")], body).event_id == "msg_s"
    assert extract(PRESETS["standard-webhooks"], [], body).event_id == "evt_body"


# -- merge -----------------------------------------------------------------------------------


def test_merge_overrides_some_fields_and_keeps_the_rest() -> None:
    merged = merge(PRESETS["stripe"], {"resource_version": "/data/object/metadata/version"})
    assert merged.resource_version == "/data/object/metadata/version"
    assert merged.event_id == "/id"
    assert PRESETS["stripe"].resource_version is None


def test_merge_with_none_switches_a_field_off() -> None:
    merged = merge(PRESETS["stripe"], {"status": None})
    assert merged.status is None
    assert extract(merged, [], {"data": {"object": {"status": "x"}}}).status is None


def test_merge_with_nothing_is_the_preset() -> None:
    assert merge(PRESETS["github"], {}) == PRESETS["github"]


def test_merge_refuses_an_unknown_field() -> None:
    with pytest.raises(ValueError, match="unknown mapping field"):
        merge(PRESETS["stripe"], {"eventid": "/id"})


def test_merge_refuses_an_invalid_path_naming_the_field() -> None:
    with pytest.raises(ValueError, match="^resource_id: "):
        merge(PRESETS["stripe"], {"resource_id": "data.object.id"})


def test_field_mapping_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["stripe"].event_id = "/x"  # type: ignore[misc]


# -- typing of values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("evt_1", "evt_1"), (12345, "12345"), (820982911946154508, "820982911946154508"), (7.0, "7")],
)
def test_ids_are_coerced_to_strings(value: object, expected: str) -> None:
    assert pick("/id", {"id": value}) == expected


@pytest.mark.parametrize("value", [{"a": 1}, [1], True, False, 1.5])
def test_an_id_that_is_not_a_scalar_string_or_integer_is_refused(value: object) -> None:
    with pytest.raises(MappingError, match="event_id"):
        pick("/id", {"id": value})


@pytest.mark.parametrize(("value", "expected"), [(7, 7), (0, 0), ("42", 42), (" 42 ", 42)])
def test_versions_are_integers(value: object, expected: int) -> None:
    got = extract(only("resource_version", "/v"), [], {"v": value})
    assert got.resource_version == expected


def test_version_from_a_header() -> None:
    mapping = only("resource_version", "header:X-Resource-Version")
    assert extract(mapping, [("x-resource-version", "9")], {}).resource_version == 9


@pytest.mark.parametrize(
    "value",
    ["7a", "v7", "1.0", 1.0, 7.5, " ", "-1", "+1", "\u0661", "\u00b2", True, [7], {"v": 7}],
)
def test_a_version_that_is_not_an_integer_is_refused(value: object) -> None:
    with pytest.raises(MappingError, match="^resource_version is not an integer$"):
        extract(only("resource_version", "/v"), [], {"v": value})


@pytest.mark.parametrize("value", [-1, 2**63, "9" * 19, "9" * 30])
def test_a_version_outside_a_bigint_is_refused(value: object) -> None:
    with pytest.raises(MappingError, match="resource_version"):
        extract(only("resource_version", "/v"), [], {"v": value})


def test_largest_bigint_version_is_accepted() -> None:
    got = extract(only("resource_version", "/v"), [], {"v": str(2**63 - 1)})
    assert got.resource_version == 2**63 - 1


T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1796205600, T0),
        (1796205600.25, T0 + timedelta(milliseconds=250)),
        ("1796205600", T0),
        ("1796205600.5", T0 + timedelta(milliseconds=500)),
        ("2026-12-02T10:00:00Z", T0),
        ("2026-12-02t10:00:00z", T0),
        ("2026-12-02T10:00:00+00:00", T0),
        ("2026-12-02T12:00:00+02:00", T0),
        ("2026-12-02T05:00:00-05:00", T0),
        ("2026-12-02T10:00:00.123456Z", T0 + timedelta(microseconds=123456)),
        ("2026-12-02 10:00:00Z", T0),
        ("2026-12-02T10:00:00", T0),
        ("20261202T100000Z", T0),
    ],
)
def test_occurred_at_accepts_unix_seconds_and_rfc3339(value: object, expected: datetime) -> None:
    got = extract(only("occurred_at", "/t"), [], {"t": value}).occurred_at
    assert got == expected
    assert got is not None
    assert got.tzinfo is UTC


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run in a local time zone that is not UTC, so local-time mistakes show."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("far_from_utc")
def test_time_without_offset_is_utc_whatever_the_local_zone() -> None:
    assert time.localtime(0).tm_hour != 0
    got = extract(only("occurred_at", "/t"), [], {"t": "2026-12-02T10:00:00"}).occurred_at
    assert got == T0


def test_occurred_at_is_converted_to_utc() -> None:
    got = extract(only("occurred_at", "/t"), [], {"t": "2026-12-02T12:00:00+02:00"}).occurred_at
    assert got is not None
    assert got.utcoffset() == timedelta(0)
    assert got.hour == 10


@pytest.mark.parametrize(
    "value",
    [
        "yesterday",
        "2026-13-02T10:00:00Z",
        "2026-12-02T25:00:00Z",
        "02/12/2026",
        "0001-01-01T00:00:00+01:00",
        "9" * 40,
        "1e9",
        True,
        [1796205600],
        {"seconds": 1796205600},
        float("nan"),
        float("inf"),
        1e300,
    ],
)
def test_unreadable_occurred_at_is_refused(value: object) -> None:
    with pytest.raises(MappingError, match="occurred_at"):
        extract(only("occurred_at", "/t"), [], {"t": value})


def test_unmapped_fields_are_none() -> None:
    assert extract(EMPTY, [("webhook-id", "x")], {"id": "y"}) == Extracted(
        None, None, None, None, None, None, None
    )


@given(
    body=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=20,
    )
)
def test_any_json_body_yields_fields_or_a_mapping_error(body: object) -> None:
    for preset in PRESETS.values():
        with contextlib.suppress(MappingError):
            extract(preset, [("webhook-id", "w"), ("X-GitHub-Event", "push")], body)


# -- require ---------------------------------------------------------------------------------


def full() -> Extracted:
    """An extraction with every field present."""
    return Extracted("e", "t", "r", 1, T0, "s", "rt")


def test_require_passes_when_the_fields_are_present() -> None:
    require(full())
    require(full(), ("event_id", "resource_id", "resource_version", "occurred_at"))


def test_require_names_every_missing_field() -> None:
    extracted = dataclasses.replace(full(), event_id=None, resource_id=None)
    with pytest.raises(MappingError, match="^missing field\\(s\\): event_id, resource_id$"):
        require(extracted, ("event_id", "event_type", "resource_id"))


def test_require_defaults_to_the_event_id() -> None:
    with pytest.raises(MappingError, match="event_id"):
        require(dataclasses.replace(full(), event_id=None))
    require(dataclasses.replace(full(), resource_id=None))


def test_require_accepts_a_single_field_name() -> None:
    with pytest.raises(MappingError, match="resource_id"):
        require(dataclasses.replace(full(), resource_id=None), "resource_id")


def test_require_refuses_an_unknown_field_name() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        require(full(), ("evnt_id",))


def test_mapping_error_is_a_value_error() -> None:
    assert issubclass(MappingError, ValueError)
