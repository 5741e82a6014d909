"""The operator UI in a real Chromium (Playwright) against a live Kurir on 127.0.0.1.

A worker thread (the real RQ worker and delivery engine) delivers to a local receiver, so
"resend" is checked all the way to the partner's door. Chromium is Debian's
(`apt-get install chromium`); without it these tests skip, saying so.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import select

from app.accounts import create_operator
from app.models import DeadLetter, Delivery, Event, PortalLink
from tests.support.dlq_factories import letters_for, make_scene
from tests.support.factories import Receiver, WorkerThread, wait_for

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EMAIL, PASSWORD = "ops@example.com", "correct horse battery"
TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (see .ci/run)")
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory(prefix="kurir-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        context.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    chromium.clear_cookies()
    tab = chromium.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())  # the data-confirm prompts
    yield tab
    tab.close()


@dataclass
class Live:
    url: str
    receiver: Receiver
    target: str  # a letter whose payload holds a unique word
    target_event: str
    bulk: list[str]  # 50 letters of type bulk.test
    doomed: str  # a letter to discard


@pytest.fixture
def kurir(runtime: Any, live_server: Any) -> Iterator[Live]:
    with Receiver() as receiver:
        with runtime.db.begin() as session:
            create_operator(session, EMAIL, PASSWORD)
            scene = make_scene(session, runtime.secret_box, uid="acme", url=receiver.url + "/hook")
            (target,) = letters_for(
                session, scene, 1, data={"order": "ord_1", "note": "zebracorn parcel"}
            )
            bulk = letters_for(session, scene, 50, type="bulk.test")
            (doomed,) = letters_for(session, scene, 1, data={"note": "platypus refund"})
            target_event = session.get_one(DeadLetter, target).event_id
        with WorkerThread(runtime):
            yield Live(live_server.url, receiver, target, target_event, bulk, doomed)


def login(page: Any, live: Live, path: str = "/ui/") -> None:
    page.goto(live.url + path)
    assert "/ui/login" in page.url  # logged out: sent to the login page
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(re.escape(live.url + path.split("?")[0])))


def _delivery_states(runtime: Any, letter_ids: list[str]) -> list[str]:
    with runtime.db.begin() as session:
        return list(
            session.scalars(
                select(Delivery.state)
                .join(DeadLetter, DeadLetter.delivery_id == Delivery.id)
                .where(DeadLetter.id.in_(letter_ids))
            )
        )


def test_find_open_resend_and_see_it_delivered(page, kurir, runtime):
    login(page, kurir, "/ui/dead-letters")
    page.fill("input[name=q]", "zebracorn")
    page.press("input[name=q]", "Enter")
    page.wait_for_url(re.compile(r"q=zebracorn"))
    rows = page.locator("table.letters tbody tr")
    assert rows.count() == 1
    page.click(f"a:has-text('{kurir.target}')")
    page.wait_for_url(re.compile(f"/ui/dead-letters/{kurir.target}$"))
    assert "zebracorn parcel" in page.inner_text("[data-testid=payload]")
    page.click("button:has-text('Resend')")
    assert "Resent" in page.inner_text(".flashes")
    assert page.locator(".badge-resent").first.is_visible()
    wait_for(
        lambda: kurir.receiver.event_ids("/hook") == [kurir.target_event],
        timeout_s=15,
        message="the resend to reach the receiver",
    )
    wait_for(
        lambda: _delivery_states(runtime, [kurir.target]) == ["succeeded"],
        timeout_s=15,
        message="the delivery to be recorded as succeeded",
    )
    # The event page now shows the succeeded delivery.
    page.fill("input[name=id]", kurir.target_event)
    page.press("input[name=id]", "Enter")
    page.wait_for_url(re.compile(f"/ui/events/{kurir.target_event}$"))
    assert page.locator(".badge-succeeded").count() >= 1


def test_bulk_resend_a_filter_of_fifty_and_discard_one(page, kurir, runtime):
    login(page, kurir, "/ui/dead-letters")
    page.click("summary:has-text('Filters')")
    page.fill("input[name=type]", "bulk.test")
    page.click("button:has-text('Apply filters')")
    page.wait_for_url(re.compile(r"type=bulk.test"))
    assert page.inner_text("[data-testid=matching]") == "50"
    page.click("button:has-text('Resend all matching')")
    page.wait_for_url(re.compile(r"/ui/jobs/bop_"))
    for _ in range(40):  # the page refreshes itself every 2 s while the job runs
        if page.locator("[data-testid=job-state] .badge-succeeded").count():
            break
        page.wait_for_timeout(250)
        page.reload()
    assert page.inner_text("[data-testid=job-done]") == "50"
    wait_for(
        lambda: len(set(kurir.receiver.event_ids("/hook"))) == 50,
        timeout_s=20,
        message="50 resent deliveries to arrive",
    )
    wait_for(
        lambda: set(_delivery_states(runtime, kurir.bulk)) == {"succeeded"},
        timeout_s=20,
        message="50 deliveries recorded as succeeded",
    )

    # Discard one, picked with "select all on this page" (the page's own script).
    page.goto(kurir.url + "/ui/dead-letters?q=platypus")
    page.check("[data-select-all]")
    assert page.inner_text("[data-selected-count]") == "1 selected"
    page.fill("input[name=note]", "refunded by hand")
    page.click("button:has-text('Discard selected')")
    assert "Discarded 1 dead letter." in page.inner_text(".flashes")
    with runtime.db.begin() as session:
        doomed = session.get_one(DeadLetter, kurir.doomed)
        assert (doomed.state, doomed.note) == ("discarded", "refunded by hand")
        assert doomed.audit[-1].actor == f"operator:{EMAIL}"


def test_forged_post_is_rejected_and_logout_locks_the_ui(page, kurir, runtime):
    login(page, kurir)
    # Same browser, same session cookie, but no CSRF token: what a forged form would send.
    forged = page.request.post(
        f"{kurir.url}/ui/dead-letters/{kurir.target}/resend", form={"force": "1"}, max_redirects=0
    )
    assert forged.status == 400
    assert "CSRF" in forged.text()
    with runtime.db.begin() as session:
        assert session.get_one(DeadLetter, kurir.target).state == "open"
        assert session.get_one(Event, kurir.target_event) is not None
    page.click("button:has-text('Sign out')")
    page.wait_for_url(re.compile(r"/ui/login$"))
    page.goto(kurir.url + "/ui/endpoints")
    assert "/ui/login?next=" in page.url


def test_dead_letters_fit_a_phone_screen(page, kurir):
    page.set_viewport_size({"width": 390, "height": 844})
    login(page, kurir, "/ui/dead-letters")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"page is {overflow}px wider than a phone"
    assert page.locator("table.letters tbody tr").first.is_visible()
    page.click("label.nav-burger")
    assert page.locator("nav a:has-text('Endpoints')").is_visible()


def test_an_operator_makes_a_read_only_support_link_limited_to_deliveries(page, kurir, runtime):
    login(page, kurir, "/ui/partners/acme")
    page.click("[data-testid=link-scope] summary")
    page.check("[data-testid=scope-read-only]")
    page.check("[data-testid=scope-deliveries]")
    page.click("[data-testid=open-portal]")
    page.wait_for_url(re.compile(r"/ui/partners/acme/portal-links/"))
    assert "read-only; only deliveries" in page.inner_text("[data-testid=link-scope-shown]")
    link = page.inner_text("[data-testid=portal-link]").strip()
    with runtime.db.begin() as session:
        made = session.scalars(select(PortalLink).order_by(PortalLink.id.desc())).first()
        assert made is not None and made.read_only and made.features == ["deliveries"]

    page.goto(link)
    banner = page.inner_text("[data-testid=portal-scope]")
    assert "read-only; only deliveries" in banner
    nav = page.locator("nav a")
    assert nav.filter(has_text="Deliveries").count() == 1
    assert nav.filter(has_text="Endpoints").count() == 0
    assert nav.filter(has_text="Event catalog").count() == 0
