"""self-healing endpoints: failure-disabled endpoints are probed (`probe_next_at`,
`probe_count`), re-enabled on a 2xx when `auto_recover`; each probe kept in `endpoint_probes`

Revision ID: 0014_probes
Revises: 0013
Create Date: 2026-12-05 09:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_probes"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "endpoints",
        sa.Column("auto_recover", sa.Boolean(), nullable=False, server_default=sa.text("true")),
    )
    op.add_column(
        "endpoints", sa.Column("probe_next_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "endpoints",
        sa.Column("probe_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_index("ix_endpoints_probe_next_at", "endpoints", ["probe_next_at"])
    op.create_table(
        "endpoint_probes",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("endpoint_id", sa.String(length=40), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(length=200), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("recovered", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["endpoints.id"],
            name="fk_endpoint_probes_endpoint_id_endpoints",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_endpoint_probes"),
    )
    op.create_index("ix_endpoint_probes_endpoint_at", "endpoint_probes", ["endpoint_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_endpoint_probes_endpoint_at", table_name="endpoint_probes")
    op.drop_table("endpoint_probes")
    op.drop_index("ix_endpoints_probe_next_at", table_name="endpoints")
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("probe_count")
        batch.drop_column("probe_next_at")
        batch.drop_column("auto_recover")
