"""PostgreSQL: the layout of the partitioned history tables, and making partitions ahead.

`deliveries` is range-partitioned on its primary key `id` and `attempts` on `delivery_id`,
one partition per UTC day. Ids are ULIDs (creation time first), so a day is an id range
(`dlv_<day start>` to `dlv_<next day start>`), and an attempt lives in the partition of its
delivery's day: dropping one day of deliveries and the same day of attempts leaves no
attempt without its delivery. A `…_default` partition catches any row outside the partitions
made (rows retention moved aside, or ids from a skewed clock).

The foreign key of `attempts` is made per partition (migration 0023): a day's attempts refer
to that day's deliveries partition, the default partition to the whole of `deliveries`. One
key on the parents would make every `DETACH` of a deliveries day check all of `attempts` for
rows pointing into it (a join reading the day's whole primary key, under the drop's locks),
and every drop of an attempts day take `deliveries` whole, publishes and claims with it.
Dead letters name their delivery without a key (migration 0022).

A day whose kept rows are many is not emptied into the default partition when it expires:
they are copied into a table of their own, which takes the day's place as its partition
(`…_k<day>`, "kept"; `app.lifecycle.swap`). It holds only rows that must stay, shrinks as
the row-level purge takes them once finished, and goes once few are left (`drop`).

Unique indexes that do not hold the partition key cannot be enforced across partitions by
PostgreSQL; those of `deliveries` are made on each partition instead (`LOCAL_INDEXES`). A
publish writes an event's deliveries in one transaction, in the same millisecond, so one
event's deliveries share a day and "one delivery per (event, endpoint)" still holds.

SQLite keeps plain tables; nothing here runs there.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from app.ids import id_floor

# One partition per day: measured against weekly ones (docs/lifecycle.md), a day is dropped
# in well under a second and 30–40 partitions cost the planner a fraction of a millisecond.
PERIOD = timedelta(days=1)
# Days made ahead of today on every scheduler run, so a scheduler down for a week still
# finds today's partition there.
AHEAD_DAYS = 7

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(?P<table>[a-z_]+)_(?P<sort>[pkc])(?P<day>\d{8})$")
# The sorts of partition of a range: a day as made ahead, or what a day kept at its drop;
# and, never a partition, the log of rows written to a day while its kept rows are copied.
DAY = "p"
KEPT = "k"
CHANGES = "c"


@dataclass(frozen=True)
class Spec:
    """One partitioned table: its partition key and the id prefix of that key's values."""

    table: str
    column: str
    prefix: str
    # Storage options of each partition (a partitioned parent cannot carry them).
    storage: str = ""
    # The table this one's key column refers to, by a foreign key made on each partition.
    refers_to: str | None = None


DELIVERIES = Spec("deliveries", "id", "dlv", "WITH (fillfactor = 70)")
ATTEMPTS = Spec("attempts", "delivery_id", "dlv", refers_to="deliveries")
# Parents before children: deliveries are referenced by attempts.
SPECS: tuple[Spec, ...] = (DELIVERIES, ATTEMPTS)
# The names of their day and kept partitions (and of a day's change log), as a PostgreSQL
# regular expression.
DAY_NAME_PATTERN = f"^({'|'.join(s.table for s in SPECS)})_[pkc][0-9]{{8}}$"

# Per partition, the unique indexes PostgreSQL cannot hold on the parent (formatted with the
# partition's name). They mirror uq_deliveries_event_endpoint and ix_deliveries_ordering.
LOCAL_INDEXES: dict[str, tuple[str, ...]] = {
    "deliveries": (
        "CREATE UNIQUE INDEX IF NOT EXISTS {name}_event_endpoint ON {name} (event_id, endpoint_id)",
        "CREATE UNIQUE INDEX IF NOT EXISTS {name}_ordering "
        "ON {name} (endpoint_id, ordering_key, ordering_seq) WHERE ordering_seq IS NOT NULL",
    ),
}
# Their names in the model: on PostgreSQL the migrations' drift check leaves them out.
LOCAL_UNIQUE_NAMES = frozenset({"uq_deliveries_event_endpoint", "ix_deliveries_ordering"})
# The model's foreign keys that PostgreSQL holds per partition instead (`local_key`).
LOCAL_FOREIGN_KEYS = frozenset({"fk_attempts_delivery_id_deliveries"})


