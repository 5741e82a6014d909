"""PostgreSQL: deliveries and attempts range-partitioned by day (app.lifecycle.partitions)

The tables are rebuilt beside the old ones: a partitioned copy (one partition per day from
the oldest row's day to a week ahead, and a default partition), rows copied in id order,
the old tables dropped, the new ones renamed, then keys, indexes and foreign keys made.
Writers wait meanwhile (the old tables are locked against writes, reads go on); the figure
per million rows is in docs/lifecycle.md. SQLite: nothing changes.

Revision ID: 0020_partitions
Revises: 0019_search
Create Date: 2026-12-06 00:30:00
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from alembic import op
from sqlalchemy import Connection, text

from app.ids import moment_of
from app.lifecycle import partitions

revision: str = "0020_partitions"
down_revision: str | None = "0019_search"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

log = logging.getLogger("alembic.runtime.migration")

_DUE = (
    "CREATE INDEX ix_deliveries_due ON deliveries (state, next_attempt_at) "
    "WHERE state IN ('pending', 'delivering', 'retrying')"
)
_ENDPOINT_STATE = "CREATE INDEX ix_deliveries_endpoint_state ON deliveries (endpoint_id, state)"
_FOREIGN_KEYS = (
    "ALTER TABLE deliveries ADD CONSTRAINT fk_deliveries_event_id_events "
    "FOREIGN KEY (event_id) REFERENCES events (id) ON DELETE CASCADE",
    "ALTER TABLE deliveries ADD CONSTRAINT fk_deliveries_endpoint_id_endpoints "
    "FOREIGN KEY (endpoint_id) REFERENCES endpoints (id) ON DELETE CASCADE",
    "ALTER TABLE attempts ADD CONSTRAINT fk_attempts_delivery_id_deliveries "
    "FOREIGN KEY (delivery_id) REFERENCES deliveries (id) ON DELETE CASCADE",
    "ALTER TABLE dead_letters ADD CONSTRAINT fk_dead_letters_delivery_id_deliveries "
    "FOREIGN KEY (delivery_id) REFERENCES deliveries (id) ON DELETE CASCADE",
)
# Rows per INSERT … SELECT: bounded statements, and progress in the log.
_COPY_BATCH = 200_000


def _oldest_day(connection: Connection) -> datetime:
    oldest = connection.execute(text("SELECT min(id) FROM deliveries")).scalar()
    made = moment_of(oldest) if oldest else None
    return partitions.day_start(made or datetime.now(UTC))


def _copy(connection: Connection, source: str, target: str, key: str) -> int:
    """Every row of `source` into `target`, in key order, batch by batch."""
    copied, after = 0, ""
    while True:
        last = connection.execute(
            text(
                f"WITH moved AS (INSERT INTO {target} SELECT * FROM {source} "  # noqa: S608
                f"WHERE {key} > :after ORDER BY {key} LIMIT {_COPY_BATCH} RETURNING {key}) "
                f"SELECT max({key}), count(*) FROM moved"
            ),
            {"after": after},
        ).one()
        if not last[1]:
            return copied
        copied += int(last[1])
        after = last[0]
        log.info("copied %d rows into %s", copied, target)


def upgrade() -> None:
    connection = op.get_bind()
    if connection.dialect.name != "postgresql":
        return
    started = time.perf_counter()
    connection.execute(text("LOCK TABLE deliveries, attempts, dead_letters IN SHARE MODE"))
    first = _oldest_day(connection)
    last = partitions.day_start(datetime.now(UTC)) + partitions.AHEAD_DAYS * partitions.PERIOD
    for spec in partitions.SPECS:
        new = f"{spec.table}_new"
        connection.execute(
            text(
                f"CREATE TABLE {new} (LIKE {spec.table} INCLUDING DEFAULTS) "
                f"PARTITION BY RANGE ({spec.column})"
            )
        )
        day = first
        while day <= last:
            partitions.create(connection, spec, day, parent=new)
            day += partitions.PERIOD
        partitions.create_default(connection, spec, parent=new)
    copied = _copy(connection, "deliveries", "deliveries_new", "id")
    copied += _copy(connection, "attempts", "attempts_new", "id")
    connection.execute(text("DROP TABLE attempts"))
    connection.execute(
        text("ALTER TABLE dead_letters DROP CONSTRAINT fk_dead_letters_delivery_id_deliveries")
    )
    connection.execute(text("DROP TABLE deliveries"))
    connection.execute(text("ALTER TABLE deliveries_new RENAME TO deliveries"))
    connection.execute(text("ALTER TABLE attempts_new RENAME TO attempts"))
    connection.execute(text("ALTER TABLE deliveries ADD CONSTRAINT pk_deliveries PRIMARY KEY (id)"))
    # The partition key must be in every unique key: (delivery_id, n) already holds it.
    connection.execute(
        text("ALTER TABLE attempts ADD CONSTRAINT pk_attempts PRIMARY KEY (id, delivery_id)")
    )
    connection.execute(
        text("ALTER TABLE attempts ADD CONSTRAINT uq_attempts_delivery_n UNIQUE (delivery_id, n)")
    )
    connection.execute(text(_DUE))
    connection.execute(text(_ENDPOINT_STATE))
    for ddl in _FOREIGN_KEYS:
        connection.execute(text(ddl))
    connection.execute(text("ANALYZE deliveries"))
    connection.execute(text("ANALYZE attempts"))
    log.info(
        "partitioned deliveries and attempts: %d rows in %.1f s",
        copied,
        time.perf_counter() - started,
    )


def downgrade() -> None:
    connection = op.get_bind()
    if connection.dialect.name != "postgresql":
        return
    connection.execute(text("LOCK TABLE deliveries, attempts, dead_letters IN SHARE MODE"))
    connection.execute(
        text(
            "CREATE TABLE deliveries_old (LIKE deliveries INCLUDING DEFAULTS) "
            "WITH (fillfactor = 70)"
        )
    )
    connection.execute(text("CREATE TABLE attempts_old (LIKE attempts INCLUDING DEFAULTS)"))
    _copy(connection, "deliveries", "deliveries_old", "id")
    _copy(connection, "attempts", "attempts_old", "id")
    connection.execute(text("DROP TABLE attempts"))
    connection.execute(
        text("ALTER TABLE dead_letters DROP CONSTRAINT fk_dead_letters_delivery_id_deliveries")
    )
    connection.execute(text("DROP TABLE deliveries"))
    connection.execute(text("ALTER TABLE deliveries_old RENAME TO deliveries"))
    connection.execute(text("ALTER TABLE attempts_old RENAME TO attempts"))
    connection.execute(text("ALTER TABLE deliveries ADD CONSTRAINT pk_deliveries PRIMARY KEY (id)"))
    connection.execute(
        text(
            "ALTER TABLE deliveries ADD CONSTRAINT uq_deliveries_event_endpoint "
            "UNIQUE (event_id, endpoint_id)"
        )
    )
    connection.execute(
        text(
            "CREATE UNIQUE INDEX ix_deliveries_ordering ON deliveries "
            "(endpoint_id, ordering_key, ordering_seq) WHERE ordering_seq IS NOT NULL"
        )
    )
    connection.execute(text("ALTER TABLE attempts ADD CONSTRAINT pk_attempts PRIMARY KEY (id)"))
    connection.execute(
        text("ALTER TABLE attempts ADD CONSTRAINT uq_attempts_delivery_n UNIQUE (delivery_id, n)")
    )
    connection.execute(text(_DUE))
    connection.execute(text(_ENDPOINT_STATE))
    for ddl in _FOREIGN_KEYS:
        connection.execute(text(ddl))
