"""A test database taken back to an earlier revision for a migration test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from alembic import command

from app import migrate


@contextmanager
def migrated_back(migrated: Any, revision: str) -> Iterator[Any]:
    """`migrated` downgraded to `revision`, and upgraded to head again afterwards (other
    tests share the database)."""
    command.downgrade(migrate.alembic_config(migrated.url), revision)
    try:
        yield migrated
    finally:
        migrate.upgrade(migrated.url)
