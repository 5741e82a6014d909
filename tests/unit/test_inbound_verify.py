"""Signature verification of partner callbacks, signed the way each provider signs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import stripe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.inbound.verify import (
    DEFAULT_TOLERANCE_S,
    SCHEMES,
    SignatureError,
    standard_webhooks_key,
    verify,
)

NOW = 1_767_000_000
BODY = b'{"id":"evt_1","type":"payment.succeeded","data":{"amount":1250,"note":"caf\xc3\xa9"}}'
REASONS = {
    "missing_header",
    "malformed_header",
    "duplicate_header",
    "timestamp_out_of_tolerance",
    "signature_mismatch",
    "no_usable_secret",
}

SW_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
SW_OTHER = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()
STRIPE_SECRET = "whsec_8Tq2cB4XlK0pZr7vW1sYh9Nm3Jd6Fg5A"
STRIPE_OTHER = "whsec_0aB1cD2eF3gH4iJ5kL6mN7oP8qR9sT0u"
GITHUB_SECRET = "It's a Secret to Everybody"
GITHUB_OTHER = "another-hook-secret"
SHOPIFY_SECRET = "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"
SHOPIFY_OTHER = "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"

Headers = list[tuple[str, str]]


# -- signing as the providers do -------------------------------------------------------------


def sign_standard(
    secret: str, body: bytes, ts: int = NOW, msg_id: str = "msg_2Jd8", prefix: str = "webhook-"
) -> Headers:
    """Headers a Standard Webhooks sender (the reference library) produces."""
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(ts, UTC), body.decode())
    return [
        (f"{prefix}id", msg_id),
        (f"{prefix}timestamp", str(ts)),
        (f"{prefix}signature", signature),
    ]


def sign_stripe(secret: str, body: bytes, ts: int = NOW) -> Headers:
    """Headers Stripe sends, built by Stripe's own library."""
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=ts)
    return [("Stripe-Signature", header)]


def sign_github(secret: str, body: bytes, ts: int = NOW) -> Headers:
    """Headers GitHub sends: hex HMAC-SHA256 of the body."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return [("X-Hub-Signature-256", f"sha256={digest}"), ("X-GitHub-Delivery", "d-1")]


def sign_shopify(secret: str, body: bytes, ts: int = NOW) -> Headers:
    """Headers Shopify sends: base64 HMAC-SHA256 of the body."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    return [("X-Shopify-Hmac-Sha256", base64.b64encode(digest).decode())]


@dataclass(frozen=True)
class Scheme:
    """One scheme under test: how to sign, with which secrets, and what headers it reads."""

    name: str
    secret: str
    other_secret: str
    sign: Callable[..., Headers]
    signature_header: str
    timestamped: bool

    def __str__(self) -> str:
        return self.name


STANDARD = Scheme(
    "standard-webhooks", SW_SECRET, SW_OTHER, sign_standard, "webhook-signature", True
)
STRIPE = Scheme("stripe", STRIPE_SECRET, STRIPE_OTHER, sign_stripe, "stripe-signature", True)
GITHUB = Scheme("github", GITHUB_SECRET, GITHUB_OTHER, sign_github, "x-hub-signature-256", False)
SHOPIFY = Scheme(
    "shopify", SHOPIFY_SECRET, SHOPIFY_OTHER, sign_shopify, "x-shopify-hmac-sha256", False
)
ALL = [STANDARD, STRIPE, GITHUB, SHOPIFY]
TIMESTAMPED = [s for s in ALL if s.timestamped]
READ_HEADERS = {
    "standard-webhooks": ["webhook-id", "webhook-timestamp", "webhook-signature"],
    "stripe": ["stripe-signature"],
    "github": ["x-hub-signature-256"],
    "shopify": ["x-shopify-hmac-sha256"],
}


def reason_of(
    scheme: str, secrets: list[str], headers: Headers, body: bytes = BODY, **kw: float
) -> str:
    """Run verify, expecting a refusal, and return its reason."""
    with pytest.raises(SignatureError) as caught:
        verify(scheme, secrets, headers, body, kw.pop("now", NOW), **kw)  # type: ignore[arg-type]
    return caught.value.reason


# -- every scheme ----------------------------------------------------------------------------


