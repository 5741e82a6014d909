"""A bench's own database, wiped and migrated: every bench that owns one starts from this.

PostgreSQL: the database is created when missing (through the server's `postgres` database),
its `public` schema dropped and made again. SQLite: the file is deleted. Then the migrations
run. The benches WIPE what they are pointed at, so each names its own default database.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import make_url, text

from app import migrate
from app.config import normalise_database_url
from app.db import Database


def fresh_database(url: str) -> str:
    """Wipe and migrate the database at `url`; returns the URL as Kurir uses it."""
    url = normalise_database_url(url)
    if not url.startswith("postgresql"):
        Path(url.split("///", 1)[1]).unlink(missing_ok=True)
        migrate.upgrade(url)
        return url
    parsed = make_url(url)
    admin = Database(
        parsed.set(database="postgres").render_as_string(hide_password=False), pool_size=1
    )
    with admin.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not conn.execute(
            text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": parsed.database}
        ).first():
            conn.execute(text(f'CREATE DATABASE "{parsed.database}"'))
    admin.dispose()
    db = Database(url, pool_size=1)
    with db.engine.begin() as conn:
        conn.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    db.dispose()
    migrate.upgrade(url)
    return url
