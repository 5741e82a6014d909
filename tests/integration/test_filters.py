"""Endpoint filters: set and refused at the door, evaluated in the publish fan-out (hot path and
transaction), tried with filter-test from the API, the operator UI and the portal."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from app.event_types import filters
from app.models import AuditRecord, DeadLetter, Delivery
from tests.integration.test_portal import csrf, sign_in
from tests.integration.test_ui import EMAIL, PASSWORD, token
from tests.support.publish import (
    contract_and_partner,
    error_of,
    make_endpoint,
    make_event_type,
    order,
)

pytestmark = pytest.mark.pgbouncer

BIG = "data.amount > `1000`"
EUR = "data.currency == 'EUR'"
# Static bomb: each stage doubles what the one before built (2^n nodes written out).
BOMB = "{a: @, b: @} | {a: @, b: @} | {a: @, b: @}"


@pytest.fixture
def acme(client, auth):
    return contract_and_partner(client, auth)


def _publish(client, auth, body, **headers):
    response = client.post("/v1/partners/acme/events", headers={**auth, **headers}, json=body)
    assert response.status_code == 202, response.get_json()
    return response.get_json()


def _delivered_to(runtime, event_id: str) -> set[str]:
    with runtime.db.Session() as session:
        return set(
            session.scalars(select(Delivery.endpoint_id).where(Delivery.event_id == event_id))
        )


# ------------------------------------------------------------------------------ at the door


def test_a_filter_is_set_shown_changed_and_removed(client, auth, acme, runtime):
    ep = make_endpoint(client, auth, filter=f"{BIG} && {EUR}")
    assert ep["filter"] == f"{BIG} && {EUR}"
    url = f"/v1/partners/acme/endpoints/{ep['id']}"
    assert client.get(url, headers=auth).get_json()["filter"] == f"{BIG} && {EUR}"
    changed = client.patch(url, headers=auth, json={"filter": EUR})
    assert changed.status_code == 200 and changed.get_json()["filter"] == EUR
    blank = client.patch(url, headers=auth, json={"filter": "  "})
    assert blank.status_code == 200 and blank.get_json()["filter"] is None
    with runtime.db.Session() as session:
        audited = session.scalars(
            select(AuditRecord.details).where(AuditRecord.action == "endpoint.updated")
        ).all()
    assert {"fields": ["filter"], "filter": EUR} in audited


@pytest.mark.parametrize(
    ("expression", "bound", "says"),
    [
        ("data.amount >", "syntax", "not a valid JMESPath expression"),
        ("data.[", "syntax", "not a valid JMESPath expression"),
        ("nope(data)", "functions", "unknown function"),
        (BOMB, "copies", "copy one part of its input"),
        ("x" * (filters.MAX_LENGTH + 1), "length", "characters"),
    ],
)
def test_a_broken_or_unbounded_filter_is_refused_with_the_reason(
    client, auth, acme, expression, bound, says
):
    created = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"url": "http://127.0.0.1:9/hook", "filter": expression},
    )
    assert created.status_code == 422
    error = error_of(created)
    assert error["code"] == "invalid_filter" and says in error["message"], error
    assert error["details"]["field"] == "filter" and error["details"]["bound"] == bound
    ep = make_endpoint(client, auth)
    patched = client.patch(
        f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth, json={"filter": expression}
    )
    assert patched.status_code == 422 and error_of(patched)["code"] == "invalid_filter"
    assert (
        client.get(f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth).get_json()["filter"]
        is None
    )


def test_a_filter_must_be_text_and_is_for_push_endpoints(client, auth, acme):
    for body in (
        {"url": "http://127.0.0.1:9/hook", "filter": 42},
        {"mode": "pull", "filter": BIG},
    ):
        refused = client.post("/v1/partners/acme/endpoints", headers=auth, json=body)
        assert refused.status_code == 422 and error_of(refused)["code"] == "invalid_filter"


# ------------------------------------------------------------------------------ fan-out


@pytest.mark.parametrize("path", ["hot", "transaction"])
def test_only_endpoints_whose_filter_matches_get_the_event(client, auth, acme, runtime, path):
    everything = make_endpoint(client, auth, url="http://127.0.0.1:9/all")
    big = make_endpoint(client, auth, url="http://127.0.0.1:9/big", filter=BIG)
    eur = make_endpoint(client, auth, url="http://127.0.0.1:9/eur", filter=EUR)
    truthy_zero = make_endpoint(client, auth, url="http://127.0.0.1:9/zero", filter="`0`")

    # The transaction path: an Idempotency-Key (every database), the hot path otherwise.
    def sale(order_id: str, amount: int, currency: str) -> dict:
        body = order(order_id, amount)
        body["data"]["currency"] = currency
        keyed = {"Idempotency-Key": f"{path}-{order_id}"} if path == "transaction" else {}
        return _publish(client, auth, body, **keyed)

    answer = sale("o-1", 5000, "USD")
    expected = {everything["id"], big["id"], truthy_zero["id"]}
    assert {d["endpoint"] for d in answer["deliveries"]} == expected
    assert _delivered_to(runtime, answer["id"]) == expected
    small = sale("o-2", 5, "EUR")
    assert {d["endpoint"] for d in small["deliveries"]} == {
        everything["id"],
        eur["id"],
        truthy_zero["id"],
    }
    assert _delivered_to(runtime, small["id"]) == {everything["id"], eur["id"], truthy_zero["id"]}


def test_a_changed_filter_applies_to_the_next_publish(client, auth, acme, runtime):
    ep = make_endpoint(client, auth, filter=BIG)
    first = _publish(client, auth, order(amount=5000))
    assert [d["endpoint"] for d in first["deliveries"]] == [ep["id"]]
    # The hot path cached the targets: the change must still be seen at once.
    client.patch(
        f"/v1/partners/acme/endpoints/{ep['id']}",
        headers=auth,
        json={"filter": "data.amount < `0`"},
    )
    second = _publish(client, auth, order("o-2", amount=5000))
    assert second["deliveries"] == [] and _delivered_to(runtime, second["id"]) == set()
    client.patch(f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth, json={"filter": None})
    third = _publish(client, auth, order("o-3", amount=1))
    assert [d["endpoint"] for d in third["deliveries"]] == [ep["id"]]


def test_a_filtered_out_disabled_endpoint_parks_nothing(client, auth, acme, runtime):
    ep = make_endpoint(client, auth, filter=BIG)
    client.post(f"/v1/partners/acme/endpoints/{ep['id']}/disable", headers=auth)
    answer = _publish(client, auth, order(amount=1))
    assert answer["deliveries"] == []
    parked = _publish(client, auth, order("o-2", amount=5000))
    assert [d["state"] for d in parked["deliveries"]] == ["dead"]
    with runtime.db.Session() as session:
        letters = session.scalars(select(DeadLetter.event_id)).all()
    assert letters == [parked["id"]]


def test_a_pinned_endpoint_filtered_out_needs_no_downgrade(client, auth, acme, runtime):
    make_event_type(
        client,
        auth,
        "order.created",
        version=2,
        schema={"type": "object", "required": ["order_id"]},
        downgrade="{order_id: order_id, amount: `1`}",
    )
    pinned = make_endpoint(
        client, auth, versions={"order.created": 1}, filter="data.order_id == 'wanted'"
    )
    answer = _publish(
        client, auth, {"type": "order.created", "version": 2, "data": {"order_id": "x"}}
    )
    assert answer["deliveries"] == []
    wanted = _publish(
        client, auth, {"type": "order.created", "version": 2, "data": {"order_id": "wanted"}}
    )
    assert [(d["endpoint"], d["version"]) for d in wanted["deliveries"]] == [(pinned["id"], 1)]


def test_a_filter_past_its_work_budget_does_not_match(client, auth, acme, runtime):
    make_event_type(client, auth, "bulk.made", schema={"type": "object"})
    spender = make_endpoint(
        client,
        auth,
        url="http://127.0.0.1:9/spend",
        filter="length(data.items[*].to_string(@)) > `0`",
    )
    plain = make_endpoint(client, auth, url="http://127.0.0.1:9/plain")
    many = {"type": "bulk.made", "version": 1, "data": {"items": list(range(filters.MAX_WORK))}}
    answer = _publish(client, auth, many)
    assert [d["endpoint"] for d in answer["deliveries"]] == [plain["id"]]
    few = _publish(client, auth, {**many, "data": {"items": [1, 2]}})
    assert {d["endpoint"] for d in few["deliveries"]} == {plain["id"], spender["id"]}
    tried = client.post(
        f"/v1/partners/acme/endpoints/{spender['id']}/filter-test",
        headers=auth,
        json={"event": {"type": "bulk.made", "data": many["data"]}},
    ).get_json()
    [sample] = tried["samples"]
    assert sample["matched"] is False and "more work than" in sample["error"]


# ------------------------------------------------------------------------------ filter-test


def test_filter_test_judges_examples_recent_given_and_named_events(client, auth, acme, runtime):
    make_event_type(
        client,
        auth,
        "order.shipped",
        schema={"type": "object", "examples": [{"carrier": "dhl"}]},
    )
    ep = make_endpoint(client, auth, filter=BIG)
    url = f"/v1/partners/acme/endpoints/{ep['id']}/filter-test"
    sent = _publish(client, auth, order(amount=5000))
    _publish(client, auth, order("o-2", amount=1))
    tried = client.post(url, headers=auth)
    assert tried.status_code == 200, tried.get_json()
    body = tried.get_json()
    assert body["filter"] == BIG
    by_source = [(s["source"], s["type"], s["matched"]) for s in body["samples"]]
    assert ("example", "order.shipped", False) in by_source
    assert [s for s in by_source if s[0] == "recent"] == [
        ("recent", "order.created", False),
        ("recent", "order.created", True),
    ]
    assert body["matched"] == sum(s["matched"] for s in body["samples"])
    # Another filter than the endpoint's, on a given event and on a stored one.
    given = client.post(
        url,
        headers=auth,
        json={"filter": EUR, "event": {"type": "order.created", "data": {"currency": "EUR"}}},
    ).get_json()
    assert [(s["source"], s["matched"]) for s in given["samples"]] == [("given", True)]
    named = client.post(url, headers=auth, json={"event": sent["id"]}).get_json()
    assert [(s["source"], s["event"], s["matched"]) for s in named["samples"]] == [
        ("event", sent["id"], True)
    ]
    # Nothing was changed by trying.
    assert (
        client.get(f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth).get_json()["filter"]
        == BIG
    )


def test_filter_test_refuses_a_broken_filter_a_missing_one_and_a_foreign_event(client, auth, acme):
    ep = make_endpoint(client, auth)
    url = f"/v1/partners/acme/endpoints/{ep['id']}/filter-test"
    broken = client.post(url, headers=auth, json={"filter": "data.["})
    assert broken.status_code == 422 and error_of(broken)["code"] == "invalid_filter"
    assert "not a valid JMESPath" in error_of(broken)["message"]
    none = client.post(url, headers=auth)
    assert none.status_code == 422 and error_of(none)["code"] == "invalid_filter"
    unknown = client.post(url, headers=auth, json={"filter": BIG, "event": "evt_nope"})
    assert unknown.status_code == 404
    malformed = client.post(url, headers=auth, json={"filter": BIG, "event": {"type": "x"}})
    assert malformed.status_code == 422
    extra = client.post(url, headers=auth, json={"filter": BIG, "oops": 1})
    assert extra.status_code == 422


def test_compiled_filters_are_cached_by_endpoint_and_text():
    cache = filters.CompiledFilters()
    first = cache.get("ep_1", BIG)
    assert cache.get("ep_1", BIG) is first and cache.compiled == 1
    assert cache.get("ep_1", EUR) is not first and cache.compiled == 2
    assert cache.get("ep_2", BIG) is not None and cache.compiled == 3
    event = filters.envelope("order.created", 1, {"amount": 5000, "currency": "EUR"}, None)
    assert filters.evaluate(first, event).matched
    assert filters.filtered_out({"a": BIG, "b": "data.amount < `0`"}, event) == {"b"}
    assert [filters.truthy(v) for v in (0, "", [], {}, None, False, "x", [0])] == [
        True,
        False,
        False,
        False,
        False,
        False,
        True,
        True,
    ]


# ------------------------------------------------------------------------------ the forms


_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def test_the_portal_form_tries_a_filter_without_saving_it(app, client, auth, acme, runtime):
    ep = make_endpoint(client, auth)
    _publish(client, auth, order(amount=5000))
    portal = sign_in(app.test_client(), auth)
    edit = f"/portal/endpoints/{ep['id']}/edit"
    page = portal.get(edit)
    assert 'data-testid="try-filter"' in page.text
    form = {
        "csrf_token": csrf(portal, edit),
        "url": "http://127.0.0.1:9/hook",
        "all_types": "1",
        "timeout_s": "10",
        "ordering": "none",
        "on_dead": "skip",
        "filter": BIG,
    }
    tried = portal.post(f"/portal/endpoints/{ep['id']}/filter-test", data=form)
    assert tried.status_code == 200
    assert 'data-testid="filter-results"' in tried.text and "matches 1 of" in tried.text
    broken = portal.post(
        f"/portal/endpoints/{ep['id']}/filter-test", data={**form, "filter": "a.["}
    )
    assert broken.status_code == 422 and "not a valid JMESPath" in broken.text
    new = portal.post(
        "/portal/endpoints/new/filter-test",
        data={**form, "csrf_token": csrf(portal, "/portal/endpoints/new")},
    )
    assert new.status_code == 200 and 'data-testid="filter-results"' in new.text
    assert (
        client.get(f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth).get_json()["filter"]
        is None
    )
    saved = portal.post(edit, data=form)
    assert saved.status_code == 302
    assert (
        client.get(f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth).get_json()["filter"]
        == BIG
    )
    assert 'data-testid="filter"' in portal.get(f"/portal/endpoints/{ep['id']}").text


def test_the_operator_form_tries_and_saves_a_filter(app, auth, acme, runtime):
    from app.accounts import create_operator

    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
    api = app.test_client()
    ep = make_endpoint(api, auth)
    ui = app.test_client()
    signed = ui.post(
        "/ui/login", data={"email": EMAIL, "password": PASSWORD, "csrf_token": token(ui)}
    )
    assert signed.status_code == 302
    edit = f"/ui/endpoints/{ep['id']}/edit"
    page = ui.get(edit)
    form = {
        "csrf_token": _CSRF.search(page.text).group(1),
        "url": "http://127.0.0.1:9/hook",
        "all_types": "1",
        "timeout_s": "10",
        "ordering": "none",
        "on_dead": "skip",
        "filter": EUR,
    }
    tried = ui.post(f"/ui/endpoints/{ep['id']}/filter-test", data=form)
    assert tried.status_code == 200 and 'data-testid="filter-results"' in tried.text
    assert ui.post(edit, data=form).status_code == 302
    with runtime.db.Session() as session:
        actors = session.scalars(
            select(AuditRecord.actor).where(AuditRecord.action == "endpoint.updated")
        ).all()
    assert actors == [f"operator:{EMAIL}"]
    assert (
        api.get(f"/v1/partners/acme/endpoints/{ep['id']}", headers=auth).get_json()["filter"] == EUR
    )