@dataclass(frozen=True)
class Partition:
    spec: Spec
    name: str
    start: datetime
    sort: str = DAY

    def of(self, spec: Spec) -> str:
        """The name of the partition of `spec`'s table for the same range and sort (a
        deliveries day's attempts)."""
        return name_for(spec, self.start, self.sort)

    @property
    def end(self) -> datetime:
        return self.start + PERIOD

    @property
    def low(self) -> str:
        return id_floor(self.spec.prefix, self.start)

    @property
    def high(self) -> str:
        return id_floor(self.spec.prefix, self.end)


def day_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def name_for(spec: Spec, start: datetime, sort: str = DAY) -> str:
    return f"{spec.table}_{sort}{start:%Y%m%d}"


def default_name(spec: Spec) -> str:
    return f"{spec.table}_default"


def is_partition_name(name: str) -> bool:
    """Whether a table is one of the partitions (the drift check must not see them)."""
    found = _NAME.match(name)
    if found is not None:
        return any(found["table"] == s.table for s in SPECS)
    return any(name == default_name(s) for s in SPECS)


def is_partitioned(connection: Connection, table: str) -> bool:
    """Whether `table` is a partitioned parent (PostgreSQL after migration 0020)."""
    if connection.dialect.name != "postgresql":
        return False
    found = connection.execute(
        text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table}
    ).scalar()
    return found == "p"


def partitions(connection: Connection, spec: Spec, sort: str = DAY) -> list[Partition]:
    """The day partitions of a table (or with `sort=KEPT` its kept partitions), oldest first
    (the default partition left out)."""
    names = connection.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:t)"
        ),
        {"t": spec.table},
    ).scalars()
    found = []
    for name in names:
        match = _NAME.match(name)
        if match is not None and match["sort"] == sort:
            start = datetime.strptime(match["day"], "%Y%m%d").replace(tzinfo=UTC)
            found.append(Partition(spec, name, start, sort))
    return sorted(found, key=lambda p: p.start)


def create(
    connection: Connection, spec: Spec, start: datetime, parent: str | None = None
) -> Partition:
    """The partition of the day starting at `start`, made if missing (with its local
    unique indexes and foreign key). `parent`: another parent than the table itself
    (migration 0020 builds the partitioned table beside the old one, keys on the parents)."""
    part = Partition(spec, name_for(spec, day_start(start)), day_start(start))
    connection.execute(
        text(
            f"CREATE TABLE IF NOT EXISTS {part.name} PARTITION OF {parent or spec.table} "
            f"FOR VALUES FROM ('{part.low}') TO ('{part.high}') {spec.storage}"
        )
    )
    local_indexes(connection, spec, part.name)
    if parent is None:
        local_key(connection, spec, part.name, part.start)
    return part


def create_default(connection: Connection, spec: Spec, parent: str | None = None) -> str:
    name = default_name(spec)
    connection.execute(
        text(
            f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {parent or spec.table} "
            f"DEFAULT {spec.storage}"
        )
    )
    local_indexes(connection, spec, name)
    if parent is None:
        local_key(connection, spec, name, None)
    return name


def key_name(name: str) -> str:
    """The name of a partition's own foreign key."""
    return f"{name}_fkey"


