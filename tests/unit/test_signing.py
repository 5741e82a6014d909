"""Standard Webhooks signing: the published vector, the reference library, rotation."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app import signing

VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_spec_vector() -> None:
    assert signing.sign([VECTOR_SECRET], VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG


def test_reference_library_verifies_our_headers() -> None:
    ts = int(time.time())
    headers = signing.build_headers(VECTOR_ID, ts, VECTOR_BODY, [VECTOR_SECRET], "Kurir/1.0")
    assert Webhook(VECTOR_SECRET).verify(VECTOR_BODY, headers) == {"test": 2432232314}


def test_reference_library_rejects_tampered_body() -> None:
    ts = int(time.time())
    headers = signing.build_headers(VECTOR_ID, ts, VECTOR_BODY, [VECTOR_SECRET], "Kurir/1.0")
    with pytest.raises(WebhookVerificationError):
        Webhook(VECTOR_SECRET).verify(b'{"test": 2432232315}', headers)


def test_build_headers_shape() -> None:
    headers = signing.build_headers("evt_1", 1700000000, b"{}", [VECTOR_SECRET], "Kurir/0.1")
    assert headers == {
        "webhook-id": "evt_1",
        "webhook-timestamp": "1700000000",
        "webhook-signature": signing.sign([VECTOR_SECRET], "evt_1", 1700000000, b"{}"),
        "content-type": "application/json",
        "user-agent": "Kurir/0.1",
    }


def test_two_secrets_two_signatures_each_verifiable() -> None:
    old, new = signing.generate_secret(), signing.generate_secret()
    ts = int(time.time())
    headers = signing.build_headers("evt_rot", ts, b'{"a":1}', [new, old], "Kurir/1.0")
    parts = headers["webhook-signature"].split(" ")
    assert len(parts) == 2
    assert parts[0] == signing.sign([new], "evt_rot", ts, b'{"a":1}')
    assert parts[1] == signing.sign([old], "evt_rot", ts, b'{"a":1}')
    for secret, own in ((new, parts[0]), (old, parts[1])):
        assert Webhook(secret).verify(b'{"a":1}', headers) == {"a": 1}
        alone = dict(headers, **{"webhook-signature": own})
        assert Webhook(secret).verify(b'{"a":1}', alone) == {"a": 1}
    other = dict(headers, **{"webhook-signature": parts[1]})
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(b'{"a":1}', other)


def test_signature_depends_on_id_timestamp_and_body() -> None:
    base = signing.sign([VECTOR_SECRET], VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    assert signing.sign([VECTOR_SECRET], VECTOR_ID + "x", VECTOR_TS, VECTOR_BODY) != base
    assert signing.sign([VECTOR_SECRET], VECTOR_ID, VECTOR_TS + 1, VECTOR_BODY) != base
    assert signing.sign([VECTOR_SECRET], VECTOR_ID, VECTOR_TS, VECTOR_BODY + b" ") != base


def test_generate_secret_format() -> None:
    secret = signing.generate_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[6:], validate=True)) == 32
    assert signing.is_valid_secret(secret)
    assert signing.generate_secret() != secret


def test_secret_key_decodes_after_prefix() -> None:
    raw = bytes(range(24))
    assert signing.secret_key("whsec_" + base64.b64encode(raw).decode()) == raw


@pytest.mark.parametrize(
    ("secret", "valid"),
    [
        (VECTOR_SECRET, True),
        ("whsec_" + base64.b64encode(b"x" * 24).decode(), True),
        ("whsec_" + base64.b64encode(b"x" * 64).decode(), True),
        ("whsec_" + base64.b64encode(b"x" * 23).decode(), False),
        ("whsec_" + base64.b64encode(b"x" * 65).decode(), False),
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", False),
        ("whsec_", False),
        ("whsec_not base64!!", False),
        ("whsec_" + base64.urlsafe_b64encode(b"\xfb\xff" * 16).decode(), False),
        ("whsec_" + base64.b64encode(b"x" * 32).decode().rstrip("="), False),
        ("WHSEC_" + base64.b64encode(b"x" * 32).decode(), False),
        ("whsec_" + base64.b64encode(b"x" * 32).decode() + "\n", False),
        ("whsec_ü", False),
    ],
)
def test_is_valid_secret(secret: str, valid: bool) -> None:
    assert signing.is_valid_secret(secret) is valid


def test_secret_key_rejects_malformed() -> None:
    with pytest.raises(ValueError, match="whsec_"):
        signing.secret_key("nope")
    with pytest.raises(ValueError, match="base64"):
        signing.secret_key("whsec_@@@@")


def test_sign_requires_a_sequence_of_secrets() -> None:
    with pytest.raises(TypeError):
        signing.sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    with pytest.raises(ValueError, match="at least one"):
        signing.sign([], VECTOR_ID, VECTOR_TS, VECTOR_BODY)


@given(
    key=st.binary(min_size=24, max_size=64),
    msg_id=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1),
    body=st.binary(max_size=512),
)
def test_matches_reference_sign_for_any_input(key: bytes, msg_id: str, body: bytes) -> None:
    secret = "whsec_" + base64.b64encode(key).decode()
    ts = 1700000000
    text = body.decode("latin-1")
    expected = Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, tz=UTC), text)
    assert signing.sign([secret], msg_id, ts, text.encode("utf-8")) == expected
