"""Operator accounts: people who sign in to the UI — and their sessions.

A UI session is a row (`operator_sessions`) whose random token lives in the operator's
cookie, stored here as a SHA-256, like the portal's. The UI reads the row on every request,
so ending it — signing out, disabling the operator, changing their password — takes effect at
once in every API process, and a copied cookie dies with it.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app import accounts
from app.clock import utcnow
from app.errors import NotFound
from app.models import Operator, OperatorSession
from app.services import audit
from app.services.actor import Actor

SESSION_LIFETIME = timedelta(hours=12)
# Ended and expired sessions are kept this long (for the record), then purged.
KEEP_ENDED = timedelta(days=1)
# Why a session ended.
SIGNED_OUT, DISABLED, PASSWORD_CHANGED = "signed_out", "disabled", "password_changed"


def create(session: Session, actor: Actor, email: str, password: str) -> Operator:
    actor.require("admin")
    operator = accounts.create_operator(session, email, password)
    audit.record(session, actor, "operator.created", "operator", operator.id, email=operator.email)
    return operator


def sign_in(session: Session, email: str, password: str) -> Operator | None:
    """The operator for these credentials, or None (the time taken does not tell which part
    was wrong)."""
    if not email or not password:
        return None
    return accounts.verify_operator(session, email, password)


def _get(session: Session, actor: Actor, email: str) -> Operator:
    actor.require("admin")
    operator = session.scalar(select(Operator).where(Operator.email == email.strip().lower()))
    if operator is None:
        raise NotFound(f"operator {email!r} does not exist", details={"email": email})
    return operator


def _end_all(session: Session, operator_id: str, reason: str, now: datetime) -> int:
    result = session.execute(
        update(OperatorSession)
        .where(
            OperatorSession.operator_id == operator_id,
            OperatorSession.ended_at.is_(None),
            OperatorSession.expires_at > now,
        )
        .values(ended_at=now, end_reason=reason)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def set_disabled(session: Session, actor: Actor, email: str, disabled: bool) -> int:
    """Disable (or enable again) an operator; disabling ends every session of theirs.
    Returns how many sessions ended."""
    operator = _get(session, actor, email)
    operator.disabled = disabled
    ended = _end_all(session, operator.id, DISABLED, utcnow()) if disabled else 0
    audit.record(
        session,
        actor,
        "operator.disabled" if disabled else "operator.enabled",
        "operator",
        operator.id,
        email=operator.email,
        sessions_ended=ended,
    )
    return ended


def set_password(session: Session, actor: Actor, email: str, password: str) -> int:
    """A new password; every session opened with the old one ends (a stolen cookie too).
    Returns how many sessions ended."""
    operator = _get(session, actor, email)
    accounts.set_operator_password(operator, password)
    ended = _end_all(session, operator.id, PASSWORD_CHANGED, utcnow())
    audit.record(
        session,
        actor,
        "operator.password_changed",
        "operator",
        operator.id,
        email=operator.email,
        sessions_ended=ended,
    )
    return ended


# ------------------------------------------------------------------------------ sessions


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def open_session(session: Session, operator: Operator, now: datetime | None = None) -> str:
    """A new session for a signed-in operator; returns the token for the cookie (once)."""
    now = now or utcnow()
    token = secrets.token_urlsafe(32)
    session.add(
        OperatorSession(
            operator_id=operator.id,
            token_hash=_digest(token),
            created_at=now,
            expires_at=now + SESSION_LIFETIME,
        )
    )
    session.flush()
    return token


@dataclass(frozen=True)
class Current:
    """The operator behind a live session."""

    operator_id: str
    email: str
    session_id: str


def resume(session: Session, token: str, now: datetime | None = None) -> Current | None:
    """The operator of the session behind a cookie's token, if it still holds."""
    now = now or utcnow()
    row = session.execute(
        select(OperatorSession, Operator)
        .join(Operator, Operator.id == OperatorSession.operator_id)
        .where(OperatorSession.token_hash == _digest(token))
    ).first()
    if row is None:
        return None
    found, operator = row
    if found.ended_at is not None or found.expires_at <= now or operator.disabled:
        return None
    return Current(operator.id, operator.email, found.id)


def end_session(session: Session, token: str, now: datetime | None = None) -> None:
    """Sign out: the session's token opens nothing any more, in any browser."""
    session.execute(
        update(OperatorSession)
        .where(OperatorSession.token_hash == _digest(token), OperatorSession.ended_at.is_(None))
        .values(ended_at=now or utcnow(), end_reason=SIGNED_OUT)
        .execution_options(synchronize_session=False)
    )


def purge(session: Session, now: datetime | None = None) -> int:
    """Forget sessions that ended or expired more than `KEEP_ENDED` ago (a periodic job)."""
    cutoff = (now or utcnow()) - KEEP_ENDED
    result = session.execute(
        delete(OperatorSession).where(
            (OperatorSession.expires_at < cutoff) | (OperatorSession.ended_at < cutoff)
        )
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
