"""The relational model of every concept Kurir has; the database is the source of truth.

Ids are prefixed ULIDs (`app.ids`), so ordering by id is ordering by creation and ids serve as
pagination cursors. Times are stored as timezone-aware UTC (`UTCDateTime` makes SQLite agree).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from app import secret_ring
from app.clock import utcnow
from app.ids import new_id
from app.vocabulary import (
    DeadLetterState,
    DeliveryState,
    DisabledBy,
    EndpointMode,
    EndpointState,
    InboundStatus,
    OnDead,
    Ordering,
    ReconcileState,
    ResendJobState,
    SignatureKind,
    values,
)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# The state words, re-exported under the short names most of the code and tests know them by;
# their one home is `app.vocabulary`.
PENDING, DELIVERING, SUCCEEDED, RETRYING, DEAD = (
    DeliveryState.PENDING,
    DeliveryState.DELIVERING,
    DeliveryState.SUCCEEDED,
    DeliveryState.RETRYING,
    DeliveryState.DEAD,
)
DELIVERY_STATES = values(DeliveryState)
DL_OPEN, DL_RESENT, DL_DISCARDED = (
    DeadLetterState.OPEN,
    DeadLetterState.RESENT,
    DeadLetterState.DISCARDED,
)
DL_STATES = values(DeadLetterState)
INBOUND_STATUSES = values(InboundStatus)
# Who disabled an endpoint (`Endpoint.disabled_by`).
DISABLED_BY_OPERATOR, DISABLED_BY_PARTNER, DISABLED_BY_HEALTH = (
    DisabledBy.OPERATOR,
    DisabledBy.PARTNER,
    DisabledBy.HEALTH,
)

# API key scopes. `admin` implies every other one; any write scope implies `read`.
# `feed:write`: read a partner's feed and acknowledge it, nothing else (the key a partner
# makes itself in the portal for a pull consumer).
SCOPES = (
    "admin",
    "read",
    "events:write",
    "endpoints:write",
    "dlq:write",
    "sources:write",
    "feed:write",
)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in and out, on PostgreSQL and on SQLite (which stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


def _id(prefix: str) -> Any:
    return mapped_column(String(40), primary_key=True, default=lambda: new_id(prefix))


def _created() -> Any:
    return mapped_column(UTCDateTime(), nullable=False, default=utcnow)


def _updated() -> Any:
    return mapped_column(UTCDateTime(), nullable=False, default=utcnow, onupdate=utcnow)


class RotatingSecret:
    """The shape of a secret on a rotating ring (`app.secret_ring` holds its rule): stored
    encrypted, live until `expires_at` (None: until a rotation caps it)."""

    secret_encrypted: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    def is_live(self, now: datetime) -> bool:
        return secret_ring.is_live(self.expires_at, now)


# ---------------------------------------------------------------------------- access control


class ApiKey(Base):
    """A publisher's credential; only a SHA-256 of the key is kept."""

    __tablename__ = "api_keys"

    id: Mapped[str] = _id("key")
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = _created()
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # A partner-scoped key reaches only that partner's resources; None reaches everything
    # its scopes allow. No foreign key (see migration 0003): partners are never deleted.
    partner_id: Mapped[str | None] = mapped_column(String(40), index=True)


class Operator(Base):
    """A person who logs in to the UI; the password is kept as a salted hash."""

    __tablename__ = "operators"

    id: Mapped[str] = _id("op")
    email: Mapped[str] = mapped_column(String(320), unique=True)
    password_hash: Mapped[str] = mapped_column(String(400))
    created_at: Mapped[datetime] = _created()
    last_login_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)


class OperatorSession(Base):
    """A signed-in operator's UI session; the cookie holds its token, this row its life.

    Kept server-side (like the portal's) so that signing out, disabling the operator or
    changing their password ends it everywhere, not just in one browser.
    """

    __tablename__ = "operator_sessions"

    id: Mapped[str] = _id("os")
    operator_id: Mapped[str] = mapped_column(
        ForeignKey("operators.id", ondelete="CASCADE"), index=True
    )
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # "signed_out", "disabled" or "password_changed".
    end_reason: Mapped[str | None] = mapped_column(String(20))


