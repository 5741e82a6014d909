"""audit records for every face, write-only endpoint headers, partner-scoped API keys

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_records",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("actor", sa.String(length=320), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("subject_type", sa.String(length=32), nullable=False),
        sa.Column("subject_id", sa.String(length=200), nullable=False),
        sa.Column("partner_id", sa.String(length=40), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_records")),
    )
    op.create_index("ix_audit_records_subject", "audit_records", ["subject_id", "id"])
    op.create_index("ix_audit_records_partner", "audit_records", ["partner_id", "id"])
    # Plain ADD COLUMN on both databases (no batch-mode table copy on SQLite, see 0002).
    op.add_column("endpoints", sa.Column("public_headers", sa.JSON(), nullable=True))
    # No foreign key: SQLite cannot add one to an existing table without copying it, and
    # partners are never deleted.
    op.add_column("api_keys", sa.Column("partner_id", sa.String(length=40), nullable=True))
    op.create_index(op.f("ix_api_keys_partner_id"), "api_keys", ["partner_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_api_keys_partner_id"), table_name="api_keys")
    op.drop_column("api_keys", "partner_id")
    op.drop_column("endpoints", "public_headers")
    op.drop_index("ix_audit_records_partner", table_name="audit_records")
    op.drop_index("ix_audit_records_subject", table_name="audit_records")
    op.drop_table("audit_records")
