"""The partner portal's doors: one-time magic links, and the sessions they open.

A publisher (an admin key, a key with `endpoints:write`, an operator) asks for a link for one
partner; the link's token is shown once and stored only as a SHA-256, like API keys. Entering
with it flips `used_at` with one conditional UPDATE, so two clicks (or a link scanner racing
the partner) open at most one session. The session's own token lives in the partner's cookie,
stored here hashed too; it ends after `SESSION_LIFETIME`, after `SESSION_IDLE` without a
request, when the partner signs out, or when it is revoked. A session acts as `Actor.portal`:
its partner only, scopes `read`, `endpoints:write` and `dlq:write`, audited as `portal:<uid>`.

Revocation rides on the database, the way API-key revocation does: a link and its session
carry the id of the key that minted them, revoking the key (or every access of a partner)
marks the rows, and every API process reads the row on each portal request, so the next
request anywhere is refused. The minting key's `revoked_at` is also checked on entry and on
every request, so a key revoked while one of its links is being opened cannot leave a
session behind. A partner key is itself partner-bound and revocable, but a link it mints is a
bearer credential of its own: such links live at most `PARTNER_KEY_LINK_TTL_MAX_S`.
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
from app.errors import Forbidden, KurirError, NotFound, ValidationFailed
from app.models import ApiKey, Partner, PortalLink, PortalSession
from app.services import audit, partners
from app.services.actor import KEY, Actor

# Links and sessions that stopped working are kept this long (a "link expired" page still
# finds its link), then purged; the audit trail keeps their story.
KEEP_ENDED = timedelta(days=1)
LINK_TTL_MIN_S = 60
LINK_TTL_MAX_S = 86400
# A link minted by a partner-bound key outlives that key's revocation only until it is used;
# an hour bounds what a stolen partner key can stockpile.
PARTNER_KEY_LINK_TTL_MAX_S = 3600
SESSION_LIFETIME = timedelta(hours=12)
SESSION_IDLE = timedelta(hours=1)
# `last_seen_at` is written at most this often, so browsing costs no write per page.
TOUCH_EVERY = timedelta(seconds=60)

# Why a link does not open the portal.
LINK_UNKNOWN, LINK_USED, LINK_EXPIRED, LINK_REVOKED = (
    "link_invalid",
    "link_used",
    "link_expired",
    "link_revoked",
)
# Why a session no longer holds.
ENDED, EXPIRED, IDLE, UNKNOWN, REVOKED = "signed_out", "expired", "idle", "unknown", "revoked"


# The portal's sections a scoped link may open (default: all of them).
FEATURES = ("endpoints", "secrets", "deliveries", "resend", "test", "catalog", "feed")
READ_ONLY_CODE = "read_only_session"


@dataclass(frozen=True)
class Scope:
    """What a portal session may see and do: `features` (None: every section), and whether
    it changes anything at all."""

    read_only: bool = False
    features: frozenset[str] | None = None

    def shows(self, feature: str) -> bool:
        return self.features is None or feature in self.features

    @property
    def can_change(self) -> bool:
        return not self.read_only

    @property
    def full(self) -> bool:
        return not self.read_only and self.features is None

    @property
    def features_list(self) -> list[str]:
        return [f for f in FEATURES if self.shows(f)]

    def describe(self) -> str:
        """The scope in words, as every page of a scoped session says it."""
        if self.full:
            return "full access"
        parts = ["read-only"] if self.read_only else []
        if self.features is not None:
            parts.append("only " + ", ".join(self.features_list) if self.features else "no section")
        return "; ".join(parts)

    def audit(self) -> dict[str, Any]:
        return {"read_only": self.read_only, "features": self.features_list}


FULL = Scope()


def check_scope(read_only: Any, features: Any) -> Scope:
    """A link's scope from a request's `read_only` and `features`.

    Raises:
        ValidationFailed: `invalid_field` for a non-boolean flag, or a feature list that is
            not a list of known names.
    """
    if not isinstance(read_only, bool):
        raise ValidationFailed(
            "read_only must be true or false",
            code="invalid_field",
            details={"field": "read_only"},
        )
    if features is None:
        return Scope(read_only, None)
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise ValidationFailed(
            f"features must be a list of portal sections: {', '.join(FEATURES)}",
            code="invalid_field",
            details={"field": "features", "allowed": list(FEATURES)},
        )
    unknown = sorted(set(features) - set(FEATURES))
    if unknown:
        raise ValidationFailed(
            f"unknown portal feature(s): {', '.join(unknown)}; known: {', '.join(FEATURES)}",
            code="invalid_field",
            details={"field": "features", "unknown": unknown, "allowed": list(FEATURES)},
        )
    return Scope(read_only, frozenset(features))


def scope_of(row: PortalLink | PortalSession) -> Scope:
    features = row.features
    return Scope(bool(row.read_only), None if features is None else frozenset(features))


def require(scope: Scope, feature: str | None, *, changes: bool) -> None:
    """Whether a session of this scope may open a page of `feature` (None: every session
    may), or make a change.

    Raises:
        NotFound: the section is not part of this session (it does not exist for it).
        Forbidden: `read_only_session`, a change asked of a read-only session.
    """
    if feature is not None and not scope.shows(feature):
        raise NotFound(
            f"this page is not part of this portal session (it opens: {scope.describe()})",
            details={"feature": feature},
        )
    if changes and scope.read_only:
        raise Forbidden(
            "This portal session is read-only: it shows everything and changes nothing. "
            "Ask the publisher for a link that allows changes.",
            code=READ_ONLY_CODE,
        )


class LinkRefused(KurirError):
    """A magic link that does not (or no longer) open the portal; `code` says why."""

    status = 410


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def ttl_ceiling(actor: Actor) -> int:
    """The longest link this actor may mint: 1 h for partner credentials, else 24 h."""
    return PARTNER_KEY_LINK_TTL_MAX_S if actor.bound_to_partner else LINK_TTL_MAX_S


def _ttl(value: Any, default_s: int, ceiling: int) -> int:
    if value is None:
        return min(default_s, ceiling)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (LINK_TTL_MIN_S <= value <= ceiling)
    ):
        who = " for a partner key" if ceiling == PARTNER_KEY_LINK_TTL_MAX_S else ""
        raise ValidationFailed(
            f"expires_in_s must be an integer from {LINK_TTL_MIN_S} to "
            f"{ceiling} ({ceiling // 3600} h){who}",
            code="invalid_field",
            details={"field": "expires_in_s", "max": ceiling},
        )
    return value


def create_link(
    session: Session,
    actor: Actor,
    uid: str,
    *,
    expires_in_s: Any = None,
    default_ttl_s: int = 900,
    read_only: Any = False,
    features: Any = None,
    now: datetime | None = None,
) -> tuple[PortalLink, str]:
    """A one-time link for partner `uid`, opening a session of the scope asked (`read_only`,
    `features`; default everything); the token is returned once, never stored."""
    partner = partners.visible(session, actor, uid, "endpoints:write")
    ttl = _ttl(expires_in_s, default_ttl_s, ttl_ceiling(actor))
    scope = check_scope(read_only, features)
    now = now or utcnow()
    token = secrets.token_urlsafe(32)
    link = PortalLink(
        partner_id=partner.id,
        token_hash=_digest(token),
        created_by=str(actor)[:320],
        created_at=now,
        key_id=actor.key_id if actor.kind == KEY else None,
        expires_at=now + timedelta(seconds=ttl),
        read_only=scope.read_only,
        features=None if scope.features is None else scope.features_list,
    )
    session.add(link)
    session.flush()
    audit.record(
        session,
        actor,
        "portal_link.created",
        "portal_link",
        link.id,
        partner_id=partner.id,
        uid=partner.uid,
        expires_at=isoformat(link.expires_at),
        **scope.audit(),
    )
    return link, token


@dataclass(frozen=True)
class Entered:
    """A session just opened: its row, the token for the cookie, and who it acts as."""

    session: PortalSession
    token: str
    actor: Actor
    partner: Partner
    scope: Scope = FULL


_USED_MESSAGE = "This link was already used. Each link opens the portal once; ask for a new one."
_REVOKED_MESSAGE = "This link was withdrawn by the publisher before it was used. Ask for a new one."


def enter(session: Session, token: str, now: datetime | None = None) -> Entered:
    """Spend a link and open a session.

    Raises:
        LinkRefused: `link_invalid` (404: no such link), `link_used`, `link_revoked` or
            `link_expired` (410).
    """
    now = now or utcnow()
    row = session.execute(
        select(PortalLink, ApiKey.revoked_at)
        .outerjoin(ApiKey, ApiKey.id == PortalLink.key_id)
        .where(PortalLink.token_hash == _digest(token))
    ).first()
    if row is None:
        raise LinkRefused(
            "This link is not valid. Check that it was copied whole, or ask for a new one.",
            code=LINK_UNKNOWN,
            status=404,
        )
    link, key_revoked_at = row
    if link.used_at is not None:
        raise LinkRefused(
            _USED_MESSAGE, code=LINK_USED, details={"used_at": isoformat(link.used_at)}
        )
    if link.revoked_at is not None or key_revoked_at is not None:
        raise LinkRefused(_REVOKED_MESSAGE, code=LINK_REVOKED)
    if link.expires_at <= now:
        raise LinkRefused(
            "This link has expired. Ask for a new one.",
            code=LINK_EXPIRED,
            details={"expired_at": isoformat(link.expires_at)},
        )
    spent = session.execute(
        update(PortalLink)
        .where(
            PortalLink.id == link.id, PortalLink.used_at.is_(None), PortalLink.revoked_at.is_(None)
        )
        .values(used_at=now)
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    if spent != 1:
        # Another click spent it, or a revocation committed in between: say which.
        revoked = (
            session.scalar(select(PortalLink.revoked_at).where(PortalLink.id == link.id))
            is not None
        )
        raise LinkRefused(
            _REVOKED_MESSAGE if revoked else _USED_MESSAGE,
            code=LINK_REVOKED if revoked else LINK_USED,
        )
    partner = session.get_one(Partner, link.partner_id)
    session_token = secrets.token_urlsafe(32)
    found = PortalSession(
        partner_id=partner.id,
        link_id=link.id,
        key_id=link.key_id,
        token_hash=_digest(session_token),
        created_at=now,
        last_seen_at=now,
        expires_at=now + SESSION_LIFETIME,
        read_only=link.read_only,
        features=link.features,
    )
    session.add(found)
    session.flush()
    scope = scope_of(found)
    actor = Actor.portal(partner.id, partner.uid, found.id, read_only=scope.read_only)
    audit.record(
        session,
        actor,
        "portal.signed_in",
        "portal_session",
        found.id,
        partner_id=partner.id,
        link=link.id,
        link_created_by=link.created_by,
        **scope.audit(),
    )
    return Entered(found, session_token, actor, partner, scope)


@dataclass(frozen=True)
class Resumed:
    """The actor of a live session, or why there is none (`reason`)."""

    actor: Actor | None
    partner: Partner | None = None
    reason: str | None = None
    expires_at: datetime | None = None
    scope: Scope = FULL


def resume(session: Session, token: str, now: datetime | None = None) -> Resumed:
    """The session behind a cookie's token, if it still holds; touches `last_seen_at`."""
    now = now or utcnow()
    row = session.execute(
        select(PortalSession, Partner, ApiKey.revoked_at)
        .join(Partner, Partner.id == PortalSession.partner_id)
        .outerjoin(ApiKey, ApiKey.id == PortalSession.key_id)
        .where(PortalSession.token_hash == _digest(token))
    ).first()
    if row is None:
        return Resumed(None, reason=UNKNOWN)
    found, partner, key_revoked_at = row
    if found.ended_at is not None:
        return Resumed(None, reason=REVOKED if found.end_reason == REVOKED else ENDED)
    if key_revoked_at is not None:
        return Resumed(None, reason=REVOKED)
    if found.expires_at <= now:
        return Resumed(None, reason=EXPIRED)
    if found.last_seen_at + SESSION_IDLE <= now:
        return Resumed(None, reason=IDLE)
    if now - found.last_seen_at >= TOUCH_EVERY:
        found.last_seen_at = now
    scope = scope_of(found)
    return Resumed(
        Actor.portal(partner.id, partner.uid, found.id, read_only=scope.read_only),
        partner,
        expires_at=found.expires_at,
        scope=scope,
    )


