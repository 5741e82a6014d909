"""The PostgreSQL publish hot path (cached targets, one guarded autocommit statement) must
answer exactly what the transactional path answers, whatever changed since the last publish.

Every test runs on both databases: on SQLite the same requests take the transactional path,
so the two paths are held to one behaviour.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, text

from app import db as db_module
from app.db import Database
from app.intake import plan as plan_module
from app.intake import publish as publish_module
from app.intake import targets as targets_module
from app.models import DeadLetter, Delivery, Event
from app.runtime import Runtime
from app.web import create_app
from tests.support.publish import (
    contract_and_partner,
    counts,
    make_endpoint,
    make_event_type,
    make_partner,
    order,
)

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer


@pytest.fixture
def partner(client, auth):
    return contract_and_partner(client, auth)


def _publish(client, auth, **extra):
    response = client.post("/v1/partners/acme/events", headers=auth, json=order(**extra))
    assert response.status_code == 202, response.get_json()
    return response.get_json()


def _endpoints_of(answer) -> dict[str, str]:
    return {d["endpoint"]: d["state"] for d in answer["deliveries"]}


def test_an_endpoint_added_after_a_publish_gets_the_next_event(client, auth, partner):
    first = make_endpoint(client, auth)
    assert _endpoints_of(_publish(client, auth)) == {first["id"]: "pending"}
    second = make_endpoint(client, auth, url="http://127.0.0.1:9/second")
    assert _endpoints_of(_publish(client, auth)) == {
        first["id"]: "pending",
        second["id"]: "pending",
    }


def test_a_disabled_endpoint_is_parked_even_right_after_a_publish(client, auth, partner, runtime):
    ep = make_endpoint(client, auth)
    _publish(client, auth)
    assert (
        client.post(f"/v1/partners/acme/endpoints/{ep['id']}/disable", headers=auth).status_code
        == 200
    )
    answer = _publish(client, auth)
    assert _endpoints_of(answer) == {ep["id"]: "dead"}
    with runtime.db.Session() as session:
        [letter] = session.scalars(select(DeadLetter)).all()
        assert (letter.event_id, letter.reason) == (answer["id"], "endpoint_disabled")


def test_subscription_changes_and_deletions_apply_to_the_next_publish(client, auth, partner):
    kept = make_endpoint(client, auth)
    narrowed = make_endpoint(client, auth, url="http://127.0.0.1:9/narrowed")
    _publish(client, auth)
    assert client.patch(
        f"/v1/partners/acme/endpoints/{narrowed['id']}",
        headers=auth,
        json={"event_types": ["order.paid"]},
    ).status_code in (200, 422)
    make_event_type(client, auth, name="order.paid")
    assert (
        client.patch(
            f"/v1/partners/acme/endpoints/{narrowed['id']}",
            headers=auth,
            json={"event_types": ["order.paid"]},
        ).status_code
        == 200
    )
    assert _endpoints_of(_publish(client, auth)) == {kept["id"]: "pending"}
    assert client.delete(f"/v1/partners/acme/endpoints/{kept['id']}", headers=auth).status_code in (
        200,
        204,
    )
    assert _publish(client, auth)["deliveries"] == []


def test_deprecating_a_contract_warns_on_the_very_next_publish(client, auth, partner):
    make_endpoint(client, auth)
    assert _publish(client, auth)["warnings"] == []
    response = client.post("/v1/event-types/order.created/1/deprecate", headers=auth)
    assert response.status_code == 200, response.get_json()
    [warning] = _publish(client, auth)["warnings"]
    assert warning["code"] == "deprecated_event_type"


def test_a_contract_registered_after_an_unknown_type_publish_is_found(client, auth):
    make_partner(client, auth, "acme")
    response = client.post("/v1/partners/acme/events", headers=auth, json=order())
    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "unknown_event_type"
    make_event_type(client, auth)
    assert _publish(client, auth)["deliveries"] == []


def test_endpoints_changing_under_every_read_fall_back_to_a_transaction(
    client, auth, partner, runtime, monkeypatch
):
    ep = make_endpoint(client, auth)
    real = publish_module.read_targets

    def stale(connection, uid, type_, version, **kwargs):
        # As if another request changed the endpoints right after each read.
        targets = real(connection, uid, type_, version, **kwargs)
        return targets_module.Targets(
            targets.partner_id, targets.endpoints, targets.contract, digest="0" * 32
        )

    transactional = []
    real_publish = publish_module.publish_in_transaction

    def counted(*args, **kwargs):
        transactional.append(1)
        return real_publish(*args, **kwargs)

    monkeypatch.setattr(publish_module, "read_targets", stale)
    monkeypatch.setattr(publish_module, "publish_in_transaction", counted)
    answer = _publish(client, auth)
    assert transactional == [1]  # the guard refused both plans (SQLite: always this path)
    assert _endpoints_of(answer) == {ep["id"]: "pending"}
    with runtime.db.Session() as session:
        assert session.scalar(select(Event.id)) == answer["id"]
        assert [d.endpoint_id for d in session.scalars(select(Delivery))] == [ep["id"]]


def test_a_failing_fan_out_statement_stores_nothing(client, auth, partner, runtime, monkeypatch):
    make_endpoint(client, auth)
    make_endpoint(client, auth, url="http://127.0.0.1:9/two")
    _publish(client, auth)  # the targets are cached now
    before = counts(runtime.db)
    real = plan_module.new_id
    # Two deliveries with one id: the statement fails after the event row was inserted.
    monkeypatch.setattr(
        plan_module,
        "new_id",
        lambda prefix: "dlv_DUPLICATE" if prefix == "dlv" else real(prefix),
    )
    response = client.post("/v1/partners/acme/events", headers=auth, json=order())
    assert response.status_code == 500
    assert counts(runtime.db) == before


def test_a_pooled_connection_killed_while_idle_is_replaced_before_use(
    client, auth, partner, migrated, runtime, backend, monkeypatch
):
    if backend != "postgresql":
        pytest.skip("server-side connection termination is a PostgreSQL affair")
    make_endpoint(client, auth)
    own = Database(migrated.url, pool_size=1)  # a pool this test may break
    try:
        app_client = create_app(runtime=Runtime(runtime.settings, database=own)).test_client()
        assert (
            app_client.post("/v1/partners/acme/events", headers=auth, json=order()).status_code
            == 202
        )
        with own.engine.connect() as connection:
            pooled = connection.execute(text("SELECT pg_backend_pid()")).scalar()
        with migrated.db.engine.connect() as admin:
            assert (
                admin.execute(
                    text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pooled}
                ).scalar()
                is True
            )  # waits until it is gone
        monkeypatch.setattr(db_module, "PING_AFTER_IDLE_S", 0.0)
        response = app_client.post("/v1/partners/acme/events", headers=auth, json=order())
        assert response.status_code == 202, response.get_json()
        with own.engine.connect() as connection:
            assert connection.execute(text("SELECT pg_backend_pid()")).scalar() != pooled
    finally:
        own.dispose()
