"""the feed: a position per committed event, pull endpoints and their acknowledgements

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-03 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SEQUENCED = "feed_seq IS NOT NULL"
_UNSEQUENCED = "feed_seq IS NULL"


def upgrade() -> None:
    # Plain ADD COLUMN on both databases (no batch-mode table copy on SQLite, see 0002).
    op.add_column("events", sa.Column("feed_seq", sa.BigInteger(), nullable=True))
    op.create_index(
        "uq_events_feed_seq",
        "events",
        ["feed_seq"],
        unique=True,
        sqlite_where=sa.text(_SEQUENCED),
        postgresql_where=sa.text(_SEQUENCED),
    )
    op.create_index(
        "ix_events_partner_feed",
        "events",
        ["partner_id", "feed_seq"],
        sqlite_where=sa.text(_SEQUENCED),
        postgresql_where=sa.text(_SEQUENCED),
    )
    # Every existing event waits here until the sequencer's first pass numbers it.
    op.create_index(
        "ix_events_unsequenced",
        "events",
        ["id"],
        sqlite_where=sa.text(_UNSEQUENCED),
        postgresql_where=sa.text(_UNSEQUENCED),
    )
    op.add_column(
        "endpoints", sa.Column("mode", sa.String(length=8), nullable=False, server_default="push")
    )
    op.add_column("endpoints", sa.Column("acked_seq", sa.BigInteger(), nullable=True))
    op.add_column("endpoints", sa.Column("acked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("endpoints", "acked_at")
    op.drop_column("endpoints", "acked_seq")
    op.drop_column("endpoints", "mode")
    op.drop_index("ix_events_unsequenced", table_name="events")
    op.drop_index("ix_events_partner_feed", table_name="events")
    op.drop_index("uq_events_feed_seq", table_name="events")
    op.drop_column("events", "feed_seq")
