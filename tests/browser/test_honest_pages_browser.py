"""Honest pages in a real Chromium: a resend job whose letters all failed again says so and
stops refreshing once done; a refused bulk action keeps the selection; a held-back delivery
is described as held back; rotations appear in an endpoint's history; the operator deletes
an endpoint with a typed confirmation; a form refused far down says so at the top; a long
correlation id wraps instead of widening the page.

A real worker sends the resent letters to a receiver that answers 410, so they die again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import func, select

from app.accounts import create_operator
from app.clock import utcnow
from app.models import DeadLetter, Endpoint, InboundEvent, InboundSource, PortalLink
from tests.browser.test_ui_browser import EMAIL, PASSWORD, chromium, page  # noqa: F401
from tests.support.dlq_factories import make_dead_letter, make_endpoint, make_event, make_partner
from tests.support.factories import Receiver, WorkerThread, wait_for

pytestmark = pytest.mark.browser


@dataclass
class Scene:
    url: str
    held_back: list[str]  # dead letters parked before any attempt (endpoint disabled)
    gone: str  # their endpoint, disabled, answering 410
    spare: str  # an enabled endpoint to rotate, edit and delete
    spare_url: str
    long_event: str  # an event with a 150-character correlation id


@pytest.fixture
def scene(runtime: Any, live_server: Any) -> Iterator[Scene]:
    with Receiver(reply=lambda received, n: (410, {}, b"gone")) as receiver:
        with runtime.db.begin() as session:
            create_operator(session, EMAIL, PASSWORD)
            initech = make_partner(session, "initech")
            gone, _ = make_endpoint(
                session, runtime.secret_box, initech, url=receiver.url + "/old", state="disabled"
            )
            spare, _ = make_endpoint(
                session, runtime.secret_box, initech, url=receiver.url + "/spare"
            )
            held = [
                make_dead_letter(
                    session,
                    gone,
                    make_event(session, initech),
                    reason="endpoint_disabled",
                    status_code=None,
                    error=None,
                    attempts=0,
                ).id
                for _ in range(2)
            ]
            long_event = make_event(session, initech)
            long_event.correlation_id = "c" * 150
            ids = Scene(live_server.url, held, gone.id, spare.id, spare.url, long_event.id)
        with WorkerThread(runtime):
            yield ids


def _login(page: Any, scene: Scene, path: str) -> None:  # noqa: F811
    page.goto(scene.url + path)
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(re.escape(path.split("?")[0])))


def test_a_refused_and_a_failed_resend_are_told_as_they_are(page, scene, runtime):  # noqa: F811
    _login(page, scene, "/ui/dead-letters?partner=initech")
    # A held-back delivery is not "stopped being retried" nor "queued".
    with runtime.db.begin() as session:
        delivery_id = session.get_one(DeadLetter, scene.held_back[0]).delivery_id
    page.goto(f"{scene.url}/ui/deliveries/{delivery_id}")
    assert "held back" in page.inner_text("[data-testid=delivery-state]")
    assert "Never attempted" in page.inner_text("[data-testid=no-attempts]")

    # Resend selected, refused (endpoint disabled): the two stay ticked.
    page.goto(scene.url + "/ui/dead-letters?partner=initech")
    page.check("[data-select-all]")
    page.click("button:has-text('Resend selected')")
    page.wait_for_load_state()
    assert "Not resent: 2 letters (endpoint disabled)" in page.inner_text(".flashes")
    assert page.inner_text("[data-selected-count]") == "2 selected"

    # Resend all matching, even to the disabled endpoint: the receiver answers 410, both die
    # again, and the job says so rather than "succeeded", and stops refreshing.
    page.check("form[action$='resend-matching'] input[name=force]")
    page.click("button:has-text('Resend all matching')")
    page.wait_for_url(re.compile(r"/ui/jobs/"))

    def failed_again() -> bool:
        page.reload()
        return "2 failed again" in page.inner_text("[data-testid=job-verdict]")

    wait_for(
        failed_again,
        timeout_s=30,
        message="the job to report both letters failed again",
    )
    verdict = page.locator("[data-testid=job-verdict]")
    assert verdict.inner_text() == "finished · 0 delivered, 2 failed again"
    assert "badge-failed" in (verdict.get_attribute("class") or "")
    assert page.locator("meta[http-equiv=refresh]").count() == 0


def test_endpoint_history_delete_form_errors_and_wrapping(page, scene, runtime):  # noqa: F811
    _login(page, scene, f"/ui/endpoints/{scene.spare}")
    # A rotation shows in the endpoint's history.
    page.click("button:has-text('Rotate secret')")
    page.goto(f"{scene.url}/ui/endpoints/{scene.spare}")
    assert "endpoint.secret_rotated" in page.inner_text("section:has(h2:has-text('History'))")

    # A refusal far down the edit form is summarised at the top, and focused.
    page.goto(f"{scene.url}/ui/endpoints/{scene.spare}/edit")
    page.fill("input[name=timeout_s]", "99")
    page.click("button:has-text('Save')")
    page.wait_for_selector("[data-testid=error-summary]")
    assert "timeout" in page.inner_text("[data-testid=error-summary]")
    assert page.evaluate("document.activeElement.hasAttribute('data-error-summary')")
    assert page.evaluate("window.scrollY") < 400

    # Delete, after typing the URL (a wrong one is refused).
    page.goto(f"{scene.url}/ui/endpoints/{scene.spare}")
    page.click("a:has-text('Delete…')")
    page.fill("input[name=confirm]", "nope")
    page.click("button:has-text('Delete endpoint')")
    assert "Not deleted" in page.inner_text(".flashes")
    page.fill("input[name=confirm]", scene.spare_url)
    page.click("button:has-text('Delete endpoint')")
    assert "Endpoint deleted" in page.inner_text(".flashes")
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, scene.spare).deleted_at is not None

    # A 150-character correlation id wraps: the page does not scroll sideways.
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{scene.url}/ui/events/{scene.long_event}")
    assert page.locator("[data-testid=correlation-id]").is_visible()
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0


def test_a_portal_link_survives_a_reload_and_the_partner_ends_the_overlap(
    page,  # noqa: F811
    scene,
    runtime,
):
    _login(page, scene, "/ui/partners/initech")
    page.click("button:has-text('Open portal as this partner')")
    page.wait_for_url(re.compile(r"/ui/partners/initech/portal-links/pl_"))
    link = page.inner_text("[data-testid=portal-link]").strip()
    page.reload()  # a GET now: shows the link's facts, mints no second link
    assert page.locator("[data-testid=link-shown-already]").is_visible()
    with runtime.db.begin() as session:
        assert session.scalar(select(func.count()).select_from(PortalLink)) == 1

    # The partner rotates, then cuts the previous secret off at once.
    page.goto(link)
    page.wait_for_url(re.compile(r"/portal/$"))
    page.goto(f"{scene.url}/portal/endpoints/{scene.spare}/secret")
    page.click("button:has-text('Rotate secret')")
    page.wait_for_selector("[data-testid=expire-previous]")
    page.click("button:has-text('Expire it now')")
    assert "stops signing now" in page.inner_text(".flashes")
    assert page.locator("[data-testid=expire-previous]").count() == 0
    with runtime.db.begin() as session:
        live = [s for s in session.get_one(Endpoint, scene.spare).secrets if s.is_live(utcnow())]
        assert len(live) == 1


def test_an_inbound_callback_shows_what_was_sent(page, scene, runtime):  # noqa: F811
    body = b'{"id":"evt_p1","type":"payment.updated","data":{"status":"paid"}}'
    with runtime.db.begin() as session:
        source = InboundSource(name="acme-callbacks", scheme="standard-webhooks")
        session.add(source)
        session.flush()
        received = InboundEvent(
            source_id=source.id,
            event_id="evt_p1",
            event_type="payment.updated",
            status="quarantined",
            reason="version gap: expected 5",
            raw_body=body,
            headers={"content-type": "application/json", "authorization": "Bearer s3cret"},
        )
        session.add(received)
        session.flush()
    _login(page, scene, "/ui/inbound")
    page.click("a:has-text('evt_p1')")
    page.wait_for_url(re.compile(r"/ui/inbound/ine_"))
    assert page.inner_text("[data-testid=inbound-body]") == body.decode()
    headers = page.inner_text("[data-testid=inbound-headers]")
    assert "application/json" in headers and "s3cret" not in headers
    assert "version gap" in page.inner_text("[data-testid=inbound-reason]")


def test_a_partner_makes_and_revokes_its_own_feed_key(page, scene, client, auth):  # noqa: F811
    made = client.post("/v1/partners/initech/endpoints", headers=auth, json={"mode": "pull"})
    assert made.status_code == 201, made.get_json()
    pull = made.get_json()["id"]
    link = client.post("/v1/partners/initech/portal-links", headers=auth).get_json()["url"]
    page.goto(scene.url + "/" + link.split("/", 3)[3])
    page.wait_for_url(re.compile(r"/portal/$"))
    page.goto(f"{scene.url}/portal/endpoints/{pull}")
    page.fill("[data-testid=feed-keys] input[name=name]", "billing consumer")
    page.click("button:has-text('Make a feed key')")
    token = page.inner_text("#feed-key").strip()
    page.reload()  # shown once
    assert page.locator("[data-testid=new-feed-key]").count() == 0
    assert "billing consumer" in page.inner_text("[data-testid=feed-key-list]")

    bearer = {"Authorization": f"Bearer {token}"}
    read = client.get(f"/v1/partners/initech/feed?endpoint={pull}", headers=bearer)
    assert read.status_code == 200
    cursor = read.get_json()["next_cursor"]
    acked = client.post(
        f"/v1/partners/initech/endpoints/{pull}/ack", headers=bearer, json={"cursor": cursor}
    )
    assert acked.status_code in (200, 204), acked.get_json()
    # Read-only otherwise: it changes no endpoint.
    changed = client.patch(
        f"/v1/partners/initech/endpoints/{pull}", headers=bearer, json={"description": "x"}
    )
    assert changed.status_code == 403

    page.click("[data-testid=feed-key-list] button:has-text('Revoke')")
    assert "revoked" in page.inner_text(".flashes")
    assert (
        client.get(f"/v1/partners/initech/feed?endpoint={pull}", headers=bearer).status_code == 401
    )
