"""Operator accounts: people who sign in to the UI."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app import accounts
from app.models import Operator
from app.services import audit
from app.services.actor import Actor


def create(session: Session, actor: Actor, email: str, password: str) -> Operator:
    actor.require("admin")
    operator = accounts.create_operator(session, email, password)
    audit.record(session, actor, "operator.created", "operator", operator.id,
                 email=operator.email)
    return operator


def sign_in(session: Session, email: str, password: str) -> Operator | None:
    """The operator for these credentials, or None (the time taken does not tell which part
    was wrong)."""
    if not email or not password:
        return None
    return accounts.verify_operator(session, email, password)
