"""Standard Webhooks signing, pure so it can be checked against published vectors.

Two schemes, told apart by the key's own prefix so that every caller passes plain strings:
a `whsec_` secret signs `v1` (HMAC-SHA256, the receiver holds the same secret), a `whsk_`
key signs `v1a` (Ed25519: the receiver holds only the `whpk_` public key, so a leaked copy
on its side cannot forge a webhook). Both sign `{id}.{timestamp}.{body}`; an endpoint
mid-rotation carries one signature per live key, space-separated, whatever their schemes.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets as _secrets
from collections.abc import Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SECRET_PREFIX = "whsec_"  # noqa: S105 - a format prefix, not a secret
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
DEFAULT_SECRET_BYTES = 32

SIGNING_KEY_PREFIX = "whsk_"
PUBLIC_KEY_PREFIX = "whpk_"
ED25519_KEY_BYTES = 32  # both halves: the private key is kept as its 32-byte seed
# Decoded private keys kept per process: deriving one costs about as much as a signature.
_PRIVATE_KEYS_CACHED = 1024


def generate_secret() -> str:
    """Create a fresh secret in the whsec_ form every Standard Webhooks library accepts."""
    raw = _secrets.token_bytes(DEFAULT_SECRET_BYTES)
    return SECRET_PREFIX + base64.b64encode(raw).decode("ascii")


def _decode_key(secret: str) -> bytes:
    """Decode the base64 part strictly so malformed secrets are caught, not silently mangled."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError("secret must start with 'whsec_'")
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        return base64.b64decode(encoded.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError("secret is not valid standard base64 after 'whsec_'") from exc


def is_valid_secret(secret: str) -> bool:
    """Tell whether a secret is well-formed so bad ones are refused at the API boundary."""
    try:
        key = _decode_key(secret)
    except ValueError:
        return False
    return MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES


def secret_key(secret: str) -> bytes:
    """Return the HMAC key, which per the spec is the decoded bytes, not the whsec_ string."""
    key = _decode_key(secret)
    if not key:
        raise ValueError("secret key is empty")
    return key


# ---------------------------------------------------------------------------- Ed25519 (v1a)


def is_signing_key(secret: str) -> bool:
    """Whether `secret` is an Ed25519 private key (`whsk_`), which signs v1a, not v1."""
    return isinstance(secret, str) and secret.startswith(SIGNING_KEY_PREFIX)


def generate_signing_key() -> str:
    """A fresh Ed25519 private key in the whsk_ form: the base64 of its 32-byte seed, as the
    Standard Webhooks libraries read it."""
    return SIGNING_KEY_PREFIX + base64.b64encode(_secrets.token_bytes(ED25519_KEY_BYTES)).decode(
        "ascii"
    )


def _decode_32(text: str, prefix: str) -> bytes:
    if not isinstance(text, str) or not text.startswith(prefix):
        raise ValueError(f"key must start with {prefix!r}")
    try:
        raw = base64.b64decode(text[len(prefix) :].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"key is not valid standard base64 after {prefix!r}") from exc
    if len(raw) != ED25519_KEY_BYTES:
        raise ValueError(f"an Ed25519 key is {ED25519_KEY_BYTES} bytes, this one {len(raw)}")
    return raw


@functools.lru_cache(maxsize=_PRIVATE_KEYS_CACHED)
def _private_key(signing_key: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(_decode_32(signing_key, SIGNING_KEY_PREFIX))


def public_key_of(signing_key: str) -> str:
    """The whpk_ public key of a whsk_ private key: what the partner verifies with."""
    raw = (
        _private_key(signing_key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return PUBLIC_KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def is_valid_public_key(public_key: str) -> bool:
    """Whether `public_key` is a well-formed whpk_ key (so a receiver tool can refuse it early)."""
    try:
        _decode_32(public_key, PUBLIC_KEY_PREFIX)
    except ValueError:
        return False
    return True


def verify_v1a(
    public_keys: Sequence[str], msg_id: str, timestamp: int, body: bytes, signatures: str
) -> bool:
    """Whether one `v1a` entry of a webhook-signature header verifies with one of the keys.

    For a receiver (`kurir listen`); other entries (v1, unknown versions) are skipped, as the
    spec lets receivers do. The caller checks the timestamp's freshness.
    """
    keys = [
        Ed25519PublicKey.from_public_bytes(_decode_32(k, PUBLIC_KEY_PREFIX)) for k in public_keys
    ]
    content = _content(msg_id, timestamp, body)
    for entry in signatures.split():
        version, _, encoded = entry.partition(",")
        if version != "v1a":
            continue
        try:
            signature = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        for key in keys:
            try:
                key.verify(signature, content)
            except InvalidSignature:
                continue
            return True
    return False


# ---------------------------------------------------------------------------- signing


def _content(msg_id: str, timestamp: int, body: bytes) -> bytes:
    """The signed content, `{id}.{timestamp}.{body}`, for both schemes."""
    return f"{msg_id}.{int(timestamp)}.".encode() + body


def _signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """Compute one v1 signature over the id.timestamp.body content the receivers rebuild."""
    digest = hmac.new(key, _content(msg_id, timestamp, body), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def _signature_v1a(signing_key: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """Compute one v1a (Ed25519) signature over the same content."""
    signed = _private_key(signing_key).sign(_content(msg_id, timestamp, body))
    return "v1a," + base64.b64encode(signed).decode("ascii")


def _one(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    if is_signing_key(secret):
        return _signature_v1a(secret, msg_id, timestamp, body)
    return _signature(secret_key(secret), msg_id, timestamp, body)


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """Sign with every active key so receivers keep verifying during a rotation: `v1` for a
    whsec_ secret, `v1a` for a whsk_ key, newest first as given."""
    if isinstance(secrets, str):
        raise TypeError("secrets must be a sequence of secrets, not a single string")
    if not secrets:
        raise ValueError("at least one secret is required")
    return " ".join(_one(s, msg_id, timestamp, body) for s in secrets)


def build_headers(
    msg_id: str,
    timestamp: int,
    body: bytes,
    secrets: Sequence[str],
    user_agent: str,
) -> dict[str, str]:
    """Build the protocol headers in one place so every attempt is signed the same way."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": sign(secrets, msg_id, timestamp, body),
        "content-type": "application/json",
        "user-agent": user_agent,
    }
