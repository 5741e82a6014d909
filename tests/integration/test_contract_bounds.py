"""Contract bounds over the API: a downgrade cannot blow up at registration or at publish, the
catalog's examples stay small and are made once, and a pin cannot break the publisher."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import func, select

from app.event_types import MAX_DOWNGRADE_HOPS
from app.event_types import examples as schema_example
from app.models import Delivery, Event, EventType, EventVersion
from app.services import event_types
from tests.integration.test_portal import sign_in
from tests.support.publish import make_endpoint, make_partner

# A smaller KURIR_MAX_PAYLOAD_BYTES keeps the oversized bodies of these tests small.
LIMIT = 32 * 1024
LOOSE: dict[str, Any] = {"type": "object"}  # checks only that data is an object (H1's case)
# Builds 2^30 nodes from anything: 299 characters.
PIPE_BOMB = "|".join(["{a: @, b: @}"] * 30)
# Eight copies of the input, within the pipe limit: caught by the copy count.
DOUBLING = "|".join(["{a: @, b: @}"] * 3)
STRING_BOMB = "|".join(["to_string([@, @, @, @, @, @, @, @, @, @])"] * 5)
# Python's parser recursion ran out on this (a 500).
DEEP = "(" * 1000 + "@" + ")" * 1000
# Copies nothing from its input, so no static count sees it: 600 x 600 x 600 zeros.
ZEROS = "`[" + ",".join(["0"] * 600) + "]`"
LITERAL_BOMB = f"map(&map(&{ZEROS}, {ZEROS}), {ZEROS})"


@pytest.fixture
def settings(settings):
    return settings.with_overrides(max_payload_bytes=LIMIT)


def register(
    client: Any,
    auth: dict[str, str],
    name: str,
    version: int,
    schema: dict[str, Any] | None = None,
    **extra: Any,
) -> Any:
    return client.post(
        "/v1/event-types",
        headers=auth,
        json={"name": name, "version": version, "schema": schema or LOOSE, **extra},
    )


def _stored(runtime) -> dict[str, int]:
    with runtime.db.begin() as session:
        return {
            model.__tablename__: int(session.scalar(select(func.count()).select_from(model)))
            for model in (Event, Delivery, EventVersion)
        }


def _values(value: Any) -> int:
    """How many JSON values `value` writes out (a shared part counts at each place)."""
    if isinstance(value, dict):
        return 1 + sum(_values(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(_values(v) for v in value)
    return 1


# ---------------------------------------------------------------------------- registration


def test_downgrades_that_would_blow_up_are_refused_at_registration(client, auth):
    assert register(client, auth, "t", 1).status_code == 201
    expected = {PIPE_BOMB: "pipes", DOUBLING: "copies", STRING_BOMB: "copies", DEEP: "depth"}
    for expression, bound in expected.items():
        response = register(client, auth, "t", 2, downgrade=expression, examples=[{"x": 1}])
        assert response.status_code == 422, (bound, response.get_json())
        error = response.get_json()["error"]
        assert error["code"] == "invalid_downgrade"
        assert (error["details"]["bound"], error["details"]["field"]) == (bound, "downgrade")
    # No static count sees a literal bomb: running it on an example made from the schema does,
    # although the publisher gave no examples.
    literal = register(client, auth, "t", 2, downgrade=LITERAL_BOMB)
    assert literal.status_code == 422
    details = literal.get_json()["error"]["details"]
    assert (details["reason"], details["limit"], details["input"]) == (
        "bytes",
        LIMIT,
        "schema_example",
    )
    # The API is still answering, and nothing was registered.
    listed = client.get("/v1/event-types?name=t", headers=auth)
    assert [row["version"] for row in listed.get_json()["data"]] == [1]


def test_an_example_whose_downgrade_is_too_large_is_refused(client, auth):
    register(client, auth, "t", 1)
    response = register(
        client,
        auth,
        "t",
        2,
        downgrade=DOUBLING.rsplit("|", 1)[0],
        examples=[{"x": 1}, {"note": "n" * (LIMIT // 3)}],
    )
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "invalid_downgrade"
    assert (error["details"]["example"], error["details"]["reason"]) == (1, "bytes")


# ---------------------------------------------------------------------------- publish


def test_a_version_too_large_to_make_is_422_naming_it_and_stores_nothing(client, auth, runtime):
    register(client, auth, "t", 1)
    # Four copies: within the static bound, and small on its example.
    assert (
        register(
            client,
            auth,
            "t",
            2,
            downgrade="{a: @, b: @} | {a: @, b: @}",
            examples=[{"note": "small"}],
        ).status_code
        == 201
    )
    make_partner(client, auth, "acme")
    make_endpoint(client, auth, versions={"t": 1})
    big = {"type": "t", "version": 2, "data": {"note": "n" * (LIMIT // 3)}}
    response = client.post("/v1/partners/acme/events", headers=auth, json=big)
    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "version_too_large"
    assert (error["details"]["version"], error["details"]["reason"], error["details"]["limit"]) == (
        1,
        "bytes",
        LIMIT,
    )
    assert _stored(runtime) == {"events": 0, "deliveries": 0, "event_versions": 0}
    # The API keeps answering, and the same pin is served when the data is small.
    small = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": "t", "version": 2, "data": {"note": "ok"}},
    )
    assert small.status_code == 202
    (delivery,) = small.get_json()["deliveries"]
    assert delivery["version"] == 1


def test_a_stored_bomb_is_stopped_by_the_budget_at_publish(client, auth, runtime):
    """An expression stored before the static bounds existed still runs metered."""
    register(client, auth, "t", 1)
    register(client, auth, "t", 2)
    with runtime.db.begin() as session:
        session.scalars(select(EventType).where(EventType.version == 2)).one().downgrade = PIPE_BOMB
    make_partner(client, auth, "acme")
    make_endpoint(client, auth, versions={"t": 1})
    response = client.post(
        "/v1/partners/acme/events", headers=auth, json={"type": "t", "version": 2, "data": {"x": 1}}
    )
    assert response.status_code == 422
    assert response.get_json()["error"]["details"]["version"] == 1
    assert _stored(runtime)["events"] == 0


# ---------------------------------------------------------------------------- pins


def test_a_pin_further_than_the_chain_bound_is_refused(client, auth):
    newest = MAX_DOWNGRADE_HOPS + 2
    register(client, auth, "long", 1)
    for version in range(2, newest + 1):
        assert register(client, auth, "long", version, downgrade="@").status_code == 201
    make_partner(client, auth, "acme")
    too_far = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/", "versions": {"long": 1}},
    )
    assert too_far.status_code == 422
    assert too_far.get_json()["error"]["details"]["unavailable"] == [
        {"type": "long", "version": 1, "newest": newest}
    ]
    make_endpoint(client, auth, versions={"long": newest - MAX_DOWNGRADE_HOPS})


# ---------------------------------------------------------------------------- catalog


SELF_REFERENCING = {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(120)}}
TREE = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}},
    },
}


@pytest.fixture
def catalog(client, auth, app):
    assert register(client, auth, "wide", 1, SELF_REFERENCING).status_code == 201
    assert register(client, auth, "tree", 1, TREE).status_code == 201
    make_partner(client, auth, "acme")
    return sign_in(app.test_client(), auth)


def test_the_catalog_makes_a_small_example_of_a_self_referencing_schema(catalog, runtime):
    page = catalog.get("/portal/catalog")
    assert page.status_code == 200
    with runtime.db.begin() as session:
        rows = {row.name: row for row in session.scalars(select(EventType))}
        wide, tree = (event_types.example(rows[name]) for name in ("wide", "tree"))
    # The budget, plus a null for each property left when it ran out (120 at the top, and
    # those of the one object being filled below it): 14,521 values without a bound.
    properties = len(SELF_REFERENCING["properties"])
    assert _values(wide) <= schema_example.MAX_NODES + 2 * properties
    assert len(json.dumps(wide)) <= schema_example.MAX_BYTES
    assert set(wide) == set(SELF_REFERENCING["properties"])
    # A legitimate tree shows one level of its recursion.
    assert tree == {"name": "string", "children": [{"name": "string", "children": []}]}
    assert "children" in page.text


def test_each_versions_example_is_made_once(catalog):
    before = event_types.examples.made
    assert catalog.get("/portal/catalog").status_code == 200
    assert event_types.examples.made - before == 2  # wide v1 and tree v1
    assert catalog.get("/portal/catalog").status_code == 200
    assert event_types.examples.made - before == 2
