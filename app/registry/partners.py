"""Partners: the rules for creating and reading one (its uid and name)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import Conflict, NotFound, ValidationFailed, reject_unknown_fields
from app.models import Partner
from app.registry.endpoint_fields import check_flag, invalid

UID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}$")
MAX_NAME_LENGTH = 400
# The partner whose endpoints receive Kurir's operational events (`app.operational`): Kurir
# makes it, no one else may.
OPERATOR_PARTNER_UID = "kurir-operators"


def is_reserved_partner(uid: Any) -> bool:
    return isinstance(uid, str) and uid.lower() == OPERATOR_PARTNER_UID


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
    if is_reserved_partner(uid):
        raise ValidationFailed(
            f"partner {uid!r} is Kurir's own (operator endpoints for operational events); "
            "pick another uid",
            code="reserved_partner",
            details={"field": "uid"},
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


PATCHABLE = frozenset({"name", "operational_events"})


def update_partner(session: Session, partner: Partner, body: dict[str, Any]) -> dict[str, Any]:
    """Change the fields given (name, the operational-events opt-in); returns those that
    changed, with their new values. Raises ValidationFailed for a bad field."""
    reject_unknown_fields(body, PATCHABLE)
    changed: dict[str, Any] = {}
    if "name" in body:
        name = body["name"]
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
            raise invalid(
                "name", f"name must be a non-empty string of at most {MAX_NAME_LENGTH} characters"
            )
        if partner.name != name.strip():
            partner.name = changed["name"] = name.strip()
    if "operational_events" in body:
        flag = check_flag("operational_events", body["operational_events"])
        if partner.operational_events != flag:
            partner.operational_events = changed["operational_events"] = flag
    session.flush()
    return changed


def get_partner(session: Session, uid: str) -> Partner:
    partner = session.scalar(select(Partner).where(Partner.uid == uid))
    if partner is None:
        raise NotFound(f"partner {uid!r} does not exist", details={"uid": uid})
    return partner
