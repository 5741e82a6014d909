"""PostgreSQL: a deliveries day whose kept rows are many, dropped without moving them while
the tables are held.

The plain drop (`app.lifecycle.drop`) copies a day's kept rows aside and back under its
locks, about 0.035 ms a kept row with every publish and claim waiting: 0.7 s a day at 2 M
deliveries a day with 1 % kept, 3.5 s at 10 M. Here the kept rows go, before any lock, into
tables of their own that then take the day's place as its partitions (`deliveries_k<day>`,
`attempts_k<day>`), and the locked step is catalog changes and the few rows written since:

1. **Log** (`_log_changes`): a change-log table, and a row trigger on each of the day's
   partitions (migration 0024) that logs the delivery of every row written to it from now on.
2. **Copy**, unlocked: the kept deliveries and their attempts, into tables made like the
   parents (their indexes, so `ATTACH` finds them made), with a check of the day's range
   (so `ATTACH` need not scan them), the partitions' own unique indexes and foreign keys
   (made `NOT VALID`, then validated without blocking writers, so `ATTACH` reuses them), and a
   check on each default partition that it holds none of the range (so `ATTACH` need not
   scan the default either). The log is applied once, still unlocked.
3. **Swap**, under the drop's locks: the late look of `drop` adds the rows that turned into
   ones to keep; those and the deliveries logged since step 2 are copied again from the day;
   the day is detached and the copies attached for its range.

What is kept is exactly what the plain drop keeps: the rows step 1 of `drop` found, those
its late look finds, each as it is at the swap. A kept partition then holds only rows that
must stay; the row-level purge deletes them as they finish, and `drop` folds the partition
into the default once few are left.

A day takes this way only when it keeps at least `SWAP_MIN_ROWS` (below, copying under the
locks costs less than the extra statements) and when no attempt of it waits in the default
partition (an earlier attempts-only drop moved it there; the default could then not be
shown free of the range). Anything left by a run that failed or died (triggers, tables,
checks) is undone before a day is tried again, and the triggers do nothing once their log
is gone.
"""

# SQL here names partitions, logs and constraints made by this package (never from input);
# every value is a bound parameter.
# ruff: noqa: S608

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, text

from app.lifecycle import giveway, partitions
from app.lifecycle.partitions import ATTEMPTS, CHANGES, DELIVERIES, KEPT, Partition

# Kept deliveries from which a day is swapped rather than copied under the locks: the swap's
# locked step is about 10 ms whatever it keeps, the plain drop's about 0.035 ms a kept row.
SWAP_MIN_ROWS = 2000
# Row triggers on the day's partitions, logging into the table named as their argument.
TRIGGER = "kurir_retention_changes"
_FUNCTIONS = {
    DELIVERIES.table: "kurir_retention_changed_delivery",
    ATTEMPTS.table: "kurir_retention_changed_attempt",
}


@dataclass(frozen=True)
class Shadow:
    """A day being swapped: its partitions, the copies that will take their place, and the
    change log (with the last entry applied to the copies)."""

    day: Partition
    applied: int
    # Per table, its columns in the parent's order: rows are copied by name, whatever order
    # an older partition holds them in.
    columns: tuple[tuple[str, str], ...] = ()

    @property
    def deliveries(self) -> str:
        return partitions.name_for(DELIVERIES, self.day.start, KEPT)

    @property
    def attempts(self) -> str:
        return partitions.name_for(ATTEMPTS, self.day.start, KEPT)

    @property
    def changes(self) -> str:
        return partitions.name_for(DELIVERIES, self.day.start, CHANGES)

    def source(self, table: str) -> str:
        return self.day.of(DELIVERIES if table == DELIVERIES.table else ATTEMPTS)

    def copy(self, table: str) -> str:
        return self.deliveries if table == DELIVERIES.table else self.attempts

    def columns_of(self, table: str) -> str:
        return dict(self.columns)[table]

    def copying(self, table: str, where: str) -> str:
        """SQL copying the rows of the day's partition of `table` that `where` picks into
        its copy."""
        columns = self.columns_of(table)
        return (
            f"INSERT INTO {self.copy(table)} ({columns}) "
            f"SELECT {columns} FROM {self.source(table)} WHERE {where}"
        )


