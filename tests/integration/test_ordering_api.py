"""The ordering fields over the API: the publish's `ordering_key`, the endpoint's `ordering`
and `on_dead`, and what a delivery to an ordered endpoint says about its place."""

from __future__ import annotations

from typing import Any

from tests.support.publish import (
    contract_and_partner,
    error_of,
    make_endpoint,
    order,
)


def _publish(client: Any, auth: dict[str, str], **extra: Any) -> dict[str, Any]:
    response = client.post("/v1/partners/acme/events", headers=auth, json=order(**extra))
    assert response.status_code == 202, response.get_json()
    return response.get_json()


def _event(client: Any, auth: dict[str, str], event_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/events/{event_id}", headers=auth)
    assert response.status_code == 200
    return response.get_json()


def test_ordering_key_is_stored_shown_and_defaults_to_the_resource(client, auth):
    contract_and_partner(client, auth)
    make_endpoint(client, auth)
    given = _publish(client, auth, ordering_key="cart-7")
    default = _publish(client, auth, resource={"type": "order", "id": "o-1"})
    opted_out = _publish(client, auth, resource={"type": "order", "id": "o-1"}, ordering_key=None)
    bare = _publish(client, auth)
    long_id = "x" * 200
    hashed = _publish(client, auth, resource={"type": "y" * 100, "id": long_id})
    assert _event(client, auth, given["id"])["ordering_key"] == "cart-7"
    assert _event(client, auth, default["id"])["ordering_key"] == "order:o-1"
    assert _event(client, auth, opted_out["id"])["ordering_key"] is None
    assert _event(client, auth, bare["id"])["ordering_key"] is None
    assert _event(client, auth, hashed["id"])["ordering_key"].startswith("sha256:")


def test_a_bad_ordering_key_is_refused_and_nothing_stored(client, auth):
    contract_and_partner(client, auth)
    make_endpoint(client, auth)
    for bad in ("", "k" * 256, 7, ["a"]):
        response = client.post(
            "/v1/partners/acme/events", headers=auth, json=order(ordering_key=bad)
        )
        assert response.status_code == 422, bad
        assert error_of(response)["details"] == {"field": "ordering_key"}
    listed = client.get("/v1/partners/acme/events", headers=auth).get_json()
    assert listed["data"] == []


def test_endpoint_ordering_fields_on_create_patch_and_read(client, auth):
    contract_and_partner(client, auth)
    created = make_endpoint(client, auth, ordering="key", on_dead="block")
    assert (created["ordering"], created["on_dead"]) == ("key", "block")
    path = f"/v1/partners/acme/endpoints/{created['id']}"
    patched = client.patch(path, headers=auth, json={"on_dead": "skip"}).get_json()
    assert (patched["ordering"], patched["on_dead"]) == ("key", "skip")
    read = client.get(path, headers=auth).get_json()
    assert (read["ordering"], read["on_dead"]) == ("key", "skip")
    for field, bad in (("ordering", "fifo"), ("on_dead", "retry"), ("ordering", None)):
        response = client.patch(path, headers=auth, json={field: bad})
        assert response.status_code == 422
        error = error_of(response)
        assert error["code"] == "invalid_field" and error["details"]["field"] == field
    refused = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/x", "on_dead": "park"},
    )
    assert refused.status_code == 422


def test_deliveries_to_an_ordered_endpoint_are_numbered_per_key(client, auth):
    contract_and_partner(client, auth)
    ordered = make_endpoint(client, auth, url="http://127.0.0.1:9/ordered", ordering="key")
    plain = make_endpoint(client, auth, url="http://127.0.0.1:9/plain")
    first = _publish(client, auth, ordering_key="k")
    other = _publish(client, auth, ordering_key="other")
    second = _publish(client, auth, ordering_key="k")
    unkeyed = _publish(client, auth)

    def place(event_id: str, endpoint_id: str) -> Any:
        deliveries = _event(client, auth, event_id)["deliveries"]
        return next(d["ordering"] for d in deliveries if d["endpoint"] == endpoint_id)

    assert place(first["id"], ordered["id"]) == {"key": "k", "sequence": 1, "previous_event": None}
    assert place(second["id"], ordered["id"]) == {
        "key": "k",
        "sequence": 2,
        "previous_event": first["id"],
    }
    assert place(other["id"], ordered["id"])["sequence"] == 1
    assert place(unkeyed["id"], ordered["id"]) is None
    assert place(second["id"], plain["id"]) is None
