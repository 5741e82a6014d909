"""Search by resource id and correlation id: an index on each of the events' columns

Revision ID: 0019_search
Revises: 0018_filters
Create Date: 2026-12-05 09:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019_search"
down_revision: str | None = "0018_filters"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_events_resource_id", "events", ["resource_id"])
    op.create_index("ix_events_correlation_id", "events", ["correlation_id"])


def downgrade() -> None:
    op.drop_index("ix_events_correlation_id", table_name="events")
    op.drop_index("ix_events_resource_id", table_name="events")
