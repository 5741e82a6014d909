"""What a bench phase cost PostgreSQL and Redis per delivery, and what one of each carries.

A `CostMeter` takes a snapshot before and after a phase; `cost(before, after, deliveries)`
divides the difference by the deliveries the phase made, and `ceilings` divides a stated
capacity (commits/s and WAL bandwidth of one PostgreSQL, commands/s of one Redis) by it: the
rate at which a fleet stops growing by adding workers. How each figure is taken:

- **Commits, rows** (`pg_stat_database` for the bench's own database: `xact_commit`,
  `xact_rollback`, `tup_inserted/updated/deleted`). Backends report these counters
  asynchronously: PostgreSQL 15 flushes a backend's pending counters at most once a second,
  and one that goes idle less than a second after its last flush keeps them for up to 10 s
  (`PGSTAT_IDLE_INTERVAL`); `pg_stat_force_next_flush()` reaches only the calling backend.
  So a snapshot first waits until the counters have not moved for `SETTLE_QUIET_S` (read,
  with a fresh stats snapshot each time, from a connection to the server's maintenance
  database, whose own reads land elsewhere); a phase's figures cost it about 25 s of waiting.
  The meter's one read inside the bench database per snapshot, and the polls the bench makes
  itself while waiting for outcomes (`own_commits`), are subtracted. `xact_commit` counts
  read-only transactions too (a claim that found nothing, a pool's ping).
- **Writing commits, WAL bytes, index entries** (`pg_walinspect`, when the server has it:
  the bench creates the extension in its own database). The WAL between the two snapshots'
  `pg_current_wal_lsn()` is read record by record (a temporary replication slot keeps the
  server from recycling it meanwhile); a record is the bench's when its block
  reference names the bench database (`rel <tablespace>/<database>/<relfilenode>`), and so
  are the commit and abort records of the transaction ids those records carry. Writing
  commits are those commit records: the ones that wait for a WAL flush (`synchronous_commit
  = on`), which is what a disk's commit rate limits. Index entries are the B-tree leaf
  inserts (`INSERT_LEAF`, `INSERT_POST`, leaf splits) per index: exact, partial indexes and
  deduplication included. Full-page images are counted apart: how many a phase writes depends
  on when the last checkpoint was, which the bench does not force (the server is shared).
  Autovacuum's work on the bench's tables inside the window is counted (it is a cost of the
  workload: every non-HOT update leaves a dead row and dead index entries to clean).
- **Server-wide WAL** (`pg_stat_wal`: records, full-page images, bytes; and the
  `pg_current_wal_lsn()` difference) is printed beside it as a cross-check. It includes every
  other database on the server, so on a shared server it is an upper bound, not a figure.
- **Without pg_walinspect** the WAL figures are the server-wide ones and index entries are
  estimated from `pg_stat_user_tables`: (inserts + non-HOT updates) x the table's indexes
  (an overcount where an index is partial).
- **PostgreSQL CPU**: user + system time of the server processes connected to the bench
  database (`pg_stat_activity` pids read through `psutil`: only when the server runs on this
  machine; a backend that exits within the phase is missed, so it is a floor).
- **Redis**: `INFO commandstats` differences (calls and microseconds per command, the
  meter's own `INFO` left out; commands a Lua script runs count as well as the script) and
  the server's CPU time (`INFO cpu`). The Redis must be the bench's own: the counters are
  per server.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

# PostgreSQL 15 backends flush stats at most once a second; an idle one within 10 s.
SETTLE_QUIET_S = 11.0
SETTLE_MAX_S = 40.0
# Transactions the meter itself makes in the bench database per snapshot (one read).
OWN_TXNS_PER_SNAPSHOT = 1
DB_COUNTERS = (
    "xact_commit",
    "xact_rollback",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
    "blks_hit",
    "blks_read",
)
# What must stop moving before a snapshot is taken (blks_hit moves with any read).
SETTLE_ON = DB_COUNTERS[:5]
TABLE_COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")
WAL_COUNTERS = ("wal_records", "wal_fpi", "wal_bytes")
BTREE_ENTRY_RECORDS = ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R")
DB_QUERY = (
    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, blks_hit, "
    "blks_read FROM pg_stat_database WHERE datname = %s"
)
WAL_QUERY = "SELECT wal_records, wal_fpi, wal_bytes, pg_current_wal_lsn()::text FROM pg_stat_wal"
TABLES_QUERY = (
    "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
)


@dataclass(frozen=True)
class Capacity:
    """What one server is taken to sustain; the ceilings are these divided by the cost."""

    pg_commits_per_s: float = 20_000.0
    pg_wal_mb_per_s: float = 200.0
    redis_commands_per_s: float = 100_000.0
    disk: str = "NVMe"


@dataclass(frozen=True)
class Snapshot:
    at: float
    db: dict[str, int] | None
    wal: dict[str, int] | None
    lsn: str | None
    tables: dict[str, dict[str, int]]
    backend_cpu_s: dict[int, float] | None
    redis_calls: dict[str, tuple[int, int]]
    redis_cpu_s: float


def _pg_url(url: str, database: str | None = None) -> str:
    from sqlalchemy import make_url

    parsed = make_url(url).set(drivername="postgresql")
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.render_as_string(hide_password=False)


class CostMeter:
    """Snapshots of one bench database's PostgreSQL counters and one Redis server's."""

    def __init__(self, db_url: str, redis_url: str) -> None:
        import redis

        self.redis = redis.Redis.from_url(redis_url)
        self.postgres = db_url.startswith("postgresql")
        self.walinspect = False
        self.reserving = False
        self.slot = f"kurir_bench_{os.getpid()}"
        self.inside: Any = None
        self.outside: Any = None
        self.dboid = 0
        self.indexes: dict[str, int] = {}
        if not self.postgres:
            return
        import psycopg

        self.inside = psycopg.connect(_pg_url(db_url), autocommit=True)
        self.outside = psycopg.connect(_pg_url(db_url, "postgres"), autocommit=True)
        self.database = self.inside.info.dbname
        try:
            self.inside.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            self.walinspect = True
        except psycopg.Error as exc:
            print(f"(pg_walinspect unavailable, WAL figures are server-wide: {exc})")
        row = self.inside.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        self.dboid = int(row[0])
        # Indexes per table, for the estimate when the WAL cannot be read.
        self.indexes = {
            str(name): int(n)
            for name, n in self.inside.execute(
                "SELECT c.relname, count(i.indexrelid) FROM pg_class c "
                "JOIN pg_namespace s ON s.oid = c.relnamespace AND s.nspname = 'public' "
                "LEFT JOIN pg_index i ON i.indrelid = c.oid WHERE c.relkind = 'r' "
                "GROUP BY c.relname"
            )
        }

    def close(self) -> None:
        for conn in (self.inside, self.outside):
            if conn is not None:
                conn.close()
        self.redis.close()

    # ------------------------------------------------------------------ snapshots

    def _db_counters(self) -> dict[str, int]:
        row = self.outside.execute(DB_QUERY, (self.database,)).fetchone()
        return dict(zip(DB_COUNTERS, (int(v) for v in row), strict=True))

    def _settled(self) -> dict[str, int]:
        """The database's counters once every backend has reported (they stop moving)."""
        deadline = time.monotonic() + SETTLE_MAX_S
        last = self._db_counters()
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            self.outside.execute("SELECT pg_stat_clear_snapshot()")
            now = self._db_counters()
            if any(now[k] != last[k] for k in SETTLE_ON):
                quiet_since = time.monotonic()
            last = now
            if time.monotonic() - quiet_since >= SETTLE_QUIET_S:
                break
        return last

    def snapshot(self) -> Snapshot:
        db = wal = lsn = None
        tables: dict[str, dict[str, int]] = {}
        cpu: dict[int, float] | None = None
        if self.postgres:
            db = self._settled()
            # One transaction in the bench database (OWN_TXNS_PER_SNAPSHOT).
            with self.inside.transaction():
                if self.walinspect and not self.reserving:
                    # Keep the server from recycling the WAL the phase will be read back
                    # from (a shared server checkpoints often): a temporary slot, dropped
                    # once it is read, or with this connection if the bench dies.
                    self.inside.execute(
                        "SELECT pg_create_physical_replication_slot(%s, true, true)",
                        (self.slot,),
                    )
                    self.reserving = True
                tables = {
                    str(r[0]): dict(zip(TABLE_COUNTERS, (int(v) for v in r[1:]), strict=True))
                    for r in self.inside.execute(TABLES_QUERY)
                }
                pids = [
                    int(r[0])
                    for r in self.inside.execute(
                        "SELECT pid FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ]
            cpu = _process_cpu(pids)
            row = self.outside.execute(WAL_QUERY).fetchone()
            wal = dict(zip(WAL_COUNTERS, (int(v) for v in row[:3]), strict=True))
            lsn = str(row[3])
        stats = self.redis.info("commandstats")
        calls = {
            name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
            for name, v in stats.items()
            if name != "cmdstat_info"
        }
        used = self.redis.info("cpu")
        redis_cpu = float(used["used_cpu_user"]) + float(used["used_cpu_sys"])
        return Snapshot(time.time(), db, wal, lsn, tables, cpu, calls, redis_cpu)

    # ------------------------------------------------------------------ the difference

    def cost(
        self, before: Snapshot, after: Snapshot, deliveries: int, *, own_commits: int = 0
    ) -> dict[str, Any]:
        """Per delivery: what PostgreSQL and Redis did between the two snapshots."""
        n = max(deliveries, 1)
        out: dict[str, Any] = {"deliveries": deliveries}
        if before.db is not None and after.db is not None:
            d = {k: after.db[k] - before.db[k] for k in DB_COUNTERS}
            commits = d["xact_commit"] - OWN_TXNS_PER_SNAPSHOT - own_commits
            pg: dict[str, Any] = {
                "commits": commits / n,
                "rollbacks": d["xact_rollback"] / n,
                "rows_inserted": d["tup_inserted"] / n,
                "rows_updated": d["tup_updated"] / n,
                "rows_deleted": d["tup_deleted"] / n,
                "blocks_hit": d["blks_hit"] / n,
                "blocks_read": d["blks_read"] / n,
            }
            out["pg"] = pg
            tables = _table_deltas(before.tables, after.tables)
            updates = sum(t["n_tup_upd"] for t in tables.values())
            hot = sum(t["n_tup_hot_upd"] for t in tables.values())
            pg["hot_update_share"] = hot / updates if updates else None
            estimate = sum(
                (t["n_tup_ins"] + t["n_tup_upd"] - t["n_tup_hot_upd"]) * self.indexes.get(name, 0)
                for name, t in tables.items()
            )
            pg["index_entries_estimate"] = estimate / n
            pg["tables"] = {
                name: {
                    "inserted": t["n_tup_ins"] / n,
                    "updated": t["n_tup_upd"] / n,
                    "hot_updated": t["n_tup_hot_upd"] / n,
                    "deleted": t["n_tup_del"] / n,
                    "indexes": self.indexes.get(name, 0),
                }
                for name, t in sorted(tables.items())
                if any(t.values())
            }
            assert before.wal is not None
            assert after.wal is not None
            assert before.lsn is not None
            assert after.lsn is not None
            server = {k: after.wal[k] - before.wal[k] for k in WAL_COUNTERS}
            lsn_bytes = self._lsn_diff(before.lsn, after.lsn)
            pg["server_wal_bytes"] = lsn_bytes / n
            pg["server_wal_records"] = server["wal_records"] / n
            pg["server_wal_fpi"] = server["wal_fpi"] / n
            pg["server_wal_stat_bytes"] = server["wal_bytes"] / n
            pg["wal_source"] = "server-wide"
            pg["writing_commits"] = None
            pg["wal_bytes"] = lsn_bytes / n
            pg["wal_records"] = server["wal_records"] / n
            pg["wal_fpi"] = server["wal_fpi"] / n
            pg["index_entries"] = None
            if self.walinspect:
                try:
                    pg.update(self._own_wal(before.lsn, after.lsn, n))
                except Exception as exc:  # noqa: BLE001 - segments recycled, etc.: fall back
                    print(f"(WAL could not be read back, server-wide figures used: {exc})")
                finally:
                    self._release()
            if before.backend_cpu_s is not None and after.backend_cpu_s is not None:
                used = sum(
                    cpu - before.backend_cpu_s.get(pid, 0.0)
                    for pid, cpu in after.backend_cpu_s.items()
                )
                pg["backend_cpu_ms"] = used * 1000 / n
            else:
                pg["backend_cpu_ms"] = None
        calls = {
            name: (
                c - before.redis_calls.get(name, (0, 0))[0],
                u - before.redis_calls.get(name, (0, 0))[1],
            )
            for name, (c, u) in after.redis_calls.items()
        }
        calls = {k: v for k, v in calls.items() if v[0] > 0}
        total = sum(c for c, _ in calls.values())
        out["redis"] = {
            "commands": total / n,
            "usec": sum(u for _, u in calls.values()) / n,
            "cpu_ms": (after.redis_cpu_s - before.redis_cpu_s) * 1000 / n,
            "top": {
                name: round(c / n, 3)
                for name, (c, _) in sorted(calls.items(), key=lambda kv: -kv[1][0])[:6]
            },
        }
        return out

    def _release(self) -> None:
        """Let the server recycle WAL again."""
        if self.reserving:
            self.inside.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
            self.reserving = False

    def _lsn_diff(self, start: str, end: str) -> int:
        row = self.outside.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, start)).fetchone()
        return int(row[0])

    def _own_wal(self, start: str, end: str, n: int) -> dict[str, Any]:
        """The bench database's own WAL between two positions, record by record."""
        rows = self.inside.execute(
            """
            WITH rec AS (
                SELECT resource_manager AS rm, record_type AS kind, xid::text::bigint AS xid,
                       record_length AS len, fpi_length AS fpi,
                       substring(block_ref FROM 'rel \\d+/(\\d+)/')::bigint AS dbo,
                       substring(block_ref FROM 'rel \\d+/\\d+/(\\d+)')::bigint AS rel
                FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
            ),
            ours AS (SELECT * FROM rec WHERE dbo = %(dboid)s),
            xids AS (SELECT DISTINCT xid FROM ours WHERE xid <> 0),
            ends AS (
                SELECT rec.* FROM rec JOIN xids USING (xid)
                WHERE rec.dbo IS NULL AND rec.rm = 'Transaction'
            )
            SELECT x.rel, x.rm, x.kind, count(*), sum(x.len), sum(x.fpi)
            FROM (SELECT * FROM ours UNION ALL SELECT * FROM ends) x
            GROUP BY 1, 2, 3
            """,
            {"start": start, "end": end, "dboid": self.dboid},
        ).fetchall()
        names = self._relations()
        by_rel: dict[str, int] = {}
        by_kind: dict[str, int] = {}
        entries: dict[str, int] = {}
        total = fpi = records = commits = 0
        for rel, rm, kind, count, length, fpi_len in rows:
            total += int(length)
            fpi += int(fpi_len)
            records += int(count)
            if rm == "Transaction" and str(kind).startswith("COMMIT"):
                commits += int(count)
            name = names.get(int(rel), f"rel {rel}") if rel is not None else "(commit records)"
            by_rel[name] = by_rel.get(name, 0) + int(length)
            kind_name = f"{rm}/{kind}"
            by_kind[kind_name] = by_kind.get(kind_name, 0) + int(length)
            if rm == "Btree" and str(kind).split("+")[0] in BTREE_ENTRY_RECORDS:
                entries[name] = entries.get(name, 0) + int(count)
        top = sorted(by_rel.items(), key=lambda kv: -kv[1])[:8]
        return {
            "wal_source": "this database (pg_walinspect)",
            "writing_commits": commits / n,
            "wal_bytes": total / n,
            "wal_fpi_bytes": fpi / n,
            "wal_records": records / n,
            "index_entries": sum(entries.values()) / n,
            "index_entries_by_index": {
                k: round(v / n, 3) for k, v in sorted(entries.items(), key=lambda kv: -kv[1])
            },
            "wal_bytes_by_relation": {k: round(v / n, 1) for k, v in top},
            "wal_bytes_by_record": {
                k: round(v / n, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])[:8]
            },
        }

    def _relations(self) -> dict[int, str]:
        """relfilenode -> "table" or "table.index" (a TOAST table as its owner's)."""
        return {
            int(node): str(name)
            for node, name in self.inside.execute(
                """
                SELECT c.relfilenode,
                       CASE WHEN i.indrelid IS NOT NULL THEN t.relname || '.' || c.relname
                            WHEN o.relname IS NOT NULL THEN o.relname || ' (toast)'
                            ELSE c.relname END
                FROM pg_class c
                LEFT JOIN pg_index i ON i.indexrelid = c.oid
                LEFT JOIN pg_class t ON t.oid = i.indrelid
                LEFT JOIN pg_class o ON o.reltoastrelid = c.oid
                WHERE c.relfilenode <> 0
                """
            )
        }


