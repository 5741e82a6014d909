"""Attempt totals folded once and kept, so `/metrics` stops reading the whole history

A scrape counted every attempt by outcome and latency with an aggregate over the whole
`attempts` table (5.5-6.6 s at 5 million rows), and the counts fell when retention purged.
`metric_rollups` holds what the attempts up to an id added up to; the scheduler folds new
ones in (`app.services.attempt_totals`) and a scrape counts only those after it.

Revision ID: 0025_metric_rollups
Revises: 0024_retention_change_log
Create Date: 2026-12-07 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_metric_rollups"
down_revision: str | None = "0024_retention_change_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("through_id", sa.String(length=40), nullable=True),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("source", name=op.f("pk_metric_rollups")),
    )


def downgrade() -> None:
    op.drop_table("metric_rollups")
