"""The database layer beyond the schema: a failing statement's bound values (which may hold
secrets) never reach a log or an error message; DATABASE_URL's `prepare_threshold` reaches
psycopg (tests/integration/test_pgbouncer.py shows why it matters)."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from app.accounts import create_api_key
from app.db import Database
from app.models import ApiKey


def test_bound_values_never_reach_logs_or_error_messages(runtime, caplog):
    """A failing statement holding a secret: SQLAlchemy used to print its parameters."""
    secret = "whsec_this-must-not-be-logged"
    with runtime.db.begin() as session:
        create_api_key(session, "svc", ["read"])
        existing = session.scalar(select(ApiKey.key_hash))
    engine_log = logging.getLogger("sqlalchemy.engine")
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    engine_log.setLevel(logging.INFO)
    try:
        with pytest.raises(IntegrityError) as info, runtime.db.begin() as session:
            session.execute(
                insert(ApiKey).values(
                    id="key_dup", name=secret, prefix="x", key_hash=existing, scopes=[]
                )
            )
    finally:
        engine_log.setLevel(logging.WARNING)
    assert secret not in str(info.value)
    assert secret not in caplog.text
    assert "api_keys" in str(info.value)  # the statement is still there to debug with


@pytest.mark.parametrize("backend", ["postgresql"])
@pytest.mark.parametrize(
    ("query", "threshold"), [("", 5), ("?prepare_threshold=none", None)], ids=["default", "none"]
)
def test_the_url_sets_when_psycopg_prepares_statements(backend, migrated, query, threshold):
    """psycopg's default (prepare on a query's 5th run) unless the URL says otherwise; the
    parameter is Kurir's to read, and never reaches libpq (which would refuse it)."""
    db = Database(migrated.url + query, pool_size=1)
    try:
        with db.engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert driver is not None and driver.prepare_threshold == threshold
    finally:
        db.dispose()
