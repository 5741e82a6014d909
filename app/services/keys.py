"""API keys: create, list, read, revoke — and turn a bearer token into an Actor.

Authentication runs on every API request, the publish hot path included, so each process keeps
what it learned about a key for `CACHE_TTL_S`: a revoked key is refused by every process
within that second. `last_used_at` is written at most once a minute per key, by a conditional
UPDATE, so a busy key costs no write per request.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app import accounts
from app.cache import TTLCache
from app.clock import utcnow
from app.errors import Conflict, NotFound, ValidationFailed
from app.models import ApiKey, Partner
from app.pagination import paginate
from app.runtime import Runtime
from app.services import audit, partners, portal
from app.services.actor import PARTNER_SCOPES, Actor

# A partner key holds these unless told otherwise (`feed:write` is for feed keys).
DEFAULT_PARTNER_SCOPES = frozenset({"read", "endpoints:write", "dlq:write"})

CACHE_TTL_S = 1.0
CACHE_MAX_KEYS = 10_000  # beyond this the cache starts over (one query per key to refill)
LAST_USED_EVERY_S = 60.0


@dataclass(frozen=True)
class KeyView:
    """A key as anyone may see it: never the key itself, nor its hash."""

    key: ApiKey
    partner_uid: str | None


def _require_admin(actor: Actor) -> None:
    """Keys are managed by admins; for a partner-bound caller they do not exist at all."""
    if actor.bound_to_partner:
        raise NotFound("not found")
    actor.require("admin")


def create(
    session: Session,
    actor: Actor,
    name: str,
    scopes: Iterable[str] = (),
    *,
    partner_uid: str | None = None,
) -> tuple[KeyView, str]:
    """A new key; the token is returned once and stored only as a hash.

    A partner-bound key may hold only `read`, `endpoints:write` and `dlq:write` (default:
    all three).
    """
    _require_admin(actor)
    partner_id = None
    if partner_uid is not None:
        partner = partners.visible(session, actor, partner_uid, "admin")
        partner_id = partner.id
        scopes = list(scopes) or sorted(DEFAULT_PARTNER_SCOPES)
        refused = sorted(set(scopes) - PARTNER_SCOPES)
        if refused:
            raise ValidationFailed(
                f"a partner key can hold only {', '.join(sorted(PARTNER_SCOPES))}; "
                f"not {', '.join(refused)}",
                code="invalid_scope",
                details={"scopes": refused},
            )
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValidationFailed(
            "name must be a non-empty string of at most 200 characters",
            code="invalid_field",
            details={"field": "name"},
        )
    key, token = accounts.create_api_key(session, name, scopes)
    key.partner_id = partner_id
    session.flush()
    audit.record(
        session,
        actor,
        "key.created",
        "api_key",
        key.id,
        partner_id=partner_id,
        name=key.name,
        scopes=list(key.scopes),
    )
    return KeyView(key, partner_uid), token


def any_exist(session: Session, actor: Actor) -> bool:
    """Whether any key was ever made (revoked ones count): `kurir up` says how to make the
    first one otherwise."""
    _require_admin(actor)
    return session.scalar(select(ApiKey.id).limit(1)) is not None


def _view(session: Session, key: ApiKey) -> KeyView:
    uid = None
    if key.partner_id is not None:
        uid = session.scalar(select(Partner.uid).where(Partner.id == key.partner_id))
    return KeyView(key, uid)


def _visible_stmt(actor: Actor):  # type: ignore[no-untyped-def]
    stmt = select(ApiKey)
    if actor.partner_id is not None:
        stmt = stmt.where(ApiKey.partner_id == actor.partner_id)
    return stmt


def page(
    session: Session,
    actor: Actor,
    *,
    limit: int,
    cursor: str | None,
    partner_uid: str | None = None,
) -> tuple[list[KeyView], str | None]:
    """Keys, newest first; `partner_uid` narrows to the keys bound to that partner."""
    _require_admin(actor)
    stmt = _visible_stmt(actor)
    if partner_uid is not None:
        stmt = stmt.where(
            ApiKey.partner_id == partners.visible(session, actor, partner_uid, "admin").id
        )
    rows, next_cursor = paginate(session, stmt, ApiKey.id, limit=limit, cursor=cursor)
    return [_view(session, k) for k in rows], next_cursor


def get(session: Session, actor: Actor, key_id: str) -> KeyView:
    _require_admin(actor)
    key = session.scalar(_visible_stmt(actor).where(ApiKey.id == key_id))
    if key is None:
        raise NotFound(f"API key {key_id!r} does not exist", details={"id": key_id})
    return _view(session, key)


def revoke(session: Session, actor: Actor, key_id: str) -> KeyView:
    """Revoke a key for good; every API process refuses it within `CACHE_TTL_S`.

    What the key opened into the partner portal goes with it, in the same transaction: its
    unused magic links are revoked and the sessions they opened end (the portal reads its
    session row on every request, so that is at once, in every process).
    """
    view = get(session, actor, key_id)
    key = view.key
    if key.revoked_at is not None:
        raise Conflict(
            f"API key {key_id} was revoked already",
            code="key_revoked",
            details={"id": key_id, "revoked_at": key.revoked_at.isoformat()},
        )
    now = utcnow()
    key.revoked_at = now
    session.flush()
    stopped = portal.revoke_key_access(session, key.id, now)
    audit.record(
        session,
        actor,
        "key.revoked",
        "api_key",
        key.id,
        partner_id=key.partner_id,
        name=key.name,
        portal_sessions_ended=stopped.ended,
        portal_links_revoked=stopped.revoked,
    )
    forget(key.key_hash)
    return view


# ------------------------------------------------------------------------ authentication

_clock = time.monotonic  # the cache's clock; a test moves it instead of sleeping
# Actors by key hash; an unknown or revoked key is cached too (as None).
_cache: TTLCache[str, Actor | None] = TTLCache(CACHE_TTL_S, CACHE_MAX_KEYS, clock=lambda: _clock())


def forget(key_hash: str | None = None) -> None:
    """Drop cached keys (one, or all) in this process."""
    _cache.forget(key_hash)


def authenticate(rt: Runtime, token: str) -> Actor | None:
    """The Actor a bearer token stands for; None for an unknown or revoked key."""
    digest = accounts.hash_key(token)

    def load() -> Actor | None:
        with rt.db.begin() as session:
            return _load(session, digest, utcnow())

    return _cache.get_or_load(digest, load)


def _load(session: Session, digest: str, now: datetime) -> Actor | None:
    row = session.execute(
        select(ApiKey, Partner.uid)
        .outerjoin(Partner, Partner.id == ApiKey.partner_id)
        .where(ApiKey.key_hash == digest)
    ).first()
    if row is None:
        return None
    key, partner_uid = row
    if key.revoked_at is not None:
        return None
    if key.last_used_at is None or key.last_used_at < now - timedelta(seconds=LAST_USED_EVERY_S):
        cutoff = now - timedelta(seconds=LAST_USED_EVERY_S)
        session.execute(
            update(ApiKey)
            .where(
                ApiKey.id == key.id,
                (ApiKey.last_used_at.is_(None)) | (ApiKey.last_used_at < cutoff),
            )
            .values(last_used_at=now)
            .execution_options(synchronize_session=False)
        )
    return Actor.key(
        key.name, key.scopes or (), key.id, partner_id=key.partner_id, partner_uid=partner_uid
    )


# ------------------------------------------------------------------------ a partner's feed keys

FEED_KEY_SCOPES = ("feed:write",)
FEED_KEYS_MAX = 10


def _require_partner_writer(actor: Actor) -> None:
    """A feed key is made by its partner (the portal), for itself."""
    if actor.partner_id is None:
        raise NotFound("not found")
    actor.require("endpoints:write")


def feed_keys(session: Session, actor: Actor) -> list[ApiKey]:
    """The partner's live feed keys, newest first."""
    _require_partner_writer(actor)
    rows = session.scalars(
        _visible_stmt(actor).where(ApiKey.revoked_at.is_(None)).order_by(ApiKey.id.desc())
    )
    return [k for k in rows if _is_feed_key(k)]


