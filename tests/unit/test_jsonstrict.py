"""Strict JSON parsing: what json.loads accepts but could not be stored or sent on as JSON."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.jsonstrict import InvalidJSON, has_lone_surrogate, loads, nul_at


@pytest.mark.parametrize(
    "body",
    [
        rb'{"s": "\ud800"}',  # high surrogate alone
        rb'{"s": "x\uDFFF"}',  # low surrogate alone, upper-case hex
        rb'{"s": "\ude00\ud83d"}',  # a pair in the wrong order is two lone halves
        rb'{"s": "\ud83d\u0041"}',  # high surrogate followed by a non-surrogate
        rb'{"k\udc00": 1}',  # in a key
        rb'[{"a": ["ok", "\ud800"]}]',  # deep in arrays and objects
        rb'"\ud800"',  # the document itself
    ],
)
def test_lone_surrogate_escapes_are_refused(body):
    json.loads(body)  # what Python lets through
    with pytest.raises(InvalidJSON, match="lone UTF-16 surrogate"):
        loads(body)


def test_the_refusal_says_where_and_is_itself_encodable():
    with pytest.raises(InvalidJSON) as caught:
        loads(rb'{"a": [{"b/c": "x\ud800"}], "ok": "\u00e9"}')
    message = str(caught.value)
    assert "'/a/0/b~1c'" in message
    message.encode()  # never echoes the surrogate it refuses
    with pytest.raises(InvalidJSON) as caught:
        loads(rb'{"a": {"k\udc00": 1}}')
    assert "a key of the object at '/a'" in str(caught.value)
    str(caught.value).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (rb'{"s": "\ud83d\ude00"}', {"s": "\U0001f600"}),  # a valid pair is one code point
        (rb'{"s": "\uD83D\uDE00"}', {"s": "\U0001f600"}),
        (rb'{"s": "\\ud800"}', {"s": "\\ud800"}),  # an escaped backslash, not an escape
        (rb'{"s": "\ud7ff\ue000"}', {"s": "\ud7ff\ue000"}),  # either side of the block
        ('{"s": "caf\u00e9 \U0001f600"}'.encode(), {"s": "caf\u00e9 \U0001f600"}),
        (b'\xef\xbb\xbf{"a": 1}', {"a": 1}),  # a UTF-8 byte order mark
        ('{"a": "\u00e9"}'.encode("utf-16"), {"a": "\u00e9"}),  # UTF-16, as json.loads allows
        (
            b"[1.5, -0.0, 1e-400, 1E+308, 12345678901234567890]",
            [1.5, -0.0, 0.0, 1e308, 12345678901234567890],
        ),
    ],
)
def test_valid_json_parses_as_json_loads_would(body, expected):
    assert loads(body) == expected == json.loads(body)


def test_raw_surrogate_bytes_are_refused_though_json_loads_decodes_them():
    # json.loads(bytes) decodes with 'surrogatepass': CESU-style bytes become a lone surrogate.
    assert json.loads(b'"\xed\xa0\x80"') == "\ud800"
    with pytest.raises(InvalidJSON, match="can't decode"):
        loads(b'"\xed\xa0\x80"')
    utf16 = '"\ud800"'.encode("utf-16-le", "surrogatepass")
    assert json.loads(utf16) == "\ud800"
    with pytest.raises(InvalidJSON):
        loads(utf16)
    escaped_in_utf16 = '{"a": "\\ud800"}'.encode("utf-16")
    with pytest.raises(InvalidJSON, match="lone UTF-16 surrogate"):
        loads(escaped_in_utf16)


@pytest.mark.parametrize(
    "literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1.5e999", "1" * 400 + ".0"]
)
def test_non_finite_numbers_are_refused(literal):
    body = f'{{"v": [{literal}]}}'.encode()
    json.loads(body)  # what Python lets through
    with pytest.raises(InvalidJSON):
        loads(body)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "Expecting value"),
        (b"{not json", "Expecting property name"),
        (b"\xff\xfe\x00", "decode"),
        (b"1" * (sys.get_int_max_str_digits() + 1), "too many digits"),
        (b"[" * 100_000, "nested too deeply"),
    ],
)
def test_every_other_failure_is_invalid_json_too(body, reason):
    with pytest.raises(InvalidJSON, match=reason):
        loads(body)


def test_has_lone_surrogate():
    assert has_lone_surrogate("a\ud800") and has_lone_surrogate("\udfff")
    assert not has_lone_surrogate("caf\u00e9 \U0001f600") and not has_lone_surrogate("")


# Hypothesis' text() never draws surrogates, so these documents are all storable.
documents = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(documents, st.booleans())
def test_storable_documents_round_trip_in_any_escaping(document, ensure_ascii):
    body = json.dumps(document, ensure_ascii=ensure_ascii).encode()
    assert loads(body) == json.loads(body)


@given(documents, st.integers(0xD800, 0xDFFF))
def test_one_lone_surrogate_anywhere_is_refused(document, code_point):
    body = json.dumps({"doc": document, "bad": ["x" + chr(code_point)]}).encode()
    with pytest.raises(InvalidJSON):
        loads(body)


@pytest.mark.parametrize(
    ("document", "where"),
    [
        ({"name": "a\x00b"}, "the string at '/name'"),
        ({"a": [{"b": "\x00"}]}, "the string at '/a/0/b'"),
        ({"x\x00": 1}, "a key of the object at the root"),
        ({"data": {"k": "\x00"}, "name": "ok"}, None),  # skipped: kept as JSON only
        ({"data": {"k": "\x00"}, "type": "\x00"}, "the string at '/type'"),
        ({"name": "no nul here"}, None),
    ],
)
def test_nul_is_found_where_it_would_be_stored_as_text(document, where):
    for ensure_ascii in (True, False):
        raw = json.dumps(document, ensure_ascii=ensure_ascii).encode()
        assert nul_at(raw, loads(raw), skip={"data"}) == where


def test_nul_is_found_in_utf16_text_too():
    raw = json.dumps({"name": "\x00"}).encode("utf-16")
    assert nul_at(raw, loads(raw)) == "the string at '/name'"
