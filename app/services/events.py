"""Publishing events and reading them back.

Publishing is the hot path: it owns its transaction (on PostgreSQL a key-less publish is one
autocommit statement, see `app.intake.publish`), so this service takes the Runtime rather than a
session. A publish is not written to the audit trail: the event row, immutable, is its record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import exists, select
from sqlalchemy.orm import Session, selectinload

from app import event_types, telemetry
from app.errors import NotFound, ValidationFailed
from app.ids import id_floor
from app.intake import publish as intake
from app.intake.envelope import PublishResult
from app.models import SUCCEEDED, Attempt, DeadLetter, Delivery, Endpoint, Event, Partner
from app.pagination import paginate
from app.registry.partners import is_reserved_partner
from app.runtime import Runtime
from app.services import partners
from app.services.actor import Actor
from app.services.search import Search
from sender.bodies import delivered_version


def publish(
    rt: Runtime,
    actor: Actor,
    uid: str,
    body: dict[str, object],
    idempotency_key: str | None,
    *,
    traceparent: str | None = None,
) -> PublishResult:
    """Validate and store one event with its fan-out; `202` only after the commit.

    With tracing on, this is the `kurir.publish` span, a child of the publisher's
    `traceparent`: the event row keeps its context, which every later span of the event joins.

    Raises what `app.intake.publish.publish_in_transaction` raises; NotFound for a
    partner-bound actor.
    """
    with telemetry.span(
        "kurir.publish",
        parent=traceparent,
        kind=telemetry.SERVER,
        attributes={"kurir.partner": uid},
    ) as span:
        result = _publish(rt, actor, uid, body, idempotency_key)
        if span.is_recording():
            span.set_attributes(
                {
                    "kurir.event.id": str(result.body.get("id", "")),
                    "kurir.event.type": str(body.get("type", "")),
                    "kurir.deliveries": len(result.body.get("deliveries") or ()),
                    "kurir.idempotent_replay": result.replayed,
                }
            )
        return result


def _publish(
    rt: Runtime, actor: Actor, uid: str, body: dict[str, object], idempotency_key: str | None
) -> PublishResult:
    actor.require("events:write")
    if actor.bound_to_partner:
        raise NotFound("not found")
    if event_types.is_reserved(body.get("type")):
        raise ValidationFailed(
            f"{body.get('type')} is Kurir's own event type and cannot be "
            "published; a test event is sent with POST /v1/partners/{uid}/"
            "endpoints/{id}/test",
            code="reserved_event_type",
            details={"field": "type"},
        )
    if event_types.is_operational(body.get("type")):
        raise ValidationFailed(
            f"{body.get('type')} is one of Kurir's operational event types: Kurir publishes it "
            "when it happens",
            code="reserved_event_type",
            details={"field": "type"},
        )
    if is_reserved_partner(uid):
        raise ValidationFailed(
            f"partner {uid!r} is Kurir's own: its endpoints receive operational events only",
            code="reserved_partner",
            details={"uid": uid},
        )
    return intake.publish(
        rt.db,
        rt.redis,
        rt.settings,
        partner_uid=uid,
        body=dict(body),
        api_key_id=actor.key_id or str(actor),
        idempotency_key=idempotency_key,
    )


def page(
    session: Session,
    actor: Actor,
    uid: str | None,
    *,
    type_: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    delivery_success: bool | None = None,
    search: Search | None = None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Event], str | None]:
    """The partner's events (every visible partner's when `uid` is None), newest first;
    `delivery_success=False` is what did not arrive."""
    if uid is not None:
        partner = partners.visible(session, actor, uid)
        stmt = select(Event).where(Event.partner_id == partner.id)
    else:
        actor.require("read")
        stmt = select(Event)
        if actor.partner_id is not None:
            stmt = stmt.where(Event.partner_id == actor.partner_id)
    if type_:
        stmt = stmt.where(Event.type == type_)
    if since is not None:
        stmt = stmt.where(Event.id >= id_floor("evt", since), Event.created_at >= since)
    if until is not None:
        stmt = stmt.where(Event.created_at < until)
    if search is not None:
        stmt = stmt.where(search.event_condition(since))
    if delivery_success is not None:
        unfinished = exists().where(Delivery.event_id == Event.id, Delivery.state != SUCCEEDED)
        stmt = stmt.where(unfinished if delivery_success is False else ~unfinished)
    return paginate(session, stmt, Event.id, limit=limit, cursor=cursor)


def get(session: Session, actor: Actor, event_id: str) -> tuple[Event, str]:
    """One event with its deliveries and their attempts, and its partner's uid."""
    actor.require("read")
    row = session.execute(
        select(Event, Partner.uid)
        .join(Partner, Partner.id == Event.partner_id)
        .where(Event.id == event_id)
        .options(selectinload(Event.deliveries).selectinload(Delivery.attempts))
    ).first()
    if row is None or not actor.may_see_partner(row[0].partner_id):
        raise NotFound(f"event {event_id!r} does not exist", details={"id": event_id})
    return row[0], row[1]


@dataclass(frozen=True)
class Detail:
    """One event with its partner, its deliveries (their endpoints, attempts and dead
    letters, by delivery id) and the version each delivery carries."""

    event: Event
    partner: Partner
    deliveries: list[Delivery]
    endpoints: dict[str, Endpoint]  # by endpoint id
    letters: dict[str, DeadLetter]  # by delivery id: the latest letter of each
    attempts: dict[str, list[Attempt]]  # by delivery id
    # Each endpoint got the version it was pinned to, which may not be the one published.
    versions: dict[str, int]  # by delivery id


def detail(session: Session, actor: Actor, event_id: str) -> Detail:
    event, _ = get(session, actor, event_id)
    deliveries = list(event.deliveries)
    endpoints = (
        {
            e.id: e
            for e in session.scalars(
                select(Endpoint).where(Endpoint.id.in_([d.endpoint_id for d in deliveries]))
            )
        }
        if deliveries
        else {}
    )
    letters = {
        dl.delivery_id: dl
        for dl in session.scalars(
            select(DeadLetter).where(DeadLetter.event_id == event.id).order_by(DeadLetter.id)
        )
    }
    return Detail(
        event,
        session.get_one(Partner, event.partner_id),
        deliveries,
        endpoints,
        letters,
        {d.id: list(d.attempts) for d in deliveries},
        {d.id: delivered_version(d, event.version) for d in deliveries},
    )
