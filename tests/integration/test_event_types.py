"""Event contracts: valid JSON Schema only, immutable versions, listing, deprecation."""

from __future__ import annotations

import threading

import pytest

from tests.support.publish import ORDER_SCHEMA, error_of, make_event_type


def test_register_returns_201_and_reads_back(client, auth):
    response = client.post(
        "/v1/event-types",
        headers=auth,
        json={
            "name": "order.created",
            "version": 1,
            "schema": ORDER_SCHEMA,
            "description": "An order was placed",
        },
    )
    assert response.status_code == 201
    created = response.get_json()
    assert created["id"].startswith("ety_")
    assert created["deprecated"] is False and created["deprecated_at"] is None
    got = client.get("/v1/event-types/order.created/1", headers=auth)
    assert got.status_code == 200
    assert got.get_json() == created
    assert got.get_json()["schema"] == ORDER_SCHEMA


def test_identical_reregistration_is_idempotent_200(client, auth):
    first = make_event_type(client, auth)
    again = client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": "order.created", "version": 1, "schema": ORDER_SCHEMA},
    )
    assert again.status_code == 200
    assert again.get_json()["id"] == first["id"]
    listed = client.get("/v1/event-types", headers=auth).get_json()
    assert len(listed["data"]) == 1


def test_reregistering_with_a_new_description_updates_it(client, auth):
    first = make_event_type(client, auth)
    body = {
        "name": "order.created",
        "version": 1,
        "schema": ORDER_SCHEMA,
        "description": "Placed by a customer",
    }
    again = client.post("/v1/event-types", headers=auth, json=body)
    assert again.status_code == 200
    assert again.get_json()["id"] == first["id"]
    assert again.get_json()["description"] == "Placed by a customer"
    read = client.get("/v1/event-types/order.created/1", headers=auth).get_json()
    assert read["description"] == "Placed by a customer"
    # Without a description, a re-registration leaves the stored one alone.
    body.pop("description")
    assert (
        client.post("/v1/event-types", headers=auth, json=body).get_json()["description"]
        == "Placed by a customer"
    )


def test_same_version_with_another_schema_is_409(client, auth):
    make_event_type(client, auth)
    changed = dict(ORDER_SCHEMA, required=["order_id"])
    response = client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": "order.created", "version": 1, "schema": changed},
    )
    assert response.status_code == 409
    assert error_of(response)["code"] == "event_type_version_exists"
    kept = client.get("/v1/event-types/order.created/1", headers=auth).get_json()
    assert kept["schema"] == ORDER_SCHEMA


def test_new_version_of_same_name_is_its_own_contract(client, auth):
    make_event_type(client, auth, version=1)
    v2 = make_event_type(client, auth, version=2, schema={"type": "object"})
    assert v2["version"] == 2
    names = client.get("/v1/event-types?name=order.created", headers=auth).get_json()["data"]
    assert sorted(t["version"] for t in names) == [1, 2]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "no-such-type"},
        {"properties": {"a": {"minimum": "zero"}}},
        {"required": "order_id"},
        "not an object",
        [1, 2],
        {"$ref": "https://example.com/schema.json"},
    ],
)
def test_invalid_json_schema_is_422_and_not_stored(client, auth, schema):
    response = client.post(
        "/v1/event-types", headers=auth, json={"name": "bad.type", "version": 1, "schema": schema}
    )
    assert response.status_code == 422, response.get_json()
    assert error_of(response)["code"] == "invalid_schema"
    assert client.get("/v1/event-types/bad.type/1", headers=auth).status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"version": 1, "schema": {}},
        {"name": "has space", "version": 1, "schema": {}},
        {"name": "trailing.newline\n", "version": 1, "schema": {}},
        {"name": "x", "version": 0, "schema": {}},
        {"name": "x", "version": "1", "schema": {}},
        {"name": "x", "version": True, "schema": {}},
        {"name": "x", "version": 1},
        {"name": "x", "version": 1, "schema": {}, "colour": "blue"},
    ],
)
def test_bad_fields_are_422(client, auth, body):
    response = client.post("/v1/event-types", headers=auth, json=body)
    assert response.status_code == 422, response.get_json()


def test_deprecate_marks_version_and_is_repeatable(client, auth):
    make_event_type(client, auth, version=1)
    make_event_type(client, auth, version=2)
    response = client.post("/v1/event-types/order.created/1/deprecate", headers=auth)
    assert response.status_code == 200
    body = response.get_json()
    assert body["deprecated"] is True and body["deprecated_at"].endswith("Z")
    again = client.post("/v1/event-types/order.created/1/deprecate", headers=auth).get_json()
    assert again["deprecated_at"] == body["deprecated_at"]
    assert (
        client.get("/v1/event-types/order.created/2", headers=auth).get_json()["deprecated"]
        is False
    )


def test_unknown_event_type_is_404(client, auth):
    assert client.get("/v1/event-types/nope/1", headers=auth).status_code == 404
    assert client.post("/v1/event-types/nope/1/deprecate", headers=auth).status_code == 404


def test_list_is_cursor_paginated_newest_first(client, auth):
    for version in range(1, 6):
        make_event_type(client, auth, version=version, schema={"type": "object"})
    first = client.get("/v1/event-types?limit=2", headers=auth).get_json()
    assert [t["version"] for t in first["data"]] == [5, 4]
    seen = [t["version"] for t in first["data"]]
    cursor = first["next_cursor"]
    while cursor:
        page = client.get(f"/v1/event-types?limit=2&cursor={cursor}", headers=auth).get_json()
        seen += [t["version"] for t in page["data"]]
        cursor = page["next_cursor"]
    assert seen == [5, 4, 3, 2, 1]


def test_registering_needs_write_scope(client, runtime):
    from app.accounts import create_api_key

    with runtime.db.begin() as session:
        _, token = create_api_key(session, "reader", ["read"])
    response = client.post(
        "/v1/event-types",
        headers={"Authorization": f"Bearer {token}"},
        json={"name": "x", "version": 1, "schema": {}},
    )
    assert response.status_code == 403


def test_concurrent_registration_of_one_version_stores_one_row(live_server, admin_token):
    import requests

    results: list[int] = []
    barrier = threading.Barrier(8)

    def register() -> None:
        barrier.wait()
        response = requests.post(
            f"{live_server.url}/v1/event-types",
            timeout=30,
            headers={"Authorization": f"Bearer {admin_token}"},
            json={"name": "race.type", "version": 1, "schema": ORDER_SCHEMA},
        )
        results.append(response.status_code)

    threads = [threading.Thread(target=register) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [200] * 7 + [201]
