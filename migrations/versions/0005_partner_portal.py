"""partner portal: one-time links, portal sessions, response headers of attempts, resend jobs
named on their dead-letter audit rows

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "portal_links",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("partner_id", sa.String(length=40), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_by", sa.String(length=320), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["partners.id"],
            name=op.f("fk_portal_links_partner_id_partners"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_portal_links")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_portal_links_token_hash")),
    )
    op.create_table(
        "portal_sessions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("partner_id", sa.String(length=40), nullable=False),
        sa.Column("link_id", sa.String(length=40), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["partners.id"],
            name=op.f("fk_portal_sessions_partner_id_partners"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_portal_sessions")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_portal_sessions_token_hash")),
    )
    op.create_index(op.f("ix_portal_sessions_partner_id"), "portal_sessions", ["partner_id"])
    # Plain ADD COLUMN on both databases (no batch-mode table copy on SQLite, see 0002).
    op.add_column("attempts", sa.Column("response_headers", sa.JSON(), nullable=True))
    op.add_column(
        "dead_letter_audit", sa.Column("operation_id", sa.String(length=40), nullable=True)
    )
    op.create_index(
        op.f("ix_dead_letter_audit_operation_id"), "dead_letter_audit", ["operation_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_dead_letter_audit_operation_id"), table_name="dead_letter_audit")
    op.drop_column("dead_letter_audit", "operation_id")
    op.drop_column("attempts", "response_headers")
    op.drop_index(op.f("ix_portal_sessions_partner_id"), table_name="portal_sessions")
    op.drop_table("portal_sessions")
    op.drop_table("portal_links")
