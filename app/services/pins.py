"""An endpoint's version pins as its pages show them, each with its deprecation and sunset.

An endpoint pinned to an old version keeps receiving that version after its sunset (a sunset
never breaks a partner silently), so the one warning its owner gets is on the endpoint page:
the operator's and the partner's show the same facts, read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.models import Endpoint, EventType
from app.services.actor import Actor


@dataclass(frozen=True)
class Pin:
    """One event type an endpoint receives in a fixed version, and how long that lasts."""

    type: str
    version: int
    deprecated: bool
    sunset_at: datetime | None
    newest: int | None  # the newest registered version of the type
    sunset_passed: bool

    @property
    def behind(self) -> bool:
        """A newer version exists: the pin receives a conversion of what is published."""
        return self.newest is not None and self.newest > self.version


def of_endpoint(
    session: Session, actor: Actor, endpoint: Endpoint, now: datetime | None = None
) -> list[Pin]:
    """The endpoint's pins by type name, with their contract's deprecation and sunset (the
    caller has already found the endpoint visible to `actor`)."""
    actor.require("read")
    now = now or utcnow()
    pinned = {str(name): int(version) for name, version in (endpoint.versions or {}).items()}
    if not pinned:
        return []
    facts: dict[tuple[str, int], EventType] = {}
    newest: dict[str, int] = {}
    for row in session.scalars(select(EventType).where(EventType.name.in_(pinned))):
        facts[(row.name, row.version)] = row
        newest[row.name] = max(newest.get(row.name, row.version), row.version)
    out = []
    for name, version in sorted(pinned.items()):
        contract = facts.get((name, version))
        sunset_at = contract.sunset_at if contract else None
        out.append(
            Pin(
                name,
                version,
                bool(contract and contract.deprecated),
                sunset_at,
                newest.get(name),
                sunset_at is not None and sunset_at <= now,
            )
        )
    return out
