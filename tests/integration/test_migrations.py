"""The migrations create the whole model, with no drift, on both databases, and keep data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import inspect, text

from app import migrate
from app.clock import utcnow
from app.db import Database
from app.models import Base, DeadLetter, DeadLetterAudit, Delivery, Endpoint, Event, Partner
from tests.support.migrations import migrated_back


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


def test_delivery_rows_are_cheap_to_rewrite_on_postgresql(migrated) -> None:
    """0012: a finished delivery leaves the due index (it holds the work in flight only), and
    `deliveries` pages keep room for a row's claimed and recorded versions (same-page
    updates); bench/deliver.py measures the WAL this saves."""
    if not migrated.db.is_postgres:
        pytest.skip("PostgreSQL only: SQLite keeps the whole index and has no fillfactor")
    with migrated.db.engine.connect() as connection:
        due = connection.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_deliveries_due'")
        ).scalar_one()
        # A partitioned parent has no storage: every partition carries the option.
        options = connection.execute(
            text(
                "SELECT array_agg(DISTINCT array_to_string(c.reloptions, ',')) "
                "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'deliveries'::regclass"
            )
        ).scalar_one()
    assert " WHERE " in due, due
    predicate = due.split(" WHERE ", 1)[1]
    for state in ("pending", "delivering", "retrying"):
        assert f"'{state}'" in predicate
    for state in ("succeeded", "dead"):
        assert f"'{state}'" not in predicate
    assert options == ["fillfactor=70"], options


def test_upgrading_a_filled_sqlite_database_keeps_every_row(tmp_path) -> None:
    """Migrations must not rebuild tables on SQLite: with foreign keys on, dropping the old
    copy of `deliveries` cascades to every attempt and dead letter."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate.upgrade(url, "0001")
    rows = [
        "INSERT INTO partners (id, uid, name, created_at, updated_at) "
        "VALUES ('ptn_1', 'acme', 'Acme', '2026-01-01', '2026-01-01')",
        "INSERT INTO endpoints (id, partner_id, url, headers, timeout_s, state, "
        "consecutive_failures, created_at, updated_at) "
        "VALUES ('ep_1', 'ptn_1', 'https://x.example', '{}', 5, 'enabled', 0, '2026-01-01', "
        "'2026-01-01')",
        "INSERT INTO events (id, partner_id, type, version, data, payload, occurred_at, "
        "created_at) VALUES ('evt_1', 'ptn_1', 't', 1, '{}', '{}', '2026-01-01', '2026-01-01')",
        "INSERT INTO deliveries (id, event_id, endpoint_id, state, attempt_count, run_attempts, "
        "run, created_at, updated_at) "
        "VALUES ('dlv_1', 'evt_1', 'ep_1', 'dead', 1, 1, 1, '2026-01-01', '2026-01-01')",
        "INSERT INTO attempts (id, delivery_id, n, started_at, duration_ms, url, "
        "request_headers, created_at) "
        "VALUES ('att_1', 'dlv_1', 1, '2026-01-01', 12, 'https://x.example', '{}', '2026-01-01')",
    ]
    old = Database(url)
    try:
        with old.engine.begin() as connection:
            for row in rows:
                connection.execute(text(row))
    finally:
        old.dispose()
    migrate.upgrade(url)
    new = Database(url)
    try:
        with new.engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM attempts")).scalar() == 1
            assert (
                connection.execute(
                    text("SELECT forced FROM deliveries WHERE id = 'dlv_1'")
                ).scalar()
                == 0
            )
    finally:
        new.dispose()


@pytest.fixture
def at_0021(migrated: Any) -> Iterator[Any]:
    """The test database migrated back to 0021 (and forward to head again afterwards)."""
    with migrated_back(migrated, "0021_cascade_indexes") as database:
        yield database


def _letter_keys(db: Database) -> list[Any]:
    keys = inspect(db.engine).get_foreign_keys("dead_letters")
    return [key for key in keys if key["referred_table"] == "deliveries"]


def test_0022_letters_name_their_delivery_without_a_key_and_keep_every_row(at_0021) -> None:
    """0022 drops the key from a dead letter to its delivery (so a partition drop leaves
    letters where they are) and keeps every letter and its audit; a downgrade puts the key
    back, and says which letters it would refuse instead of failing on them."""
    db = at_0021.db
    assert _letter_keys(db)
    with db.begin() as session:
        partner = Partner(uid="acme", name="Acme")
        session.add(partner)
        session.flush()
        endpoint = Endpoint(partner_id=partner.id, url="http://127.0.0.1:9/hook")
        at = utcnow()
        event = Event(
            partner_id=partner.id,
            type="order.created",
            version=1,
            data={},
            payload="{}",
            occurred_at=at,
            created_at=at,
        )
        session.add_all([endpoint, event])
        session.flush()
        delivery = Delivery(event_id=event.id, endpoint_id=endpoint.id, state="dead")
        session.add(delivery)
        session.flush()
        letter = DeadLetter(
            delivery=delivery,
            event_id=event.id,
            endpoint_id=endpoint.id,
            partner_id=partner.id,
            event_type=event.type,
            reason="exhausted",
        )
        session.add(letter)
        session.flush()
        session.add(
            DeadLetterAudit(dead_letter_id=letter.id, actor="ops", action="note", outcome="ok")
        )
        letter_id, delivery_id = letter.id, delivery.id

    migrate.upgrade(at_0021.url)

    assert not _letter_keys(db)
    with db.begin() as session:
        kept = session.get_one(DeadLetter, letter_id)
        assert (kept.delivery_id, kept.delivery.id) == (delivery_id, delivery_id)
        assert len(kept.audit) == 1
        # Its delivery gone (as no retention rule allows, by hand here), the letter stays.
        session.execute(text("DELETE FROM attempts WHERE delivery_id = :d"), {"d": delivery_id})
        session.execute(text("DELETE FROM deliveries WHERE id = :d"), {"d": delivery_id})
    with db.begin() as session:
        assert session.get(DeadLetter, letter_id) is not None
    with pytest.raises(RuntimeError, match="1 dead letter"):
        command.downgrade(migrate.alembic_config(at_0021.url), "0021_cascade_indexes")
    with db.begin() as session:
        session.execute(text("DELETE FROM dead_letter_audit"))
        session.execute(text("DELETE FROM dead_letters"))
    command.downgrade(migrate.alembic_config(at_0021.url), "0021_cascade_indexes")
    assert _letter_keys(db)
