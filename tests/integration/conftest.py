"""Fixtures shared by the integration tests (a module's own fixture of the same name wins)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app import runtime as runtime_mod
from app.lifecycle import triggers
from app.runtime import Runtime
from tests.support.fuzz import seeded  # noqa: F401 - re-exported fixture
from tests.support.publish import acme  # noqa: F401 - re-exported fixture


@pytest.fixture
def make_rt(settings: Any, migrated: Any, redis_client: Any) -> Iterator[Callable[..., Runtime]]:
    """Build a Runtime with setting overrides (compressed schedules, thresholds), installed
    as the process's runtime; closed at the end of the test."""
    made: list[Runtime] = []

    def build(**overrides: Any) -> Runtime:
        rt = Runtime(settings.with_overrides(**overrides), database=migrated.db)
        runtime_mod.install(rt)
        made.append(rt)
        return rt

    yield build
    for rt in made:
        rt.close()


@pytest.fixture(params=["triggers skipped", "triggers fired"])
def fk_triggers(request: Any, monkeypatch: Any, runtime: Runtime) -> str:
    """Retention (the drop's put-back, the events batches' deletes) skips foreign-key
    triggers on PostgreSQL where the role may, as the tests' role may; both ways are
    tested. SQLite's always fire."""
    if request.param == "triggers fired":
        if not runtime.db.is_postgres:
            pytest.skip("SQLite: its triggers always fire")
        monkeypatch.setattr(triggers, "skip", lambda _connection: False)
    return str(request.param)