class IdempotencyKey(Base):
    """The first answer to a keyed publish, replayed for the same key and body for ≥ 24 h."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("api_key_id", "key", name="uq_idempotency_keys_scope"),)

    id: Mapped[str] = _id("idk")
    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    response_status: Mapped[int] = mapped_column(Integer)
    response_body: Mapped[dict[str, Any]] = mapped_column(JSON)
    event_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)


class AuditRecord(Base):
    """Who changed what, through which face: one row per state change an actor made.

    `actor` reads `key:<name>`, `operator:<email>`, `cli[:<user>]`, `portal:<uid>` or
    `system`; `partner_id` lets a partner's own view list what concerns it. Dead letters keep
    their own trail (`DeadLetterAudit`), shown with each letter.
    """

    __tablename__ = "audit_records"
    __table_args__ = (
        Index("ix_audit_records_subject", "subject_id", "id"),
        Index("ix_audit_records_partner", "partner_id", "id"),
    )

    id: Mapped[str] = _id("aud")
    actor: Mapped[str] = mapped_column(String(320))
    # The partner the actor was bound to (its keys, its portal sessions); None for operators,
    # admin keys, the CLI and Kurir: what a partner reading the row is shown as "publisher".
    actor_partner_id: Mapped[str | None] = mapped_column(String(40))
    action: Mapped[str] = mapped_column(String(64))
    subject_type: Mapped[str] = mapped_column(String(32))
    subject_id: Mapped[str] = mapped_column(String(200))
    partner_id: Mapped[str | None] = mapped_column(String(40))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = _created()


class PortalLink(Base):
    """A one-time magic link into the partner portal; only a SHA-256 of its token is kept."""

    __tablename__ = "portal_links"

    id: Mapped[str] = _id("pl")
    partner_id: Mapped[str] = mapped_column(
        ForeignKey("partners.id", ondelete="CASCADE"), index=True
    )
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_by: Mapped[str] = mapped_column(String(320))
    # The API key that minted the link (None: an operator, the CLI): revoking that key
    # revokes the link while unused and ends the session it opened.
    key_id: Mapped[str | None] = mapped_column(String(40), index=True)
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The scope of the session it opens: changes nothing (read_only), and sees only these
    # portal sections (features; None: all of them).
    read_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    features: Mapped[list[Any] | None] = mapped_column(JSON)


class PortalSession(Base):
    """A partner's signed-in portal session, opened by one link; the cookie holds its token."""

    __tablename__ = "portal_sessions"

    id: Mapped[str] = _id("ps")
    partner_id: Mapped[str] = mapped_column(
        ForeignKey("partners.id", ondelete="CASCADE"), index=True
    )
    link_id: Mapped[str | None] = mapped_column(String(40))
    # Carried over from the link: the API key whose revocation ends this session.
    key_id: Mapped[str | None] = mapped_column(String(40), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = _created()
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # "signed_out" or "revoked": what the partner is told when the cookie comes back.
    end_reason: Mapped[str | None] = mapped_column(String(20))
    # Carried over from the link: its scope (see PortalLink).
    read_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    features: Mapped[list[Any] | None] = mapped_column(JSON)


# ---------------------------------------------------------------------------- contracts


class EventType(Base):
    """A named, versioned contract; a published version never changes its schema."""

    __tablename__ = "event_types"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_event_types_name_version"),)

    id: Mapped[str] = _id("ety")
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    schema: Mapped[dict[str, Any]] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(Text)
    deprecated: Mapped[bool] = mapped_column(Boolean, default=False)
    deprecated_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # After this moment endpoints still pinned to the version are reported (once each).
    sunset_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    sunset_reported_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # A JMESPath expression turning this version's `data` into the previous version's.
    downgrade: Mapped[str | None] = mapped_column(Text)
    # Sample `data` of this version, checked against its schema (and the downgrade) once.
    examples: Mapped[list[Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = _created()


# ---------------------------------------------------------------------------- outbound


class Partner(Base):
    """A receiving organisation, addressed by the publisher-chosen `uid`."""

    __tablename__ = "partners"

    id: Mapped[str] = _id("ptn")
    uid: Mapped[str] = mapped_column(String(200), unique=True)
    name: Mapped[str] = mapped_column(String(400))
    # Opted in to Kurir's operational events about its own endpoints (sent to those of its
    # endpoints that subscribe to them).
    operational_events: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=text("false")
    )
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()

    endpoints: Mapped[list[Endpoint]] = relationship(back_populates="partner")


class Endpoint(Base):
    """A partner URL with its subscription, limits, state and delivery health counters."""

    __tablename__ = "endpoints"
    __table_args__ = (Index("ix_endpoints_partner_state", "partner_id", "state"),)

    id: Mapped[str] = _id("ep")
    partner_id: Mapped[str] = mapped_column(ForeignKey("partners.id", ondelete="CASCADE"))
    # Empty for a pull endpoint, which is never sent anything (see `mode`).
    url: Mapped[str] = mapped_column(Text)
    # "push" (Kurir POSTs every event) or "pull" (the partner reads the feed and acknowledges);
    # fixed at creation.
    mode: Mapped[str] = mapped_column(
        String(8), default=EndpointMode.PUSH.value, server_default=EndpointMode.PUSH.value
    )
    # Pull endpoints: the feed position acknowledged last (see app.feed), and when.
    acked_seq: Mapped[int | None] = mapped_column(BigInteger)
    acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    description: Mapped[str | None] = mapped_column(Text)
    # None subscribes to every type.
    event_types: Mapped[list[Any] | None] = mapped_column(JSON)
    headers: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Names of custom headers whose values reads may show; every other value is write-only.
    public_headers: Mapped[list[Any] | None] = mapped_column(JSON)
    # Contract version pinned per event type ({"payment.succeeded": 1}); others get the
    # version published.
    versions: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    timeout_s: Mapped[int] = mapped_column(Integer, default=15)
    rate_limit_per_s: Mapped[int | None] = mapped_column(Integer)
    # "key": one ordering key's deliveries go out one at a time, in publish-commit order
    # (sender.engine.ordering); "none": no order at all, the engine's full parallelism.
    ordering: Mapped[str] = mapped_column(
        String(8), default=Ordering.NONE.value, server_default=Ordering.NONE.value
    )
    # What a dead delivery of an ordered key does to the ones after it: "skip" lets them go,
    # "block" holds them until an operator resends or discards it.
    on_dead: Mapped[str] = mapped_column(
        String(8), default=OnDead.SKIP.value, server_default=OnDead.SKIP.value
    )
    # Whether its attempts carry a W3C `traceparent` header (the attempt's span) while tracing
    # is on: off unless an operator turns it on, so internal trace ids stay internal.
    send_traceparent: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=text("false")
    )
    # "hmac" (v1, a shared whsec_ secret) or "ed25519" (v1a: Kurir keeps the whsk_ private
    # key, the partner verifies with the whpk_ public key); changed only by a rotation.
    signature: Mapped[str] = mapped_column(
        String(8), default=SignatureKind.HMAC.value, server_default=SignatureKind.HMAC.value
    )
    # A JMESPath expression over the event (data, type, version, resource) that must be
    # truthy for the endpoint to get it (None: every event it subscribes to).
    filter: Mapped[str | None] = mapped_column(Text)
    # "enabled", "disabled" or "pending_verification" (see `verify`).
    state: Mapped[str] = mapped_column(String(32), default=EndpointState.ENABLED.value)
    disabled_reason: Mapped[str | None] = mapped_column(String(200))
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Who disabled it: "operator" (the UI, an admin key, the CLI), "partner" (its keys, its
    # portal) or "health" (Kurir, after failures); a partner may not undo an operator's.
    disabled_by: Mapped[str | None] = mapped_column(String(16))
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    # Self-healing (app.recovery): an endpoint disabled after failures is probed while
    # `probe_next_at` is set; with `auto_recover` the first 2xx re-enables it and replays
    # what it parked. `probe_count` probes were sent since it was disabled.
    auto_recover: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))
    probe_next_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), index=True)
    probe_count: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    first_failure_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_failure_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_success_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Ownership challenge (sender.verification): with `verify`, the endpoint is sent nothing
    # but the challenge until it answers it; `verification_started_at` starts the window
    # after which it is disabled as unverified. The challenge is kept as its SHA-256 (what
    # an answer is checked against) and encrypted (what a retry sends again).
    verify: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    verified_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    verification_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    challenge_hash: Mapped[str | None] = mapped_column(String(64))
    challenge_encrypted: Mapped[str | None] = mapped_column(Text)
    challenge_sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    challenge_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    # When the challenge is (re)sent next; None once it reached the endpoint with a 2xx.
    challenge_next_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    challenge_error: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()

    partner: Mapped[Partner] = relationship(back_populates="endpoints")
    secrets: Mapped[list[EndpointSecret]] = relationship(
        back_populates="endpoint", order_by="EndpointSecret.created_at.desc()"
    )


