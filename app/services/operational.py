"""Operational events as operators and partners manage them: the operator endpoints (the
endpoints of the reserved partner `kurir-operators`, made here from `/ui`), and a partner's
opt-in (`partners.update`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import operational
from app.errors import NotFound
from app.models import Endpoint, Partner
from app.runtime import Runtime
from app.services import endpoints
from app.services.actor import Actor
from app.vocabulary import OperationalEventType

TYPES = tuple(t.value for t in OperationalEventType)


@dataclass(frozen=True)
class OperatorEndpoints:
    partner: Partner | None
    endpoints: list[Endpoint]
    from_setting: str  # the description that marks those made from the setting


def operator_endpoints(session: Session, actor: Actor) -> OperatorEndpoints:
    """The live operator endpoints (none before the first is made)."""
    _require_operator(actor, "read")
    partner = operational.operator_partner(session)
    rows: list[Endpoint] = []
    if partner is not None:
        rows = list(
            session.scalars(
                select(Endpoint)
                .where(Endpoint.partner_id == partner.id, Endpoint.deleted_at.is_(None))
                .order_by(Endpoint.id)
            )
        )
    return OperatorEndpoints(partner, rows, operational.FROM_SETTING)


def create_operator_endpoint(
    session: Session, rt: Runtime, actor: Actor, body: dict[str, Any]
) -> endpoints.EndpointWithSecret:
    """A new operator endpoint: the reserved partner is made on first use, and the endpoint
    as any other (validated, audited, with its first secret)."""
    _require_operator(actor, "endpoints:write")
    operational.ensure_registered(session)
    operational.ensure_operator_partner(session)
    return endpoints.create(session, rt, actor, operational.OPERATOR_PARTNER_UID, body)


def _require_operator(actor: Actor, scope: str) -> None:
    actor.require(scope)
    if actor.bound_to_partner:
        raise NotFound("not found")
