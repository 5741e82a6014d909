"""trace context: events and inbound events keep the W3C traceparent of the span that made
them, endpoints say whether their attempts send one

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-12 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN on both databases (no batch-mode table copy on SQLite, see 0002); a
    # nullable column and a constant default rewrite no rows on PostgreSQL.
    op.add_column("events", sa.Column("trace_context", sa.String(length=64), nullable=True))
    op.add_column("inbound_events", sa.Column("trace_context", sa.String(length=64), nullable=True))
    op.add_column(
        "endpoints",
        sa.Column(
            "send_traceparent", sa.Boolean(), nullable=False, server_default=sa.text("false")
        ),
    )


def downgrade() -> None:
    op.drop_column("endpoints", "send_traceparent")
    op.drop_column("inbound_events", "trace_context")
    op.drop_column("events", "trace_context")
