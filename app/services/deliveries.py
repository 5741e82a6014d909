"""Deliveries: the delivery log (search, newest first), one delivery with its attempts, and
"try it now".

A dead delivery is resent through its open dead letter, so the action is audited there like
any resend (and in the audit trail); a waiting one is brought forward; a succeeded one is sent
again as a new run. The log is what both the operator UI and the partner portal show: a
partner-bound actor sees only its partner's deliveries, whatever the filter says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from app.clock import isoformat, parse_time, utcnow
from app.errors import Conflict, NotFound
from app.ids import id_floor
from app.models import (
    DEAD,
    DELIVERING,
    DELIVERY_STATES,
    DL_OPEN,
    PENDING,
    RETRYING,
    SUCCEEDED,
    Attempt,
    DeadLetter,
    Delivery,
    Endpoint,
    Event,
    Partner,
)
from app.pagination import paginate
from app.queues import enqueue_after_commit
from app.runtime import Runtime
from app.services import audit, dead_letters, partners
from app.services.actor import Actor
from app.services.search import Search
from app.vocabulary import ResendSkip
from sender import ordering
from sender.bodies import Sent, delivered_version, sent_by
from sender.dispatch import job_specs

FILTER_KEYS = ("q", "partner", "endpoint", "state", "type", "status_code", "since", "until")
NO_STATUS = 0  # `status_code=none`: the last attempt got no HTTP answer


def _text(value: Any) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text or None


@dataclass(frozen=True)
class DeliveryFilter:
    """What the delivery log is narrowed to; every field optional, combined with AND."""

    partner: str | None = None  # partner uid
    endpoint: str | None = None  # endpoint id
    state: str | None = None
    type: str | None = None  # event type
    status_code: int | None = None  # last HTTP status; NO_STATUS = none received
    since: datetime | None = None  # created at or after
    until: datetime | None = None  # created before
    # The search box (`app.services.search`): an event, delivery, resource or correlation
    # id, or payload words.
    q: Search | None = None

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> tuple[DeliveryFilter, dict[str, str]]:
        """Every criterion that parses, and a message per field that does not."""
        values: dict[str, Any] = {k: _text(params.get(k)) for k in ("partner", "endpoint", "type")}
        errors: dict[str, str] = {}
        state = _text(params.get("state"))
        if state is not None and state not in DELIVERY_STATES:
            errors["state"] = f"must be one of {', '.join(DELIVERY_STATES)}"
            state = None
        values["state"] = state
        raw_status = _text(params.get("status_code"))
        values["status_code"] = None
        if raw_status is not None:
            if raw_status.lower() in {"none", "0"}:
                values["status_code"] = NO_STATUS
            elif raw_status.isdigit() and 100 <= int(raw_status) <= 599:
                values["status_code"] = int(raw_status)
            else:
                errors["status_code"] = "must be an HTTP status (100-599) or none"
        for key in ("since", "until"):
            raw = _text(params.get(key))
            values[key] = None
            if raw is not None:
                try:
                    values[key] = parse_time(raw)
                except ValueError:
                    errors[key] = "must be a time like 2026-01-31T00:00:00Z"
        values["q"], q_error = Search.parse(_text(params.get("q")))
        if q_error is not None:
            errors["q"] = q_error
        return cls(**values), errors

    def to_params(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key in FILTER_KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if key == "status_code":
                out[key] = "none" if value == NO_STATUS else str(value)
            elif key == "q":
                out[key] = " ".join(f'"{w}"' if " " in w else w for w in value.words)
            elif isinstance(value, datetime):
                out[key] = isoformat(value) or ""
            else:
                out[key] = str(value)
        return out


@dataclass
class LogPage:
    """One page of the delivery log, with what its rows point at (loaded in bulk)."""

    deliveries: list[Delivery]
    next_cursor: str | None
    events: dict[str, Event] = field(default_factory=dict)
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    partner_uids: dict[str, str] = field(default_factory=dict)

    def version_of(self, delivery: Delivery) -> int | None:
        """The version this row's endpoint received: its pin, or the version published."""
        event = self.events.get(delivery.event_id)
        return None if event is None else delivered_version(delivery, event.version)


