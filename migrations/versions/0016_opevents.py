"""Operational events: Kurir's own event types (registered here), a partner's opt-in, and
the operational events table as an outbox (what is still to be published)

Revision ID: 0016_opevents
Revises: 0015_verify
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0016_opevents"
down_revision: str | None = "0015_verify"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Version 1 of each operational event type, as registered (a contract never changes: a new
# shape is a new version). `app.operational.catalog` holds the same; a test compares them.
TYPES: list[dict[str, Any]] = [
    {
        "name": "endpoint.disabled",
        "description": "Kurir's own: an endpoint was disabled, after failing too long (`disabled_by: "
        "health`), answering 410 Gone, or by hand. Its waiting deliveries became dead "
        "letters (`parked_deliveries`); new events for it are parked until it is "
        "enabled.",
        "schema": {
            "type": "object",
            "required": ["partner", "endpoint", "reason", "disabled_by", "disabled_at"],
            "properties": {
                "partner": {
                    "type": "string",
                    "description": "uid of the partner the event is about",
                },
                "endpoint": {
                    "type": "string",
                    "description": "id of the endpoint the event is about",
                },
                "url": {"type": "string", "description": "the endpoint's URL"},
                "reason": {"type": "string", "description": "why it was disabled"},
                "disabled_by": {
                    "type": "string",
                    "enum": ["health", "operator", "partner", "verification"],
                    "description": (
                        "Kurir after failures, an operator, the partner, or an "
                        "unanswered ownership challenge"
                    ),
                },
                "disabled_at": {"type": "string", "description": "RFC 3339, UTC"},
                "parked_deliveries": {
                    "type": "integer",
                    "description": "waiting deliveries made dead letters",
                },
                "consecutive_failures": {"type": "integer"},
                "last_status_code": {
                    "type": ["integer", "null"],
                    "description": "HTTP status of the last attempt (null: no answer)",
                },
                "last_error": {
                    "type": ["string", "null"],
                    "description": "error class of the last attempt",
                },
                "delivery": {
                    "type": "string",
                    "description": "the delivery whose answer (410) disabled it",
                },
            },
            "additionalProperties": False,
            "examples": [
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "reason": "failing: 8 consecutive failures, none succeeded for 86400 s",
                    "disabled_by": "health",
                    "disabled_at": "2026-12-02T10:00:00Z",
                    "parked_deliveries": 12,
                    "consecutive_failures": 8,
                    "last_status_code": 503,
                    "last_error": "http_status",
                }
            ],
        },
    },
    {
        "name": "endpoint.recovered",
        "description": "Kurir's own: a disabled endpoint answered a probe and was enabled again; "
        "what was parked since it was disabled is replayed (`replayed`).",
        "schema": {
            "type": "object",
            "required": ["partner", "endpoint", "recovered_at"],
            "properties": {
                "partner": {
                    "type": "string",
                    "description": "uid of the partner the event is about",
                },
                "endpoint": {
                    "type": "string",
                    "description": "id of the endpoint the event is about",
                },
                "url": {"type": "string", "description": "the endpoint's URL"},
                "reason": {"type": "string", "description": "how it recovered"},
                "disabled_at": {"type": ["string", "null"], "description": "RFC 3339, UTC"},
                "recovered_at": {"type": "string", "description": "RFC 3339, UTC"},
                "replayed": {"type": "integer", "description": "parked deliveries sent again"},
            },
            "additionalProperties": False,
            "examples": [
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "reason": "probe_succeeded",
                    "disabled_at": "2026-12-02T10:00:00Z",
                    "recovered_at": "2026-12-02T11:05:00Z",
                    "replayed": 12,
                }
            ],
        },
    },
    {
        "name": "endpoint.verification_failed",
        "description": "Kurir's own: an endpoint that must prove it receives webhooks did not echo "
        "its verification challenge in time, and was disabled with reason "
        "`unverified`.",
        "schema": {
            "type": "object",
            "required": ["partner", "endpoint", "reason"],
            "properties": {
                "partner": {
                    "type": "string",
                    "description": "uid of the partner the event is about",
                },
                "endpoint": {
                    "type": "string",
                    "description": "id of the endpoint the event is about",
                },
                "url": {"type": "string", "description": "the endpoint's URL"},
                "reason": {"type": "string", "description": "why verification failed"},
                "requested_at": {
                    "type": ["string", "null"],
                    "description": "when verification was asked for (RFC 3339, UTC)",
                },
                "failed_at": {"type": "string", "description": "RFC 3339, UTC"},
            },
            "additionalProperties": False,
            "examples": [
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "reason": "unverified",
                    "requested_at": "2026-12-02T10:00:00Z",
                    "failed_at": "2026-12-05T10:00:00Z",
                }
            ],
        },
    },
    {
        "name": "delivery.exhausted",
        "description": "Kurir's own: a delivery used up its retries and became a dead letter "
        "(`dead_letter`), which an operator can resend.",
        "schema": {
            "type": "object",
            "required": [
                "partner",
                "endpoint",
                "event",
                "event_type",
                "delivery",
                "dead_letter",
                "reason",
                "attempts",
            ],
            "properties": {
                "partner": {
                    "type": "string",
                    "description": "uid of the partner the event is about",
                },
                "endpoint": {
                    "type": "string",
                    "description": "id of the endpoint the event is about",
                },
                "url": {"type": "string", "description": "the endpoint's URL"},
                "event": {"type": "string", "description": "id of the event"},
                "event_type": {"type": "string"},
                "version": {"type": ["integer", "null"]},
                "delivery": {"type": "string", "description": "id of the delivery"},
                "dead_letter": {"type": "string", "description": "id of the dead letter"},
                "reason": {"type": "string", "description": "why it was parked"},
                "attempts": {"type": "integer", "description": "attempts made in all"},
                "last_status_code": {
                    "type": ["integer", "null"],
                    "description": "HTTP status of the last attempt (null: no answer)",
                },
                "last_error": {
                    "type": ["string", "null"],
                    "description": "error class of the last attempt",
                },
            },
            "additionalProperties": False,
            "examples": [
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "event": "evt_2Jd…",
                    "event_type": "payment.succeeded",
                    "version": 2,
                    "delivery": "dlv_2Jd…",
                    "dead_letter": "dl_2Jd…",
                    "reason": "retries_exhausted",
                    "attempts": 13,
                    "last_status_code": 500,
                    "last_error": "http_status",
                }
            ],
        },
    },
    {
        "name": "ordering.key_blocked",
        "description": "Kurir's own: a delivery of an ordered endpoint with `on_dead: block` became "
        "a dead letter, so the events of its ordering key wait behind it until that "
        "letter is resent or discarded.",
        "schema": {
            "type": "object",
            "required": [
                "partner",
                "endpoint",
                "ordering_key",
                "sequence",
                "event",
                "delivery",
                "dead_letter",
                "reason",
            ],
            "properties": {
                "partner": {
                    "type": "string",
                    "description": "uid of the partner the event is about",
                },
                "endpoint": {
                    "type": "string",
                    "description": "id of the endpoint the event is about",
                },
                "url": {"type": "string", "description": "the endpoint's URL"},
                "ordering_key": {"type": "string"},
                "sequence": {"type": "integer", "description": "the blocking delivery's"},
                "event": {"type": "string"},
                "delivery": {"type": "string"},
                "dead_letter": {"type": "string"},
                "reason": {"type": "string"},
            },
            "additionalProperties": False,
            "examples": [
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "ordering_key": "payment:pay_123",
                    "sequence": 7,
                    "event": "evt_2Jd…",
                    "delivery": "dlv_2Jd…",
                    "dead_letter": "dl_2Jd…",
                    "reason": "retries_exhausted",
                }
            ],
        },
    },
    {
        "name": "event_type.sunset_passed",
        "description": "Kurir's own: the sunset of a deprecated contract version passed while this "
        "endpoint is still pinned to it. It keeps receiving that version until its "
        "pin changes.",
        "schema": {
            "type": "object",
            "required": ["partner", "endpoint", "type", "version", "sunset_at"],
            "properties": {
                "partner": {
                    "type": "string",
                    "description": "uid of the partner the event is about",
                },
                "endpoint": {
                    "type": "string",
                    "description": "id of the endpoint the event is about",
                },
                "url": {"type": "string", "description": "the endpoint's URL"},
                "type": {"type": "string", "description": "the event type"},
                "version": {"type": "integer", "description": "the version pinned"},
                "sunset_at": {"type": "string", "description": "RFC 3339, UTC"},
            },
            "additionalProperties": False,
            "examples": [
                {
                    "partner": "acme",
                    "endpoint": "ep_2Jd…",
                    "url": "https://hooks.acme.example/kurir",
                    "type": "payment.succeeded",
                    "version": 1,
                    "sunset_at": "2026-12-31T00:00:00Z",
                }
            ],
        },
    },
]

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _ulid(index: int) -> str:
    def encode(value: int, length: int) -> str:
        chars = []
        for _ in range(length):
            chars.append(_ALPHABET[value & 31])
            value >>= 5
        return "".join(reversed(chars))

    rand = (int.from_bytes(os.urandom(10), "big") >> 8 << 8) + index
    return encode(time.time_ns() // 1_000_000, 10) + encode(rand & ((1 << 80) - 1), 16)


def upgrade() -> None:
    op.add_column(
        "partners",
        sa.Column(
            "operational_events", sa.Boolean(), nullable=False, server_default=sa.text("false")
        ),
    )
    op.add_column("operational_events", sa.Column("partner_id", sa.String(length=40)))
    op.add_column(
        "operational_events", sa.Column("published_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(
        op.f("ix_operational_events_published_at"),
        "operational_events",
        ["published_at"],
        unique=False,
    )
    # What was recorded before is history, not news: it is not published now.
    op.execute("UPDATE operational_events SET published_at = created_at")
    event_types = sa.table(
        "event_types",
        sa.column("id", sa.String),
        sa.column("name", sa.String),
        sa.column("version", sa.Integer),
        sa.column("schema", sa.JSON),
        sa.column("description", sa.Text),
        sa.column("deprecated", sa.Boolean),
        sa.column("examples", sa.JSON),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    bind = op.get_bind()
    taken = {
        row[0]
        for row in bind.execute(
            sa.select(event_types.c.name).where(
                event_types.c.name.in_([t["name"] for t in TYPES]), event_types.c.version == 1
            )
        )
    }
    now = datetime.now(UTC)
    if bind.dialect.name == "sqlite":
        now = now.replace(tzinfo=None)
    rows = [
        {
            "id": f"ety_{_ulid(index)}",
            "name": t["name"],
            "version": 1,
            "schema": t["schema"],
            "description": t["description"],
            "deprecated": False,
            "examples": t["schema"]["examples"],
            "created_at": now,
        }
        for index, t in enumerate(TYPES)
        if t["name"] not in taken
    ]
    if rows:
        op.bulk_insert(event_types, rows)


def downgrade() -> None:
    op.execute(
        sa.text("DELETE FROM event_types WHERE version = 1 AND name IN :names").bindparams(
            sa.bindparam("names", [t["name"] for t in TYPES], expanding=True)
        )
    )
    op.drop_index(op.f("ix_operational_events_published_at"), table_name="operational_events")
    with op.batch_alter_table("operational_events") as batch:
        batch.drop_column("published_at")
        batch.drop_column("partner_id")
    with op.batch_alter_table("partners") as batch:
        batch.drop_column("operational_events")
