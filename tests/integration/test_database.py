"""The database layer beyond the schema: a failing statement's bound values (which may hold
secrets) never reach a log or an error message."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from app.accounts import create_api_key
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
