"""Indexes under two foreign keys that cascade: dead letters by delivery, reconcile requests
by inbound source

Deleting a delivery (retention, a partition drop's set-aside rows, an endpoint or partner
deleted) cascades to its dead letters, and deleting an inbound source to its reconcile
requests. Without an index on the referencing column, PostgreSQL and SQLite scan the whole
referencing table once per deleted row: 0.5 ms a delivery with 9,000 dead letters, and it
grows with them. (The unique index on open letters' delivery cannot serve: it is partial.)

Revision ID: 0021_cascade_indexes
Revises: 0020_partitions
Create Date: 2026-12-06 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0021_cascade_indexes"
down_revision: str | None = "0020_partitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_dead_letters_delivery", "dead_letters", ["delivery_id"])
    op.create_index("ix_reconcile_requests_source", "reconcile_requests", ["source_id"])


def downgrade() -> None:
    op.drop_index("ix_reconcile_requests_source", table_name="reconcile_requests")
    op.drop_index("ix_dead_letters_delivery", table_name="dead_letters")