def _table_deltas(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    return {
        name: {k: v - before.get(name, {}).get(k, 0) for k, v in counters.items()}
        for name, counters in after.items()
    }


def _process_cpu(pids: list[int]) -> dict[int, float] | None:
    """CPU seconds of the server processes with these pids, when they run on this machine."""
    import psutil

    found: dict[int, float] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if not proc.name().startswith("postgres"):
                continue
            times = proc.cpu_times()
        except (psutil.Error, OSError):
            continue
        found[pid] = times.user + times.system
    return found if found or not pids else None


def ceilings(cost: dict[str, Any], capacity: Capacity) -> dict[str, Any]:
    """Deliveries per second one PostgreSQL and one Redis carry at `capacity`."""
    out: dict[str, Any] = {}
    pg = cost.get("pg")
    if pg is not None:
        commits = pg["writing_commits"] if pg["writing_commits"] is not None else pg["commits"]
        out["pg_by_commits_per_s"] = capacity.pg_commits_per_s / commits if commits else None
        wal = pg["wal_bytes"]
        out["pg_by_wal_per_s"] = capacity.pg_wal_mb_per_s * 1e6 / wal if wal else None
        cpu = pg["backend_cpu_ms"]
        out["pg_per_core_by_cpu_per_s"] = 1000 / cpu if cpu else None
    redis = cost["redis"]
    out["redis_by_commands_per_s"] = (
        capacity.redis_commands_per_s / redis["commands"] if redis["commands"] else None
    )
    out["redis_per_core_by_cpu_per_s"] = 1000 / redis["cpu_ms"] if redis["cpu_ms"] else None
    return out


def report(name: str, cost: dict[str, Any], capacity: Capacity) -> str:
    """The cost and the ceilings as a few printed lines."""
    lines = [f"  {name}: PostgreSQL and Redis work per delivery ({cost['deliveries']:,})"]
    pg = cost.get("pg")
    if pg is not None:
        writing = pg["writing_commits"]
        lines.append(
            f"    commits {pg['commits']:.3f}"
            + (f" (writing {writing:.3f})" if writing is not None else "")
            + f"; rows inserted {pg['rows_inserted']:.2f}, updated {pg['rows_updated']:.2f}"
            f", deleted {pg['rows_deleted']:.2f}"
            + (f" (HOT {pg['hot_update_share']:.0%})" if pg["hot_update_share"] is not None else "")
        )
        entries = pg["index_entries"]
        lines.append(
            f"    WAL {pg['wal_bytes']:,.0f} B in {pg['wal_records']:.1f} records"
            + (
                f", of it full-page images {pg['wal_fpi_bytes']:,.0f} B"
                if entries is not None
                else ""
            )
            + f" [{pg['wal_source']}; server-wide {pg['server_wal_bytes']:,.0f} B]"
            + "; index entries "
            + (f"{entries:.2f}" if entries is not None else "n/a")
            + f" (estimate from row counts {pg['index_entries_estimate']:.2f})"
        )
        if pg.get("index_entries_by_index"):
            lines.append(
                "    index entries by index: "
                + ", ".join(f"{k} {v}" for k, v in pg["index_entries_by_index"].items())
            )
        for key, label in (
            ("wal_bytes_by_relation", "relation"),
            ("wal_bytes_by_record", "record"),
        ):
            if pg.get(key):
                lines.append(
                    f"    WAL bytes by {label}: "
                    + ", ".join(f"{k} {v:,.0f}" for k, v in pg[key].items())
                )
        if pg["backend_cpu_ms"] is not None:
            lines.append(f"    PostgreSQL backends' CPU {pg['backend_cpu_ms']:.3f} ms")
    redis = cost["redis"]
    lines.append(
        f"    Redis {redis['commands']:.2f} commands ({redis['usec']:.1f} us executing, "
        f"server CPU {redis['cpu_ms']:.3f} ms): "
        + ", ".join(f"{k} {v}" for k, v in redis["top"].items())
    )
    c = ceilings(cost, capacity)
    parts = []
    if pg is not None:
        parts.append(
            f"one PostgreSQL {_rate(c['pg_by_commits_per_s'])}/s at "
            f"{capacity.pg_commits_per_s:,.0f} commits/s, {_rate(c['pg_by_wal_per_s'])}/s at "
            f"{capacity.pg_wal_mb_per_s:,.0f} MB/s of WAL ({capacity.disk})"
            + (
                f", {_rate(c['pg_per_core_by_cpu_per_s'])}/s per server core"
                if c["pg_per_core_by_cpu_per_s"]
                else ""
            )
        )
    parts.append(
        f"one Redis {_rate(c['redis_by_commands_per_s'])}/s at "
        f"{capacity.redis_commands_per_s:,.0f} commands/s"
        + (
            f" ({_rate(c['redis_per_core_by_cpu_per_s'])}/s by its CPU here)"
            if c["redis_per_core_by_cpu_per_s"]
            else ""
        )
    )
    lines.append("    ceiling, deliveries: " + "; ".join(parts))
    return "\n".join(lines)


def _rate(value: float | None) -> str:
    return f"{value:,.0f}" if value else "n/a"


def rounded(cost: dict[str, Any], capacity: Capacity) -> dict[str, Any]:
    """The cost with its ceilings, rounded for the bench's JSON line."""

    def r(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 3 if abs(value) < 100 else 0)
        if isinstance(value, dict):
            return {k: r(v) for k, v in value.items()}
        return value

    return r({**cost, "ceilings": ceilings(cost, capacity)})