class EndpointProbe(Base):
    """One `kurir.endpoint.probe` sent to a failure-disabled endpoint: never a delivery,
    kept as the endpoint's probe history."""

    __tablename__ = "endpoint_probes"
    __table_args__ = (Index("ix_endpoint_probes_endpoint_at", "endpoint_id", "at"),)

    id: Mapped[str] = _id("prb")
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    # The probe's number since the endpoint was disabled (1 for the first).
    n: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(200))
    duration_ms: Mapped[int] = mapped_column(Integer, default=0)
    ok: Mapped[bool] = mapped_column(Boolean, default=False)
    # Whether this probe re-enabled the endpoint.
    recovered: Mapped[bool] = mapped_column(Boolean, default=False)


class EndpointSecret(RotatingSecret, Base):
    """One signing secret (encrypted); the newest signs, older ones until `expires_at`."""

    __tablename__ = "endpoint_secrets"

    id: Mapped[str] = _id("whs")
    endpoint_id: Mapped[str] = mapped_column(
        ForeignKey("endpoints.id", ondelete="CASCADE"), index=True
    )
    # An Ed25519 key's whpk_ public half, kept in clear so it is shown without decrypting
    # the private one; None for an HMAC secret.
    public_key: Mapped[str | None] = mapped_column(String(64))

    endpoint: Mapped[Endpoint] = relationship(back_populates="secrets")


