"""Who receives operational events: the operator endpoints, and opted-in partners.

Operator endpoints are the endpoints of a reserved partner, `kurir-operators`, which no one
can create by hand (`422 reserved_partner`): those made from `KURIR_OPERATOR_WEBHOOK_URL`
(kept in step with it by `sync_operator_endpoints`, marked by their description) and those an
operator adds in `/ui`. They get every operational event, whatever they subscribe to. A
partner with `operational_events` on gets, on those of its endpoints that subscribe to a type
by name, the events of that type about its own endpoints.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.config import Settings
from app.crypto import SecretBox
from app.errors import ValidationFailed
from app.models import Endpoint, Partner
from app.registry import endpoints as endpoint_rules
from app.registry.partners import OPERATOR_PARTNER_UID
from app.vocabulary import OperationalEventType

log = logging.getLogger(__name__)

OPERATOR_PARTNER_NAME = "Kurir operators"
# The description of an endpoint made from KURIR_OPERATOR_WEBHOOK_URL: what the sync owns.
FROM_SETTING = "from KURIR_OPERATOR_WEBHOOK_URL"


def operator_partner(session: Session) -> Partner | None:
    return session.scalar(select(Partner).where(Partner.uid == OPERATOR_PARTNER_UID))


def ensure_operator_partner(session: Session) -> Partner:
    """The reserved partner, made on first use (race-safe)."""
    found = operator_partner(session)
    if found is not None:
        return found
    partner = Partner(uid=OPERATOR_PARTNER_UID, name=OPERATOR_PARTNER_NAME)
    try:
        with session.begin_nested():
            session.add(partner)
    except IntegrityError:
        found = operator_partner(session)
        if found is None:
            raise
        return found
    return partner


def operator_listens(session: Session) -> bool:
    """Whether the operator partner has a live endpoint to send operational events to."""
    return (
        session.scalar(
            select(Endpoint.id)
            .join(Partner, Partner.id == Endpoint.partner_id)
            .where(Partner.uid == OPERATOR_PARTNER_UID, Endpoint.deleted_at.is_(None))
            .limit(1)
        )
        is not None
    )


@dataclass(frozen=True)
class Synced:
    created: int
    removed: int


def sync_operator_endpoints(session: Session, settings: Settings, box: SecretBox) -> Synced:
    """Make the operator endpoints match `KURIR_OPERATOR_WEBHOOK_URL`: one endpoint per URL
    (signed with `KURIR_OPERATOR_WEBHOOK_SECRET` when set); those made from a URL no longer
    listed are deleted. Endpoints added by hand are left alone. A URL the endpoint rules
    refuse is logged and skipped, so one bad entry never stops the others."""
    urls = settings.operator_webhook_urls
    partner = operator_partner(session) if not urls else ensure_operator_partner(session)
    if partner is None:
        return Synced(0, 0)
    managed = {
        endpoint.url: endpoint
        for endpoint in session.scalars(
            select(Endpoint).where(
                Endpoint.partner_id == partner.id,
                Endpoint.deleted_at.is_(None),
                Endpoint.description == FROM_SETTING,
            )
        )
    }
    created = removed = 0
    for url in urls:
        if url in managed:
            continue
        body: dict[str, object] = {"url": url, "description": FROM_SETTING}
        if settings.operator_webhook_secret:
            body["secret"] = settings.operator_webhook_secret
        try:
            with session.begin_nested():
                endpoint_rules.create_endpoint(session, partner, body, settings, box)
        except ValidationFailed as exc:
            log.error(
                "operator webhook refused",
                extra={"url_index": urls.index(url), "code": exc.code, "error": str(exc)},
            )
            continue
        created += 1
    now = utcnow()
    for url, endpoint in managed.items():
        if url not in urls:
            endpoint_rules.delete_endpoint(session, endpoint, now)
            removed += 1
    return Synced(created, removed)


def is_operational_only(endpoint: Endpoint, operator_partner_id: str | None) -> bool:
    """An endpoint that receives nothing but operational events: its own failures are about
    operational deliveries, so they must not make operational events in turn."""
    if operator_partner_id is not None and endpoint.partner_id == operator_partner_id:
        return True
    subscribed = endpoint.event_types or []
    names = {t.value for t in OperationalEventType}
    return bool(subscribed) and all(name in names for name in subscribed)
