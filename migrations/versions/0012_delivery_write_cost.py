"""delivery write cost (PostgreSQL): the due index holds only deliveries still being worked
on, and `deliveries` pages keep room for a row's later versions

Every delivery row is written three times (published, claimed, recorded), never as a HOT
update (`state` is indexed). Two changes make those writes cheaper without changing what is
stored or read (measured with `bench/deliver.py`, see docs/benchmarks.md):

- `ix_deliveries_due` becomes partial (pending, delivering, retrying): the sweeper and the
  dashboard only ever ask it for those states, so a delivery that succeeds or is parked adds
  no entry to it, and the index stays the size of the work in flight instead of growing with
  the history. (Their states are bound parameters: PostgreSQL proves the predicate when it
  plans with the values, and a generic plan, which could not use the index, costs more and
  is not chosen.) SQLite keeps the whole index: it uses a partial index only for queries
  that repeat its WHERE term word for word.
- `fillfactor = 70` on `deliveries`: the claim's and the outcome's new row versions fit on
  the row's own page, so each is logged as a same-page update (changed bytes only, no extra
  lock record, one page dirtied instead of two). The cost: new pages are filled to 70 %.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "state IN ('pending', 'delivering', 'retrying')"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_deliveries_due", table_name="deliveries")
    op.create_index(
        "ix_deliveries_due",
        "deliveries",
        ["state", "next_attempt_at"],
        postgresql_where=sa.text(LIVE),
    )
    op.execute("ALTER TABLE deliveries SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE deliveries RESET (fillfactor)")
    op.drop_index("ix_deliveries_due", table_name="deliveries")
    op.create_index("ix_deliveries_due", "deliveries", ["state", "next_attempt_at"])
