"""Standard Webhooks v1 signing, pure so it can be verified against published vectors."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as _secrets
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"  # noqa: S105 - a format prefix, not a secret
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
DEFAULT_SECRET_BYTES = 32


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


def _signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """Compute one v1 signature over the id.timestamp.body content the receivers rebuild."""
    content = f"{msg_id}.{int(timestamp)}.".encode() + body
    digest = hmac.new(key, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """Sign with every active secret so receivers keep verifying during a rotation."""
    if isinstance(secrets, str):
        raise TypeError("secrets must be a sequence of secrets, not a single string")
    if not secrets:
        raise ValueError("at least one secret is required")
    return " ".join(_signature(secret_key(s), msg_id, timestamp, body) for s in secrets)


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
