"""Trigger functions that log the rows written to a day while retention copies its kept rows

A day whose kept rows are many is dropped by copying them, before any lock, into a table that
then takes the day's place (`app.lifecycle.swap`). Rows written to the day meanwhile (a
retrying delivery claimed and recorded, an attempt added) are logged by these functions, one
row-level trigger on each of the day's partitions, so that the locked step brings only those
up to date. Each logs the delivery id the row belongs to into the table named by the
trigger's argument, and does nothing once that table is gone (a retention process that died
leaves its triggers on a day that is still used).

The downgrade puts the rows of the kept partitions that swapped days left back through their
parents (into the default partitions, as the plain drop does), and drops those partitions.

PostgreSQL only: SQLite keeps plain tables.

Revision ID: 0024_retention_change_log
Revises: 0023_attempt_keys_per_day
Create Date: 2026-12-07 13:00:00
"""

# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Sequence

from alembic import op
from sqlalchemy import text

from app.lifecycle import partitions

revision: str = "0024_retention_change_log"
down_revision: str | None = "0023_attempt_keys_per_day"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Per function, the column of the row that names its delivery.
_FUNCTIONS = {
    "kurir_retention_changed_delivery": "id",
    "kurir_retention_changed_attempt": "delivery_id",
}


def _body(column: str) -> str:
    # The column is one of `_FUNCTIONS`'; the table logged into is quoted by `format`.
    return f"""
CREATE OR REPLACE FUNCTION {{name}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass(TG_ARGV[0]) IS NOT NULL THEN
        IF TG_OP = 'DELETE' THEN
            EXECUTE format('INSERT INTO %I (delivery_id) VALUES ($1)', TG_ARGV[0])
                USING OLD.{column};
        ELSE
            EXECUTE format('INSERT INTO %I (delivery_id) VALUES ($1)', TG_ARGV[0])
                USING NEW.{column};
        END IF;
    END IF;
    RETURN NULL;
END
$$"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, column in _FUNCTIONS.items():
        op.execute(text(_body(column).format(name=name)))


def downgrade() -> None:
    connection = op.get_bind()
    if connection.dialect.name != "postgresql":
        return
    kept = {
        spec: partitions.partitions(connection, spec, partitions.KEPT) for spec in partitions.SPECS
    }
    for spec in reversed(partitions.SPECS):
        for part in kept[spec]:
            partitions.detach(connection, spec.table, part.name)
    for spec in partitions.SPECS:
        for part in kept[spec]:
            connection.execute(text(f"INSERT INTO {spec.table} SELECT * FROM {part.name}"))
    for spec in reversed(partitions.SPECS):
        for part in kept[spec]:
            connection.execute(text(f"DROP TABLE {part.name}"))
    for name in _FUNCTIONS:
        op.execute(text(f"DROP FUNCTION IF EXISTS {name}() CASCADE"))
