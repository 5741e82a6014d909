"""Dead letters name their delivery without a foreign key

A partition drop must first take out of the day every row that refers into it, because
`DETACH PARTITION` checks that none does: with this key, every letter of a delivery kept
back (1 % of a day in the month bench) was copied, deleted and put back under the drop's
locks, its trigram index the dearest part, and the check joined `dead_letters` with the
day's whole primary key. The key guarded nothing the retention rules do not: a letter's
delivery is kept as long as the letter (and with its event), and a letter is deleted with
its event, endpoint or partner through their keys, which stay. Its index stays too (the
letter pages and the purge look letters up by delivery).

Revision ID: 0022_letter_delivery_no_fk
Revises: 0021_cascade_indexes
Create Date: 2026-12-06 23:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0022_letter_delivery_no_fk"
down_revision: str | None = "0021_cascade_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "fk_dead_letters_delivery_id_deliveries"


def upgrade() -> None:
    with op.batch_alter_table("dead_letters") as batch:
        batch.drop_constraint(_NAME, type_="foreignkey")


def downgrade() -> None:
    # Letters whose delivery is gone could not be kept under the key: none can be, by the
    # retention rules, but a database edited by hand is checked here, not by a failed ALTER.
    orphans = op.get_bind().exec_driver_sql(
        "SELECT count(*) FROM dead_letters l WHERE NOT EXISTS "
        "(SELECT 1 FROM deliveries d WHERE d.id = l.delivery_id)"
    )
    missing = orphans.scalar()
    if missing:
        raise RuntimeError(
            f"{missing} dead letter(s) name a delivery that is gone: delete them before "
            "downgrading (the foreign key would refuse them)"
        )
    with op.batch_alter_table("dead_letters") as batch:
        batch.create_foreign_key(_NAME, "deliveries", ["delivery_id"], ["id"], ondelete="CASCADE")
