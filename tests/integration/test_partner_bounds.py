"""What one partner can cause is bounded, and what the publisher decided stays decided.

- Endpoints per partner: one more than `KURIR_MAX_ENDPOINTS_PER_PARTNER` is `422
  endpoint_limit`, through every face, and concurrent creations never overshoot.
- A partner's own credentials create endpoints and send test events at a bounded rate
  (`429 rate_limited` with `Retry-After`); with Redis down a creation goes ahead and a test
  event is refused (`503`). A disabled endpoint is sent no test event (`409`).
- A resend job is its key's by key id, not by key name.
- Partners see the publisher's people and admin keys as "publisher".
- A partner cannot enable an endpoint an operator disabled (`409 disabled_by_operator`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from rq import Queue
from sqlalchemy import func, select, text

from app import migrate
from app.clock import utcnow
from app.models import AuditRecord, DeadLetter, Delivery, Endpoint, Partner
from app.ports import free_port
from app.queues import DEFAULT, KurirJob
from app.services import partner_bounds
from app.web import create_app
from sender import health
from tests.conftest import LiveServer
from tests.integration.test_portal import csrf, link_for, path_of, sign_in
from tests.support.dlq_factories import make_dead_letter
from tests.support.dlq_factories import make_event as make_dl_event
from tests.support.migrations import migrated_back
from tests.support.publish import error_of, make_endpoint, make_partner

OPERATOR_EMAIL = "ops@publisher.example"


@pytest.fixture
def make_app(make_rt: Callable[..., Any]) -> Callable[..., Any]:
    """The app on a runtime with setting overrides (the bounds under test, set low)."""
    from app.web.auth import clear_cache

    def build(**overrides: Any) -> Any:
        clear_cache()
        flask_app = create_app(runtime=make_rt(**overrides))
        flask_app.testing = False
        return flask_app

    return build


def test_a_partner_cannot_force_a_resend_to_what_an_operator_disabled(client, auth, runtime):
    """Forcing past a disable is the partner's to do when the partner or Kurir's health
    monitor disabled the endpoint, never past an operator's decision (which the operator's
    own force still overrides)."""
    make_partner(client, auth, "acme")
    key = partner_key(client, auth)
    endpoint = make_endpoint(client, auth, "acme")
    base = f"/v1/partners/acme/endpoints/{endpoint['id']}"
    with runtime.db.begin() as session:
        partner = session.scalar(select(Partner).where(Partner.uid == "acme"))
        ep = session.get_one(Endpoint, endpoint["id"])
        letters = [make_dead_letter(session, ep, make_dl_event(session, partner)).id for _ in "ab"]
    assert client.post(f"{base}/disable", headers=auth, json={"reason": "abuse"}).status_code == 200
    refused = client.post(f"/v1/dead-letters/{letters[0]}/resend?force=true", headers=key)
    assert refused.status_code == 409, refused.get_json()
    assert error_of(refused)["code"] == "disabled_by_operator"
    bulk = client.post(
        "/v1/dead-letters/resend", headers=key, json={"ids": letters, "force": True}
    ).get_json()
    assert bulk["count"] == 0
    with runtime.db.begin() as session:
        assert {session.get_one(DeadLetter, i).state for i in letters} == {"open"}
    # The operator may force; and once the partner disabled it itself, so may the partner.
    ok = client.post(f"/v1/dead-letters/{letters[0]}/resend?force=true", headers=auth)
    assert ok.status_code in (200, 202), ok.get_json()
    assert client.post(f"{base}/enable", headers=auth).status_code == 200
    assert client.post(f"{base}/disable", headers=key, json={"reason": "ours"}).status_code == 200
    mine = client.post(f"/v1/dead-letters/{letters[1]}/resend?force=true", headers=key)
    assert mine.status_code in (200, 202), mine.get_json()


def partner_key(
    client: Any, auth: dict[str, str], uid: str = "acme", name: str = "acme-robot"
) -> dict[str, str]:
    response = client.post(
        f"/v1/partners/{uid}/keys",
        headers=auth,
        json={"name": name, "scopes": ["endpoints:write", "dlq:write"]},
    )
    assert response.status_code == 201, response.get_json()
    return {"Authorization": f"Bearer {response.get_json()['key']}"}


def live_endpoints(runtime: Any, uid: str = "acme") -> int:
    with runtime.db.begin() as session:
        return (
            session.scalar(
                select(func.count())
                .select_from(Endpoint)
                .join(Partner)
                .where(Partner.uid == uid, Endpoint.deleted_at.is_(None))
            )
            or 0
        )


def deliveries(runtime: Any) -> int:
    with runtime.db.begin() as session:
        return session.scalar(select(func.count()).select_from(Delivery)) or 0


def hook(n: int) -> dict[str, str]:
    return {"url": f"http://127.0.0.1:9/hook-{n}"}


# ---------------------------------------------------------------------------- endpoint limit


def test_one_endpoint_more_than_the_limit_is_422_endpoint_limit_for_any_caller(
    make_app, auth, runtime
):
    client = make_app(max_endpoints_per_partner=3).test_client()
    make_partner(client, auth, "acme")
    make_partner(client, auth, "globex")
    key = partner_key(client, auth)
    base = "/v1/partners/acme/endpoints"
    first = make_endpoint(client, auth, "acme")
    make_endpoint(client, key, "acme", url=hook(2)["url"])
    make_endpoint(client, key, "acme", mode="pull", url=None)  # pull endpoints count too
    for caller in (key, auth):  # the partner's key, and an operator's admin key alike
        refused = client.post(base, headers=caller, json=hook(4))
        assert refused.status_code == 422
        error = error_of(refused)
        assert error["code"] == "endpoint_limit"
        assert "the most endpoints one partner may have (3)" in error["message"]
        assert "acme" in error["message"]
        assert error["details"] == {"limit": 3, "endpoints": 3}
    assert live_endpoints(runtime) == 3
    make_endpoint(client, auth, "globex")  # another partner's endpoints are its own count
    # A deleted endpoint frees its place.
    assert client.delete(f"{base}/{first['id']}", headers=key).status_code == 204
    make_endpoint(client, key, "acme", url=hook(5)["url"])
    assert live_endpoints(runtime) == 3


def test_the_portal_form_says_the_partner_has_as_many_endpoints_as_it_may(make_app, auth, runtime):
    flask_app = make_app(max_endpoints_per_partner=1)
    client = flask_app.test_client()
    make_partner(client, auth, "acme")
    make_endpoint(client, auth, "acme")
    portal = sign_in(flask_app.test_client(), auth)
    refused = portal.post(
        "/portal/endpoints/new",
        data={
            "csrf_token": csrf(portal),
            "url": "http://127.0.0.1:9/second",
            "mode": "push",
            "timeout_s": "5",
        },
    )
    assert refused.status_code == 422
    assert 'data-testid="error-form"' in refused.text
    assert "the most endpoints one partner may have (1)" in refused.text
    assert live_endpoints(runtime) == 1


def test_concurrent_creations_never_overshoot_the_limit(make_app, auth, runtime):
    flask_app = make_app(max_endpoints_per_partner=3)
    client = flask_app.test_client()
    make_partner(client, auth, "acme")
    make_endpoint(client, auth, "acme")
    make_endpoint(client, auth, "acme", url=hook(2)["url"])
    racers = 8
    start = threading.Barrier(racers)
    statuses: list[int] = []

    with LiveServer(flask_app) as server:

        def create(n: int) -> None:
            start.wait(timeout=30)
            answer = requests.post(
                f"{server.url}/v1/partners/acme/endpoints",
                headers=auth,
                json=hook(10 + n),
                timeout=60,
            )
            statuses.append(answer.status_code)
            if answer.status_code != 201:
                assert answer.json()["error"]["code"] == "endpoint_limit"

        threads = [threading.Thread(target=create, args=(n,)) for n in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert sorted(statuses) == [201] + [422] * (racers - 1)
    assert live_endpoints(runtime) == 3


# ---------------------------------------------------------------------------- rates


def test_a_rate_is_a_burst_of_n_then_one_every_60_over_n_seconds(redis_client):
    now = 1_000_000_000.0
    granted = [
        partner_bounds.wait_s(redis_client, partner_bounds.TEST_SENDS, "ptn_a", 7, now_ms=now)
        for _ in range(7)
    ]
    assert granted == [0.0] * 7
    wait = partner_bounds.wait_s(redis_client, partner_bounds.TEST_SENDS, "ptn_a", 7, now_ms=now)
    assert wait == pytest.approx(60 / 7, abs=0.01)
    # Another partner, and another kind of work, have slots of their own.
    assert (
        partner_bounds.wait_s(redis_client, partner_bounds.TEST_SENDS, "ptn_b", 7, now_ms=now)
        == 0.0
    )
    assert (
        partner_bounds.wait_s(redis_client, partner_bounds.CREATES, "ptn_a", 7, now_ms=now) == 0.0
    )
    later = now + wait * 1000
    assert (
        partner_bounds.wait_s(redis_client, partner_bounds.TEST_SENDS, "ptn_a", 7, now_ms=later)
        == 0.0
    )
    assert (
        partner_bounds.wait_s(redis_client, partner_bounds.TEST_SENDS, "ptn_a", 7, now_ms=later) > 0
    )


def test_a_partner_key_creating_endpoints_too_fast_gets_429_with_retry_after(
    make_app, auth, runtime
):
    flask_app = make_app(partner_endpoint_creates_per_minute=2)
    client = flask_app.test_client()
    make_partner(client, auth, "acme")
    make_partner(client, auth, "globex")
    key = partner_key(client, auth)
    make_endpoint(client, key, "acme", url=hook(1)["url"])
    make_endpoint(client, key, "acme", url=hook(2)["url"])
    refused = client.post("/v1/partners/acme/endpoints", headers=key, json=hook(3))
    assert refused.status_code == 429
    assert error_of(refused)["code"] == "rate_limited"
    wait = int(refused.headers["Retry-After"])
    assert 1 <= wait <= 30  # the next slot: one every 60/2 s
    assert error_of(refused)["details"] == {"limit_per_minute": 2, "retry_after_s": wait}
    # The portal is the same partner: its form says so and keeps what was typed.
    portal = sign_in(flask_app.test_client(), auth)
    form = portal.post(
        "/portal/endpoints/new",
        data={"csrf_token": csrf(portal), "url": "http://127.0.0.1:9/typed", "timeout_s": "5"},
    )
    assert form.status_code == 429 and int(form.headers["Retry-After"]) >= 1
    assert 'data-testid="error-form"' in form.text and "too many endpoint creations" in form.text
    assert "http://127.0.0.1:9/typed" in form.text
    assert live_endpoints(runtime) == 2
    # The bound is the partner's: the publisher's operators, and another partner, go on.
    make_endpoint(client, auth, "acme", url=hook(4)["url"])
    make_endpoint(client, partner_key(client, auth, "globex", "globex-robot"), "globex")


def test_test_events_are_rate_limited_per_partner_through_the_api_and_the_portal(
    make_app, auth, runtime
):
    flask_app = make_app(partner_test_sends_per_minute=2)
    client = flask_app.test_client()
    make_partner(client, auth, "acme")
    key = partner_key(client, auth)
    endpoint = make_endpoint(client, auth, "acme")
    url = f"/v1/partners/acme/endpoints/{endpoint['id']}/test"
    assert client.post(url, headers=key).status_code == 202
    portal = sign_in(flask_app.test_client(), auth)
    page = f"/portal/endpoints/{endpoint['id']}"
    assert (
        portal.post(
            f"{page}/test",
            data={"csrf_token": csrf(portal, page)},
            headers={"Referer": f"http://localhost{page}"},
        ).status_code
        == 302
    )
    assert deliveries(runtime) == 2
    refused = client.post(url, headers=key)  # the portal's test counted: same partner
    assert refused.status_code == 429 and error_of(refused)["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    button = portal.post(
        f"{page}/test",
        data={"csrf_token": csrf(portal, page)},
        headers={"Referer": f"http://localhost{page}"},
    )
    assert button.status_code == 302 and button.headers["Location"].endswith(page)
    assert "too many test events" in portal.get(page).text
    assert deliveries(runtime) == 2
    assert client.post(url, headers=auth).status_code == 202  # an operator is not limited


def test_with_redis_down_creation_goes_ahead_and_a_test_event_is_refused(make_app, auth, runtime):
    # Set up through a working app, then act through one whose Redis does not answer.
    working = make_app().test_client()
    make_partner(working, auth, "acme")
    key = partner_key(working, auth)
    endpoint = make_endpoint(working, auth, "acme")
    down = make_app(redis_url=f"redis://127.0.0.1:{free_port()}/0").test_client()
    created = down.post("/v1/partners/acme/endpoints", headers=key, json=hook(2))
    assert created.status_code == 201, created.get_json()  # fail open: it sends nothing
    refused = down.post(f"/v1/partners/acme/endpoints/{endpoint['id']}/test", headers=key)
    assert refused.status_code == 503  # fail closed: a test event is a POST to their URL
    assert error_of(refused)["code"] == "unavailable"
    assert int(refused.headers["Retry-After"]) >= 1
    assert deliveries(runtime) == 0


def test_a_disabled_endpoint_is_sent_no_test_event(client, auth, runtime):
    make_partner(client, auth, "acme")
    key = partner_key(client, auth)
    endpoint = make_endpoint(client, auth, "acme")
    base = f"/v1/partners/acme/endpoints/{endpoint['id']}"
    assert client.post(f"{base}/disable", headers=key).status_code == 200
    for caller in (key, auth):
        refused = client.post(f"{base}/test", headers=caller)
        assert refused.status_code == 409
        assert error_of(refused)["code"] == "endpoint_disabled"
    portal = sign_in(client.application.test_client(), auth)
    page = f"/portal/endpoints/{endpoint['id']}"
    shown = portal.get(page).text
    assert f"{page}/test" not in shown  # no button for it
    button = portal.post(
        f"{page}/test",
        data={"csrf_token": csrf(portal, page)},
        headers={"Referer": f"http://localhost{page}"},
    )
    assert button.status_code == 302
    assert "this endpoint is disabled and is sent nothing" in portal.get(page).text
    assert deliveries(runtime) == 0


# ---------------------------------------------------------------------------- resend jobs


def test_a_resend_job_is_found_by_the_key_that_started_it_not_by_its_name(client, auth, runtime):
    make_partner(client, auth, "acme")
    endpoint = make_endpoint(client, auth, "acme")
    with runtime.db.begin() as session:
        partner = session.scalar(select(Partner).where(Partner.uid == "acme"))
        ep = session.get_one(Endpoint, endpoint["id"])
        for _ in range(2):
            make_dead_letter(session, ep, make_dl_event(session, partner))
    # The admin key is called "test-admin"; so are two of acme's keys.
    first = partner_key(client, auth, name="test-admin")
    second = partner_key(client, auth, name="test-admin")

    def job_of(caller: dict[str, str]) -> str:
        started = client.post(
            "/v1/dead-letters/resend", headers=caller, json={"filter": {"partner": "acme"}}
        )
        assert started.status_code == 202, started.get_json()
        return str(started.get_json()["job_id"])

    admins, firsts = job_of(auth), job_of(first)
    status = "/v1/dead-letters/resend-jobs/{}"
    assert client.get(status.format(firsts), headers=first).status_code == 200
    for caller, job in ((first, admins), (second, admins), (second, firsts)):
        hidden = client.get(status.format(job), headers=caller)
        assert hidden.status_code == 404 and error_of(hidden)["code"] == "not_found"
    assert client.get(status.format(firsts), headers=auth).status_code == 200


# ---------------------------------------------------------------------------- "publisher"


def test_a_partner_sees_the_publishers_people_and_keys_as_publisher(
    client, auth, runtime, redis_client
):
    make_partner(client, auth, "acme")
    key = partner_key(client, auth)
    endpoint = make_endpoint(client, auth, "acme")
    base = f"/v1/partners/acme/endpoints/{endpoint['id']}"
    # The publisher's admin key acts on acme's things; so does acme's own key.
    assert client.post(f"{base}/test", headers=auth).status_code == 202
    client.patch(base, headers=key, json={"description": "ours"})
    operator_link = link_for(client, auth)
    partner_link = link_for(client, key)
    for link in (operator_link, partner_link):
        browser = client.application.test_client()
        browser.get(path_of(link["url"]))
        assert browser.post(path_of(link["url"])).status_code == 302
    with runtime.db.begin() as session:
        partner = session.scalar(select(Partner).where(Partner.uid == "acme"))
        ep = session.get_one(Endpoint, endpoint["id"])
        letter = make_dead_letter(session, ep, make_dl_event(session, partner))
        letter_id = letter.id
    assert (
        client.post(
            f"/v1/dead-letters/{letter_id}/discard", headers=auth, json={"note": "by ops"}
        ).status_code
        == 200
    )

    trail = client.get("/v1/audit?limit=100", headers=key).get_json()["data"]
    actors = {row["actor"] for row in trail}
    assert actors == {"publisher", "key:acme-robot", "portal:acme"}
    signed_in = sorted(
        row["details"]["link_created_by"] for row in trail if row["action"] == "portal.signed_in"
    )
    assert signed_in == ["key:acme-robot", "publisher"]
    letter_trail = client.get(f"/v1/dead-letters/{letter_id}", headers=key).get_json()["audit"]
    assert [(a["actor"], a["action"]) for a in letter_trail] == [
        ("system", "park"),
        ("publisher", "discard"),
    ]
    assert "test-admin" not in str(trail) + str(letter_trail)
    # The publisher itself still reads who did what.
    own = client.get("/v1/audit?limit=100", headers=auth).get_json()["data"]
    assert {"key:test-admin", "key:acme-robot", "portal:acme"} <= {r["actor"] for r in own}
    assert (
        client.get(f"/v1/dead-letters/{letter_id}", headers=auth).get_json()["audit"][-1]["actor"]
        == "key:test-admin"
    )

    # The test event the admin key sent names "publisher": in the body the partner gets, in
    # the API, and on the portal's delivery page.
    (test_delivery,) = client.get(
        f"/v1/deliveries?endpoint={endpoint['id']}&type=kurir.test", headers=key
    ).get_json()["data"]
    event = client.get(f"/v1/events/{test_delivery['event']}", headers=key).get_json()
    assert event["data"]["sent_by"] == "publisher"
    portal = sign_in(client.application.test_client(), auth)
    page = portal.get(f"/portal/deliveries/{test_delivery['id']}").text
    assert "publisher" in page and "test-admin" not in page


def test_the_portal_never_shows_an_operators_email(client, auth, runtime):
    """An operator in the UI sends a test event; acme's portal shows "publisher"."""
    from app.services import endpoints as endpoint_service
    from app.services.actor import Actor

    make_partner(client, auth, "acme")
    endpoint = make_endpoint(client, auth, "acme")
    with runtime.db.begin() as session:
        ep = session.get_one(Endpoint, endpoint["id"])
        delivery_id = endpoint_service.send_test(
            session, runtime, Actor.operator(OPERATOR_EMAIL), ep
        ).id
    portal = sign_in(client.application.test_client(), auth)
    page = portal.get(f"/portal/deliveries/{delivery_id}").text
    assert "publisher" in page and OPERATOR_EMAIL not in page
    with runtime.db.begin() as session:  # the operator's own trail keeps the name
        (row,) = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "endpoint.test_sent")
        )
        assert row.actor == f"operator:{OPERATOR_EMAIL}"


