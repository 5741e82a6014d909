"""Endpoint signing secrets: stored encrypted, rotated with an overlap, newest signs first."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.crypto import SecretBox
from app.models import Endpoint, EndpointSecret


def add_secret(session: Session, endpoint: Endpoint, secret: str, box: SecretBox) -> EndpointSecret:
    row = EndpointSecret(endpoint=endpoint, secret_encrypted=box.encrypt(secret))
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
    expires = now + timedelta(seconds=overlap_s)
    for existing in endpoint.secrets:
        if existing.expires_at is None or existing.expires_at > expires:
            existing.expires_at = expires
    row = EndpointSecret(
        endpoint=endpoint, secret_encrypted=box.encrypt(new_secret), created_at=now
    )
    session.add(row)
    endpoint.updated_at = now  # its signing changed: readers of the endpoint should see that
    session.flush()
    return row


def _live(endpoint: Endpoint, now: datetime) -> list[EndpointSecret]:
    """The secrets that sign right now, newest (the current one) first."""
    live = [s for s in endpoint.secrets if s.expires_at is None or s.expires_at > now]
    live.sort(key=lambda s: (s.created_at, s.id), reverse=True)
    return live


def active_secrets(endpoint: Endpoint, box: SecretBox, now: datetime) -> list[str]:
    """Every secret that signs right now, newest first (the first is the current one)."""
    return [box.decrypt(s.secret_encrypted) for s in _live(endpoint, now)]


def current_secret_row(endpoint: Endpoint, now: datetime) -> EndpointSecret:
    live = _live(endpoint, now)
    if not live:
        raise LookupError(f"endpoint {endpoint.id} has no active secret")
    return live[0]


def current_secret(endpoint: Endpoint, box: SecretBox, now: datetime) -> str:
    return box.decrypt(current_secret_row(endpoint, now).secret_encrypted)
