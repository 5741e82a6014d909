"""Attempts refer to deliveries by a foreign key on each partition, not one on the parents

With one key from `attempts` to `deliveries`, retention's locked step paid for it twice:
`DETACH PARTITION` of a deliveries day checked all of `attempts` for rows pointing into the
day (a join reading the day's whole primary key: 23 ms for 100,000 rows cached, 250 ms
cold), and dropping an attempts day removed the key's triggers from `deliveries` whole, so
the attempts' own drops held every publish and claim. Each attempts day now refers to the
deliveries day it mirrors, and the default partition to the whole table: the same rule (an
attempt's delivery is in its day's partition, or in the default once that day is gone), held
where dropping a day touches only that day.

The keys are made `NOT VALID`: every row was checked by the parent's key, which this one
only narrows to the partition the delivery's id routes to; validating would scan every
attempt under the locks of the key it replaces. New rows are checked as before.

Revision ID: 0023_attempt_keys_per_day
Revises: 0022_letter_delivery_no_fk
Create Date: 2026-12-07 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

from app.lifecycle import partitions
from app.lifecycle.partitions import ATTEMPTS

revision: str = "0023_attempt_keys_per_day"
down_revision: str | None = "0022_letter_delivery_no_fk"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PARENT_KEY = "fk_attempts_delivery_id_deliveries"


def upgrade() -> None:
    connection = op.get_bind()
    if not partitions.is_partitioned(connection, ATTEMPTS.table):
        return
    connection.execute(text(f"ALTER TABLE attempts DROP CONSTRAINT {_PARENT_KEY}"))
    for part in partitions.partitions(connection, ATTEMPTS):
        partitions.local_key(connection, ATTEMPTS, part.name, part.start, validate=False)
    default = partitions.default_name(ATTEMPTS)
    partitions.local_key(connection, ATTEMPTS, default, None, validate=False)


def downgrade() -> None:
    connection = op.get_bind()
    if not partitions.is_partitioned(connection, ATTEMPTS.table):
        return
    names = [p.name for p in partitions.partitions(connection, ATTEMPTS)]
    for name in [*names, partitions.default_name(ATTEMPTS)]:
        connection.execute(
            text(f"ALTER TABLE {name} DROP CONSTRAINT IF EXISTS {partitions.key_name(name)}")
        )
    connection.execute(
        text(
            f"ALTER TABLE attempts ADD CONSTRAINT {_PARENT_KEY} FOREIGN KEY (delivery_id) "
            "REFERENCES deliveries (id) ON DELETE CASCADE"
        )
    )
