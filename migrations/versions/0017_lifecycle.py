"""data lifecycle: retention marks per kind, and how far each partner's feed was purged

Revision ID: 0017_lifecycle
Revises: 0016_opevents
Create Date: 2026-12-13 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_lifecycle"
down_revision: str | None = "0016_opevents"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "retention_marks",
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("purged_total", sa.BigInteger(), nullable=False),
        sa.Column("last_purged", sa.BigInteger(), nullable=False),
        sa.Column("horizon", sa.DateTime(timezone=True), nullable=True),
        sa.Column("oldest_kept_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("kind", name=op.f("pk_retention_marks")),
    )
    op.create_table(
        "feed_purges",
        sa.Column("partner_id", sa.String(length=40), nullable=False),
        sa.Column("event_type", sa.String(length=200), nullable=False),
        sa.Column("purged_seq", sa.BigInteger(), nullable=False),
        sa.Column("horizon", sa.DateTime(timezone=True), nullable=False),
        sa.Column("purged_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["partner_id"],
            ["partners.id"],
            name=op.f("fk_feed_purges_partner_id_partners"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("partner_id", "event_type", name=op.f("pk_feed_purges")),
    )


def downgrade() -> None:
    op.drop_table("feed_purges")
    op.drop_table("retention_marks")
