"""How much each table holds: rows (exact), and on PostgreSQL its bytes on disk with indexes
and TOAST (`pg_total_relation_size`, summed over a partitioned table's partitions); SQLite
reports no per-table size.

Two statements whatever the number of tables: one `UNION ALL` of counts, one size query.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, literal, select, text, union_all
from sqlalchemy.orm import Session

from app.models import Base


@dataclass(frozen=True)
class TableStat:
    table: str
    rows: int
    bytes: int | None  # None where the database cannot say (SQLite)


def tables(session: Session) -> list[TableStat]:
    """Every table of the model, largest first (by bytes where known, else by rows)."""
    names = sorted(Base.metadata.tables)
    counts = union_all(
        *(
            select(literal(name).label("name"), func.count().label("n")).select_from(
                Base.metadata.tables[name]
            )
            for name in names
        )
    )
    rows = {name: int(n) for name, n in session.execute(counts)}
    sizes: dict[str, int] = {}
    if session.get_bind().dialect.name == "postgresql":
        sizes = {
            name: int(size)
            for name, size in session.execute(
                text(
                    # A partitioned table has no storage of its own: its partitions' sum.
                    "SELECT c.relname, COALESCE((SELECT sum(pg_total_relation_size(t.relid)) "
                    "FROM pg_partition_tree(c.oid) t), pg_total_relation_size(c.oid)) "
                    "FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relkind IN ('r', 'p') AND n.nspname = current_schema() "
                    "AND c.relname = ANY(:names)"
                ),
                {"names": names},
            )
        }
    found = [TableStat(name, rows.get(name, 0), sizes.get(name)) for name in names]
    return sorted(found, key=lambda s: (-(s.bytes or 0), -s.rows, s.table))
