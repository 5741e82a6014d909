"""Signature verification of partner callbacks over the raw body, before anything parses it.

Every refusal is a :class:`SignatureError` whose ``reason`` is a short, stable machine code:

- ``missing_header``: a header the scheme needs is absent or empty;
- ``duplicate_header``: a header the scheme reads appears more than once (otherwise an attacker
  or a confused proxy could choose which copy gets checked);
- ``malformed_header``: a value that does not parse: not ASCII, bad base64 or hex, wrong shape,
  a timestamp that is not an integer;
- ``timestamp_out_of_tolerance``: the signed timestamp is too far in the past or the future;
- ``signature_mismatch``: well formed, but no signature matches any of the secrets;
- ``no_usable_secret``: none of the source's secrets can verify anything (fail closed).

An unknown scheme or a bare string passed as ``secrets`` is a programming error and raises
``ValueError`` / ``TypeError`` instead, so it is not mistaken for a forged request.

GitHub and Shopify sign no timestamp: replays of a genuine callback pass verification and are
stopped by the (source, event id) uniqueness of the inbound store, not here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable, Sequence

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "SCHEMES",
    "SignatureError",
    "standard_webhooks_key",
    "verify",
]

SCHEMES = ("standard-webhooks", "stripe", "github", "shopify")
DEFAULT_TOLERANCE_S = 300

# int() refuses more than 4,300 digits with ValueError; twelve digits reach the year 33658.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_HEX_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_SHA256_BYTES = 32
_WHSEC_PREFIX = "whsec_"

Headers = Sequence[tuple[str, str]]


class SignatureError(Exception):
    """A callback whose authenticity could not be established; ``reason`` is for machines."""

    def __init__(self, reason: str, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason = reason


def standard_webhooks_key(secret: str) -> bytes:
    """Derive the HMAC key as Standard Webhooks libraries do, so their senders verify here.

    Raises:
        ValueError: the part after ``whsec_`` is not base64, or the key is empty.
    """
    if secret.startswith(_WHSEC_PREFIX):
        encoded = secret[len(_WHSEC_PREFIX) :]
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("the part after whsec_ is not base64") from exc
    else:
        try:
            key = base64.b64decode(secret, validate=True)
        except (binascii.Error, ValueError):
            key = _utf8(secret) or b""
    if not key:
        raise ValueError("the secret is empty")
    return key


def verify(
    scheme: str,
    secrets: Sequence[str],
    headers: Headers,
    body: bytes,
    now: float,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
) -> None:
    """Raise SignatureError unless ``body`` was signed, recently enough, with one of ``secrets``.

    Args:
        scheme: one of :data:`SCHEMES`.
        secrets: every currently valid secret of the source (several during a rotation).
        headers: the raw (name, value) pairs as received, duplicates included.
        body: the raw request body, exactly as received.
        now: the current time in Unix seconds (injected so tests need no clock).
        tolerance_s: how far a signed timestamp may be from ``now``, either way.
    """
    verifier = _VERIFIERS.get(scheme)
    if verifier is None:
        raise ValueError(f"unknown signature scheme {scheme!r}; expected one of {SCHEMES}")
    if isinstance(secrets, str | bytes):
        # Iterating a lone string would make every character a one-letter secret.
        raise TypeError("secrets must be a sequence of strings, not a single string")
    if tolerance_s < 0:
        raise ValueError("tolerance_s must not be negative")
    verifier(secrets, headers, bytes(body), now, tolerance_s)


def _verify_standard_webhooks(
    secrets: Sequence[str], headers: Headers, body: bytes, now: float, tolerance_s: int
) -> None:
    """Standard Webhooks (and Svix): v1 signatures over ``{id}.{timestamp}.{body}``."""
    keys = [key for key in map(_standard_key_or_none, secrets) if key]
    # Svix sends the same trio prefixed svix-; the unprefixed one wins when both are present.
    standard = ("webhook-id", "webhook-timestamp", "webhook-signature")
    svix_only = not any(_present(headers, name) for name in standard) and any(
        _present(headers, "svix-" + name[8:]) for name in standard
    )
    prefix = "svix-" if svix_only else "webhook-"
    msg_id = _required(headers, prefix + "id")
    timestamp = _timestamp(_required(headers, prefix + "timestamp"), prefix + "timestamp")
    signature_list = _required(headers, prefix + "signature")

    candidates: list[bytes] = []
    malformed: SignatureError | None = None
    for entry in signature_list.split():
        version, comma, value = entry.partition(",")
        if not comma or not version or not value or "," in value:
            raise SignatureError("malformed_header", f"{prefix}signature entry is not v<n>,<sig>")
        if version == "v1":
            # One unusable signature does not spoil the others (a sender mid-rotation may
            # list a stale or truncated one first); as in the reference libraries, any match
            # is enough.
            try:
                candidates.append(_base64_digest(value, prefix + "signature"))
            except SignatureError as exc:
                malformed = exc
        # Other versions (v1a is Ed25519) are skipped: the spec lets receivers ignore them.
    if not candidates:
        raise malformed or SignatureError(
            "signature_mismatch", f"{prefix}signature has no v1 signature"
        )
    _require_keys(keys)
    _check_tolerance(timestamp, now, tolerance_s)
    message = f"{msg_id}.{timestamp}.".encode() + body
    _require_match(keys, message, candidates, hex_digest=False)


def _verify_stripe(
    secrets: Sequence[str], headers: Headers, body: bytes, now: float, tolerance_s: int
) -> None:
    """Stripe: hex v1 signatures over ``{t}.{body}`` keyed by the whole secret string."""
    keys = [key for key in map(_utf8, secrets) if key]
    value = _required(headers, "stripe-signature")
    timestamp: int | None = None
    candidates: list[bytes] = []
    malformed = False
    for item in value.split(","):
        name, equals, part = item.partition("=")
        if not equals or not name or not part:
            raise SignatureError("malformed_header", "stripe-signature item is not key=value")
        if name == "t":
            if timestamp is not None:
                raise SignatureError("malformed_header", "stripe-signature has two t= items")
            timestamp = _timestamp(part, "stripe-signature t")
        elif name == "v1":
            # Any matching v1 is enough, as in Stripe's libraries: one that is not even
            # SHA-256 hex is skipped, not allowed to spoil the others.
            if _HEX_SHA256.fullmatch(part):
                candidates.append(part.lower().encode("ascii"))
            else:
                malformed = True
        # v0 (test-mode legacy) and unknown keys are ignored, as Stripe's libraries do.
    if timestamp is None:
        raise SignatureError("malformed_header", "stripe-signature has no t= item")
    if not candidates and malformed:
        raise SignatureError("malformed_header", "stripe-signature v1 is not SHA-256 hex")
    if not candidates:
        raise SignatureError("signature_mismatch", "stripe-signature has no v1 signature")
    _require_keys(keys)
    _check_tolerance(timestamp, now, tolerance_s)
    message = f"{timestamp}.".encode() + body
    _require_match(keys, message, candidates, hex_digest=True)


def _verify_github(
    secrets: Sequence[str], headers: Headers, body: bytes, now: float, tolerance_s: int
) -> None:
    """GitHub: ``X-Hub-Signature-256: sha256=<hex>`` over the body; the SHA-1 header is refused."""
    keys = [key for key in map(_utf8, secrets) if key]
    value = _required(headers, "x-hub-signature-256")
    algorithm, equals, signature = value.partition("=")
    if not equals or algorithm.lower() != "sha256" or not _HEX_SHA256.fullmatch(signature):
        raise SignatureError("malformed_header", "x-hub-signature-256 is not sha256=<hex>")
    _require_keys(keys)
    _require_match(keys, body, [signature.lower().encode("ascii")], hex_digest=True)


def _verify_shopify(
    secrets: Sequence[str], headers: Headers, body: bytes, now: float, tolerance_s: int
) -> None:
    """Shopify: ``X-Shopify-Hmac-Sha256: <base64>`` over the body."""
    keys = [key for key in map(_utf8, secrets) if key]
    value = _required(headers, "x-shopify-hmac-sha256")
    candidate = _base64_digest(value, "x-shopify-hmac-sha256")
    _require_keys(keys)
    _require_match(keys, body, [candidate], hex_digest=False)


_VERIFIERS: dict[str, Callable[[Sequence[str], Headers, bytes, float, int], None]] = {
    "standard-webhooks": _verify_standard_webhooks,
    "stripe": _verify_stripe,
    "github": _verify_github,
    "shopify": _verify_shopify,
}


def _ascii_lower(name: object) -> str | None:
    """Fold a header name's case, ignoring non-ASCII names (``'\\u212a'.lower()`` is ``'k'``)."""
    if isinstance(name, str) and name.isascii():
        return name.lower()
    return None