class Event(Base):
    """One published message for one partner; `payload` is the exact body every attempt sends."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_partner_created", "partner_id", "id"),
        # The search box (app.services.search): a resource id or a correlation id.
        Index("ix_events_resource_id", "resource_id"),
        Index("ix_events_correlation_id", "correlation_id"),
        Index("ix_events_partner_type", "partner_id", "type", "id"),
        # The feed (app.feed): positions are unique, read per partner in order, and the
        # events still waiting for one are found without a scan. All partial, so a publish
        # (which writes feed_seq NULL) only touches the last.
        Index(
            "uq_events_feed_seq",
            "feed_seq",
            unique=True,
            sqlite_where=text("feed_seq IS NOT NULL"),
            postgresql_where=text("feed_seq IS NOT NULL"),
        ),
        Index(
            "ix_events_partner_feed",
            "partner_id",
            "feed_seq",
            sqlite_where=text("feed_seq IS NOT NULL"),
            postgresql_where=text("feed_seq IS NOT NULL"),
        ),
        Index(
            "ix_events_unsequenced",
            "id",
            sqlite_where=text("feed_seq IS NULL"),
            postgresql_where=text("feed_seq IS NULL"),
        ),
    )

    id: Mapped[str] = _id("evt")
    partner_id: Mapped[str] = mapped_column(ForeignKey("partners.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(200))
    version: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    payload: Mapped[str] = mapped_column(Text)
    occurred_at: Mapped[datetime] = mapped_column(UTCDateTime())
    resource_type: Mapped[str | None] = mapped_column(String(200))
    resource_id: Mapped[str | None] = mapped_column(String(200))
    resource_version: Mapped[int | None] = mapped_column(BigInteger)
    correlation_id: Mapped[str | None] = mapped_column(String(200))
    # Events of one key reach ordered endpoints one at a time, in publish-commit order.
    ordering_key: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = _created()
    # The W3C traceparent of the publish span (app.telemetry), so that the attempts workers
    # make later join the publisher's trace; NULL while tracing is off.
    trace_context: Mapped[str | None] = mapped_column(String(64))
    # Position in the feed, given after commit by the sequencer (app.feed.sequencer);
    # NULL until then.
    feed_seq: Mapped[int | None] = mapped_column(BigInteger)

    deliveries: Mapped[list[Delivery]] = relationship(
        back_populates="event", order_by="Delivery.id"
    )


class EventVersion(Base):
    """The event in another contract version than the one published, for the endpoints
    pinned to it: stored once per version, not per endpoint, and never changed."""

    __tablename__ = "event_versions"

    event_id: Mapped[str] = mapped_column(
        ForeignKey("events.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    payload: Mapped[str] = mapped_column(Text)
    # "rendition" (sent by the publisher) or "downgrade" (made by the contract's transform).
    source: Mapped[str] = mapped_column(String(16))


class Delivery(Base):
    """One event to one endpoint; its state machine drives the workers and the sweeper.

    `attempt_count` counts every attempt ever made; `run_attempts` counts the attempts of the
    current run (a resend starts a new run with a fresh retry budget).
    """

    __tablename__ = "deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "endpoint_id", name="uq_deliveries_event_endpoint"),
        # Read only for deliveries still being worked on (the sweeper, the dashboard): on
        # PostgreSQL a finished delivery leaves it, so recording an outcome adds no entry and
        # the index stays the size of the work in flight. SQLite keeps it whole (it uses a
        # partial index only for a query repeating its WHERE).
        Index(
            "ix_deliveries_due",
            "state",
            "next_attempt_at",
            postgresql_where=text("state IN ('pending', 'delivering', 'retrying')"),
        ),
        Index("ix_deliveries_endpoint_state", "endpoint_id", "state"),
        # Only ordered deliveries are in it, so unordered publishes pay nothing for it.
        Index(
            "ix_deliveries_ordering",
            "endpoint_id",
            "ordering_key",
            "ordering_seq",
            unique=True,
            sqlite_where=text("ordering_seq IS NOT NULL"),
            postgresql_where=text("ordering_seq IS NOT NULL"),
        ),
        # A row is written three times (published, claimed, recorded), never as a HOT update
        # (`state` is indexed): room on its page keeps each new version beside the old one
        # (a same-page update logs only the changed bytes and dirties one page).
        {"postgresql_with": {"fillfactor": 70}},
    )

    id: Mapped[str] = _id("dlv")
    event_id: Mapped[str] = mapped_column(ForeignKey("events.id", ondelete="CASCADE"))
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"))
    state: Mapped[str] = mapped_column(String(16), default=PENDING)
    # The contract version this delivery carries when it is not the published one (a pin):
    # its body is then the event's `event_versions` row. Kept through every resend.
    version: Mapped[int | None] = mapped_column(Integer)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    run_attempts: Mapped[int] = mapped_column(Integer, default=0)
    run: Mapped[int] = mapped_column(Integer, default=1)
    # This run was resent with `force` to a disabled endpoint: it is sent despite the state.
    forced: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(200))
    succeeded_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Set only for an ordered endpoint and an event with a key: the key, its place in the
    # key's sequence for this endpoint (1, 2, ... without gaps) and the event before it.
    ordering_key: Mapped[str | None] = mapped_column(String(255))
    ordering_seq: Mapped[int | None] = mapped_column(BigInteger)
    previous_event_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()

    event: Mapped[Event] = relationship(back_populates="deliveries")
    endpoint: Mapped[Endpoint] = relationship()
    attempts: Mapped[list[Attempt]] = relationship(back_populates="delivery", order_by="Attempt.n")


class OrderingSequence(Base):
    """The last sequence number given per (ordered endpoint, ordering key).

    A publish updates this row inside its transaction, so two publishers of one key wait for
    each other on its row lock: the numbers follow the order in which their publishes commit.
    """

    __tablename__ = "ordering_sequences"

    endpoint_id: Mapped[str] = mapped_column(
        ForeignKey("endpoints.id", ondelete="CASCADE"), primary_key=True
    )
    ordering_key: Mapped[str] = mapped_column(String(255), primary_key=True)
    last_seq: Mapped[int] = mapped_column(BigInteger)
    last_event_id: Mapped[str] = mapped_column(String(40))
    # The event before `last_event_id` (None when last_seq is 1): returned by the upsert.
    previous_event_id: Mapped[str | None] = mapped_column(String(40))


class Attempt(Base):
    """One HTTP try of a delivery, kept whole enough for an operator to see what happened."""

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("delivery_id", "n", name="uq_attempts_delivery_n"),)

    id: Mapped[str] = _id("att")
    delivery_id: Mapped[str] = mapped_column(ForeignKey("deliveries.id", ondelete="CASCADE"))
    n: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    duration_ms: Mapped[int] = mapped_column(Integer)
    url: Mapped[str] = mapped_column(Text)
    request_headers: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    response_status: Mapped[int | None] = mapped_column(Integer)
    response_body: Mapped[bytes | None] = mapped_column(LargeBinary)
    # The partner's answer headers, where the engine kept them (rows before it did: None).
    response_headers: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = _created()

    delivery: Mapped[Delivery] = relationship(back_populates="attempts")


class OperationalEvent(Base):
    """Things operators must notice that are not deliveries, e.g. `endpoint.disabled`.

    A row of one of Kurir's operational event types is also an outbox entry: it is written in
    the transaction of what happened, and published as an event (`app.intake.operational`)
    after that commits; `published_at` says when. Other kinds are shown in the UI only.
    """

    __tablename__ = "operational_events"

    id: Mapped[str] = _id("ope")
    kind: Mapped[str] = mapped_column(String(100), index=True)
    subject_id: Mapped[str | None] = mapped_column(String(40), index=True)
    # The partner the event is about (no foreign key: partners are never deleted).
    partner_id: Mapped[str | None] = mapped_column(String(40))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = _created()
    # None: an operational event type still to be published (None for other kinds too, which
    # the publisher never reads); set when published, or at once when the loop guard keeps it
    # from being published.
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), index=True)


# ---------------------------------------------------------------------------- dead letters


class DeadLetter(Base):
    """A delivery Kurir stopped trying; denormalised columns make the search indexable."""

    __tablename__ = "dead_letters"
    __table_args__ = (
        # A dead delivery has exactly one open dead letter.
        Index(
            "uq_dead_letters_open_delivery",
            "delivery_id",
            unique=True,
            sqlite_where=text("state = 'open'"),
            postgresql_where=text("state = 'open'"),
        ),
        # A delivery's letters, looked up by the pages and the purge.
        Index("ix_dead_letters_delivery", "delivery_id"),
        Index("ix_dead_letters_state_created", "state", "id"),
        Index("ix_dead_letters_partner", "partner_id", "id"),
        Index("ix_dead_letters_endpoint", "endpoint_id", "id"),
        Index("ix_dead_letters_type", "event_type", "id"),
        Index("ix_dead_letters_reason", "reason", "id"),
        Index("ix_dead_letters_status_code", "last_status_code", "id"),
        Index(
            "ix_dead_letters_search_trgm",
            "search_text",
            postgresql_using="gin",
            postgresql_ops={"search_text": "gin_trgm_ops"},
            info={"dialects": ("postgresql",)},
        ).ddl_if(dialect="postgresql"),
    )

    id: Mapped[str] = _id("dl")
    # No foreign key (migration 0022): the retention rules keep a letter's delivery as long
    # as the letter, and a partition drop need not take the letters out of a dropped day.
    delivery_id: Mapped[str] = mapped_column(String(40))
    event_id: Mapped[str] = mapped_column(ForeignKey("events.id", ondelete="CASCADE"), index=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"))
    partner_id: Mapped[str] = mapped_column(ForeignKey("partners.id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(String(64))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(200))
    search_text: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), default=DL_OPEN)
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    delivery: Mapped[Delivery] = relationship(
        primaryjoin="foreign(DeadLetter.delivery_id) == Delivery.id"
    )
    audit: Mapped[list[DeadLetterAudit]] = relationship(
        back_populates="dead_letter", order_by="DeadLetterAudit.id"
    )


class DeadLetterAudit(Base):
    """Who did what to a dead letter, and how it turned out."""

    __tablename__ = "dead_letter_audit"

    id: Mapped[str] = _id("dla")
    dead_letter_id: Mapped[str] = mapped_column(
        ForeignKey("dead_letters.id", ondelete="CASCADE"), index=True
    )
    actor: Mapped[str] = mapped_column(String(320))
    # As on `AuditRecord`: the partner a partner-bound actor acted for, else None.
    actor_partner_id: Mapped[str | None] = mapped_column(String(40))
    action: Mapped[str] = mapped_column(String(32))
    outcome: Mapped[str] = mapped_column(String(200))
    note: Mapped[str | None] = mapped_column(Text)
    # The `ResendJob` that did it, so a resend job can report what became of its runs.
    operation_id: Mapped[str | None] = mapped_column(String(40), index=True)
    created_at: Mapped[datetime] = _created()

    dead_letter: Mapped[DeadLetter] = relationship(back_populates="audit")


class ResendJob(Base):
    """A background resend over many dead letters, with progress an operator can watch."""

    __tablename__ = "bulk_operations"

    id: Mapped[str] = _id("bop")
    kind: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(320))
    # The API key that started it (key names are not unique: a partner key reads its own jobs
    # by this id), and the partner a partner-bound actor started it for.
    key_id: Mapped[str | None] = mapped_column(String(40))
    actor_partner_id: Mapped[str | None] = mapped_column(String(40))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default=ResendJobState.PENDING.value)
    total: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


# ---------------------------------------------------------------------------- inbound


class InboundSource(Base):
    """A partner that calls us: scheme, field mapping and optional pull API."""

    __tablename__ = "inbound_sources"

    id: Mapped[str] = _id("src")
    name: Mapped[str] = mapped_column(String(100), unique=True)
    scheme: Mapped[str] = mapped_column(String(32))
    tolerance_s: Mapped[int] = mapped_column(Integer, default=300)
    mapping: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    allow_gaps: Mapped[bool] = mapped_column(Boolean, default=True)
    handlers: Mapped[list[Any]] = mapped_column(JSON, default=list)
    reconcile_url: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()

    secrets: Mapped[list[InboundSourceSecret]] = relationship(
        back_populates="source", order_by="InboundSourceSecret.created_at.desc()"
    )


class InboundSourceSecret(RotatingSecret, Base):
    """One verification secret (encrypted); several may be valid during a rotation."""

    __tablename__ = "inbound_source_secrets"

    id: Mapped[str] = _id("srs")
    source_id: Mapped[str] = mapped_column(
        ForeignKey("inbound_sources.id", ondelete="CASCADE"), index=True
    )

    source: Mapped[InboundSource] = relationship(back_populates="secrets")


class InboundEvent(Base):
    """One received callback: raw bytes exactly as they arrived, and what we made of them."""

    __tablename__ = "inbound_events"
    __table_args__ = (
        UniqueConstraint("source_id", "event_id", name="uq_inbound_events_source_event"),
        Index("ix_inbound_events_resource", "source_id", "resource_id", "id"),
        Index("ix_inbound_events_status", "status", "id"),
    )

    id: Mapped[str] = _id("ine")
    source_id: Mapped[str] = mapped_column(ForeignKey("inbound_sources.id", ondelete="CASCADE"))
    event_id: Mapped[str] = mapped_column(String(255))
    event_type: Mapped[str | None] = mapped_column(String(200))
    resource_type: Mapped[str | None] = mapped_column(String(200))
    resource_id: Mapped[str | None] = mapped_column(String(255))
    resource_version: Mapped[int | None] = mapped_column(BigInteger)
    occurred_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    resource_status: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default=InboundStatus.RECEIVED.value)
    reason: Mapped[str | None] = mapped_column(Text)
    raw_body: Mapped[bytes] = mapped_column(LargeBinary)
    headers: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    received_at: Mapped[datetime] = _created()
    processed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = _updated()
    # The W3C traceparent of the receive span (app.telemetry): the apply span joins its trace;
    # NULL while tracing is off.
    trace_context: Mapped[str | None] = mapped_column(String(64))


class ResourceState(Base):
    """The newest applied state of one resource of one source; only ever moves forward."""

    __tablename__ = "resource_states"
    __table_args__ = (
        UniqueConstraint(
            "source_id", "resource_type", "resource_id", name="uq_resource_states_resource"
        ),
    )

    id: Mapped[str] = _id("rst")
    source_id: Mapped[str] = mapped_column(ForeignKey("inbound_sources.id", ondelete="CASCADE"))
    resource_type: Mapped[str] = mapped_column(String(200), default="")
    resource_id: Mapped[str] = mapped_column(String(255))
    last_version: Mapped[int | None] = mapped_column(BigInteger)
    last_occurred_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    status: Mapped[str | None] = mapped_column(String(200))
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    last_event_id: Mapped[str | None] = mapped_column(String(40))
    placeholder: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()


class ReconcileRequest(Base):
    """A pending pull of a provider's current state, retried with backoff until done or failed."""

    __tablename__ = "reconcile_requests"
    __table_args__ = (
        Index("ix_reconcile_requests_due", "state", "next_attempt_at"),
        # Deleting an inbound source cascades here.
        Index("ix_reconcile_requests_source", "source_id"),
    )

    id: Mapped[str] = _id("rcn")
    source_id: Mapped[str] = mapped_column(ForeignKey("inbound_sources.id", ondelete="CASCADE"))
    resource_id: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), default=ReconcileState.PENDING.value)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _updated()