def test_schemes_are_the_four_of_the_spec() -> None:
    assert SCHEMES == ("standard-webhooks", "stripe", "github", "shopify")


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_good_signature_is_accepted(scheme: Scheme) -> None:
    verify(scheme.name, [scheme.secret], scheme.sign(scheme.secret, BODY), BODY, NOW)


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_tampered_body_is_refused(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    tampered = BODY.replace(b"1250", b"9250")
    assert reason_of(scheme.name, [scheme.secret], headers, tampered) == "signature_mismatch"


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_one_flipped_bit_anywhere_in_the_body_is_refused(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    for index in (0, len(BODY) // 2, len(BODY) - 1):
        tampered = bytearray(BODY)
        tampered[index] ^= 0x01
        assert reason_of(scheme.name, [scheme.secret], headers, bytes(tampered)) == (
            "signature_mismatch"
        )


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_body_with_extra_trailing_newline_is_refused(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    assert reason_of(scheme.name, [scheme.secret], headers, BODY + b"\n") == "signature_mismatch"


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_wrong_secret_is_refused(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.other_secret, BODY)
    assert reason_of(scheme.name, [scheme.secret], headers) == "signature_mismatch"


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_rotation_accepts_a_signature_by_either_secret(scheme: Scheme) -> None:
    secrets = [scheme.secret, scheme.other_secret]
    for signer in secrets:
        verify(scheme.name, secrets, scheme.sign(signer, BODY), BODY, NOW)
    verify(scheme.name, secrets[::-1], scheme.sign(scheme.secret, BODY), BODY, NOW)


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_header_names_are_case_insensitive(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    for fold in (str.upper, str.lower, str.title):
        folded = [(fold(name), value) for name, value in headers]
        verify(scheme.name, [scheme.secret], folded, BODY, NOW)


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_unrelated_headers_are_ignored(scheme: Scheme) -> None:
    noise = [("Content-Type", "application/json"), ("X-Note", "héllo"), ("\u212aey", "v")]
    headers = noise + scheme.sign(scheme.secret, BODY) + noise
    verify(scheme.name, [scheme.secret], headers, BODY, NOW)


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_each_missing_header_is_refused(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    for name in READ_HEADERS[scheme.name]:
        kept = [(k, v) for k, v in headers if k.lower() != name]
        assert reason_of(scheme.name, [scheme.secret], kept) == "missing_header", name


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_each_empty_header_is_refused_as_missing(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    for name in READ_HEADERS[scheme.name]:
        emptied = [(k, " " if k.lower() == name else v) for k, v in headers]
        assert reason_of(scheme.name, [scheme.secret], emptied) == "missing_header", name


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_each_duplicated_header_is_refused_even_with_the_same_value(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    for name in READ_HEADERS[scheme.name]:
        copies = [(k.upper(), v) for k, v in headers if k.lower() == name]
        assert reason_of(scheme.name, [scheme.secret], headers + copies) == "duplicate_header"


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_duplicated_signature_header_cannot_smuggle_a_good_copy(scheme: Scheme) -> None:
    good = scheme.sign(scheme.secret, BODY)
    forged = scheme.sign(scheme.other_secret, BODY)
    name = READ_HEADERS[scheme.name][-1]
    extra = [(k, v) for k, v in forged if k.lower() == name]
    for headers in (good + extra, extra + good):
        assert reason_of(scheme.name, [scheme.secret], headers) == "duplicate_header"


def test_non_ascii_lookalike_header_name_is_not_the_header() -> None:
    # KELVIN SIGN lowercases to 'k': "webhoo\u212a-signature".lower() == "webhook-signature".
    headers = sign_standard(SW_SECRET, BODY)
    lookalike = [("webhoo\u212a-signature", "v1," + base64.b64encode(b"x" * 32).decode())]
    assert "webhoo\u212a-signature".lower() == "webhook-signature"
    verify("standard-webhooks", [SW_SECRET], headers + lookalike, BODY, NOW)
    assert reason_of("standard-webhooks", [SW_SECRET], headers[:2] + lookalike) == (
        "missing_header"
    )


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_non_ascii_signature_value_is_malformed_not_a_type_error(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    name = READ_HEADERS[scheme.name][-1]
    changed = [(k, v + "é" if k.lower() == name else v) for k, v in headers]
    assert reason_of(scheme.name, [scheme.secret], changed) == "malformed_header"


@pytest.mark.parametrize("scheme", ALL, ids=str)
@pytest.mark.parametrize("secrets", [[], [""]], ids=["none", "empty"])
def test_no_usable_secret_fails_closed(scheme: Scheme, secrets: list[str]) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    assert reason_of(scheme.name, secrets, headers) == "no_usable_secret"


@pytest.mark.parametrize("scheme", [GITHUB, SHOPIFY], ids=str)
def test_empty_secret_never_verifies_a_signature_made_with_an_empty_key(scheme: Scheme) -> None:
    headers = scheme.sign("", BODY)
    assert reason_of(scheme.name, [""], headers) == "no_usable_secret"
    assert reason_of(scheme.name, ["", scheme.secret], headers) == "signature_mismatch"


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_empty_body_can_be_signed_and_verified(scheme: Scheme) -> None:
    verify(scheme.name, [scheme.secret], scheme.sign(scheme.secret, b""), b"", NOW)


@pytest.mark.parametrize("scheme", [GITHUB, SHOPIFY], ids=str)
def test_untimestamped_schemes_ignore_the_clock(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY)
    for now in (0.0, NOW - 10**8, NOW + 10**8):
        verify(scheme.name, [scheme.secret], headers, BODY, now)


@pytest.mark.parametrize("scheme", ALL, ids=str)
def test_verification_is_over_raw_bytes_not_utf8_text(scheme: Scheme) -> None:
    raw = b'{"blob":"\xff\xfe\x00"}'
    secret = scheme.secret
    if scheme is STANDARD:
        key = standard_webhooks_key(secret)
        mac = hmac.new(key, f"m1.{NOW}.".encode() + raw, hashlib.sha256).digest()
        sig = "v1," + base64.b64encode(mac).decode()
        headers = [
            ("webhook-id", "m1"),
            ("webhook-timestamp", str(NOW)),
            ("webhook-signature", sig),
        ]
    elif scheme is STRIPE:
        hexmac = hmac.new(secret.encode(), f"{NOW}.".encode() + raw, hashlib.sha256).hexdigest()
        headers = [("Stripe-Signature", f"t={NOW},v1={hexmac}")]
    else:
        headers = scheme.sign(secret, raw)
    verify(scheme.name, [secret], headers, raw, NOW)
    assert reason_of(scheme.name, [secret], headers, raw[:-1] + b"\x01") == "signature_mismatch"


# -- timestamps ------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=str)
def test_expired_timestamp_is_refused(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY, ts=NOW - DEFAULT_TOLERANCE_S - 1)
    assert reason_of(scheme.name, [scheme.secret], headers) == "timestamp_out_of_tolerance"


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=str)
def test_future_timestamp_is_refused(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY, ts=NOW + DEFAULT_TOLERANCE_S + 1)
    assert reason_of(scheme.name, [scheme.secret], headers) == "timestamp_out_of_tolerance"


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=str)
@pytest.mark.parametrize("offset", [-DEFAULT_TOLERANCE_S, 0, DEFAULT_TOLERANCE_S])
def test_timestamp_at_the_edge_of_tolerance_is_accepted(scheme: Scheme, offset: int) -> None:
    headers = scheme.sign(scheme.secret, BODY, ts=NOW + offset)
    verify(scheme.name, [scheme.secret], headers, BODY, NOW)


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=str)
def test_tolerance_is_configurable(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY, ts=NOW - 60)
    verify(scheme.name, [scheme.secret], headers, BODY, NOW, tolerance_s=60)
    reason = reason_of(scheme.name, [scheme.secret], headers, tolerance_s=59)
    assert reason == "timestamp_out_of_tolerance"


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=str)
def test_fractional_now_is_compared_exactly(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.secret, BODY, ts=NOW)
    verify(scheme.name, [scheme.secret], headers, BODY, NOW + DEFAULT_TOLERANCE_S - 0.5)
    reason = reason_of(scheme.name, [scheme.secret], headers, now=NOW + DEFAULT_TOLERANCE_S + 0.5)
    assert reason == "timestamp_out_of_tolerance"


@pytest.mark.parametrize("scheme", TIMESTAMPED, ids=str)
def test_timestamp_cannot_be_refreshed_without_the_secret(scheme: Scheme) -> None:
    old = NOW - 3600
    headers = scheme.sign(scheme.secret, BODY, ts=old)
    replayed = [(k, v.replace(str(old), str(NOW))) for k, v in headers]
    assert reason_of(scheme.name, [scheme.secret], replayed) == "signature_mismatch"


# -- Standard Webhooks -----------------------------------------------------------------------


def test_standard_webhooks_published_test_vector() -> None:
    body = b'{"test": 2432232314}'
    headers = [
        ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ("webhook-timestamp", "1614265330"),
        ("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
    ]
    verify(
        "standard-webhooks", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"], headers, body, 1614265330
    )


def test_standard_webhooks_agrees_with_the_reference_library() -> None:
    now = int(time.time())
    headers = sign_standard(SW_SECRET, BODY, ts=now)
    Webhook(SW_SECRET).verify(BODY, dict(headers), json_parse=False)
    verify("standard-webhooks", [SW_SECRET], headers, BODY, now)
    tampered = BODY.replace(b"1250", b"1251")
    with pytest.raises(WebhookVerificationError):
        Webhook(SW_SECRET).verify(tampered, dict(headers), json_parse=False)
    assert reason_of("standard-webhooks", [SW_SECRET], headers, tampered, now=now) == (
        "signature_mismatch"
    )


def test_standard_webhooks_accepts_the_svix_prefixed_headers() -> None:
    headers = sign_standard(SW_SECRET, BODY, prefix="svix-")
    verify("standard-webhooks", [SW_SECRET], headers, BODY, NOW)


def test_standard_webhooks_prefers_webhook_headers_when_both_sets_are_sent() -> None:
    good = sign_standard(SW_SECRET, BODY)
    stale = sign_standard(SW_SECRET, BODY, ts=NOW - 3600, prefix="svix-")
    verify("standard-webhooks", [SW_SECRET], stale + good, BODY, NOW)
    assert reason_of("standard-webhooks", [SW_SECRET], good[:2] + stale) == "missing_header"


def test_standard_webhooks_any_signature_in_the_list_may_match() -> None:
    mine = dict(sign_standard(SW_SECRET, BODY))["webhook-signature"]
    other = dict(sign_standard(SW_OTHER, BODY))["webhook-signature"]
    ed25519 = "v1a," + base64.b64encode(b"\x01" * 64).decode()
    for value in (f"{other} {mine}", f"{mine} {other}", f"{ed25519} {mine}", f"  {other}  {mine} "):
        headers = [*sign_standard(SW_SECRET, BODY)[:2], ("webhook-signature", value)]
        verify("standard-webhooks", [SW_SECRET], headers, BODY, NOW)


def test_an_unusable_v1_entry_does_not_spoil_a_matching_one() -> None:
    # The reference libraries accept any match; only a list with nothing usable is malformed.
    mine = dict(sign_standard(SW_SECRET, BODY))["webhook-signature"]
    ts_and_id = sign_standard(SW_SECRET, BODY)[:2]
    for junk in ("v1,AAAA", "v1,bad!", "v1," + base64.b64encode(b"x" * 20).decode()):
        verify(
            "standard-webhooks",
            [SW_SECRET],
            [*ts_and_id, ("webhook-signature", f"{junk} {mine}")],
            BODY,
            NOW,
        )
        alone = [*ts_and_id, ("webhook-signature", junk)]
        assert reason_of("standard-webhooks", [SW_SECRET], alone) == "malformed_header"
    good = dict(sign_stripe(STRIPE_SECRET, BODY))["Stripe-Signature"]
    t_part, v1_part = good.split(",", 1)
    verify(
        "stripe",
        [STRIPE_SECRET],
        [("Stripe-Signature", f"{t_part},v1=deadbeef,{v1_part}")],
        BODY,
        NOW,
    )
    only_junk = [("Stripe-Signature", f"{t_part},v1=deadbeef")]
    assert reason_of("stripe", [STRIPE_SECRET], only_junk) == "malformed_header"


def test_standard_webhooks_list_without_v1_matches_nothing() -> None:
    headers = [
        *sign_standard(SW_SECRET, BODY)[:2],
        ("webhook-signature", "v1a," + base64.b64encode(b"\x01" * 64).decode()),
    ]
    assert reason_of("standard-webhooks", [SW_SECRET], headers) == "signature_mismatch"


def test_standard_webhooks_secret_after_whsec_is_base64_decoded() -> None:
    key = bytes(range(32))
    assert standard_webhooks_key(SW_SECRET) == key
    # The key is the decoded bytes, not the text: signing with the text must fail.
    wrong = hmac.new(SW_SECRET.encode(), f"m.{NOW}.".encode() + BODY, hashlib.sha256).digest()
    headers = [
        ("webhook-id", "m"),
        ("webhook-timestamp", str(NOW)),
        ("webhook-signature", "v1," + base64.b64encode(wrong).decode()),
    ]
    assert reason_of("standard-webhooks", [SW_SECRET], headers) == "signature_mismatch"


def test_standard_webhooks_unpadded_whsec_secret_works_like_the_library() -> None:
    unpadded = "whsec_" + base64.b64encode(b"0123456789abcdefghijklmnopq").decode().rstrip("=")
    assert not unpadded.endswith("=")
    verify("standard-webhooks", [unpadded], sign_standard(unpadded, BODY), BODY, NOW)


def test_standard_webhooks_secret_without_prefix_is_base64_first() -> None:
    bare = base64.b64encode(bytes(range(40, 72))).decode()
    assert standard_webhooks_key(bare) == bytes(range(40, 72))
    verify("standard-webhooks", [bare], sign_standard(bare, BODY), BODY, NOW)


def test_standard_webhooks_secret_without_prefix_falls_back_to_raw_bytes() -> None:
    raw = "plain secret: not base64!"
    assert standard_webhooks_key(raw) == raw.encode()
    mac = hmac.new(raw.encode(), f"m.{NOW}.".encode() + BODY, hashlib.sha256).digest()
    headers = [
        ("webhook-id", "m"),
        ("webhook-timestamp", str(NOW)),
        ("webhook-signature", "v1," + base64.b64encode(mac).decode()),
    ]
    verify("standard-webhooks", [raw], headers, BODY, NOW)


@pytest.mark.parametrize("secret", ["whsec_!!!not-base64!!!", "whsec_", "whsec_é"])
def test_standard_webhooks_unusable_secret_is_refused(secret: str) -> None:
    with pytest.raises(ValueError, match="whsec_|empty"):
        standard_webhooks_key(secret)
    headers = sign_standard(SW_SECRET, BODY)
    assert reason_of("standard-webhooks", [secret], headers) == "no_usable_secret"
    verify("standard-webhooks", [secret, SW_SECRET], headers, BODY, NOW)


def test_standard_webhooks_message_id_is_part_of_what_is_signed() -> None:
    headers = sign_standard(SW_SECRET, BODY, msg_id="msg_a")
    moved = [("webhook-id", "msg_b"), *headers[1:]]
    assert reason_of("standard-webhooks", [SW_SECRET], moved) == "signature_mismatch"


# -- Stripe ----------------------------------------------------------------------------------


def test_stripe_agrees_with_stripes_own_library() -> None:
    now = int(time.time())
    header = dict(sign_stripe(STRIPE_SECRET, BODY, ts=now))["Stripe-Signature"]
    assert stripe.WebhookSignature.verify_header(BODY, header, STRIPE_SECRET, 300) is True
    verify("stripe", [STRIPE_SECRET], [("Stripe-Signature", header)], BODY, now)

    tampered = BODY + b" "
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(tampered, header, STRIPE_SECRET, 300)
    assert reason_of(
        "stripe", [STRIPE_SECRET], [("Stripe-Signature", header)], tampered, now=now
    ) == ("signature_mismatch")


def test_stripe_expired_signature_is_refused_by_both_stripe_and_us() -> None:
    now = int(time.time())
    old = now - 301
    header = dict(sign_stripe(STRIPE_SECRET, BODY, ts=old))["Stripe-Signature"]
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(BODY, header, STRIPE_SECRET, 300)
    reason = reason_of("stripe", [STRIPE_SECRET], [("Stripe-Signature", header)], now=now)
    assert reason == "timestamp_out_of_tolerance"


def test_stripe_key_is_the_whole_secret_string_not_its_base64() -> None:
    mac = hmac.new(STRIPE_SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    verify("stripe", [STRIPE_SECRET], [("Stripe-Signature", f"t={NOW},v1={mac}")], BODY, NOW)
    decoded = standard_webhooks_key(STRIPE_SECRET)
    wrong = hmac.new(decoded, f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    headers = [("Stripe-Signature", f"t={NOW},v1={wrong}")]
    assert reason_of("stripe", [STRIPE_SECRET], headers) == "signature_mismatch"


def test_stripe_header_with_several_v1_and_a_v0_matches_any_v1() -> None:
    now = int(time.time())
    good = dict(sign_stripe(STRIPE_SECRET, BODY, ts=now))["Stripe-Signature"].split(",v1=")[1]
    other = dict(sign_stripe(STRIPE_OTHER, BODY, ts=now))["Stripe-Signature"].split(",v1=")[1]
    header = f"t={now},v1={other},v1={good},v0={'0' * 64}"
    assert stripe.WebhookSignature.verify_header(BODY, header, STRIPE_SECRET, 300) is True
    verify("stripe", [STRIPE_SECRET], [("Stripe-Signature", header)], BODY, now)
    reordered = f"v0={'0' * 64},v1={good},t={now}"
    verify("stripe", [STRIPE_SECRET], [("Stripe-Signature", reordered)], BODY, now)


def test_stripe_header_with_only_v0_matches_nothing() -> None:
    mac = hmac.new(STRIPE_SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    headers = [("Stripe-Signature", f"t={NOW},v0={mac}")]
    assert reason_of("stripe", [STRIPE_SECRET], headers) == "signature_mismatch"


def test_stripe_uppercase_hex_is_the_same_signature() -> None:
    header = dict(sign_stripe(STRIPE_SECRET, BODY))["Stripe-Signature"]
    t_part, v1_part = header.split(",")
    upper = f"{t_part},v1={v1_part[3:].upper()}"
    verify("stripe", [STRIPE_SECRET], [("Stripe-Signature", upper)], BODY, NOW)


# -- GitHub and Shopify ----------------------------------------------------------------------


def test_github_published_test_vector() -> None:
    signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    headers = [("X-Hub-Signature-256", signature)]
    verify("github", ["It's a Secret to Everybody"], headers, b"Hello, World!", NOW)


def test_github_legacy_sha1_header_alone_is_not_enough() -> None:
    sha1 = hmac.new(GITHUB_SECRET.encode(), BODY, hashlib.sha1).hexdigest()
    headers = [("X-Hub-Signature", f"sha1={sha1}")]
    assert reason_of("github", [GITHUB_SECRET], headers) == "missing_header"


def test_shopify_hex_digest_in_place_of_base64_is_malformed() -> None:
    digest = hmac.new(SHOPIFY_SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    headers = [("X-Shopify-Hmac-Sha256", digest)]
    assert reason_of("shopify", [SHOPIFY_SECRET], headers) == "malformed_header"


# -- malformed headers, table-driven ---------------------------------------------------------

B64_32 = base64.b64encode(b"\x07" * 32).decode()
HEX_64 = "ab" * 32


def sw(signature: str, ts: str = str(NOW), msg_id: str = "msg_1") -> Headers:
    """A Standard Webhooks header set with chosen raw values."""
    return [("webhook-id", msg_id), ("webhook-timestamp", ts), ("webhook-signature", signature)]


MALFORMED: list[tuple[str, str, Headers, str]] = [
    # Standard Webhooks signature list
    ("sw-version-only", "standard-webhooks", sw("v1"), "malformed_header"),
    ("sw-three-parts", "standard-webhooks", sw("v1,a,b"), "malformed_header"),
    ("sw-not-base64", "standard-webhooks", sw("v1,!!!notbase64"), "malformed_header"),
    ("sw-empty-signature-part", "standard-webhooks", sw("v1,"), "malformed_header"),
    ("sw-empty-version-part", "standard-webhooks", sw("," + B64_32), "malformed_header"),
    (
        "sw-bad-padding",
        "standard-webhooks",
        sw("v1," + B64_32.rstrip("=")[:-1]),
        "malformed_header",
    ),
    ("sw-short-digest", "standard-webhooks", sw("v1,YWJj"), "malformed_header"),
    ("sw-urlsafe-alphabet", "standard-webhooks", sw("v1,-_-_" + B64_32[4:]), "malformed_header"),
    ("sw-good-then-garbage", "standard-webhooks", sw(f"v1,{B64_32} v1"), "malformed_header"),
    ("sw-non-ascii-signature", "standard-webhooks", sw("v1,é" + B64_32[1:]), "malformed_header"),
    (
        "sw-non-ascii-id",
        "standard-webhooks",
        sw("v1," + B64_32, msg_id="msg_é"),
        "malformed_header",
    ),
    ("sw-only-v2", "standard-webhooks", sw("v2," + B64_32), "signature_mismatch"),
    # Standard Webhooks timestamp
    (
        "sw-float-timestamp",
        "standard-webhooks",
        sw("v1," + B64_32, ts=f"{NOW}.5"),
        "malformed_header",
    ),
    ("sw-negative-timestamp", "standard-webhooks", sw("v1," + B64_32, ts="-5"), "malformed_header"),
    (
        "sw-plus-timestamp",
        "standard-webhooks",
        sw("v1," + B64_32, ts=f"+{NOW}"),
        "malformed_header",
    ),
    (
        "sw-word-timestamp",
        "standard-webhooks",
        sw("v1," + B64_32, ts="yesterday"),
        "malformed_header",
    ),
    (
        "sw-huge-timestamp",
        "standard-webhooks",
        sw("v1," + B64_32, ts="9" * 5000),
        "malformed_header",
    ),
    (
        "sw-arabic-digits",
        "standard-webhooks",
        sw("v1," + B64_32, ts="١٧٦٧٠٠٠٠٠٠"),
        "malformed_header",
    ),
    (
        "sw-iso-timestamp",
        "standard-webhooks",
        sw("v1," + B64_32, ts="2026-01-01T00:00:00Z"),
        "malformed_header",
    ),
    (
        "sw-old-timestamp",
        "standard-webhooks",
        sw("v1," + B64_32, ts="0"),
        "timestamp_out_of_tolerance",
    ),
    ("sw-missing-id", "standard-webhooks", sw("v1," + B64_32)[1:], "missing_header"),
    ("sw-nothing", "standard-webhooks", [], "missing_header"),
    (
        "sw-mixed-prefixes",
        "standard-webhooks",
        [("svix-id", "m"), *sw("v1," + B64_32)[1:]],
        "missing_header",
    ),
    # Stripe
    ("stripe-empty-items", "stripe", [("Stripe-Signature", ",,")], "malformed_header"),
    ("stripe-no-t", "stripe", [("Stripe-Signature", f"v1={HEX_64}")], "malformed_header"),
    (
        "stripe-two-t",
        "stripe",
        [("Stripe-Signature", f"t={NOW},t={NOW},v1={HEX_64}")],
        "malformed_header",
    ),
    (
        "stripe-t-not-integer",
        "stripe",
        [("Stripe-Signature", f"t=abc,v1={HEX_64}")],
        "malformed_header",
    ),
    ("stripe-t-empty", "stripe", [("Stripe-Signature", f"t=,v1={HEX_64}")], "malformed_header"),
    (
        "stripe-t-float",
        "stripe",
        [("Stripe-Signature", f"t={NOW}.0,v1={HEX_64}")],
        "malformed_header",
    ),
    (
        "stripe-v1-not-hex",
        "stripe",
        [("Stripe-Signature", f"t={NOW},v1={'zz' * 32}")],
        "malformed_header",
    ),
    ("stripe-v1-short", "stripe", [("Stripe-Signature", f"t={NOW},v1=abcd")], "malformed_header"),
    (
        "stripe-item-without-equals",
        "stripe",
        [("Stripe-Signature", f"t={NOW},v1")],
        "malformed_header",
    ),
    # Like Stripe's library: " v1" is an unknown key, so there is no v1 to match.
    (
        "stripe-spaces",
        "stripe",
        [("Stripe-Signature", f"t={NOW}, v1={HEX_64}")],
        "signature_mismatch",
    ),
    (
        "stripe-non-ascii",
        "stripe",
        [("Stripe-Signature", f"t={NOW},v1={HEX_64[:-1]}é")],
        "malformed_header",
    ),
    ("stripe-no-v1", "stripe", [("Stripe-Signature", f"t={NOW}")], "signature_mismatch"),
    (
        "stripe-future",
        "stripe",
        [("Stripe-Signature", f"t={NOW + 10**6},v1={HEX_64}")],
        "timestamp_out_of_tolerance",
    ),
    (
        "stripe-missing",
        "stripe",
        [("X-Stripe-Signature", f"t={NOW},v1={HEX_64}")],
        "missing_header",
    ),
    # GitHub
    ("github-no-prefix", "github", [("X-Hub-Signature-256", HEX_64)], "malformed_header"),
    (
        "github-sha1-prefix",
        "github",
        [("X-Hub-Signature-256", f"sha1={HEX_64}")],
        "malformed_header",
    ),
    ("github-short-hex", "github", [("X-Hub-Signature-256", "sha256=abcd")], "malformed_header"),
    (
        "github-not-hex",
        "github",
        [("X-Hub-Signature-256", "sha256=" + "g" * 64)],
        "malformed_header",
    ),
    ("github-empty-digest", "github", [("X-Hub-Signature-256", "sha256=")], "malformed_header"),
    (
        "github-non-ascii",
        "github",
        [("X-Hub-Signature-256", "sha256=" + "é" * 64)],
        "malformed_header",
    ),
    (
        "github-wrong-digest",
        "github",
        [("X-Hub-Signature-256", f"sha256={HEX_64}")],
        "signature_mismatch",
    ),
    # Shopify
    (
        "shopify-not-base64",
        "shopify",
        [("X-Shopify-Hmac-Sha256", "!!!notbase64")],
        "malformed_header",
    ),
    ("shopify-short-digest", "shopify", [("X-Shopify-Hmac-Sha256", "YWJj")], "malformed_header"),
    (
        "shopify-non-ascii",
        "shopify",
        [("X-Shopify-Hmac-Sha256", "é" + B64_32[1:])],
        "malformed_header",
    ),
    ("shopify-duplicate", "shopify", [("X-Shopify-Hmac-Sha256", B64_32)] * 2, "duplicate_header"),
    ("shopify-wrong-digest", "shopify", [("X-Shopify-Hmac-Sha256", B64_32)], "signature_mismatch"),
]

SECRET_OF = {s.name: s.secret for s in ALL}


@pytest.mark.parametrize(
    ("scheme", "headers", "reason"),
    [pytest.param(scheme, headers, reason, id=case) for case, scheme, headers, reason in MALFORMED],
)
def test_malformed_header_is_refused_with_its_reason(
    scheme: str, headers: Headers, reason: str
) -> None:
    assert reason_of(scheme, [SECRET_OF[scheme]], headers) == reason


def test_malformed_table_is_large_enough() -> None:
    assert len(MALFORMED) >= 25


# -- programming errors are not forged requests ----------------------------------------------


def test_unknown_scheme_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="unknown signature scheme"):
        verify("hmac-md5", [GITHUB_SECRET], sign_github(GITHUB_SECRET, BODY), BODY, NOW)


def test_a_single_string_as_secrets_is_refused() -> None:
    with pytest.raises(TypeError, match="sequence of strings"):
        verify("github", GITHUB_SECRET, sign_github(GITHUB_SECRET, BODY), BODY, NOW)


def test_negative_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        verify("stripe", [STRIPE_SECRET], sign_stripe(STRIPE_SECRET, BODY), BODY, NOW, -1)


def test_signature_error_carries_a_reason_and_a_message() -> None:
    error = SignatureError("signature_mismatch", "no signature matches any secret")
    assert error.reason == "signature_mismatch"
    assert str(error) == "no signature matches any secret"
    assert str(SignatureError("missing_header")) == "missing_header"


# -- properties ------------------------------------------------------------------------------

HEADER_NAMES = sorted({name for names in READ_HEADERS.values() for name in names}) + [
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "Webhook-Signature",
    "STRIPE-SIGNATURE",
]
SIGNATURE_TEXT = st.text(alphabet="v1at=,0123456789abcdefABCDEF+/= \t-_é\x00", max_size=120)
TOKENS = st.sampled_from(
    [
        "v1,",
        "v1a,",
        "v1," + B64_32,
        "t=",
        f"t={NOW}",
        "v1=",
        f"v1={HEX_64}",
        "v0=",
        "sha256=",
        HEX_64,
        B64_32,
        str(NOW),
        ",",
        " ",
        "=",
        "é",
        "",
    ]
)
VALUES = st.one_of(
    st.text(max_size=200),
    SIGNATURE_TEXT,
    st.lists(TOKENS, max_size=8).map("".join),
)
HEADER_LISTS = st.lists(
    st.tuples(st.one_of(st.sampled_from(HEADER_NAMES), st.text(max_size=30)), VALUES),
    max_size=8,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    scheme=st.sampled_from(SCHEMES),
    headers=HEADER_LISTS,
    body=st.binary(max_size=200),
    now=st.floats(min_value=0, max_value=2e10, allow_nan=False),
)
def test_arbitrary_header_text_raises_nothing_but_signature_error(
    scheme: str, headers: Headers, body: bytes, now: float
) -> None:
    secrets = [s.secret for s in ALL]
    with pytest.raises(SignatureError) as caught:
        verify(scheme, secrets, headers, body, now)
    assert caught.value.reason in REASONS


@settings(max_examples=150, deadline=None)
@given(
    scheme=st.sampled_from(ALL),
    body=st.text(max_size=300).map(str.encode),
    offset=st.integers(min_value=-DEFAULT_TOLERANCE_S, max_value=DEFAULT_TOLERANCE_S),
    flip=st.integers(min_value=0),
)
def test_any_signed_body_verifies_and_any_changed_byte_does_not(
    scheme: Scheme, body: bytes, offset: int, flip: int
) -> None:
    headers = scheme.sign(scheme.secret, body, ts=NOW + offset)
    verify(scheme.name, [scheme.secret], headers, body, NOW)
    if body:
        tampered = bytearray(body)
        tampered[flip % len(body)] ^= 0x20
        assert reason_of(scheme.name, [scheme.secret], headers, bytes(tampered)) == (
            "signature_mismatch"
        )


def test_refusal_messages_name_the_standard_header_and_the_direction_of_the_skew() -> None:
    with pytest.raises(SignatureError, match="webhook-id"):
        verify("standard-webhooks", [SW_SECRET], [], BODY, NOW)
    with pytest.raises(SignatureError, match="400 s in the future"):
        verify(
            "standard-webhooks",
            [SW_SECRET],
            sign_standard(SW_SECRET, BODY, ts=NOW + 400),
            BODY,
            NOW,
        )
    with pytest.raises(SignatureError, match="400 s in the past"):
        verify(
            "standard-webhooks",
            [SW_SECRET],
            sign_standard(SW_SECRET, BODY, ts=NOW - 400),
            BODY,
            NOW,
        )