# ---------------------------------------------------------------------------- who disabled


def test_a_partner_cannot_enable_what_an_operator_disabled(client, auth, runtime):
    make_partner(client, auth, "acme")
    key = partner_key(client, auth)
    endpoint = make_endpoint(client, auth, "acme")
    base = f"/v1/partners/acme/endpoints/{endpoint['id']}"
    disabled = client.post(f"{base}/disable", headers=auth, json={"reason": "abuse report"})
    assert disabled.get_json()["disabled_by"] == "operator"
    refused = client.post(f"{base}/enable", headers=key)
    assert refused.status_code == 409
    assert error_of(refused)["code"] == "disabled_by_operator"
    # Disabling it again does not make it the partner's to enable, nor change why.
    again = client.post(f"{base}/disable", headers=key, json={"reason": "fine now"}).get_json()
    assert (again["disabled_by"], again["disabled_reason"]) == ("operator", "abuse report")
    assert client.post(f"{base}/enable", headers=key).status_code == 409

    portal = sign_in(client.application.test_client(), auth)
    page = f"/portal/endpoints/{endpoint['id']}"
    shown = portal.get(page).text
    assert 'data-testid="disabled-by-operator"' in shown and f"{page}/enable" not in shown
    for action in ("enable", "resend-parked"):
        tried = portal.post(
            f"{page}/{action}",
            data={"csrf_token": csrf(portal, page)},
            headers={"Referer": f"http://localhost{page}"},
        )
        assert tried.status_code == 302
        assert "only they can enable it again" in portal.get(page).text
    with runtime.db.begin() as session:
        ep = session.get_one(Endpoint, endpoint["id"])
        assert (ep.state, ep.disabled_by) == ("disabled", "operator")
        assert (
            session.scalar(
                select(func.count())
                .select_from(AuditRecord)
                .where(AuditRecord.action == "endpoint.enabled")
            )
            == 0
        )
    enabled = client.post(f"{base}/enable", headers=auth)  # the operator can
    assert enabled.status_code == 200 and enabled.get_json()["disabled_by"] is None


