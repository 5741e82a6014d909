"""Ed25519 (`v1a`) signing: the Standard Webhooks reference vector, key formats, and headers
that mix v1 and v1a during a rotation, checked with `cryptography` as a receiver would."""

from __future__ import annotations

import base64

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from app import signing

# The Standard Webhooks specification publishes no v1a vector of its own (its header example
# gives no key); this one is its reference Go library's (libraries/go/webhook_asymmetric_test.go,
# TestAsymmetricWebhookSign): the key is the base64 of a 32-byte seed, as whsk_ carries it.
VECTOR_KEY = "whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk="
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIG = (
    "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag=="
)
HMAC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _receiver_verifies(public_key: str, entry: str, msg_id: str, ts: int, body: bytes) -> bool:
    """A receiver's check, with nothing of app.signing: the whpk_ bytes, the v1a bytes."""
    version, _, encoded = entry.partition(",")
    assert version == "v1a"
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key.removeprefix("whpk_")))
    try:
        key.verify(base64.b64decode(encoded), f"{msg_id}.{ts}.".encode() + body)
    except InvalidSignature:
        return False
    return True


def test_the_reference_vector() -> None:
    assert signing.sign([VECTOR_KEY], VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG


def test_the_vector_verifies_with_the_public_key_and_nothing_else() -> None:
    public = signing.public_key_of(VECTOR_KEY)
    assert public.startswith("whpk_")
    assert len(base64.b64decode(public.removeprefix("whpk_"), validate=True)) == 32
    assert _receiver_verifies(public, VECTOR_SIG, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    assert not _receiver_verifies(public, VECTOR_SIG, VECTOR_ID, VECTOR_TS, VECTOR_BODY + b" ")
    assert not _receiver_verifies(public, VECTOR_SIG, VECTOR_ID, VECTOR_TS + 1, VECTOR_BODY)
    other = signing.public_key_of(signing.generate_signing_key())
    assert not _receiver_verifies(other, VECTOR_SIG, VECTOR_ID, VECTOR_TS, VECTOR_BODY)


def test_generated_keys_are_32_byte_seeds_and_differ() -> None:
    first, second = signing.generate_signing_key(), signing.generate_signing_key()
    assert first != second
    for key in (first, second):
        assert signing.is_signing_key(key) and not signing.is_valid_secret(key)
        assert len(base64.b64decode(key.removeprefix("whsk_"), validate=True)) == 32
        assert signing.is_valid_public_key(signing.public_key_of(key))


def test_a_rotation_header_mixes_schemes_newest_first_each_verifying_with_its_own_key() -> None:
    new, old = signing.generate_signing_key(), signing.generate_signing_key()
    header = signing.sign([new, old, HMAC_SECRET], "evt_1", 1700000000, b'{"a":1}')
    first, second, third = header.split(" ")
    assert third == signing.sign([HMAC_SECRET], "evt_1", 1700000000, b'{"a":1}')
    new_public, old_public = signing.public_key_of(new), signing.public_key_of(old)
    assert _receiver_verifies(new_public, first, "evt_1", 1700000000, b'{"a":1}')
    assert _receiver_verifies(old_public, second, "evt_1", 1700000000, b'{"a":1}')
    assert not _receiver_verifies(old_public, first, "evt_1", 1700000000, b'{"a":1}')
    assert signing.verify_v1a([old_public], "evt_1", 1700000000, b'{"a":1}', header)
    assert not signing.verify_v1a([old_public], "evt_1", 1700000000, b'{"a":2}', header)


@pytest.mark.parametrize(
    "key",
    [
        "whpk_",
        "whpk_not base64!",
        "whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=",  # a private key is not public
        "whpk_" + base64.b64encode(b"x" * 31).decode(),
        "whpk_" + base64.b64encode(b"x" * 33).decode(),
    ],
)
def test_malformed_public_keys_are_refused(key: str) -> None:
    assert not signing.is_valid_public_key(key)