def _is_feed_key(key: ApiKey) -> bool:
    return list(key.scopes or ()) == list(FEED_KEY_SCOPES)


def create_feed_key(session: Session, actor: Actor, name: str) -> tuple[ApiKey, str]:
    """A key of the actor's partner that reads its feed and acknowledges it, nothing else;
    the token is returned once. At most FEED_KEYS_MAX live ones.

    Raises:
        ValidationFailed: `invalid_field` (name), `feed_key_limit`.
    """
    _require_partner_writer(actor)
    if len(feed_keys(session, actor)) >= FEED_KEYS_MAX:
        raise ValidationFailed(
            f"a partner has at most {FEED_KEYS_MAX} feed keys: revoke one first",
            code="feed_key_limit",
            details={"limit": FEED_KEYS_MAX},
        )
    name = (name or "").strip() or "feed key"
    if len(name) > 200:
        raise ValidationFailed(
            "name must be at most 200 characters", code="invalid_field", details={"field": "name"}
        )
    key, token = accounts.create_api_key(session, name, list(FEED_KEY_SCOPES))
    key.partner_id = actor.partner_id
    session.flush()
    audit.record(
        session,
        actor,
        "key.created",
        "api_key",
        key.id,
        partner_id=actor.partner_id,
        name=key.name,
        scopes=list(key.scopes),
    )
    return key, token


def revoke_feed_key(session: Session, actor: Actor, key_id: str) -> ApiKey:
    """Revoke one of the partner's own feed keys (another key of its is the publisher's to
    manage, and is not found here)."""
    _require_partner_writer(actor)
    key = session.scalar(_visible_stmt(actor).where(ApiKey.id == key_id))
    if key is None or not _is_feed_key(key) or key.revoked_at is not None:
        raise NotFound(f"feed key {key_id!r} does not exist", details={"id": key_id})
    key.revoked_at = utcnow()
    session.flush()
    audit.record(
        session, actor, "key.revoked", "api_key", key.id, partner_id=key.partner_id, name=key.name
    )
    forget(key.key_hash)
    return key
