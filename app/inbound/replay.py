"""Replaying a stored callback: process it again from its raw bytes, safely.

The fields are read again from the stored body with the source's *current* mapping, so a
callback refused for a mapping mistake can be replayed once the mapping is fixed. The event
keeps its identity (source, event id). Processing goes through the same compare-and-set as
ever, so a replay can never move a resource's state backwards.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.clock import utcnow
from app.errors import Conflict, NotFound, ValidationFailed
from app.inbound import mapping as field_mapping
from app.inbound.process import PROCESSING, PROCESSING_LEASE_S, RECEIVED, enqueue_after_commit
from app.inbound.receive import headers_from_storage, parse_and_extract
from app.inbound.sources import effective_mapping
from app.models import InboundEvent, InboundSource
from app.runtime import Runtime


def replay(
    session: Session, runtime: Runtime, inbound_event_id: str, *, now: datetime | None = None
) -> InboundEvent:
    """Reset the event to ``received`` and enqueue it after the caller commits.

    Raises:
        NotFound: no such inbound event.
        Conflict: a worker is processing it right now.
        ValidationFailed: its body still cannot be read with the source's mapping.
    """
    now = now or utcnow()
    event = session.get(InboundEvent, inbound_event_id, with_for_update=True)
    if event is None:
        raise NotFound(f"no inbound event {inbound_event_id!r}", details={"id": inbound_event_id})
    if event.status == PROCESSING and event.updated_at > now - timedelta(
        seconds=PROCESSING_LEASE_S
    ):
        raise Conflict(
            "the event is being processed; replay it once it has finished",
            code="inbound_event_in_flight",
        )
    source = session.get(InboundSource, event.source_id)
    assert source is not None  # noqa: S101 - foreign key
    try:
        extracted = parse_and_extract(
            effective_mapping(source), headers_from_storage(event.headers), event.raw_body
        )
    except field_mapping.MappingError as exc:
        raise ValidationFailed(
            f"the stored body still cannot be used: {exc}",
            code="unusable_payload",
            details={"reason": str(exc)},
        ) from None
    event.event_type = extracted.event_type
    event.resource_type = extracted.resource_type
    event.resource_id = extracted.resource_id
    event.resource_version = extracted.resource_version
    event.occurred_at = extracted.occurred_at
    event.resource_status = extracted.status
    event.status = RECEIVED
    event.reason = "replayed"
    event.processed_at = None
    event.updated_at = now
    session.flush()
    enqueue_after_commit(session, runtime, [event.id])
    return event
