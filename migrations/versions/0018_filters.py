"""Endpoint payload filters, and scoped portal links and sessions

Revision ID: 0018_filters
Revises: 0017_lifecycle
Create Date: 2026-12-14 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_filters"
down_revision: str | None = "0017_lifecycle"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("filter", sa.Text(), nullable=True))
    for table in ("portal_links", "portal_sessions"):
        op.add_column(
            table,
            sa.Column("read_only", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        )
        op.add_column(table, sa.Column("features", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table in ("portal_sessions", "portal_links"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("features")
            batch.drop_column("read_only")
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("filter")
