"""API keys for services and operator accounts for people; both stored only as hashes.

The records alone: who may create, list or revoke them is decided by `app.services`.
"""

from __future__ import annotations

import functools
import hashlib
import re
import secrets
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from app.clock import utcnow
from app.errors import Conflict, ValidationFailed
from app.models import SCOPES, ApiKey, Operator

KEY_PREFIX = "kurir_"
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
MIN_PASSWORD_LENGTH = 8


def hash_key(token: str) -> str:
    """SHA-256 suffices: keys carry 256 random bits, so there is nothing to brute-force."""
    return hashlib.sha256(token.encode()).hexdigest()


def validate_scopes(scopes: Iterable[str]) -> list[str]:
    result = sorted(set(scopes)) or ["admin"]
    unknown = [s for s in result if s not in SCOPES]
    if unknown:
        raise ValidationFailed(
            f"unknown scope(s): {', '.join(unknown)}; known: {', '.join(SCOPES)}",
            code="invalid_scope",
        )
    return result


def create_api_key(session: Session, name: str, scopes: Iterable[str] = ()) -> tuple[ApiKey, str]:
    """Create a key; the plaintext is returned once and never stored."""
    if not name.strip():
        raise ValidationFailed("name must not be empty")
    token = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        name=name.strip(),
        prefix=token[: len(KEY_PREFIX) + 6],
        key_hash=hash_key(token),
        scopes=validate_scopes(scopes),
    )
    session.add(key)
    session.flush()
    return key, token


def _check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise ValidationFailed(
            f"password must have at least {MIN_PASSWORD_LENGTH} characters", code="weak_password"
        )


def create_operator(session: Session, email: str, password: str) -> Operator:
    email = email.strip().lower()
    if not _EMAIL.fullmatch(email):
        raise ValidationFailed(f"not an email address: {email!r}", code="invalid_email")
    _check_password(password)
    if session.scalar(select(Operator).where(Operator.email == email)) is not None:
        raise Conflict(f"operator {email} already exists", code="operator_exists")
    operator = Operator(email=email, password_hash=generate_password_hash(password))
    session.add(operator)
    session.flush()
    return operator


def set_operator_password(operator: Operator, password: str) -> None:
    _check_password(password)
    operator.password_hash = generate_password_hash(password)


def verify_operator(session: Session, email: str, password: str) -> Operator | None:
    """The operator for these credentials, or None; the time taken does not tell which part."""
    operator = session.scalar(select(Operator).where(Operator.email == email.strip().lower()))
    if operator is None or operator.disabled:
        check_password_hash(_dummy_hash(), password)
        return None
    if not check_password_hash(operator.password_hash, password):
        return None
    operator.last_login_at = utcnow()
    return operator


@functools.cache
def _dummy_hash() -> str:
    return generate_password_hash(secrets.token_hex(16))
