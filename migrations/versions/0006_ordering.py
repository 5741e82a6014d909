"""ordered delivery: ordering keys on events, ordering and on_dead on endpoints, each ordered
delivery's place in its key's sequence, and the per (endpoint, key) sequence rows

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("events", sa.Column("ordering_key", sa.String(length=255), nullable=True))
    op.add_column(
        "endpoints",
        sa.Column("ordering", sa.String(length=8), nullable=False, server_default="none"),
    )
    op.add_column(
        "endpoints",
        sa.Column("on_dead", sa.String(length=8), nullable=False, server_default="skip"),
    )
    op.add_column("deliveries", sa.Column("ordering_key", sa.String(length=255), nullable=True))
    op.add_column("deliveries", sa.Column("ordering_seq", sa.BigInteger(), nullable=True))
    op.add_column("deliveries", sa.Column("previous_event_id", sa.String(length=40), nullable=True))
    op.create_index(
        "ix_deliveries_ordering",
        "deliveries",
        ["endpoint_id", "ordering_key", "ordering_seq"],
        unique=True,
        sqlite_where=sa.text("ordering_seq IS NOT NULL"),
        postgresql_where=sa.text("ordering_seq IS NOT NULL"),
    )
    op.create_table(
        "ordering_sequences",
        sa.Column("endpoint_id", sa.String(length=40), nullable=False),
        sa.Column("ordering_key", sa.String(length=255), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_event_id", sa.String(length=40), nullable=False),
        sa.Column("previous_event_id", sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["endpoints.id"],
            name=op.f("fk_ordering_sequences_endpoint_id_endpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("endpoint_id", "ordering_key", name=op.f("pk_ordering_sequences")),
    )


def downgrade() -> None:
    op.drop_table("ordering_sequences")
    op.drop_index("ix_deliveries_ordering", table_name="deliveries")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("previous_event_id")
        batch.drop_column("ordering_seq")
        batch.drop_column("ordering_key")
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("on_dead")
        batch.drop_column("ordering")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("ordering_key")