def end(session: Session, token: str, now: datetime | None = None) -> None:
    """Sign out: the session's token opens nothing any more."""
    now = now or utcnow()
    row = session.execute(
        select(PortalSession, Partner.uid)
        .join(Partner, Partner.id == PortalSession.partner_id)
        .where(PortalSession.token_hash == _digest(token), PortalSession.ended_at.is_(None))
    ).first()
    if row is None:
        return
    found, uid = row
    found.ended_at = now
    found.end_reason = ENDED
    audit.record(
        session,
        Actor.portal(found.partner_id, uid, found.id),
        "portal.signed_out",
        "portal_session",
        found.id,
        partner_id=found.partner_id,
    )


# ------------------------------------------------------------------------------ revocation


@dataclass(frozen=True)
class Revoked:
    """What a revocation stopped: live sessions ended, unused links revoked."""

    ended: int
    revoked: int


def _revoke(
    session: Session, now: datetime, *, key_id: str | None = None, partner_id: str | None = None
) -> Revoked:
    """End the live sessions and revoke the usable links of one key or one partner.

    Only what still worked is touched and counted: a used or expired link, or a session that
    expired, went idle or ended, is left as it is.
    """
    if key_id is not None:
        link_scope, session_scope = PortalLink.key_id == key_id, PortalSession.key_id == key_id
    else:
        link_scope = PortalLink.partner_id == partner_id
        session_scope = PortalSession.partner_id == partner_id
    links = session.execute(
        update(PortalLink)
        .where(
            link_scope,
            PortalLink.used_at.is_(None),
            PortalLink.revoked_at.is_(None),
            PortalLink.expires_at > now,
        )
        .values(revoked_at=now)
        .execution_options(synchronize_session=False)
    )
    sessions = session.execute(
        update(PortalSession)
        .where(
            session_scope,
            PortalSession.ended_at.is_(None),
            PortalSession.expires_at > now,
            PortalSession.last_seen_at > now - SESSION_IDLE,
        )
        .values(ended_at=now, end_reason=REVOKED)
        .execution_options(synchronize_session=False)
    )
    return Revoked(
        ended=int(sessions.rowcount or 0),  # type: ignore[attr-defined]
        revoked=int(links.rowcount or 0),  # type: ignore[attr-defined]
    )


