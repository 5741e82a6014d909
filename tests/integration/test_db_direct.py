"""Statements run on the driver (app.db_direct) behave as SQLAlchemy's own: their errors are
SQLAlchemy's, a dead connection is thrown away and not handed out again, and a connection goes
back to the pool in transaction mode."""

from __future__ import annotations

import pytest
from sqlalchemy import bindparam, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError, IntegrityError

from app.clock import utcnow
from app.db import Database
from app.db_direct import Held
from app.models import ApiKey

KEYS = ApiKey.__table__
INSERT_KEY = (
    insert(KEYS)
    .values(
        id=bindparam("v_id"),
        name=bindparam("v_name"),
        key_hash=bindparam("v_hash"),
        prefix=bindparam("v_prefix"),
        scopes=bindparam("v_scopes", type_=KEYS.c.scopes.type),
        created_at=bindparam("v_at", type_=KEYS.c.created_at.type),
    )
    .returning(KEYS.c.id, KEYS.c.created_at)
)


@pytest.fixture
def own_db(migrated, backend):
    if backend != "postgresql":
        pytest.skip("the driver path is PostgreSQL's")
    db = Database(migrated.url, pool_size=1)  # one connection: every call reuses it
    yield db
    db.dispose()


def _key(n: int) -> dict[str, object]:
    return {
        "v_id": f"key_direct_{n}",
        "v_name": "direct",
        "v_hash": f"hash-{n}",
        "v_prefix": f"p{n}",
        "v_scopes": ["read"],
        "v_at": utcnow(),
    }


def test_rows_are_processed_as_sqlalchemy_would_and_committed(own_db):
    ((key_id, created_at),) = own_db.direct(INSERT_KEY).rows(_key(1))
    assert key_id == "key_direct_1"
    assert created_at.utcoffset() is not None  # the UTC type's result processor ran
    with own_db.engine.connect() as connection:  # another transaction sees it: committed
        assert connection.scalar(select(KEYS.c.scopes).where(KEYS.c.id == key_id)) == ["read"]


def test_a_driver_error_is_sqlalchemys_and_the_connection_stays_usable(own_db):
    own_db.direct(INSERT_KEY).rows(_key(2))
    with pytest.raises(IntegrityError):
        own_db.direct(INSERT_KEY).rows(_key(2))
    assert own_db.direct(INSERT_KEY).rows(_key(3))
    with own_db.engine.connect() as connection:
        # Back in the pool in transaction mode, as SQLAlchemy hands connections out.
        assert connection.connection.driver_connection.autocommit is False


def test_a_dead_connection_is_invalidated_and_replaced(own_db, migrated):
    with own_db.engine.connect() as connection:
        pooled = connection.execute(text("SELECT pg_backend_pid()")).scalar()
    with migrated.db.engine.connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pooled})
    with pytest.raises(DBAPIError) as raised:
        own_db.direct(INSERT_KEY).rows(_key(4))
    assert raised.value.connection_invalidated
    assert own_db.direct(INSERT_KEY).rows(_key(4))  # a fresh connection
    with own_db.engine.connect() as connection:
        assert connection.execute(text("SELECT pg_backend_pid()")).scalar() != pooled


def test_a_server_that_cannot_be_reached_is_sqlalchemys_error_too(migrated, backend):
    """A new connection that fails (the server gone) raises SQLAlchemy's OperationalError,
    as `engine.connect()` would: the intake answers such an error 503, not 500."""
    if backend != "postgresql":
        pytest.skip("the driver path is PostgreSQL's")
    from sqlalchemy import make_url
    from sqlalchemy.exc import OperationalError

    from app.ports import free_port

    nowhere = make_url(migrated.url).set(host="127.0.0.1", port=free_port())
    db = Database(nowhere.render_as_string(hide_password=False), pool_size=1)
    try:
        with pytest.raises(OperationalError) as raised:
            db.direct(INSERT_KEY).rows(_key(9))
        assert raised.value.connection_invalidated
    finally:
        db.dispose()


def test_records_are_named_and_a_statement_keeps_its_own_values(own_db):
    """A statement's literal comparisons (`scopes` compared to a constant) travel with it;
    `records` names each row's values by the columns' labels, `run` returns the count."""
    own_db.direct(INSERT_KEY).rows(_key(5))
    own_db.direct(INSERT_KEY).rows(_key(6))
    named = select(KEYS.c.id.label("key_id"), KEYS.c.created_at).where(
        KEYS.c.name == "direct", KEYS.c.id >= bindparam("v_from")
    )
    records = own_db.direct(named).records({"v_from": "key_direct_5"})
    assert sorted(r.key_id for r in records) == ["key_direct_5", "key_direct_6"]
    assert all(r.created_at.utcoffset() is not None for r in records)
    renamed = KEYS.update().where(KEYS.c.id == bindparam("v_id")).values(name="renamed")
    assert own_db.direct(renamed).run({"v_id": "key_direct_5"}) == 1
    assert own_db.direct(renamed).run({"v_id": "key_nope"}) == 0
    assert [r.key_id for r in own_db.direct(named).records({"v_from": "key_direct_5"})] == [
        "key_direct_6"
    ]


def test_an_expanding_in_list_is_refused(own_db):
    """An IN list is rendered afresh at each execution; compiled once, it could not be."""
    with pytest.raises(ValueError, match="expanding"):
        own_db.direct(select(KEYS.c.id).where(KEYS.c.id.in_(bindparam("v_ids", expanding=True))))


def _backend_pid(db: Database, held: Held) -> int:
    pid = db.direct(select(func.pg_backend_pid().label("pid"))).records({}, held)[0].pid
    return int(pid)


def test_a_held_connection_serves_every_statement_until_released(own_db):
    """One checkout for a run of statements: the pool's only connection is the held one, in
    autocommit (each statement committed on its own), and goes back in transaction mode."""
    held = Held()
    first = _backend_pid(own_db, held)
    own_db.direct(INSERT_KEY).rows(_key(20), held)
    assert own_db.direct(INSERT_KEY).run(_key(21), held) == 1
    assert _backend_pid(own_db, held) == first
    assert own_db.engine.pool.checkedout() == 1  # still out, between statements
    with pytest.raises(IntegrityError):
        own_db.direct(INSERT_KEY).rows(_key(21), held)
    assert _backend_pid(own_db, held) == first  # an error reply keeps it usable
    held.release()
    assert own_db.engine.pool.checkedout() == 0
    with own_db.engine.connect() as connection:
        assert connection.connection.driver_connection.autocommit is False
        assert connection.execute(text("SELECT pg_backend_pid()")).scalar() == first
        committed = connection.scalar(
            select(func.count())
            .select_from(KEYS)
            .where(KEYS.c.id.in_(["key_direct_20", "key_direct_21"]))
        )
    assert committed == 2


def test_a_held_connection_that_dies_is_given_up_and_replaced(own_db, migrated):
    held = Held()
    first = _backend_pid(own_db, held)
    with migrated.db.engine.connect() as admin:
        admin.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": first})
    with pytest.raises(DBAPIError) as raised:
        own_db.direct(INSERT_KEY).rows(_key(22), held)
    assert raised.value.connection_invalidated
    assert not held.holding and own_db.engine.pool.checkedout() == 0
    assert own_db.direct(INSERT_KEY).rows(_key(22), held)  # a fresh connection, held anew
    assert _backend_pid(own_db, held) != first
    held.release()