# ---------------------------------------------------------------------------- processes


class SchedulerLease(Base):
    """Which `kurir scheduler` runs the periodic jobs now: any number may run, one holds this.

    The holder renews `expires_at` well before it passes; another scheduler takes the row only
    once it has (one conditional UPDATE, `app/processes/lease.py`). `epoch` grows by one with
    every change of holder: the fencing token a term's job runs are logged under.
    """

    __tablename__ = "scheduler_leases"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())


# ---------------------------------------------------------------------------- data lifecycle


class RetentionMark(Base):
    """What retention did to one kind of history (`app.lifecycle`): rows purged so far, the
    horizon of the last run, and the oldest row kept after it."""

    __tablename__ = "retention_marks"

    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    purged_total: Mapped[int] = mapped_column(BigInteger, default=0)
    last_purged: Mapped[int] = mapped_column(BigInteger, default=0)
    horizon: Mapped[datetime | None] = mapped_column(UTCDateTime())
    oldest_kept_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class MetricRollup(Base):
    """Counts folded from an append-only history (`app.services.attempt_totals`): what rows
    up to `through_id` added up to, kept whatever retention later purges of them."""

    __tablename__ = "metric_rollups"

    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    # The last id folded in (ids are creation times); None: nothing folded yet.
    through_id: Mapped[str | None] = mapped_column(String(40))
    counts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class FeedPurge(Base):
    """How far retention has purged one partner's feed, per event type: the highest feed
    position purged and the horizon it was purged under. A cursor or acknowledgement behind
    it is refused (`app.feed.horizon`) instead of silently skipping what is gone."""

    __tablename__ = "feed_purges"

    partner_id: Mapped[str] = mapped_column(
        ForeignKey("partners.id", ondelete="CASCADE"), primary_key=True
    )
    event_type: Mapped[str] = mapped_column(String(200), primary_key=True)
    purged_seq: Mapped[int] = mapped_column(BigInteger)
    horizon: Mapped[datetime] = mapped_column(UTCDateTime())
    purged_at: Mapped[datetime] = mapped_column(UTCDateTime())