def revoke_key_access(session: Session, key_id: str, now: datetime | None = None) -> Revoked:
    """What a revoked API key had opened into the portal stops working (part of
    `keys.revoke`, which audits it)."""
    return _revoke(session, now or utcnow(), key_id=key_id)


def revoke_partner(
    session: Session, actor: Actor, uid: str, now: datetime | None = None
) -> Revoked:
    """End every portal session and revoke every unused link of partner `uid` (admin only;
    a partner credential meets "not found")."""
    partner = partners.visible(session, actor, uid, "admin")
    result = _revoke(session, now or utcnow(), partner_id=partner.id)
    audit.record(
        session,
        actor,
        "portal.revoked",
        "partner",
        partner.id,
        partner_id=partner.id,
        uid=partner.uid,
        ended=result.ended,
        revoked=result.revoked,
    )
    return result


def purge(session: Session, now: datetime | None = None) -> int:
    """Forget links and sessions that ended more than `KEEP_ENDED` ago (a periodic job)."""
    cutoff = (now or utcnow()) - KEEP_ENDED
    links = session.execute(delete(PortalLink).where(PortalLink.expires_at < cutoff))
    sessions = session.execute(
        delete(PortalSession).where(
            (PortalSession.expires_at < cutoff)
            | (PortalSession.ended_at < cutoff)
            | (PortalSession.last_seen_at < cutoff - SESSION_IDLE)
        )
    )
    return int(links.rowcount or 0) + int(sessions.rowcount or 0)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ showing a link once