def local_key(
    connection: Connection,
    spec: Spec,
    name: str,
    start: datetime | None,
    *,
    validate: bool = True,
) -> str | None:
    """The partition's own foreign key, made if missing: to the referred table's partition of
    the same day (`start`), or to the whole table for the default partition or a day whose
    referred partition is missing. None: the table has no such key, or its parent holds one
    (before migration 0023). `validate=False` makes it `NOT VALID`: the migration's partitions,
    whose rows the parent's key had checked (a day's attempts refer only into that day)."""
    if spec.refers_to is None or _parent_has_key(connection, spec):
        return None
    target = spec.refers_to
    if start is not None:
        same_day = name_for(_spec_of(spec.refers_to), start)
        if exists(connection, same_day):
            target = same_day
    key = key_name(name)
    made = connection.execute(
        text("SELECT 1 FROM pg_constraint WHERE conname = :k AND conrelid = to_regclass(:t)"),
        {"k": key, "t": name},
    ).scalar()
    if not made:
        connection.execute(
            text(
                f"ALTER TABLE {name} ADD CONSTRAINT {key} FOREIGN KEY ({spec.column}) "
                f"REFERENCES {target} (id) ON DELETE CASCADE{'' if validate else ' NOT VALID'}"
            )
        )
    return key


def exists(connection: Connection, name: str) -> bool:
    """Whether a table of that name exists (a partition, a detached one, a copy)."""
    return connection.execute(text("SELECT to_regclass(:n)"), {"n": name}).scalar() is not None


def detach(connection: Connection, table: str, name: str) -> None:
    """The partition detached and its foreign keys dropped (under a drop's locks: catalog
    changes only). Its files are removed after the commit (`drop._remove_detached`):
    unlinking a day's files at the commit held every lock another 20 ms a day of 100,000
    deliveries; and dropping a table whose keys are gone takes no lock on what they named."""
    connection.execute(text(f"ALTER TABLE {table} DETACH PARTITION {name}"))
    keys = connection.execute(
        text(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = to_regclass(:t)"
        ),
        {"t": name},
    ).scalars()
    for key in list(keys):
        connection.execute(text(f'ALTER TABLE {name} DROP CONSTRAINT "{key}"'))


def referred_by_key(connection: Connection, name: str) -> list[str]:
    """The tables a partition's own foreign keys refer to (dropping it takes them whole)."""
    return list(
        connection.execute(
            text(
                "SELECT confrelid::regclass::text FROM pg_constraint "
                "WHERE contype = 'f' AND conrelid = to_regclass(:t) ORDER BY 1"
            ),
            {"t": name},
        ).scalars()
    )


def _parent_has_key(connection: Connection, spec: Spec) -> bool:
    return bool(
        connection.execute(
            text(
                "SELECT 1 FROM pg_constraint WHERE contype = 'f' AND conrelid = to_regclass(:t) "
                "AND confrelid = to_regclass(:r)"
            ),
            {"t": spec.table, "r": spec.refers_to},
        ).scalar()
    )


def _spec_of(table: str) -> Spec:
    return next(s for s in SPECS if s.table == table)


def local_indexes(connection: Connection, spec: Spec, name: str) -> None:
    for ddl in LOCAL_INDEXES.get(spec.table, ()):
        connection.execute(text(ddl.format(name=name)))


def create_ahead(connection: Connection, now: datetime, days: int = AHEAD_DAYS) -> list[str]:
    """Today's partitions and the next `days` days', those missing made; the names made.

    A no-op where the tables are not partitioned (SQLite, or PostgreSQL before 0020).
    """
    made: list[str] = []
    for spec in SPECS:
        if not is_partitioned(connection, spec.table):
            continue
        have = {p.name for p in partitions(connection, spec)}
        today = day_start(now)
        for offset in range(days + 1):
            start = today + offset * PERIOD
            if name_for(spec, start) in have:
                continue
            try:
                with connection.begin_nested():
                    made.append(create(connection, spec, start).name)
            except DBAPIError:
                # The default partition holds rows of that day (ids from a clock ahead):
                # PostgreSQL refuses the new range; they stay in the default, still served.
                log.warning(
                    "partition not made", extra={"table": spec.table, "day": f"{start:%Y-%m-%d}"}
                )
    return made