def test_a_partner_may_enable_what_it_or_the_health_monitor_disabled(client, auth, runtime):
    make_partner(client, auth, "acme")
    key = partner_key(client, auth)
    endpoint = make_endpoint(client, auth, "acme")
    base = f"/v1/partners/acme/endpoints/{endpoint['id']}"
    with runtime.db.begin() as session:
        assert health.disable(
            session, endpoint["id"], "failing: 8 consecutive failed attempts", utcnow()
        )
    assert client.get(base, headers=key).get_json()["disabled_by"] == "health"
    assert client.post(f"{base}/enable", headers=key).status_code == 200
    assert client.post(f"{base}/disable", headers=key).get_json()["disabled_by"] == "partner"
    portal = sign_in(client.application.test_client(), auth)
    page = f"/portal/endpoints/{endpoint['id']}"
    assert portal.post(f"{page}/enable", data={"csrf_token": csrf(portal, page)}).status_code == 302
    assert client.get(base, headers=key).get_json()["state"] == "enabled"
    # An operator disabling what the partner had disabled makes it the operator's.
    client.post(f"{base}/disable", headers=key)
    assert client.post(f"{base}/disable", headers=auth).get_json()["disabled_by"] == "operator"
    assert client.post(f"{base}/enable", headers=key).status_code == 409


