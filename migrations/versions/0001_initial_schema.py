"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02 17:49:33.298592
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _is_postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if _is_postgres():
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_table(
        "bulk_operations",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(length=320), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bulk_operations")),
    )
    op.create_table(
        "event_types",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("schema", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("deprecated", sa.Boolean(), nullable=False),
        sa.Column("deprecated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event_types")),
        sa.UniqueConstraint("name", "version", name="uq_event_types_name_version"),
    )
    op.create_table(
        "inbound_sources",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("scheme", sa.String(length=32), nullable=False),
        sa.Column("tolerance_s", sa.Integer(), nullable=False),
        sa.Column("mapping", sa.JSON(), nullable=False),
        sa.Column("allow_gaps", sa.Boolean(), nullable=False),
        sa.Column("handlers", sa.JSON(), nullable=False),
        sa.Column("reconcile_url", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbound_sources")),
        sa.UniqueConstraint("name", name=op.f("uq_inbound_sources_name")),
    )
    op.create_table(
        "operational_events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=100), nullable=False),
        sa.Column("subject_id", sa.String(length=40), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operational_events")),
    )
    op.create_index(
        op.f("ix_operational_events_kind"), "operational_events", ["kind"], unique=False
    )
    op.create_index(
        op.f("ix_operational_events_subject_id"), "operational_events", ["subject_id"], unique=False
    )
    op.create_table(
        "operators",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("password_hash", sa.String(length=400), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_login_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operators")),
        sa.UniqueConstraint("email", name=op.f("uq_operators_email")),
    )
    op.create_table(
        "partners",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("uid", sa.String(length=200), nullable=False),
        sa.Column("name", sa.String(length=400), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_partners")),
        sa.UniqueConstraint("uid", name=op.f("uq_partners_uid")),
    )
    op.create_table(
        "endpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("partner_id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("event_types", sa.JSON(), nullable=True),
        sa.Column("headers", sa.JSON(), nullable=False),
        sa.Column("timeout_s", sa.Integer(), nullable=False),
        sa.Column("rate_limit_per_s", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("disabled_reason", sa.String(length=200), nullable=True),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("first_failure_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_failure_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["partners.id"],
            name=op.f("fk_endpoints_partner_id_partners"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoints")),
    )
    op.create_index(
        "ix_endpoints_partner_state", "endpoints", ["partner_id", "state"], unique=False
    )
    op.create_table(
        "events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("partner_id", sa.String(length=40), nullable=False),
        sa.Column("type", sa.String(length=200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resource_type", sa.String(length=200), nullable=True),
        sa.Column("resource_id", sa.String(length=200), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=True),
        sa.Column("correlation_id", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["partners.id"],
            name=op.f("fk_events_partner_id_partners"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_partner_created", "events", ["partner_id", "id"], unique=False)
    op.create_index("ix_events_partner_type", "events", ["partner_id", "type", "id"], unique=False)
    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("api_key_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=False),
        sa.Column("response_body", sa.JSON(), nullable=False),
        sa.Column("event_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["api_key_id"],
            ["api_keys.id"],
            name=op.f("fk_idempotency_keys_api_key_id_api_keys"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotency_keys")),
        sa.UniqueConstraint("api_key_id", "key", name="uq_idempotency_keys_scope"),
    )
    op.create_index(
        op.f("ix_idempotency_keys_expires_at"), "idempotency_keys", ["expires_at"], unique=False
    )
    op.create_table(
        "inbound_events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("source_id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=255), nullable=False),
        sa.Column("event_type", sa.String(length=200), nullable=True),
        sa.Column("resource_type", sa.String(length=200), nullable=True),
        sa.Column("resource_id", sa.String(length=255), nullable=True),
        sa.Column("resource_version", sa.BigInteger(), nullable=True),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resource_status", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("raw_body", sa.LargeBinary(), nullable=False),
        sa.Column("headers", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["inbound_sources.id"],
            name=op.f("fk_inbound_events_source_id_inbound_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbound_events")),
        sa.UniqueConstraint("source_id", "event_id", name="uq_inbound_events_source_event"),
    )
    op.create_index(
        "ix_inbound_events_resource",
        "inbound_events",
        ["source_id", "resource_id", "id"],
        unique=False,
    )
    op.create_index("ix_inbound_events_status", "inbound_events", ["status", "id"], unique=False)
    op.create_table(
        "inbound_source_secrets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("source_id", sa.String(length=40), nullable=False),
        sa.Column("secret_encrypted", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["inbound_sources.id"],
            name=op.f("fk_inbound_source_secrets_source_id_inbound_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbound_source_secrets")),
    )
    op.create_index(
        op.f("ix_inbound_source_secrets_source_id"),
        "inbound_source_secrets",
        ["source_id"],
        unique=False,
    )
    op.create_table(
        "reconcile_requests",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("source_id", sa.String(length=40), nullable=False),
        sa.Column("resource_id", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["inbound_sources.id"],
            name=op.f("fk_reconcile_requests_source_id_inbound_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reconcile_requests")),
    )
    op.create_index(
        "ix_reconcile_requests_due",
        "reconcile_requests",
        ["state", "next_attempt_at"],
        unique=False,
    )
    op.create_table(
        "resource_states",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("source_id", sa.String(length=40), nullable=False),
        sa.Column("resource_type", sa.String(length=200), nullable=False),
        sa.Column("resource_id", sa.String(length=255), nullable=False),
        sa.Column("last_version", sa.BigInteger(), nullable=True),
        sa.Column("last_occurred_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=200), nullable=True),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.Column("last_event_id", sa.String(length=40), nullable=True),
        sa.Column("placeholder", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["inbound_sources.id"],
            name=op.f("fk_resource_states_source_id_inbound_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_resource_states")),
        sa.UniqueConstraint(
            "source_id", "resource_type", "resource_id", name="uq_resource_states_resource"
        ),
    )
    op.create_table(
        "deliveries",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=40), nullable=False),
        sa.Column("endpoint_id", sa.String(length=40), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("run_attempts", sa.Integer(), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.Column("succeeded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["endpoints.id"],
            name=op.f("fk_deliveries_endpoint_id_endpoints"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["events.id"],
            name=op.f("fk_deliveries_event_id_events"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint("event_id", "endpoint_id", name="uq_deliveries_event_endpoint"),
    )
    op.create_index("ix_deliveries_due", "deliveries", ["state", "next_attempt_at"], unique=False)
    op.create_index(
        "ix_deliveries_endpoint_state", "deliveries", ["endpoint_id", "state"], unique=False
    )
    op.create_table(
        "endpoint_secrets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("endpoint_id", sa.String(length=40), nullable=False),
        sa.Column("secret_encrypted", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["endpoints.id"],
            name=op.f("fk_endpoint_secrets_endpoint_id_endpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoint_secrets")),
    )
    op.create_index(
        op.f("ix_endpoint_secrets_endpoint_id"), "endpoint_secrets", ["endpoint_id"], unique=False
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("delivery_id", sa.String(length=40), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("request_headers", sa.JSON(), nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=True),
        sa.Column("response_body", sa.LargeBinary(), nullable=True),
        sa.Column("error", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["deliveries.id"],
            name=op.f("fk_attempts_delivery_id_deliveries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("delivery_id", "n", name="uq_attempts_delivery_n"),
    )
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("delivery_id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=40), nullable=False),
        sa.Column("endpoint_id", sa.String(length=40), nullable=False),
        sa.Column("partner_id", sa.String(length=40), nullable=False),
        sa.Column("event_type", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.Column("search_text", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["deliveries.id"],
            name=op.f("fk_dead_letters_delivery_id_deliveries"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["endpoints.id"],
            name=op.f("fk_dead_letters_endpoint_id_endpoints"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["events.id"],
            name=op.f("fk_dead_letters_event_id_events"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["partners.id"],
            name=op.f("fk_dead_letters_partner_id_partners"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
    )
    op.create_index("ix_dead_letters_endpoint", "dead_letters", ["endpoint_id", "id"], unique=False)
    op.create_index(op.f("ix_dead_letters_event_id"), "dead_letters", ["event_id"], unique=False)
    op.create_index("ix_dead_letters_partner", "dead_letters", ["partner_id", "id"], unique=False)
    op.create_index("ix_dead_letters_reason", "dead_letters", ["reason", "id"], unique=False)
    if _is_postgres():
        # Trigram index: the dead-letter `q` search must not scan the table.
        op.create_index(
            "ix_dead_letters_search_trgm",
            "dead_letters",
            ["search_text"],
            unique=False,
            postgresql_using="gin",
            postgresql_ops={"search_text": "gin_trgm_ops"},
        )
    op.create_index("ix_dead_letters_state_created", "dead_letters", ["state", "id"], unique=False)
    op.create_index(
        "ix_dead_letters_status_code", "dead_letters", ["last_status_code", "id"], unique=False
    )
    op.create_index("ix_dead_letters_type", "dead_letters", ["event_type", "id"], unique=False)
    op.create_index(
        "uq_dead_letters_open_delivery",
        "dead_letters",
        ["delivery_id"],
        unique=True,
        sqlite_where=sa.text("state = 'open'"),
        postgresql_where=sa.text("state = 'open'"),
    )
    op.create_table(
        "dead_letter_audit",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("dead_letter_id", sa.String(length=40), nullable=False),
        sa.Column("actor", sa.String(length=320), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("outcome", sa.String(length=200), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["dead_letter_id"],
            ["dead_letters.id"],
            name=op.f("fk_dead_letter_audit_dead_letter_id_dead_letters"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letter_audit")),
    )
    op.create_index(
        op.f("ix_dead_letter_audit_dead_letter_id"),
        "dead_letter_audit",
        ["dead_letter_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_dead_letter_audit_dead_letter_id"), table_name="dead_letter_audit")
    op.drop_table("dead_letter_audit")
    op.drop_index(
        "uq_dead_letters_open_delivery",
        table_name="dead_letters",
        sqlite_where=sa.text("state = 'open'"),
        postgresql_where=sa.text("state = 'open'"),
    )
    op.drop_index("ix_dead_letters_type", table_name="dead_letters")
    op.drop_index("ix_dead_letters_status_code", table_name="dead_letters")
    op.drop_index("ix_dead_letters_state_created", table_name="dead_letters")
    if _is_postgres():
        op.drop_index("ix_dead_letters_search_trgm", table_name="dead_letters")
    op.drop_index("ix_dead_letters_reason", table_name="dead_letters")
    op.drop_index("ix_dead_letters_partner", table_name="dead_letters")
    op.drop_index(op.f("ix_dead_letters_event_id"), table_name="dead_letters")
    op.drop_index("ix_dead_letters_endpoint", table_name="dead_letters")
    op.drop_table("dead_letters")
    op.drop_table("attempts")
    op.drop_index(op.f("ix_endpoint_secrets_endpoint_id"), table_name="endpoint_secrets")
    op.drop_table("endpoint_secrets")
    op.drop_index("ix_deliveries_endpoint_state", table_name="deliveries")
    op.drop_index("ix_deliveries_due", table_name="deliveries")
    op.drop_table("deliveries")
    op.drop_table("resource_states")
    op.drop_index("ix_reconcile_requests_due", table_name="reconcile_requests")
    op.drop_table("reconcile_requests")
    op.drop_index(op.f("ix_inbound_source_secrets_source_id"), table_name="inbound_source_secrets")
    op.drop_table("inbound_source_secrets")
    op.drop_index("ix_inbound_events_status", table_name="inbound_events")
    op.drop_index("ix_inbound_events_resource", table_name="inbound_events")
    op.drop_table("inbound_events")
    op.drop_index(op.f("ix_idempotency_keys_expires_at"), table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
    op.drop_index("ix_events_partner_type", table_name="events")
    op.drop_index("ix_events_partner_created", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_endpoints_partner_state", table_name="endpoints")
    op.drop_table("endpoints")
    op.drop_table("partners")
    op.drop_table("operators")
    op.drop_index(op.f("ix_operational_events_subject_id"), table_name="operational_events")
    op.drop_index(op.f("ix_operational_events_kind"), table_name="operational_events")
    op.drop_table("operational_events")
    op.drop_table("inbound_sources")
    op.drop_table("event_types")
    op.drop_table("bulk_operations")
    op.drop_table("api_keys")
