"""Endpoint signing secrets: stored encrypted, rotated with an overlap, newest signs first
(the ring's rule is `app.secret_ring`, shared with inbound source secrets).

A secret is a whsec_ HMAC secret or a whsk_ Ed25519 private key (`app.signing` tells them
apart); an Ed25519 key's public half is kept beside it in clear, to be shown."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from app import secret_ring, signing
from app.crypto import SecretBox
from app.models import Endpoint, EndpointSecret


def _row(endpoint: Endpoint, secret: str, box: SecretBox, **fields: Any) -> EndpointSecret:
    public = signing.public_key_of(secret) if signing.is_signing_key(secret) else None
    return EndpointSecret(
        endpoint=endpoint, secret_encrypted=box.encrypt(secret), public_key=public, **fields
    )


def add_secret(session: Session, endpoint: Endpoint, secret: str, box: SecretBox) -> EndpointSecret:
    row = _row(endpoint, secret, box)
    session.add(row)
    return row


def rotate(
    session: Session,
    endpoint: Endpoint,
    new_secret: str,
    box: SecretBox,
    now: datetime,
    overlap_s: int,
) -> EndpointSecret:
    """Make `new_secret` current; the others stay valid (and keep signing) for `overlap_s`."""
    secret_ring.cap(endpoint.secrets, now, overlap_s)
    row = _row(endpoint, new_secret, box, created_at=now)
    session.add(row)
    endpoint.updated_at = now  # its signing changed: readers of the endpoint should see that
    session.flush()
    return row


def active_secrets(endpoint: Endpoint, box: SecretBox, now: datetime) -> list[str]:
    """Every secret that signs right now, newest first (the first is the current one)."""
    return [box.decrypt(s.secret_encrypted) for s in secret_ring.live(endpoint.secrets, now)]


def current_secret_row(endpoint: Endpoint, now: datetime) -> EndpointSecret:
    live = secret_ring.live(endpoint.secrets, now)
    if not live:
        raise LookupError(f"endpoint {endpoint.id} has no active secret")
    return live[0]


def current_secret(endpoint: Endpoint, box: SecretBox, now: datetime) -> str:
    return box.decrypt(current_secret_row(endpoint, now).secret_encrypted)