def _present(headers: Headers, name: str) -> bool:
    """Whether any header called ``name`` (lower case) was sent."""
    return any(_ascii_lower(key) == name for key, _ in headers)


def _required(headers: Headers, name: str) -> str:
    """The single, non-empty, ASCII value of header ``name`` (lower case)."""
    found = [value for key, value in headers if _ascii_lower(key) == name]
    if len(found) > 1:
        raise SignatureError("duplicate_header", f"{name} appears {len(found)} times")
    if not found:
        raise SignatureError("missing_header", f"{name} is missing")
    value = found[0]
    if not isinstance(value, str) or not value.isascii():
        raise SignatureError("malformed_header", f"{name} is not ASCII text")
    value = value.strip(" \t")
    if not value:
        raise SignatureError("missing_header", f"{name} is empty")
    return value


def _timestamp(text: str, what: str) -> int:
    """Unix seconds as a plain integer; floats, signs and huge values are malformed."""
    if not _TIMESTAMP.fullmatch(text):
        raise SignatureError("malformed_header", f"{what} is not integer Unix seconds")
    return int(text)


def _check_tolerance(timestamp: int, now: float, tolerance_s: int) -> None:
    """Refuse a replay of an old signature and a signature minted for the future alike."""
    if abs(now - timestamp) > tolerance_s:
        raise SignatureError(
            "timestamp_out_of_tolerance",
            f"timestamp is {abs(now - timestamp):.0f} s "
            f"{'in the past' if timestamp < now else 'in the future'} "
            f"(tolerance {tolerance_s} s)",
        )


