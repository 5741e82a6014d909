"""revocation: portal links and sessions remember the key that minted them, links can be
revoked, sessions say why they ended; operator UI sessions become server-side rows

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on both databases (no batch-mode table copy on SQLite, see 0002).
    op.add_column("portal_links", sa.Column("key_id", sa.String(length=40), nullable=True))
    op.add_column(
        "portal_links", sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index(op.f("ix_portal_links_key_id"), "portal_links", ["key_id"])
    op.create_index(op.f("ix_portal_links_partner_id"), "portal_links", ["partner_id"])
    op.add_column("portal_sessions", sa.Column("key_id", sa.String(length=40), nullable=True))
    op.add_column("portal_sessions", sa.Column("end_reason", sa.String(length=20), nullable=True))
    op.create_index(op.f("ix_portal_sessions_key_id"), "portal_sessions", ["key_id"])
    op.create_table(
        "operator_sessions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("operator_id", sa.String(length=40), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=20), nullable=True),
        sa.ForeignKeyConstraint(
            ["operator_id"],
            ["operators.id"],
            name=op.f("fk_operator_sessions_operator_id_operators"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operator_sessions")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_operator_sessions_token_hash")),
    )
    op.create_index(op.f("ix_operator_sessions_operator_id"), "operator_sessions", ["operator_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_operator_sessions_operator_id"), table_name="operator_sessions")
    op.drop_table("operator_sessions")
    op.drop_index(op.f("ix_portal_sessions_key_id"), table_name="portal_sessions")
    op.drop_column("portal_sessions", "end_reason")
    op.drop_column("portal_sessions", "key_id")
    op.drop_index(op.f("ix_portal_links_partner_id"), table_name="portal_links")
    op.drop_index(op.f("ix_portal_links_key_id"), table_name="portal_links")
    op.drop_column("portal_links", "revoked_at")
    op.drop_column("portal_links", "key_id")
