"""Alembic environment: the URL comes from Kurir's Settings, the target from app.models."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection

from app.config import load_settings
from app.db import make_engine
from app.lifecycle import partitions
from app.models import Base

config = context.config
target_metadata = Base.metadata


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Skip objects that exist only on some dialects (e.g. the pg_trgm index) elsewhere, and,
    on PostgreSQL, the partitions of the history tables and the unique indexes and foreign
    keys made on each partition instead of the parent (app.lifecycle.partitions)."""
    dialect = context.get_context().dialect.name
    if dialect == "postgresql":
        if type_ == "table" and reflected and name and partitions.is_partition_name(name):
            return False
        if type_ in ("index", "unique_constraint") and name in partitions.LOCAL_UNIQUE_NAMES:
            return False
        if type_ == "foreign_key_constraint" and name in partitions.LOCAL_FOREIGN_KEYS:
            return False
        # PostgreSQL keeps a copy of a foreign key per partition of the table it points to.
        if (
            type_ == "foreign_key_constraint"
            and reflected
            and partitions.is_partition_name(obj.referred_table.name)
        ):
            return False
    dialects = getattr(obj, "info", {}).get("dialects")
    return not dialects or dialect in dialects


def _url() -> str:
    return config.attributes.get("url") or load_settings().resolved_database_url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url(), pool_size=1)
    try:
        with engine.connect() as connection:
            if connection.dialect.name == "sqlite":
                # Batch mode rebuilds a table (copy, drop, rename); with foreign keys on, the
                # drop would cascade into every referencing row. The pragma only takes effect
                # outside a transaction, hence the driver connection (in autocommit).
                connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
