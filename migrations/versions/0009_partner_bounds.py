"""partner bounds: endpoints remember who disabled them, audit rows and resend jobs remember
the partner a partner-bound actor acted for, resend jobs the key that started them

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-11 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# An actor name written by a partner's own credentials, for rows written before this
# revision: its portal (`portal:<uid>`), or one of its keys whose name no other key shares
# (a name shared with an admin key stays unattributed, and so is shown as "publisher").
_AUDIT_BACKFILL = """
UPDATE audit_records SET actor_partner_id = partner_id
WHERE partner_id IS NOT NULL AND (
  actor = 'portal:' || (SELECT p.uid FROM partners p WHERE p.id = audit_records.partner_id)
  OR (EXISTS (SELECT 1 FROM api_keys k WHERE k.partner_id = audit_records.partner_id
              AND audit_records.actor = 'key:' || k.name)
      AND NOT EXISTS (SELECT 1 FROM api_keys k
                      WHERE (k.partner_id IS NULL OR k.partner_id <> audit_records.partner_id)
                        AND audit_records.actor = 'key:' || k.name)))
"""
_LETTER_AUDIT_BACKFILL = """
UPDATE dead_letter_audit SET actor_partner_id = (
  SELECT d.partner_id FROM dead_letters d WHERE d.id = dead_letter_audit.dead_letter_id)
WHERE EXISTS (
  SELECT 1 FROM dead_letters d JOIN partners p ON p.id = d.partner_id
  WHERE d.id = dead_letter_audit.dead_letter_id AND (
    dead_letter_audit.actor = 'portal:' || p.uid
    OR (EXISTS (SELECT 1 FROM api_keys k WHERE k.partner_id = d.partner_id
                AND dead_letter_audit.actor = 'key:' || k.name)
        AND NOT EXISTS (SELECT 1 FROM api_keys k
                        WHERE (k.partner_id IS NULL OR k.partner_id <> d.partner_id)
                          AND dead_letter_audit.actor = 'key:' || k.name))))
"""


def upgrade() -> None:
    # Plain ADD COLUMN on both databases (no batch-mode table copy on SQLite, see 0002).
    op.add_column("endpoints", sa.Column("disabled_by", sa.String(length=16), nullable=True))
    op.add_column(
        "audit_records", sa.Column("actor_partner_id", sa.String(length=40), nullable=True)
    )
    op.add_column(
        "dead_letter_audit", sa.Column("actor_partner_id", sa.String(length=40), nullable=True)
    )
    op.add_column("bulk_operations", sa.Column("key_id", sa.String(length=40), nullable=True))
    op.add_column(
        "bulk_operations", sa.Column("actor_partner_id", sa.String(length=40), nullable=True)
    )

    op.execute(sa.text(_AUDIT_BACKFILL))
    op.execute(sa.text(_LETTER_AUDIT_BACKFILL))
    # A portal's job names its partner; a key's job is left to no key (names are ambiguous):
    # it stays readable by operators.
    op.execute(
        sa.text(
            "UPDATE bulk_operations SET actor_partner_id = (SELECT p.id FROM partners p "
            "WHERE 'portal:' || p.uid = bulk_operations.actor) "
            "WHERE substr(actor, 1, 7) = 'portal:'"
        )
    )
    # Disabled endpoints: by health after failures (its reasons), by a partner when its last
    # `endpoint.disabled` audit row was written by the partner, else by an operator (whom a
    # partner then asks, rather than undo what may have been an operator's decision).
    op.execute(
        sa.text(
            "UPDATE endpoints SET disabled_by = 'health' WHERE state = 'disabled' "
            "AND (substr(disabled_reason, 1, 8) = 'failing:' "
            "OR substr(disabled_reason, 1, 5) = 'gone:')"
        )
    )
    op.execute(
        sa.text(
            "UPDATE endpoints SET disabled_by = CASE WHEN ("
            "SELECT a.actor_partner_id FROM audit_records a WHERE a.subject_id = endpoints.id "
            "AND a.action = 'endpoint.disabled' ORDER BY a.id DESC LIMIT 1) IS NOT NULL "
            "THEN 'partner' ELSE 'operator' END "
            "WHERE state = 'disabled' AND disabled_by IS NULL"
        )
    )


def downgrade() -> None:
    op.drop_column("bulk_operations", "actor_partner_id")
    op.drop_column("bulk_operations", "key_id")
    op.drop_column("dead_letter_audit", "actor_partner_id")
    op.drop_column("audit_records", "actor_partner_id")
    op.drop_column("endpoints", "disabled_by")
