"""Ed25519 signatures: an endpoint's signature kind, and each signing key's public half

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-12 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "endpoints",
        sa.Column("signature", sa.String(length=8), nullable=False, server_default="hmac"),
    )
    op.add_column("endpoint_secrets", sa.Column("public_key", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # The code before this revision reads every key as an HMAC secret: it could not sign
    # with an Ed25519 one. Refuse rather than leave endpoints that fail every delivery.
    ed25519 = op.get_bind().scalar(
        sa.text("SELECT COUNT(*) FROM endpoints WHERE signature = 'ed25519' AND deleted_at IS NULL")
    )
    if ed25519:
        raise RuntimeError(
            f"{ed25519} endpoint(s) sign with Ed25519: rotate them to HMAC "
            '(POST .../secret/rotate {"signature": "hmac"}) and let the overlap pass, '
            "or delete them, before downgrading"
        )
    with op.batch_alter_table("endpoint_secrets") as batch:
        batch.drop_column("public_key")
    with op.batch_alter_table("endpoints") as batch:
        batch.drop_column("signature")
