"""Endpoint ownership challenge: `verify`, the challenge's hash, sends and the state
`pending_verification` (the state column widens to hold it)

Revision ID: 0015_verify
Revises: 0014_probes
Create Date: 2026-12-05 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_verify"
down_revision: str | None = "0014_probes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("endpoints") as batch:
        batch.alter_column("state", existing_type=sa.String(length=16), type_=sa.String(length=32))
        batch.add_column(
            sa.Column("verify", sa.Boolean(), nullable=False, server_default=sa.text("false"))
        )
        batch.add_column(sa.Column("verified_at", _WHEN, nullable=True))
        batch.add_column(sa.Column("verification_started_at", _WHEN, nullable=True))
        batch.add_column(sa.Column("challenge_hash", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("challenge_encrypted", sa.Text(), nullable=True))
        batch.add_column(sa.Column("challenge_sent_at", _WHEN, nullable=True))
        batch.add_column(
            sa.Column(
                "challenge_attempts", sa.Integer(), nullable=False, server_default=sa.text("0")
            )
        )
        batch.add_column(sa.Column("challenge_next_at", _WHEN, nullable=True))
        batch.add_column(sa.Column("challenge_error", sa.String(length=200), nullable=True))


def downgrade() -> None:
    # The code before this revision knows no endpoint waiting for verification: it would
    # neither send it the challenge nor ever release what waits for it.
    waiting = op.get_bind().scalar(
        sa.text(
            "SELECT COUNT(*) FROM endpoints WHERE state = 'pending_verification' "
            "AND deleted_at IS NULL"
        )
    )
    if waiting:
        raise RuntimeError(
            f"{waiting} endpoint(s) wait for verification: let them verify, disable or delete "
            "them before downgrading"
        )
    with op.batch_alter_table("endpoints") as batch:
        for column in (
            "challenge_error",
            "challenge_next_at",
            "challenge_attempts",
            "challenge_sent_at",
            "challenge_encrypted",
            "challenge_hash",
            "verification_started_at",
            "verified_at",
            "verify",
        ):
            batch.drop_column(column)
        batch.alter_column("state", existing_type=sa.String(length=32), type_=sa.String(length=16))