def _not_found(delivery_id: str) -> NotFound:
    return NotFound(f"no delivery {delivery_id!r}", details={"delivery": delivery_id})


def _partner_of(session: Session, delivery: Delivery) -> str:
    return (
        session.scalar(select(Endpoint.partner_id).where(Endpoint.id == delivery.endpoint_id)) or ""
    )


def page(
    session: Session, actor: Actor, flt: DeliveryFilter, *, limit: int, cursor: str | None
) -> LogPage:
    """The delivery log, newest first.

    A time range is also an id range (ids are ULIDs), so the primary key answers it.
    """
    actor.require("read")
    stmt = select(Delivery)
    partner_id = actor.partner_id
    if flt.partner is not None:
        partner_id = partners.visible(session, actor, flt.partner).id
    if partner_id is not None:
        stmt = stmt.join(Endpoint, Endpoint.id == Delivery.endpoint_id).where(
            Endpoint.partner_id == partner_id
        )
    if flt.endpoint is not None:
        stmt = stmt.where(Delivery.endpoint_id == flt.endpoint)
    if flt.state is not None:
        stmt = stmt.where(Delivery.state == flt.state)
    if flt.q is not None and (flt.q.single or "").startswith("dlv_"):
        stmt = stmt.where(Delivery.id == flt.q.single)
    elif flt.type is not None or flt.q is not None:
        stmt = stmt.join(Event, Event.id == Delivery.event_id)
        if flt.q is not None:
            stmt = stmt.where(flt.q.event_condition(flt.since))
    if flt.type is not None:
        stmt = stmt.where(Event.type == flt.type)
    if flt.status_code == NO_STATUS:
        stmt = stmt.where(Delivery.last_status_code.is_(None), Delivery.attempt_count > 0)
    elif flt.status_code is not None:
        stmt = stmt.where(Delivery.last_status_code == flt.status_code)
    if flt.since is not None:
        stmt = stmt.where(
            Delivery.id >= id_floor("dlv", flt.since), Delivery.created_at >= flt.since
        )
    if flt.until is not None:
        stmt = stmt.where(Delivery.created_at < flt.until)
    rows, next_cursor = paginate(session, stmt, Delivery.id, limit=limit, cursor=cursor)
    result = LogPage(rows, next_cursor)
    if rows:
        result.events = {
            e.id: e
            for e in session.scalars(select(Event).where(Event.id.in_({d.event_id for d in rows})))
        }
        result.endpoints = {
            e.id: e
            for e in session.scalars(
                select(Endpoint).where(Endpoint.id.in_({d.endpoint_id for d in rows}))
            )
        }
        result.partner_uids = partners.uids(
            session, {e.partner_id for e in result.endpoints.values()}
        )
    return result


@dataclass
class Detail:
    """One delivery as its page shows it: attempts newest first, its dead letters, and what
    it sends (its version and exact body, as the engine reads them)."""

    delivery: Delivery
    event: Event
    endpoint: Endpoint
    partner: Partner
    attempts: list[Attempt]
    letters: list[DeadLetter]
    sent: Sent
    # The dead delivery whose key holds this one back (`on_dead: "block"`), if any.
    held_by: ordering.HeldBy | None = None

    @property
    def held_back(self) -> bool:
        """Parked without a single attempt (its endpoint was disabled, or its URL refused):
        never sent, and not queued either until someone resends it."""
        return self.delivery.state == DEAD and not self.attempts

    @property
    def on_its_way(self) -> bool:
        """Kurir is about to attempt it (a page may refresh until the attempt ends):
        pending or being attempted, or retrying before its first attempt; not while a
        blocked ordering key holds it, when it waits for an operator instead."""
        if self.held_by is not None:
            return False
        state = self.delivery.state
        return state in (PENDING, DELIVERING) or (state == RETRYING and not self.attempts)

    @property
    def open_letter(self) -> DeadLetter | None:
        return next((dl for dl in self.letters if dl.state == DL_OPEN), None)

    @property
    def can_retry(self) -> bool:
        """What "resend" may act on: a failed (retrying) or dead delivery, or a succeeded one
        sent again; not one being attempted right now."""
        if self.delivery.state == DEAD:
            return self.open_letter is not None
        if self.held_by is not None:
            return False  # trying it now would send nothing: its key is held
        return self.delivery.state != DELIVERING


