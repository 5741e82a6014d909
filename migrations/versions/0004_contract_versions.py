"""contract versions per endpoint: pins, downgrades with examples, sunsets, event versions

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on both databases (no batch-mode table copy on SQLite, see 0002).
    op.add_column("event_types", sa.Column("sunset_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "event_types", sa.Column("sunset_reported_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("event_types", sa.Column("downgrade", sa.Text(), nullable=True))
    op.add_column("event_types", sa.Column("examples", sa.JSON(), nullable=True))
    op.add_column("endpoints", sa.Column("versions", sa.JSON(), nullable=True))
    op.add_column("deliveries", sa.Column("version", sa.Integer(), nullable=True))
    op.create_table(
        "event_versions",
        sa.Column("event_id", sa.String(length=40), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["events.id"],
            ondelete="CASCADE",
            name=op.f("fk_event_versions_event_id_events"),
        ),
        sa.PrimaryKeyConstraint("event_id", "version", name=op.f("pk_event_versions")),
    )


def downgrade() -> None:
    op.drop_table("event_versions")
    op.drop_column("deliveries", "version")
    op.drop_column("endpoints", "versions")
    op.drop_column("event_types", "examples")
    op.drop_column("event_types", "downgrade")
    op.drop_column("event_types", "sunset_reported_at")
    op.drop_column("event_types", "sunset_at")
