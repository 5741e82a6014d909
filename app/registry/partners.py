"""Partners: the rules for creating and reading one (its uid and name)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import Conflict, NotFound, reject_unknown_fields
from app.models import Partner
from app.registry.endpoint_fields import invalid

UID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}$")
MAX_NAME_LENGTH = 400


def create_partner(session: Session, body: dict[str, Any]) -> Partner:
    """Raises ValidationFailed for a bad uid or name, Conflict when the uid is taken."""
    reject_unknown_fields(body, {"uid", "name"})
    uid = body.get("uid")
    if not isinstance(uid, str) or not UID_PATTERN.fullmatch(uid):
        raise invalid(
            "uid",
            "uid must be 1-200 characters of letters, digits, '.', '_', ':' "
            "or '-', starting with a letter or digit",
        )
    name = body.get("name", uid)
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
        raise invalid(
            "name", f"name must be a non-empty string of at most {MAX_NAME_LENGTH} characters"
        )
    if session.scalar(select(Partner.id).where(Partner.uid == uid)) is not None:
        raise Conflict(
            f"partner {uid!r} already exists", code="partner_exists", details={"uid": uid}
        )
    partner = Partner(uid=uid, name=name.strip())
    try:
        with session.begin_nested():
            session.add(partner)
    except IntegrityError:
        raise Conflict(
            f"partner {uid!r} already exists", code="partner_exists", details={"uid": uid}
        ) from None
    return partner


def get_partner(session: Session, uid: str) -> Partner:
    partner = session.scalar(select(Partner).where(Partner.uid == uid))
    if partner is None:
        raise NotFound(f"partner {uid!r} does not exist", details={"uid": uid})
    return partner
