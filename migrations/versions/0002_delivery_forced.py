"""deliveries.forced: a run resent with force to a disabled endpoint

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ALTER TABLE ... ADD COLUMN on both databases. Not batch mode: on SQLite that
    # copies the table and drops the old one, and with foreign keys on, the drop cascades to
    # every attempt and dead letter of every delivery.
    op.add_column(
        "deliveries",
        sa.Column("forced", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )


def downgrade() -> None:
    op.drop_column("deliveries", "forced")