def detail(session: Session, actor: Actor, delivery_id: str) -> Detail:
    delivery = get(session, actor, delivery_id)
    endpoint = session.get_one(Endpoint, delivery.endpoint_id)
    letters = list(
        session.scalars(
            select(DeadLetter)
            .where(DeadLetter.delivery_id == delivery.id)
            .order_by(DeadLetter.id.desc())
        )
    )
    event = session.get_one(Event, delivery.event_id)
    return Detail(
        delivery,
        event,
        endpoint,
        session.get_one(Partner, endpoint.partner_id),
        sorted(delivery.attempts, key=lambda a: a.n, reverse=True),
        letters,
        sent_by(session, delivery, event),
        ordering.held_by(session, delivery),
    )


def get(session: Session, actor: Actor, delivery_id: str) -> Delivery:
    actor.require("read")
    delivery = session.scalar(
        select(Delivery).where(Delivery.id == delivery_id).options(selectinload(Delivery.attempts))
    )
    if delivery is None or not actor.may_see_partner(_partner_of(session, delivery)):
        raise _not_found(delivery_id)
    return delivery


def retry(
    session: Session, rt: Runtime, actor: Actor, delivery_id: str, *, force: bool = False
) -> ordering.HeldBy | None:
    """Make the delivery due now and enqueue it after the caller commits. What holds its
    ordering key, when something does: then nothing is sent until that is released, and
    the caller says so.

    Raises:
        NotFound: no such delivery (or not the actor's partner's).
        Conflict: `delivery_in_flight`; for a dead one, what a dead-letter resend refuses
            (`dead_letter_not_open`, `endpoint_disabled` without `force`, `endpoint_deleted`).
    """
    actor.require("dlq:write")
    delivery = session.get(Delivery, delivery_id, with_for_update=True)
    if delivery is None or not actor.may_see_partner(_partner_of(session, delivery)):
        raise _not_found(delivery_id)
    if delivery.state == DELIVERING:
        raise Conflict(
            "the delivery is being attempted right now",
            code="delivery_in_flight",
            details={"delivery": delivery_id},
        )
    if delivery.state == DEAD:
        letter_id = _resend_dead(session, rt, actor, delivery_id, force=force)
        audit.record(
            session,
            actor,
            "delivery.retried",
            "delivery",
            delivery_id,
            partner_id=_partner_of(session, delivery),
            dead_letter=letter_id,
        )
        return None
    if delivery.state == SUCCEEDED:
        delivery.run += 1
        delivery.run_attempts = 0
        delivery.succeeded_at = None
        delivery.state = PENDING
    elif delivery.state not in (PENDING, RETRYING):
        raise Conflict(f"a {delivery.state} delivery cannot be retried")
    now = utcnow()
    delivery.next_attempt_at = now
    delivery.lease_expires_at = None
    delivery.updated_at = now
    session.flush()
    audit.record(
        session,
        actor,
        "delivery.retried",
        "delivery",
        delivery.id,
        partner_id=_partner_of(session, delivery),
        run=delivery.run,
    )
    enqueue_after_commit(
        session, rt.redis, job_specs([delivery.id], tag=f"r{int(now.timestamp() * 1e6)}")
    )
    return ordering.held_by(session, delivery)


def _resend_dead(
    session: Session, rt: Runtime, actor: Actor, delivery_id: str, *, force: bool
) -> str:
    letters = session.execute(
        select(DeadLetter.id, DeadLetter.state)
        .where(DeadLetter.delivery_id == delivery_id)
        .order_by(DeadLetter.id.desc())
    ).all()
    open_ids = [letter_id for letter_id, state in letters if state == DL_OPEN]
    if not open_ids:
        last_id, last_state = letters[0] if letters else (None, None)
        raise Conflict(
            "the delivery is dead and has no open dead letter to resend it from"
            + (f": its dead letter {last_id} was {last_state}" if last_id else ""),
            code=ResendSkip.NOT_OPEN,
            details={"delivery": delivery_id, "dead_letter": last_id, "state": last_state},
        )
    dead_letters.resend_one(session, rt, actor, open_ids[0], force=force)
    return open_ids[0]