def _columns(connection: Connection, table: str) -> str:
    names = connection.execute(
        text(
            "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = to_regclass(:t) "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ),
        {"t": table},
    ).scalars()
    return ", ".join(names)


def default_check(table: str, day: Partition) -> str:
    """The name of the check that a default partition holds none of the day's range."""
    return f"{table}_default_not_{day.start:%Y%m%d}"


def worth_it(connection: Connection, day: Partition) -> bool:
    """Whether the day is swapped: a day partition (not a kept one) keeping at least
    `SWAP_MIN_ROWS` deliveries (`keep_ids`, as step 1 of `drop` found them), with its
    attempts partition made and none of its attempts in the default partition."""
    if day.sort != partitions.DAY or not partitions.exists(connection, day.of(ATTEMPTS)):
        return False
    kept = connection.execute(text("SELECT count(*) FROM keep_ids")).scalar_one()
    if kept < SWAP_MIN_ROWS:
        return False
    aside = connection.execute(
        text(
            f"SELECT 1 FROM {partitions.default_name(ATTEMPTS)} "
            "WHERE delivery_id >= :low AND delivery_id < :high LIMIT 1"
        ),
        {"low": day.low, "high": day.high},
    ).scalar()
    return aside is None


def _briefly(connection: Connection, statements: list[str], sleep: Callable[[float], None]) -> None:
    """Statements that take a lock writers wait on (a trigger on a day, a key on `events`, a
    check on a default partition) in one short transaction that gives way to traffic
    (`giveway.locked`).

    Raises:
        giveway.NotGranted: not granted in time.
    """

    def run() -> None:
        for statement in statements:
            connection.execute(text(statement))

    giveway.locked(connection, run, sleep)


def undo(connection: Connection, day: Partition, sleep: Callable[[float], None]) -> None:
    """What a swap of the day left, undone: its triggers on the day's partitions, the checks
    on the default partitions, the copies and the log. Run before a day is prepared or
    dropped the plain way, and when a swap is given up. A copy already attached (the swap
    committed) is a partition now and stays."""
    with connection.begin():
        statements = _undoing(connection, Shadow(day, 0))
    if statements:
        # Dropping a copy takes `events` whole (its keys' triggers there): briefly too.
        _briefly(connection, statements, sleep)


def _undoing(connection: Connection, shadow: Shadow) -> list[str]:
    """The statements undoing what a swap left: triggers, default partitions' checks, copies
    not attached and the log."""
    day = shadow.day
    statements = [
        f"DROP TRIGGER {TRIGGER} ON {shadow.source(table)}"
        for table in (DELIVERIES.table, ATTEMPTS.table)
        if _has_trigger(connection, shadow.source(table))
    ]
    for spec in (DELIVERIES, ATTEMPTS):
        default, check = partitions.default_name(spec), default_check(spec.table, day)
        if _has_constraint(connection, default, check):
            statements.append(f"ALTER TABLE {default} DROP CONSTRAINT {check}")
    for name in (shadow.attempts, shadow.deliveries):
        attached = connection.execute(
            text("SELECT relispartition FROM pg_class WHERE oid = to_regclass(:n)"), {"n": name}
        ).scalar()
        if attached is False:  # a copy not attached (None: there is none)
            statements.append(f"DROP TABLE {name}")
    if partitions.exists(connection, shadow.changes):
        statements.append(f"DROP TABLE {shadow.changes}")
    return statements


def _has_trigger(connection: Connection, table: str) -> bool:
    return bool(
        connection.execute(
            text("SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass(:t) AND tgname = :n"),
            {"t": table, "n": TRIGGER},
        ).scalar()
    )


def _has_constraint(connection: Connection, table: str, name: str) -> bool:
    return bool(
        connection.execute(
            text("SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass(:t) AND conname = :c"),
            {"t": table, "c": name},
        ).scalar()
    )


