"""The one migration creates the whole model, with no drift, on both databases."""

from __future__ import annotations

from sqlalchemy import inspect

from app import migrate
from app.models import Base


def test_upgrade_head_then_check_reports_no_drift(migrated) -> None:
    migrate.upgrade(migrated.url)  # idempotent at head
    migrate.check(migrated.url)  # raises alembic.util.CommandError on drift
    tables = set(inspect(migrated.db.engine).get_table_names())
    assert set(Base.metadata.tables) <= tables


def test_open_dead_letter_is_unique_per_delivery(migrated) -> None:
    indexes = {ix["name"]: ix for ix in inspect(migrated.db.engine).get_indexes("dead_letters")}
    assert indexes["uq_dead_letters_open_delivery"]["unique"]
    if migrated.db.is_postgres:
        assert "ix_dead_letters_search_trgm" in indexes
