"""What signs an endpoint's webhooks: its signature kind, and the key each rotation makes.

HMAC (`v1`): a whsec_ secret, made by Kurir or supplied by the caller, and shown to the
partner, who verifies with the same secret. Ed25519 (`v1a`): Kurir makes the key pair; the
whsk_ private key is kept encrypted like any secret and never shown, the whpk_ public key is
the partner's to verify with. The kind is chosen at creation and changed only by a rotation
(`POST .../secret/rotate {"signature": ...}`), so the old key keeps signing beside the new one
for the overlap whatever their kinds: a receiver sees `v1a,… v1,…` in one header, as the
Standard Webhooks specification allows, and can switch at any time within it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app import secret_ring, signing
from app.errors import Conflict, ValidationFailed
from app.models import Endpoint, EndpointSecret
from app.vocabulary import SignatureKind, values

FIELD = "signature"
SECRET_NOT_ALLOWED = "secret_not_allowed"  # noqa: S105 - an error code
CHANGES_BY_ROTATION = "signature_changes_by_rotation"
NO_SHARED_SECRET = "no_shared_secret"  # noqa: S105 - an error code


def check_signature(value: Any) -> str:
    if value not in values(SignatureKind):
        raise ValidationFailed(
            'signature must be "hmac" (v1: a shared whsec_ secret) or "ed25519" (v1a: Kurir '
            "keeps the private key, you verify with the whpk_ public key)",
            code="invalid_field",
            details={"field": FIELD, "allowed": list(values(SignatureKind))},
        )
    return str(value)


def check_secret(value: Any) -> str:
    if not isinstance(value, str) or not signing.is_valid_secret(value):
        raise ValidationFailed(
            "secret must be 'whsec_' followed by the base64 of 24 to 64 bytes",
            code="invalid_secret",
            details={"field": "secret"},
        )
    return value


def _new_key(kind: str, given: Any) -> str:
    """A key of `kind`: the HMAC secret given (checked) or a fresh one; a fresh Ed25519 key."""
    if kind == SignatureKind.ED25519:
        if given is not None:
            raise ValidationFailed(
                "an Ed25519 endpoint's key pair is made by Kurir, whose private half never "
                "leaves it: send no secret (the public key comes in the answer)",
                code=SECRET_NOT_ALLOWED,
                details={"field": "secret", FIELD: kind},
            )
        return signing.generate_signing_key()
    return check_secret(given) if given is not None else signing.generate_secret()


def first_key(body: dict[str, Any]) -> tuple[str, str]:
    """The kind (default "hmac") and first key of an endpoint about to be created."""
    kind = check_signature(body.get(FIELD, SignatureKind.HMAC.value))
    return kind, _new_key(kind, body.get("secret"))


def next_key(endpoint: Endpoint, body: dict[str, Any]) -> tuple[str, str]:
    """The kind (default: the endpoint's own) and key a rotation makes current."""
    kind = check_signature(body.get(FIELD, kind_of(endpoint)))
    return kind, _new_key(kind, body.get("secret"))


def shown(secret: str) -> str | None:
    """What of a new key its maker's caller may see: an HMAC secret, never a private key."""
    return None if signing.is_signing_key(secret) else secret


def kind_of(endpoint: Endpoint) -> str:
    return endpoint.signature or SignatureKind.HMAC.value


def refuse_change(endpoint: Endpoint, body: dict[str, Any]) -> None:
    """A change (PATCH) may repeat the kind, not switch it: a switch is a rotation, so that
    the current key keeps signing while the receiver moves to the new one."""
    if FIELD in body and body[FIELD] != kind_of(endpoint):
        check_signature(body[FIELD])
        raise ValidationFailed(
            "the signature kind changes with a rotation, so that the current key keeps "
            "signing during the overlap: POST .../secret/rotate "
            f'{{"signature": "{body[FIELD]}"}}',
            code=CHANGES_BY_ROTATION,
            details={"field": FIELD, FIELD: kind_of(endpoint)},
        )


def live_public_keys(endpoint: Endpoint, now: datetime) -> list[EndpointSecret]:
    """The Ed25519 keys signing now, newest first (after a rotation, the previous one too,
    until its overlap ends): the partner's receiver trusts each of their public keys."""
    return [row for row in secret_ring.live(endpoint.secrets, now) if row.public_key]


def current_public_key(endpoint: Endpoint, now: datetime) -> str | None:
    """The whpk_ key of an Ed25519 endpoint's current key pair; None for an HMAC one."""
    if kind_of(endpoint) != SignatureKind.ED25519:
        return None
    live = secret_ring.live(endpoint.secrets, now)
    return live[0].public_key if live else None


def require_shared(endpoint: Endpoint, row: EndpointSecret) -> None:
    """Refuse to reveal a private key: an Ed25519 endpoint has no secret to share."""
    if row.public_key is not None:
        raise Conflict(
            "this endpoint signs with Ed25519 (v1a): its private key never leaves Kurir; "
            "verify webhooks with its public key (public_key on the endpoint)",
            code=NO_SHARED_SECRET,
            details={"endpoint": endpoint.id, "public_key": row.public_key},
        )