def prepare(
    connection: Connection, day: Partition, sleep: Callable[[float], None] = time.sleep
) -> Shadow:
    """Steps 1 and 2, unlocked but for brief locks given way to traffic: the day's kept rows
    (`keep_ids`) copied into tables ready to take its place, kept up to date by the log.

    Raises:
        giveway.NotGranted: a brief lock was not granted in time; what was made is undone.
    """
    undo(connection, day, sleep)
    with connection.begin():
        columns = tuple((t, _columns(connection, t)) for t in (DELIVERIES.table, ATTEMPTS.table))
    shadow = Shadow(day, 0, columns)
    try:
        _log_changes(connection, shadow, sleep)
        _copy(connection, shadow)
        _keys_and_checks(connection, shadow, sleep)
        with connection.begin():
            return apply_changes(connection, shadow, late=None)
    except BaseException:
        connection.rollback()
        undo(connection, day, sleep)
        raise


def _log_changes(connection: Connection, shadow: Shadow, sleep: Callable[[float], None]) -> None:
    """The change log, and the triggers that fill it: from their commit on, every row written
    to the day names its delivery there (before the copy reads the day, so no write between
    the two is missed)."""
    with connection.begin():
        connection.execute(
            text(
                f"CREATE UNLOGGED TABLE {shadow.changes} "
                "(seq bigserial PRIMARY KEY, delivery_id text NOT NULL)"
            )
        )
    statements = []
    for table in (DELIVERIES.table, ATTEMPTS.table):
        source = shadow.source(table)
        statements += [
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE ON {source} "
            f"FOR EACH ROW EXECUTE FUNCTION {_FUNCTIONS[table]}('{shadow.changes}')",
            # Also under `session_replication_role = replica` (`triggers.skip`).
            f"ALTER TABLE {source} ENABLE ALWAYS TRIGGER {TRIGGER}",
        ]
    _briefly(connection, statements, sleep)


def _copy(connection: Connection, shadow: Shadow) -> None:
    """The kept deliveries and their attempts, copied into tables made like their parents,
    each with a check of the day's range; then the partitions' own indexes and the attempts'
    key to the copied deliveries."""
    day = shadow.day
    with connection.begin():
        connection.execute(text("CREATE INDEX IF NOT EXISTS keep_ids_id ON keep_ids (id)"))
        connection.execute(text("ANALYZE keep_ids"))
        for spec in (DELIVERIES, ATTEMPTS):
            copy = shadow.copy(spec.table)
            connection.execute(
                text(f"CREATE TABLE {copy} (LIKE {spec.table} INCLUDING ALL) {spec.storage}")
            )
            connection.execute(
                text(
                    f"ALTER TABLE {copy} ADD CONSTRAINT {copy}_range "
                    f"CHECK ({spec.column} >= '{day.low}' AND {spec.column} < '{day.high}')"
                )
            )
        connection.execute(
            text(shadow.copying(DELIVERIES.table, "id IN (SELECT id FROM keep_ids)"))
        )
        connection.execute(
            text(
                shadow.copying(
                    ATTEMPTS.table, f"delivery_id IN (SELECT id FROM {shadow.deliveries})"
                )
            )
        )
        partitions.local_indexes(connection, DELIVERIES, shadow.deliveries)
        connection.execute(
            text(
                f"ALTER TABLE {shadow.attempts} ADD CONSTRAINT "
                f"{partitions.key_name(shadow.attempts)} FOREIGN KEY (delivery_id) "
                f"REFERENCES {shadow.deliveries} (id) ON DELETE CASCADE"
            )
        )
        connection.execute(text(f"ANALYZE {shadow.deliveries}, {shadow.attempts}"))


def _parent_keys(connection: Connection) -> list[tuple[str, str]]:
    """The foreign keys of `deliveries` (to events, endpoints): name and definition."""
    rows = connection.execute(
        text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE contype = 'f' AND conrelid = 'deliveries'::regclass ORDER BY conname"
        )
    )
    return [(row[0], row[1]) for row in rows]


