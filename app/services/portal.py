"""The partner portal's doors: one-time magic links, and the sessions they open.

A publisher (an admin key, a key with `endpoints:write`, an operator) asks for a link for one
partner; the link's token is shown once and stored only as a SHA-256, like API keys. Entering
with it flips `used_at` with one conditional UPDATE, so two clicks (or a link scanner racing
the partner) open at most one session. The session's own token lives in the partner's cookie,
stored here hashed too; it ends after `SESSION_LIFETIME`, after `SESSION_IDLE` without a
request, or when the partner signs out. A session acts as `Actor.portal`: its partner only,
scopes `read`, `endpoints:write` and `dlq:write`, audited as `portal:<uid>`.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from app.clock import isoformat, utcnow
from app.errors import KurirError, ValidationFailed
from app.models import Partner, PortalLink, PortalSession
from app.services import audit, partners
from app.services.actor import Actor

# Links and sessions that stopped working are kept this long (a "link expired" page still
# finds its link), then purged; the audit trail keeps their story.
KEEP_ENDED = timedelta(days=1)
LINK_TTL_MIN_S = 60
LINK_TTL_MAX_S = 86400
SESSION_LIFETIME = timedelta(hours=12)
SESSION_IDLE = timedelta(hours=1)
# `last_seen_at` is written at most this often, so browsing costs no write per page.
TOUCH_EVERY = timedelta(seconds=60)

# Why a link does not open the portal.
LINK_UNKNOWN, LINK_USED, LINK_EXPIRED = "link_invalid", "link_used", "link_expired"
# Why a session no longer holds.
ENDED, EXPIRED, IDLE, UNKNOWN = "signed_out", "expired", "idle", "unknown"


class LinkRefused(KurirError):
    """A magic link that does not (or no longer) open the portal; `code` says why."""

    status = 410


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _ttl(value: Any, default_s: int) -> int:
    if value is None:
        return default_s
    if isinstance(value, bool) or not isinstance(value, int) or not (
            LINK_TTL_MIN_S <= value <= LINK_TTL_MAX_S):
        raise ValidationFailed(f"expires_in_s must be an integer from {LINK_TTL_MIN_S} to "
                               f"{LINK_TTL_MAX_S} (24 h)", code="invalid_field",
                               details={"field": "expires_in_s"})
    return value


def create_link(session: Session, actor: Actor, uid: str, *, expires_in_s: Any = None,
                default_ttl_s: int = 900,
                now: datetime | None = None) -> tuple[PortalLink, str]:
    """A one-time link for partner `uid`; the token is returned once, never stored."""
    partner = partners.visible(session, actor, uid, "endpoints:write")
    ttl = _ttl(expires_in_s, default_ttl_s)
    now = now or utcnow()
    token = secrets.token_urlsafe(32)
    link = PortalLink(partner_id=partner.id, token_hash=_digest(token),
                      created_by=str(actor)[:320], created_at=now,
                      expires_at=now + timedelta(seconds=ttl))
    session.add(link)
    session.flush()
    audit.record(session, actor, "portal_link.created", "portal_link", link.id,
                 partner_id=partner.id, uid=partner.uid, expires_at=isoformat(link.expires_at))
    return link, token


@dataclass(frozen=True)
class Entered:
    """A session just opened: its row, the token for the cookie, and who it acts as."""

    session: PortalSession
    token: str
    actor: Actor
    partner: Partner


def enter(session: Session, token: str, now: datetime | None = None) -> Entered:
    """Spend a link and open a session.

    Raises:
        LinkRefused: `link_invalid` (404: no such link), `link_used` or `link_expired` (410).
    """
    now = now or utcnow()
    link = session.scalar(select(PortalLink).where(PortalLink.token_hash == _digest(token)))
    if link is None:
        raise LinkRefused("This link is not valid. Check that it was copied whole, or ask "
                          "for a new one.", code=LINK_UNKNOWN, status=404)
    if link.used_at is not None:
        raise LinkRefused("This link was already used. Each link opens the portal once; ask "
                          "for a new one.", code=LINK_USED,
                          details={"used_at": isoformat(link.used_at)})
    if link.expires_at <= now:
        raise LinkRefused("This link has expired. Ask for a new one.", code=LINK_EXPIRED,
                          details={"expired_at": isoformat(link.expires_at)})
    spent = session.execute(
        update(PortalLink).where(PortalLink.id == link.id, PortalLink.used_at.is_(None))
        .values(used_at=now).execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    if spent != 1:
        raise LinkRefused("This link was already used. Each link opens the portal once; ask "
                          "for a new one.", code=LINK_USED)
    partner = session.get_one(Partner, link.partner_id)
    session_token = secrets.token_urlsafe(32)
    row = PortalSession(partner_id=partner.id, link_id=link.id,
                        token_hash=_digest(session_token), created_at=now, last_seen_at=now,
                        expires_at=now + SESSION_LIFETIME)
    session.add(row)
    session.flush()
    actor = Actor.portal(partner.id, partner.uid, row.id)
    audit.record(session, actor, "portal.signed_in", "portal_session", row.id,
                 partner_id=partner.id, link=link.id, link_created_by=link.created_by)
    return Entered(row, session_token, actor, partner)


@dataclass(frozen=True)
class Resumed:
    """The actor of a live session, or why there is none (`reason`)."""

    actor: Actor | None
    partner: Partner | None = None
    reason: str | None = None
    expires_at: datetime | None = None


def resume(session: Session, token: str, now: datetime | None = None) -> Resumed:
    """The session behind a cookie's token, if it still holds; touches `last_seen_at`."""
    now = now or utcnow()
    row = session.execute(select(PortalSession, Partner)
                          .join(Partner, Partner.id == PortalSession.partner_id)
                          .where(PortalSession.token_hash == _digest(token))).first()
    if row is None:
        return Resumed(None, reason=UNKNOWN)
    found, partner = row
    if found.ended_at is not None:
        return Resumed(None, reason=ENDED)
    if found.expires_at <= now:
        return Resumed(None, reason=EXPIRED)
    if found.last_seen_at + SESSION_IDLE <= now:
        return Resumed(None, reason=IDLE)
    if now - found.last_seen_at >= TOUCH_EVERY:
        found.last_seen_at = now
    return Resumed(Actor.portal(partner.id, partner.uid, found.id), partner,
                   expires_at=found.expires_at)


def end(session: Session, token: str, now: datetime | None = None) -> None:
    """Sign out: the session's token opens nothing any more."""
    now = now or utcnow()
    row = session.execute(select(PortalSession, Partner.uid)
                          .join(Partner, Partner.id == PortalSession.partner_id)
                          .where(PortalSession.token_hash == _digest(token),
                                 PortalSession.ended_at.is_(None))).first()
    if row is None:
        return
    found, uid = row
    found.ended_at = now
    audit.record(session, Actor.portal(found.partner_id, uid, found.id), "portal.signed_out",
                 "portal_session", found.id, partner_id=found.partner_id)


def purge(session: Session, now: datetime | None = None) -> int:
    """Forget links and sessions that ended more than `KEEP_ENDED` ago (a periodic job)."""
    cutoff = (now or utcnow()) - KEEP_ENDED
    links = session.execute(delete(PortalLink).where(PortalLink.expires_at < cutoff))
    sessions = session.execute(delete(PortalSession).where(
        (PortalSession.expires_at < cutoff) | (PortalSession.ended_at < cutoff)
        | (PortalSession.last_seen_at < cutoff - SESSION_IDLE)))
    return int(links.rowcount or 0) + int(sessions.rowcount or 0)  # type: ignore[attr-defined]
