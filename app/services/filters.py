"""Trying an endpoint's filter before (or after) setting it: which events would it let through?

A filter (`app.event_types.filters`) is judged on samples, each as a publish would judge it:
an event given in full, a stored event of the partner named by id, or — when none is given —
the example of each event type the endpoint subscribes to (its newest version) and the
partner's most recent events of those types. Nothing is written and nothing is audited: a
test reads, and needs only `read`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import NotFound, ValidationFailed, reject_unknown_fields
from app.event_types import RESERVED_PREFIX, filters
from app.models import Event, Partner
from app.registry.endpoint_fields import check_filter
from app.services import endpoints, event_types, partners
from app.services.actor import Actor

# Samples taken when none is given: examples of this many event types, and this many of the
# partner's latest events.
EXAMPLE_TYPES = 20
RECENT_EVENTS = 5
SOURCES = ("given", "event", "example", "recent")


@dataclass(frozen=True)
class Sample:
    """One event the filter was tried on, and its verdict."""

    source: str  # "given", "event" (named by id), "example", "recent"
    type: str
    version: int
    event: str | None  # the stored event's id, for "event" and "recent"
    matched: bool
    error: str | None = None


@dataclass(frozen=True)
class Tried:
    filter: str
    samples: list[Sample]

    @property
    def matched(self) -> int:
        return sum(1 for s in self.samples if s.matched)


def _invalid(message: str, field: str = "event") -> ValidationFailed:
    return ValidationFailed(message, code="invalid_field", details={"field": field})


def _given(value: dict[str, Any]) -> tuple[str, int, Any, dict[str, Any] | None]:
    reject_unknown_fields(value, ("type", "version", "data", "resource"))
    type_, version, data = value.get("type"), value.get("version", 1), value.get("data")
    resource = value.get("resource")
    if not isinstance(type_, str) or not type_:
        raise _invalid("event.type must be an event type name")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _invalid("event.version must be a positive integer")
    if not isinstance(data, dict):
        raise _invalid("event.data must be a JSON object")
    if resource is not None and not isinstance(resource, dict):
        raise _invalid("event.resource must be an object or null")
    return type_, version, data, resource


def _resource(event: Event) -> dict[str, Any] | None:
    if event.resource_type is None and event.resource_id is None:
        return None
    found: dict[str, Any] = {"type": event.resource_type, "id": event.resource_id}
    if event.resource_version is not None:
        found["version"] = event.resource_version
    return found


def _stored(event: Event, source: str, parsed: Any) -> Sample:
    envelope = filters.envelope(event.type, event.version, event.data, _resource(event))
    outcome = filters.evaluate(parsed, envelope)
    return Sample(source, event.type, event.version, event.id, outcome.matched, outcome.error)


def try_filter(
    session: Session,
    actor: Actor,
    uid: str,
    endpoint_id: str | None,
    body: dict[str, Any],
    *,
    event_types_: list[str] | None = None,
) -> Tried:
    """The verdict of `body["filter"]` (default: the endpoint's own) on `body["event"]` (an
    envelope `{type, version?, data, resource?}`, or a stored event's id) or, without one,
    on examples and recent events of the types the endpoint subscribes to (`event_types_`
    when there is no endpoint yet, as in a creation form; None: every type).

    Raises:
        NotFound: the partner, endpoint or named event is not the actor's to see.
        ValidationFailed: `invalid_filter` (a bad expression, or no filter at all), or a
            malformed `event`.
    """
    reject_unknown_fields(body, ("filter", "event"))
    if endpoint_id is not None:
        endpoint = endpoints.live(session, actor, uid, endpoint_id)
        partner_id, subscribed = endpoint.partner_id, endpoint.event_types
        text = body.get("filter", endpoint.filter)
    else:
        partner: Partner = partners.visible(session, actor, uid)
        partner_id, subscribed, text = partner.id, event_types_, body.get("filter")
    text = check_filter(text)
    if text is None:
        raise ValidationFailed(
            "no filter to try: give one (filter), or set one on the endpoint",
            code="invalid_filter",
            details={"field": "filter"},
        )
    parsed = filters.check(text)
    given = body.get("event")
    samples: list[Sample] = []
    if isinstance(given, str):
        event = session.get(Event, given)
        if event is None or event.partner_id != partner_id:
            raise NotFound(f"event {given!r} does not exist", details={"event": given})
        samples.append(_stored(event, "event", parsed))
    elif isinstance(given, dict):
        type_, version, data, resource = _given(given)
        outcome = filters.evaluate(parsed, filters.envelope(type_, version, data, resource))
        samples.append(Sample("given", type_, version, None, outcome.matched, outcome.error))
    elif given is not None:
        raise _invalid("event must be an event ({type, version, data, resource}) or an event id")
    else:
        entries = [
            entry
            for entry in event_types.catalog(session, actor)
            if subscribed is None or entry.name in subscribed
        ][:EXAMPLE_TYPES]
        for entry in entries:
            row = entry.latest
            data = event_types.example(row)
            if data is None:
                continue
            outcome = filters.evaluate(parsed, filters.envelope(row.name, row.version, data, None))
            samples.append(
                Sample("example", row.name, row.version, None, outcome.matched, outcome.error)
            )
        recent = select(Event).where(
            Event.partner_id == partner_id,
            ~Event.type.startswith(RESERVED_PREFIX, autoescape=True),
        )
        if subscribed is not None:
            recent = recent.where(Event.type.in_(subscribed))
        for event in session.scalars(recent.order_by(Event.id.desc()).limit(RECENT_EVENTS)):
            samples.append(_stored(event, "recent", parsed))
    return Tried(text, samples)