# A link an operator makes is shown on the page its POST redirects to, once: the token waits
# in Redis this long (never in a URL or a cookie) and is taken by the first view.
SHOWN_LINK_TTL_S = 300


def _shown_key(actor: Actor, ref: str) -> str:
    return f"kurir:shown-once:{actor}:{ref}"


def stash_once(connection: Any, actor: Actor, ref: str, token: str) -> None:
    """Hold a token just made (a portal link, a feed key) for the one page that shows it to
    its maker, after the redirect that answers the POST."""
    connection.set(_shown_key(actor, ref), token, ex=SHOWN_LINK_TTL_S)


def take_once(connection: Any, actor: Actor, ref: str) -> str | None:
    """The token held for `ref`, the first time only (None: shown already, or too late)."""
    pipe = connection.pipeline()
    pipe.get(_shown_key(actor, ref))
    pipe.delete(_shown_key(actor, ref))
    raw, _ = pipe.execute()
    return raw.decode() if isinstance(raw, bytes) else raw


def keep_to_show(connection: Any, actor: Actor, link: PortalLink, token: str) -> None:
    """Hold the new link's token for the one page that shows it to its maker."""
    stash_once(connection, actor, link.id, token)


def take_to_show(
    session: Session, connection: Any, actor: Actor, uid: str, link_id: str
) -> tuple[PortalLink, str | None]:
    """The link and, the first time only, its token (None: shown already, or too late);
    reloading the page shows the link's facts and mints nothing.

    Raises:
        NotFound: no such link of that partner (as the actor sees it).
    """
    from app.errors import NotFound

    partner = partners.visible(session, actor, uid)
    link = session.scalar(
        select(PortalLink).where(PortalLink.id == link_id, PortalLink.partner_id == partner.id)
    )
    if link is None:
        raise NotFound(f"portal link {link_id!r} not found", details={"link": link_id})
    return link, take_once(connection, actor, link_id)
