"""The operator pages that share the portal's pieces: delivery log, delivery with Retry,
events list, endpoint edit and test, what became of resends, partners with keys and
"open portal as this partner"."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from rq import Queue
from sqlalchemy import select

from app.accounts import create_api_key, create_operator
from app.clock import utcnow
from app.errors import NotFound
from app.models import ApiKey, Attempt, AuditRecord, DeadLetter, Delivery, Endpoint
from app.queues import DEFAULT, KurirJob
from app.services import dashboard, sources
from app.services.actor import Actor
from app.web.auth import clear_cache
from sender.park import park
from tests.integration.test_ui import EMAIL, PASSWORD, token
from tests.support.dlq_factories import letters_for, make_scene
from tests.support.publish import (
    blocked_endpoint,
    make_endpoint,
    make_event_type,
    make_partner,
    old_event,
)

_LINK = re.compile(r'data-testid="portal-link">(http[^<]+)<')


@pytest.fixture
def ui(client, runtime):
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
    response = client.post(
        "/ui/login", data={"email": EMAIL, "password": PASSWORD, "csrf_token": token(client)}
    )
    assert response.status_code == 302
    return client


@pytest.fixture
def scene(runtime):
    with runtime.db.begin() as session:
        made = make_scene(session, runtime.secret_box, uid="acme")
        ids = letters_for(session, made, 2, attempts=2, data=lambda i: {"n": i})
        delivery_ids = [session.get_one(DeadLetter, i).delivery_id for i in ids]
        attempt = session.scalars(
            select(Attempt).where(Attempt.delivery_id == delivery_ids[0]).order_by(Attempt.n.desc())
        ).first()
        attempt.response_headers = {
            "Content-Type": "text/plain",
            "Set-Cookie": "sid=abc123",
            "X-Request-Id": "req-77",
        }
    return made, ids, delivery_ids


def test_delivery_log_filters_and_opens_a_delivery_with_both_header_sets(ui, scene):
    made, _, delivery_ids = scene
    listing = ui.get("/ui/deliveries").text
    assert all(d in listing for d in delivery_ids) and "acme" in listing
    assert delivery_ids[0] in ui.get("/ui/deliveries?partner=acme&state=dead").text
    assert delivery_ids[0] not in ui.get("/ui/deliveries?state=succeeded").text
    assert (
        delivery_ids[0]
        in ui.get(f"/ui/deliveries?endpoint={made.endpoint_id}&status_code=500").text
    )
    marked = ui.get("/ui/deliveries?state=lost&until=later")
    assert 'data-testid="error-state"' in marked.text and 'data-testid="error-until"' in marked.text
    missing = ui.get("/ui/deliveries?partner=ghost")  # the form stays, the field says why
    assert missing.status_code == 200 and "&#39;ghost&#39; does not exist" in missing.text
    page = ui.get(f"/ui/deliveries/{delivery_ids[0]}").text
    assert "Response headers" in page and "X-Request-Id" in page and "req-77" in page
    assert "sid=abc123" not in page  # a cookie the partner set is a credential
    assert "Request headers" in page and 'data-testid="retry"' in page


def test_retry_button_resends_a_dead_delivery_and_forces_a_disabled_endpoint(ui, scene, runtime):
    made, ids, delivery_ids = scene
    url = f"/ui/deliveries/{delivery_ids[0]}"
    retried = ui.post(f"{url}/retry", data={"csrf_token": token(ui, url)})
    assert retried.status_code == 302
    with runtime.db.begin() as session:
        assert session.get_one(Delivery, delivery_ids[0]).state == "pending"
        audit = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "delivery.retried")
        ).one()
        assert audit.actor == f"operator:{EMAIL}" and audit.details["dead_letter"] == ids[0]
        session.get_one(Endpoint, made.endpoint_id).state = "disabled"
    second = f"/ui/deliveries/{delivery_ids[1]}"
    page = ui.get(second).text
    assert "Retry anyway" in page
    refused = ui.post(f"{second}/retry", data={"csrf_token": token(ui, second)})
    assert refused.status_code == 302
    assert "enable it first" in ui.get(refused.headers["Location"]).text
    forced = ui.post(f"{second}/retry", data={"csrf_token": token(ui, second), "force": "1"})
    assert forced.status_code == 302
    with runtime.db.begin() as session:
        delivery = session.get_one(Delivery, delivery_ids[1])
        assert delivery.state == "pending" and delivery.forced


def test_events_list_filters_and_looks_up(ui, scene, runtime):
    _, ids, delivery_ids = scene
    with runtime.db.begin() as session:
        event_id = session.get_one(DeadLetter, ids[0]).event_id
    listing = ui.get("/ui/events").text
    assert event_id in listing and 'data-testid="events"' in listing
    assert event_id in ui.get("/ui/events?partner=acme&type=order.created").text
    assert event_id not in ui.get("/ui/events?type=other.type").text
    assert "No events match" in ui.get("/ui/events?type=other.type").text
    assert "RFC 3339" in ui.get("/ui/events?since=yesterday").text
    assert "does not exist" in ui.get("/ui/events?partner=ghost").text


def test_endpoint_edit_and_test_event_from_the_operator_side(ui, scene, runtime):
    made, _, _ = scene
    url = f"/ui/endpoints/{made.endpoint_id}"
    assert "Send test event" in ui.get(url).text
    form = ui.get(f"{url}/edit").text
    assert 'data-testid="endpoint-form"' in form
    saved = ui.post(
        f"{url}/edit",
        data={
            "csrf_token": token(ui, url),
            "url": "http://127.0.0.1:9/renamed",
            "all_types": "1",
            "timeout_s": "7",
            "description": "ops changed it",
        },
    )
    assert saved.status_code == 302, saved.text
    bad = ui.post(
        f"{url}/edit",
        data={"csrf_token": token(ui, url), "url": "nope", "all_types": "1", "timeout_s": "99"},
    )
    assert bad.status_code == 422 and 'data-testid="error-url"' in bad.text
    tested = ui.post(f"{url}/test", data={"csrf_token": token(ui, url)})
    assert tested.headers["Location"].startswith("/ui/deliveries/dlv_")
    assert "kurir.test" in ui.get(tested.headers["Location"]).text
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, made.endpoint_id)
        assert (endpoint.url, endpoint.timeout_s) == ("http://127.0.0.1:9/renamed", 7)
        actions = list(
            session.scalars(
                select(AuditRecord.action)
                .where(AuditRecord.subject_id == made.endpoint_id)
                .order_by(AuditRecord.id)
            )
        )
        assert actions == ["endpoint.updated", "endpoint.test_sent"]


def test_a_resent_letter_says_what_became_of_its_new_run(ui, scene, runtime):
    _, ids, _ = scene
    url = f"/ui/dead-letters/{ids[0]}"
    ui.post(f"{url}/resend", data={"csrf_token": token(ui, url)})
    assert 'data-testid="in-progress"' in ui.get(url).text
    with runtime.db.begin() as session:
        letter = session.get_one(DeadLetter, ids[0])
        delivery = letter.delivery
        delivery.state, delivery.last_status_code = "delivering", 502
        session.flush()
        park(session, delivery, delivery.event, delivery.endpoint, "retries_exhausted")
        again = session.scalars(
            select(DeadLetter.id).where(
                DeadLetter.delivery_id == delivery.id, DeadLetter.state == "open"
            )
        ).one()
    page = ui.get(url).text
    assert 'data-testid="failed-again"' in page and "Failed again" in page and again in page
    with runtime.db.begin() as session:
        session.get_one(DeadLetter, again).state = "resent"
        letter = session.get_one(DeadLetter, ids[1])
        letter.state = "resent"
        letter.delivery.state, letter.delivery.succeeded_at = "succeeded", utcnow()
    assert 'data-testid="delivered"' in ui.get(f"/ui/dead-letters/{ids[1]}").text


def test_partner_page_lists_keys_revokes_one_and_opens_the_portal(
    ui, client, auth, scene, runtime, app
):
    key = client.post(
        "/v1/partners/acme/keys", headers=auth, json={"name": "acme-ci", "scopes": ["read"]}
    ).get_json()
    assert key["partner"] == "acme" and key["key"].startswith(key["prefix"])
    make_partner(client, auth, "globex")
    assert "globex" in ui.get("/ui/partners").text
    page = ui.get("/ui/partners/acme").text
    assert "acme-ci" in page and "read" in page and key["key"] not in page
    assert "Nothing done in the portal yet" in page
    revoked = ui.post(
        f"/ui/keys/{key['id']}/revoke", data={"csrf_token": token(ui, "/ui/partners/acme")}
    )
    assert revoked.headers["Location"] == "/ui/partners/acme"
    with runtime.db.begin() as session:
        assert session.get_one(ApiKey, key["id"]).revoked_at is not None
    clear_cache()  # this process saw the key before: what every process does within 1 s
    assert (
        client.get("/v1/me", headers={"Authorization": f"Bearer {key['key']}"}).status_code == 401
    )
    posted = ui.post(
        "/ui/partners/acme/portal-link", data={"csrf_token": token(ui, "/ui/partners/acme")}
    )
    assert posted.status_code == 302  # answered by a redirect: a reload mints nothing
    made = ui.get(posted.headers["Location"])
    assert made.status_code == 200 and "opens acme" in made.text
    link = _LINK.search(made.text).group(1)
    again = ui.get(posted.headers["Location"])  # the reload: shown once, nothing minted
    assert 'data-testid="link-shown-already"' in again.text and link not in again.text
    partner_browser = app.test_client()
    entered = partner_browser.post("/" + link.split("/", 3)[3])
    assert entered.status_code == 302
    home = partner_browser.get("/portal/")
    assert home.status_code == 200
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', home.text).group(1)
    partner_browser.post(
        f"/portal/endpoints/{scene[0].endpoint_id}/secret/reveal", data={"csrf_token": csrf}
    )
    activity = ui.get("/ui/partners/acme").text
    assert "portal.signed_in" in activity and "endpoint.secret_revealed" in activity
    with runtime.db.begin() as session:
        created = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "portal_link.created")
        ).one()
        assert created.actor == f"operator:{EMAIL}"
        signed_in = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "portal.signed_in")
        ).one()
        assert signed_in.details["link_created_by"] == f"operator:{EMAIL}"


def test_a_pull_endpoint_page_shows_its_mode_and_lag_and_edits_without_a_url(ui, client, runtime):
    from tests.support.publish import make_endpoint, make_event_type, order

    with runtime.db.begin() as session:
        _, admin = create_api_key(session, "ui-admin", ["admin"])
    auth = {"Authorization": f"Bearer {admin}"}
    make_event_type(client, auth)
    make_partner(client, auth, "acme")
    pull = make_endpoint(client, auth, url=None, mode="pull")
    for n in range(2):
        assert (
            client.post("/v1/partners/acme/events", headers=auth, json=order(f"o-{n}")).status_code
            == 202
        )
    url = f"/ui/endpoints/{pull['id']}"
    page = ui.get(url).text
    assert re.search(r'data-testid="mode">pull', page)
    assert re.search(r'data-testid="lag">2 events, the oldest', page)
    form = ui.get(f"{url}/edit").text
    assert 'data-testid="pull-note"' in form and 'name="url"' not in form
    saved = ui.post(
        f"{url}/edit",
        data={
            "csrf_token": token(ui, url),
            "all_types": "1",
            "timeout_s": "5",
            "description": "poller",
        },
    )
    assert saved.status_code == 302, saved.text
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, pull["id"])
        assert (endpoint.mode, endpoint.url, endpoint.description) == ("pull", "", "poller")


def test_ordering_is_set_in_the_endpoint_form_and_blocked_keys_are_released_from_the_page(
    ui, scene, runtime
):
    made, ids, delivery_ids = scene
    url = f"/ui/endpoints/{made.endpoint_id}"
    saved = ui.post(
        f"{url}/edit",
        data={
            "csrf_token": token(ui, url),
            "url": "http://127.0.0.1:9/hook",
            "all_types": "1",
            "timeout_s": "7",
            "ordering": "key",
            "on_dead": "block",
        },
    )
    assert saved.status_code == 302, saved.text
    bad = ui.post(
        f"{url}/edit",
        data={
            "csrf_token": token(ui, url),
            "url": "http://127.0.0.1:9/",
            "all_types": "1",
            "timeout_s": "7",
            "ordering": "fifo",
        },
    )
    assert bad.status_code == 422 and 'data-testid="error-ordering"' in bad.text
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, made.endpoint_id)
        assert (endpoint.ordering, endpoint.on_dead) == ("key", "block")
        # The first dead delivery heads key order:1; the second waits behind it.
        for seq, delivery_id in enumerate(delivery_ids, start=1):
            delivery = session.get_one(Delivery, delivery_id)
            delivery.ordering_key, delivery.ordering_seq = "order:1", seq
    page = ui.get(url).text
    assert "Blocked keys" in page and 'data-testid="blocked-keys"' in page
    assert "order:1" in page and f"/ui/dead-letters/{ids[0]}/discard" in page
    discarded = ui.post(
        f"/ui/dead-letters/{ids[0]}/discard",
        data={"csrf_token": token(ui, url), "note": "release the key"},
    )
    assert discarded.status_code == 302
    # The key now stops at the second letter, which is the new head.
    page = ui.get(url).text
    assert f"/ui/dead-letters/{ids[1]}/discard" in page
    assert f"/ui/dead-letters/{ids[0]}/discard" not in page


def test_blocked_keys_stay_on_the_endpoint_page_after_ordering_is_turned_off(ui, auth, runtime):
    """The gate holds every numbered delivery whatever `ordering` says now, so the page
    must show the keys too."""
    make_event_type(ui, auth)
    make_partner(ui, auth, "acme")
    held = blocked_endpoint(ui, auth, keys=("stock:1", "stock:2"))
    assert (
        ui.patch(
            f"/v1/partners/acme/endpoints/{held['id']}", headers=auth, json={"ordering": "none"}
        ).status_code
        == 200
    )
    page = ui.get(f"/ui/endpoints/{held['id']}").text
    assert 'data-testid="blocked-keys"' in page
    assert "stock:1" in page and "stock:2" in page
    assert "Ordering is off for deliveries made from now on" in page
    # The dashboard names the endpoints that hold keys.
    dashboard = ui.get("/ui/").text
    assert re.search(rf"{held['id']}</a>: 2 keys held", dashboard)


def test_enabling_a_blocking_endpoint_offers_to_resend_what_it_parked(
    ui, auth, runtime, redis_client
):
    make_event_type(ui, auth)
    make_partner(ui, auth, "acme")
    held = blocked_endpoint(ui, auth, keys=("stock:1",), per_key=3)
    url = f"/ui/endpoints/{held['id']}"
    assert 'data-testid="parked-hold-keys"' in ui.get(url).text
    enabled = ui.post(
        f"{url}/enable", data={"csrf_token": token(ui, url)}, follow_redirects=True
    ).text
    assert "hold their ordering keys" in enabled and "Resend everything parked" in enabled
    assert 'data-testid="parked-hold-keys"' in enabled  # the offer stays after enabling
    resent = ui.post(f"{url}/resend-parked", data={"csrf_token": token(ui, url)})
    assert resent.headers["Location"].startswith("/ui/jobs/")
    (job,) = Queue(DEFAULT, connection=redis_client, job_class=KurirJob).get_jobs()
    job.perform()
    with runtime.db.begin() as session:
        letters = session.scalars(
            select(DeadLetter.state).where(DeadLetter.endpoint_id == held["id"])
        ).all()
        assert sorted(letters) == ["resent"] * 3
        trail = session.execute(
            select(AuditRecord.action, AuditRecord.actor, AuditRecord.details).where(
                AuditRecord.subject_id == held["id"], AuditRecord.action == "endpoint.parked_resent"
            )
        ).all()
        assert [(a, actor, d["letters"]) for a, actor, d in trail] == [
            ("endpoint.parked_resent", f"operator:{EMAIL}", 3)
        ]
    page = ui.get(url).text
    assert 'data-testid="parked-hold-keys"' not in page and "stock:1" not in page


def test_a_pull_endpoint_behind_retention_shows_it_and_is_skipped_from_its_page(ui, auth, runtime):
    make_event_type(ui, auth)
    make_partner(ui, auth, "acme")
    pull = make_endpoint(ui, auth, url=None, mode="pull")
    old_event(runtime, "acme", "o-old", timedelta(days=runtime.settings.retain_events_days + 1))
    assert ui.get(f"/v1/partners/acme/feed?endpoint={pull['id']}", headers=auth).status_code == 410
    url = f"/ui/endpoints/{pull['id']}"
    assert re.search(r'data-testid="backlog-expired"><strong>1 of them', ui.get(url).text)
    skipped = ui.post(
        f"{url}/skip-expired", data={"csrf_token": token(ui, url)}, follow_redirects=True
    ).text
    assert "Skipped 1 event(s) past retention" in skipped
    assert 'data-testid="backlog-expired"' not in skipped
    with runtime.db.begin() as session:
        assert session.scalars(
            select(AuditRecord.actor).where(AuditRecord.action == "endpoint.backlog_skipped")
        ).all() == [f"operator:{EMAIL}"]
    assert ui.get(f"/v1/partners/acme/feed?endpoint={pull['id']}", headers=auth).status_code == 200


def test_the_figures_over_every_partner_are_not_for_a_partner_bound_actor(runtime):
    """The dashboard and the inbound counts read across partners: a partner key or the
    portal meets 404, as for anything that does not exist for it."""
    bound = Actor.portal("prt_other", "other")
    with runtime.db.begin() as session:
        with pytest.raises(NotFound):
            dashboard.overview(session, bound)
        with pytest.raises(NotFound):
            sources.event_counts(session, bound)
        assert dashboard.overview(session, Actor.operator("ops@example.com")).open_letters == 0
