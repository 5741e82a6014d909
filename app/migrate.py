"""Apply Alembic migrations from code (`kurir db upgrade`, `kurir up`, the tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

REPO_ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS_DIR = REPO_ROOT / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def check(url: str) -> None:
    """Raise if the models and the migrated schema differ (alembic's own drift check)."""
    command.check(alembic_config(url))