def _keys_and_checks(
    connection: Connection, shadow: Shadow, sleep: Callable[[float], None]
) -> None:
    """The copy's keys as the parent's (so `ATTACH` takes them as its own, not checking each
    row again) and each default partition's check that it holds none of the day (so `ATTACH`
    need not scan it): made `NOT VALID` under a brief lock (a key takes `events` from
    writers while it is made), then validated under a lock writers pass."""
    day = shadow.day
    with connection.begin():
        keys = _parent_keys(connection)
    made: list[tuple[str, str]] = [(shadow.deliveries, name) for name, _ in keys]
    statements = [
        f'ALTER TABLE {shadow.deliveries} ADD CONSTRAINT "{name}" {definition} NOT VALID'
        for name, definition in keys
    ]
    for spec in (DELIVERIES, ATTEMPTS):
        default, check = partitions.default_name(spec), default_check(spec.table, day)
        statements.append(
            f"ALTER TABLE {default} ADD CONSTRAINT {check} "
            f"CHECK ({spec.column} < '{day.low}' OR {spec.column} >= '{day.high}') NOT VALID"
        )
        made.append((default, check))
    _briefly(connection, statements, sleep)
    for table, name in made:
        with connection.begin():
            connection.execute(text(f'ALTER TABLE {table} VALIDATE CONSTRAINT "{name}"'))


def apply_changes(connection: Connection, shadow: Shadow, late: str | None) -> Shadow:
    """The copies brought up to date for the deliveries logged since the last time (and,
    under the locks, `late`: a table of ids the late look added to `keep_ids`): each such
    delivery's rows deleted from the copies and, if it is kept, copied again from the day
    with its attempts. In the caller's transaction; the shadow with the log's last entry."""
    last = connection.execute(
        text(f"SELECT coalesce(max(seq), 0) FROM {shadow.changes}")
    ).scalar_one()
    union = f" UNION SELECT id FROM {late}" if late else ""
    connection.execute(
        text(
            "CREATE TEMP TABLE changed_ids ON COMMIT DROP AS "
            f"SELECT DISTINCT delivery_id AS id FROM {shadow.changes} "
            f"WHERE seq > :applied AND seq <= :last{union}"
        ),
        {"applied": shadow.applied, "last": last},
    )
    changed = "ARRAY(SELECT id FROM changed_ids)"
    for statement in (
        f"DELETE FROM {shadow.attempts} WHERE delivery_id = ANY({changed})",
        f"DELETE FROM {shadow.deliveries} WHERE id = ANY({changed})",
        shadow.copying(
            DELIVERIES.table, f"id = ANY({changed}) AND id IN (SELECT id FROM keep_ids)"
        ),
        shadow.copying(
            ATTEMPTS.table,
            "delivery_id = ANY(ARRAY(SELECT id FROM changed_ids "
            f"WHERE id IN (SELECT id FROM {shadow.deliveries})))",
        ),
    ):
        connection.execute(text(statement))
    connection.execute(text("DROP TABLE changed_ids"))
    return Shadow(shadow.day, last, shadow.columns)


def swap_locked(connection: Connection, shadow: Shadow, late: str) -> None:
    """Step 3, under the drop's locks (`triggers.skip` set: the rows copied go with their
    parents): the copies brought up to date, the day detached and the copies attached in
    its place, the default partitions' checks dropped (the range is a partition's again)."""
    apply_changes(connection, shadow, late)
    for spec in (ATTEMPTS, DELIVERIES):
        partitions.detach(connection, spec.table, shadow.source(spec.table))
    for spec in (DELIVERIES, ATTEMPTS):
        connection.execute(
            text(
                f"ALTER TABLE {spec.table} ATTACH PARTITION {shadow.copy(spec.table)} "
                f"FOR VALUES FROM ('{shadow.day.low}') TO ('{shadow.day.high}')"
            )
        )
        connection.execute(
            text(
                f"ALTER TABLE {partitions.default_name(spec)} "
                f"DROP CONSTRAINT {default_check(spec.table, shadow.day)}"
            )
        )


def kept_rows(connection: Connection, shadow: Shadow, last_attempt: str) -> tuple[int, int]:
    """After the swap: deliveries kept, and kept attempts that step 1 counted (made before
    it, so not beyond `last_attempt`)."""
    deliveries = connection.execute(text(f"SELECT count(*) FROM {shadow.deliveries}")).scalar_one()
    attempts = connection.execute(
        text(f"SELECT count(*) FROM {shadow.attempts} WHERE id <= :last"), {"last": last_attempt}
    ).scalar_one()
    return int(deliveries), int(attempts)
