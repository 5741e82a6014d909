"""How much each table holds: rows, and on PostgreSQL its bytes on disk with indexes and
TOAST (`pg_total_relation_size`, summed over a partitioned table's partitions); SQLite
reports no per-table size.

Rows are counted exactly where that is cheap. On PostgreSQL a table the statistics put at
`EXACT_BELOW` rows or more is shown by that estimate instead (marked so): `count(*)` reads
the whole table, which over a month of 10 million deliveries a day (300 million rows of
`deliveries`, more of `attempts`) takes minutes, on every view of the storage page. The
estimate is the statistics' live rows, kept up to date by every commit (so without
autovacuum too), or where those were reset (a crash) the planner's row count.

Two statements whatever the number of tables: sizes and estimates (PostgreSQL), then one
`UNION ALL` of the counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, literal, select, text, union_all
from sqlalchemy.orm import Session

from app.models import Base

# Estimated rows from which a PostgreSQL table's rows are estimated, not counted: counting
# 100,000 rows costs a few tens of milliseconds.
EXACT_BELOW = 100_000
# A table `c`'s leaves: a partitioned table's partitions (it has no storage of its own), or a
# plain table itself (`pg_partition_tree` lists nothing for one).
_LEAVES = (
    "(SELECT t.relid FROM pg_partition_tree(c.oid) t WHERE t.isleaf "
    "UNION ALL SELECT c.oid WHERE c.relkind = 'r') AS l"
)


@dataclass(frozen=True)
class TableStat:
    table: str
    rows: int
    bytes: int | None  # None where the database cannot say (SQLite)
    exact: bool = True  # False: `rows` is PostgreSQL's estimate


def _counts(session: Session, names: list[str]) -> dict[str, int]:
    if not names:
        return {}
    counts = union_all(
        *(
            select(literal(name).label("name"), func.count().label("n")).select_from(
                Base.metadata.tables[name]
            )
            for name in names
        )
    )
    return {name: int(n) for name, n in session.execute(counts)}


def _postgres_sizes(session: Session, names: list[str]) -> dict[str, tuple[int, int]]:
    """Per table: estimated rows and bytes, each summed over its partitions."""
    found = session.execute(
        text(
            "SELECT c.relname, "  # noqa: S608 - `_LEAVES` is a constant, no input
            "(SELECT coalesce(sum(CASE WHEN coalesce(s.n_live_tup, 0) > 0 OR p.reltuples <= 0 "
            "THEN coalesce(s.n_live_tup, 0) ELSE p.reltuples END), 0) "
            f"FROM {_LEAVES} JOIN pg_class p ON p.oid = l.relid "
            "LEFT JOIN pg_stat_user_tables s ON s.relid = l.relid), "
            f"(SELECT coalesce(sum(pg_total_relation_size(l.relid)), 0) FROM {_LEAVES}) "
            "FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname = current_schema() "
            "AND c.relname = ANY(:names)"
        ),
        {"names": names},
    )
    return {name: (int(rows), int(size)) for name, rows, size in found}


def tables(session: Session) -> list[TableStat]:
    """Every table of the model, largest first (by bytes where known, else by rows)."""
    names = sorted(Base.metadata.tables)
    if session.get_bind().dialect.name != "postgresql":
        counted = _counts(session, names)
        found = [TableStat(name, counted.get(name, 0), None) for name in names]
    else:
        sizes = _postgres_sizes(session, names)
        estimated = {name for name, (rows, _) in sizes.items() if rows >= EXACT_BELOW}
        counted = _counts(session, [name for name in names if name not in estimated])
        found = [
            TableStat(
                name,
                sizes[name][0] if name in estimated else counted.get(name, 0),
                sizes[name][1] if name in sizes else None,
                exact=name not in estimated,
            )
            for name in names
        ]
    return sorted(found, key=lambda s: (-(s.bytes or 0), -s.rows, s.table))


def live_rows(session: Session, names: list[str]) -> dict[str, int] | None:
    """PostgreSQL's estimate of each table's rows (summed over its partitions), one
    statement; None on SQLite, where counting is the only way."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    found = _postgres_sizes(session, names)
    return {name: found[name][0] if name in found else 0 for name in names}


def shares(session: Session, table: str, column: str) -> dict[str, float]:
    """PostgreSQL: how the statistics divide a table's live rows between the values of
    `column`: per partition its live rows times each common value's frequency found by its last
    ANALYZE, summed. A partition never analyzed adds nothing. `table` and `column` are the
    model's names, never input."""
    found = session.execute(
        text(
            "SELECT m.value, sum(m.freq * CASE WHEN coalesce(s.n_live_tup, 0) > 0 "  # noqa: S608
            "OR p.reltuples <= 0 THEN coalesce(s.n_live_tup, 0) ELSE p.reltuples END) "
            f"FROM pg_class c CROSS JOIN LATERAL {_LEAVES} JOIN pg_class p ON p.oid = l.relid "
            "LEFT JOIN pg_stat_user_tables s ON s.relid = l.relid "
            "JOIN pg_stats st ON st.schemaname = current_schema() AND st.tablename = p.relname "
            "AND st.attname = :column AND NOT st.inherited "
            "CROSS JOIN LATERAL unnest(st.most_common_vals::text::text[], st.most_common_freqs) "
            "AS m(value, freq) "
            "WHERE c.relname = :table AND c.relnamespace = "
            "(SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
            "GROUP BY m.value"
        ),
        {"table": table, "column": column},
    )
    return {str(value): float(n) for value, n in found}