def _base64_digest(text: str, what: str) -> bytes:
    """Decode a base64 SHA-256 digest strictly: anything else is malformed, not a mismatch."""
    try:
        digest = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SignatureError("malformed_header", f"{what} is not base64") from exc
    if len(digest) != _SHA256_BYTES:
        raise SignatureError("malformed_header", f"{what} is not a SHA-256 digest")
    return digest


def _utf8(secret: object) -> bytes | None:
    """A secret string as key bytes, or None when it cannot be one."""
    if not isinstance(secret, str):
        return None
    try:
        return secret.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _standard_key_or_none(secret: object) -> bytes | None:
    """The Standard Webhooks key of ``secret``, or None for a secret that cannot verify."""
    if not isinstance(secret, str):
        return None
    try:
        return standard_webhooks_key(secret)
    except ValueError:
        return None


def _require_keys(keys: Sequence[bytes]) -> None:
    """Fail closed when there is nothing to verify with: an empty key would sign for anyone."""
    if not keys:
        raise SignatureError("no_usable_secret", "the source has no usable secret")


def _require_match(
    keys: Sequence[bytes], message: bytes, candidates: Sequence[bytes], *, hex_digest: bool
) -> None:
    """Compare, in constant time and on bytes, every candidate against every key's HMAC."""
    matched = False
    for key in keys:
        mac = hmac.new(key, message, hashlib.sha256)
        expected = mac.hexdigest().encode("ascii") if hex_digest else mac.digest()
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise SignatureError("signature_mismatch", "no signature matches any secret")