# ---------------------------------------------------------------------------- migration


@pytest.fixture
def at_0008(migrated: Any) -> Iterator[Any]:
    """The test database migrated back to 0008 (and forward to head again afterwards)."""
    with migrated_back(migrated, "0008") as database:
        yield database


def test_upgrading_to_0009_remembers_who_did_what_before(at_0008: Any) -> None:
    rows = [
        "INSERT INTO partners (id, uid, name, created_at, updated_at) VALUES "
        "('ptn_1', 'acme', 'Acme', '2026-01-01', '2026-01-01')",
        "INSERT INTO api_keys (id, name, prefix, key_hash, scopes, created_at, partner_id) "
        "VALUES ('key_a', 'acme-robot', 'p', 'h1', '[]', '2026-01-01', 'ptn_1'), "
        "('key_b', 'shared', 'p', 'h2', '[]', '2026-01-01', 'ptn_1'), "
        "('key_c', 'shared', 'p', 'h3', '[]', '2026-01-01', NULL)",
        "INSERT INTO audit_records (id, actor, action, subject_type, subject_id, partner_id, "
        "details, created_at) VALUES "
        "('aud_1', 'portal:acme', 'endpoint.disabled', 'endpoint', 'ep_p', 'ptn_1', '{}', "
        "'2026-01-01'), "
        "('aud_2', 'operator:ops@x', 'endpoint.disabled', 'endpoint', 'ep_o', 'ptn_1', '{}', "
        "'2026-01-01'), "
        "('aud_3', 'key:acme-robot', 'endpoint.updated', 'endpoint', 'ep_e', 'ptn_1', '{}', "
        "'2026-01-01'), "
        "('aud_4', 'key:shared', 'endpoint.updated', 'endpoint', 'ep_e', 'ptn_1', '{}', "
        "'2026-01-01')",
    ]
    endpoints = [
        {"id": "ep_h", "state": "disabled", "reason": "failing: 8 in a row"},
        {"id": "ep_p", "state": "disabled", "reason": "manual"},
        {"id": "ep_o", "state": "disabled", "reason": "abuse"},
        {"id": "ep_e", "state": "enabled", "reason": None},
    ]
    with at_0008.db.engine.begin() as connection:
        for row in rows:
            connection.execute(text(row))
        connection.execute(
            text(
                "INSERT INTO endpoints (id, partner_id, url, headers, timeout_s, state, "
                "disabled_reason, consecutive_failures, created_at, updated_at) VALUES "
                "(:id, 'ptn_1', 'https://x.example', '{}', 5, :state, :reason, 0, '2026-01-01', "
                "'2026-01-01')"
            ),
            endpoints,
        )
    migrate.upgrade(at_0008.url)
    with at_0008.db.engine.connect() as connection:
        disabled_by = {
            row[0]: row[1]
            for row in connection.execute(text("SELECT id, disabled_by FROM endpoints"))
        }
        audited = {
            row[0]: row[1]
            for row in connection.execute(text("SELECT id, actor_partner_id FROM audit_records"))
        }
    assert disabled_by == {"ep_h": "health", "ep_p": "partner", "ep_o": "operator", "ep_e": None}
    # A name an admin key shares stays unattributed: shown as "publisher", never guessed.
    assert audited == {"aud_1": "ptn_1", "aud_2": None, "aud_3": "ptn_1", "aud_4": None}


def test_dead_letters_of_a_queue_job_keep_the_partner_of_who_started_it(
    client, auth, runtime, redis_client
):
    """A background resend audits its letters as its starter; a partner sees its own key."""
    make_partner(client, auth, "acme")
    key = partner_key(client, auth)
    endpoint = make_endpoint(client, auth, "acme")
    with runtime.db.begin() as session:
        partner = session.scalar(select(Partner).where(Partner.uid == "acme"))
        ep = session.get_one(Endpoint, endpoint["id"])
        letter_id = make_dead_letter(session, ep, make_dl_event(session, partner)).id
    started = client.post(
        "/v1/dead-letters/resend", headers=key, json={"filter": {"endpoint": endpoint["id"]}}
    )
    assert started.status_code == 202
    (job,) = Queue(DEFAULT, connection=redis_client, job_class=KurirJob).get_jobs()
    job.perform()
    trail = client.get(f"/v1/dead-letters/{letter_id}", headers=key).get_json()["audit"]
    assert [a["actor"] for a in trail] == ["system", "key:acme-robot"]
    with runtime.db.begin() as session:
        assert session.get_one(DeadLetter, letter_id).state == "resent"
