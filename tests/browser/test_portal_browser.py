"""The partner portal in a real Chromium (Playwright) against a live Kurir on 127.0.0.1.

A partner opens a magic link, adds an endpoint pointing at a local receiver, sends it a test
event (checked with the Standard Webhooks library), rotates the secret, watches a failing
delivery's attempts and resends it once the receiver is fixed; links are one-time, another
partner sees nothing by guessing URLs, a forged POST is refused, and the portal shows inside
an `<iframe>` only on a page from an allowed origin. Chromium is Debian's (`apt-get install
chromium`); without it these tests skip, saying so.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select
from standardwebhooks import Webhook

from app.config import Settings
from app.models import Delivery, Endpoint, EndpointSecret
from app.ports import free_port
from app.runtime import Runtime
from tests.browser.test_ui_browser import chromium  # noqa: F401 - the shared browser
from tests.conftest import LiveServer
from tests.support.factories import Received, Receiver, WorkerThread, wait_for
from tests.support.publish import ORDER_SCHEMA

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # A failed attempt waits for a resend here, not for an automatic retry 5 s later.
    return settings.with_overrides(retry_schedule=(600,))


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:  # noqa: F811
    chromium.clear_cookies()
    tab = chromium.new_page()
    tab.on("dialog", lambda dialog: dialog.accept())  # the data-confirm prompts
    yield tab
    tab.close()


class Switch:
    """The receiver's mood: failing (500 with a body) or fine (200)."""

    def __init__(self) -> None:
        self.failing = False

    def reply(self, received: Received, count: int) -> tuple[int, dict[str, str], bytes]:
        if self.failing:
            return 500, {"content-type": "text/plain"}, b"database is down, sorry"
        return 200, {"content-type": "text/plain"}, b"thanks"


@dataclass
class Live:
    url: str
    receiver: Receiver
    switch: Switch
    admin: dict[str, str]


@pytest.fixture
def kurir(runtime: Any, live_server: Any, client: Any, auth: dict[str, str]) -> Iterator[Live]:
    switch = Switch()
    with Receiver(reply=switch.reply) as receiver:
        assert (
            client.post(
                "/v1/event-types",
                headers=auth,
                json={
                    "name": "order.created",
                    "version": 1,
                    "schema": ORDER_SCHEMA,
                    "description": "An order was placed.",
                },
            ).status_code
            == 201
        )
        for uid in ("acme", "globex"):
            assert (
                client.post(
                    "/v1/partners", headers=auth, json={"uid": uid, "name": uid.title()}
                ).status_code
                == 201
            )
        with WorkerThread(runtime):
            yield Live(live_server.url, receiver, switch, auth)


def magic_link(client: Any, live: Live, uid: str, base: str | None = None) -> str:
    answer = client.post(f"/v1/partners/{uid}/portal-links", headers=live.admin)
    assert answer.status_code == 201
    path = "/" + answer.get_json()["url"].split("/", 3)[3]
    return (base or live.url) + path


def enter(page: Any, link: str) -> None:
    page.goto(link)
    page.wait_for_url(re.compile(r"/portal/$"))


def _secret_of(runtime: Any, endpoint_id: str) -> str:
    with runtime.db.begin() as session:
        rows = session.scalars(
            select(EndpointSecret)
            .where(EndpointSecret.endpoint_id == endpoint_id)
            .order_by(EndpointSecret.created_at.desc())
        ).all()
        return runtime.secret_box.decrypt(rows[0].secret_encrypted)


def test_a_partner_sets_up_tests_rotates_and_recovers_a_failed_delivery(
    page, kurir, client, runtime
):
    link = magic_link(client, kurir, "acme")
    enter(page, link)
    assert page.inner_text("[data-testid=partner]") == "Acme"
    assert page.locator("[data-testid=no-endpoints]").is_visible()

    # Create an endpoint pointing at the local receiver.
    page.click("text=Add your first endpoint")
    page.fill("input[name=url]", kurir.receiver.url + "/hook")
    page.fill("input[name=description]", "staging")
    page.click("button:has-text('Create endpoint')")
    page.wait_for_url(re.compile(r"/portal/endpoints/ep_"))
    endpoint_id = page.url.rsplit("/", 1)[1]
    assert "Endpoint created" in page.inner_text(".flashes")

    # Send a test event: it arrives, verifies, and the page shows its attempt.
    page.click("button:has-text('Send a test event')")
    page.wait_for_selector("[data-testid=test-outcome]", timeout=30_000)
    assert "answered 200" in page.inner_text("[data-testid=test-outcome]")
    assert "thanks" in page.inner_text("[data-testid=attempt-body]")
    assert "ms" in page.inner_text("[data-testid=attempt-duration]")
    (received,) = kurir.receiver.on("/hook")
    page.goto(f"{kurir.url}/portal/endpoints/{endpoint_id}/secret")
    page.click("button:has-text('Reveal')")
    secret = page.inner_text("[data-testid=secret]").strip()
    event = Webhook(secret).verify(received.body, received.headers)
    assert event["type"] == "kurir.test" and event["data"]["endpoint"] == endpoint_id

    # Rotate: the page says until when the old secret signs.
    page.click("button:has-text('Rotate secret')")
    page.wait_for_selector("[data-testid=overlap]")
    assert "keeps signing until" in page.inner_text("[data-testid=overlap]")
    assert _secret_of(runtime, endpoint_id) != secret

    # A delivery made to fail shows its attempts; fixed, a resend delivers it.
    kurir.switch.failing = True
    published = client.post(
        "/v1/partners/acme/events",
        headers=kurir.admin,
        json={"type": "order.created", "version": 1, "data": {"order_id": "o-9", "amount": 5}},
    )
    delivery_id = published.get_json()["deliveries"][0]["id"]
    wait_for(
        lambda: _state(runtime, delivery_id) == "retrying",
        timeout_s=20,
        message="the first attempt to fail",
    )
    page.goto(f"{kurir.url}/portal/deliveries?endpoint={endpoint_id}&state=retrying")
    page.click(f"a:has-text('{delivery_id}')")
    page.wait_for_url(re.compile(f"/portal/deliveries/{delivery_id}$"))
    assert page.inner_text("[data-testid=attempt-status]").strip() == "500"
    assert "database is down" in page.inner_text("[data-testid=attempt-body]")
    kurir.switch.failing = False
    page.click("[data-testid=resend]")
    wait_for(
        lambda: _state(runtime, delivery_id) == "succeeded",
        timeout_s=20,
        message="the resent delivery to arrive",
    )
    page.reload()
    assert page.locator("[data-testid=delivery-state] .badge-succeeded").is_visible()
    assert page.locator("[data-testid=attempt]").count() == 2

    # The link was spent: opening it again is refused with a clear page.
    page.goto(link)
    page.wait_for_selector("[data-testid=link-refused]")
    assert "already used" in page.inner_text("[data-testid=link-refused]")


def _state(runtime: Any, delivery_id: str) -> str:
    with runtime.db.begin() as session:
        return session.get_one(Delivery, delivery_id).state


def test_another_partner_guesses_urls_and_a_forged_post_is_refused(page, kurir, client, runtime):
    created = client.post(
        "/v1/partners/acme/endpoints",
        headers=kurir.admin,
        json={"url": kurir.receiver.url + "/acme-secret-place"},
    ).get_json()
    enter(page, magic_link(client, kurir, "globex"))
    for path in (
        f"/portal/endpoints/{created['id']}",
        f"/portal/endpoints/{created['id']}/secret",
    ):
        response = page.goto(kurir.url + path)
        assert response.status == 404, path
        assert "acme-secret-place" not in page.content()
    # Its deliveries: the log keeps its form and says no such endpoint, as for any id.
    page.goto(f"{kurir.url}/portal/deliveries?endpoint={created['id']}")
    assert "does not exist" in page.inner_text("[data-testid=filter-unknown]")
    assert "acme-secret-place" not in page.content()
    # Same browser, same session, no CSRF token: what a forged cross-site form would send.
    forged = page.request.post(
        f"{kurir.url}/portal/endpoints/{created['id']}/secret/rotate", form={}, max_redirects=0
    )
    assert forged.status == 400 and "expired" in forged.text()
    own = page.request.post(
        f"{kurir.url}/portal/endpoints/new",
        max_redirects=0,
        form={"url": kurir.receiver.url + "/globex", "all_types": "1", "timeout_s": "10"},
    )
    assert own.status == 400
    with runtime.db.begin() as session:
        assert len(session.get_one(Endpoint, created["id"]).secrets) == 1
        assert (
            session.scalars(select(Endpoint).where(Endpoint.url.endswith("/globex"))).first()
            is None
        )
    page.click("button:has-text('Sign out')")
    page.wait_for_selector("[data-testid=signed-out]")
    response = page.goto(kurir.url + "/portal/")
    assert response.status == 401


def test_the_portal_fits_a_phone(page, kurir, client):
    client.post(
        "/v1/partners/acme/endpoints",
        headers=kurir.admin,
        json={"url": kurir.receiver.url + "/a-rather-long-path/for/a/phone/screen"},
    )
    page.set_viewport_size(PHONE)
    enter(page, magic_link(client, kurir, "acme"))
    for path in ("/portal/", "/portal/catalog", "/portal/verify", "/portal/deliveries"):
        page.goto(kurir.url + path)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{path} is {overflow}px wider than a phone"
    page.goto(kurir.url + "/portal/")
    page.click("label.nav-burger")
    assert page.locator("nav a:has-text('Event catalog')").is_visible()


class _Embedder:
    """A page on another origin that shows the portal in an iframe, like a publisher's
    dashboard."""

    def __init__(self, port: int) -> None:
        self.src = ""
        embedder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                body = (
                    f"<!doctype html><title>Dashboard</title><h1>Our dashboard</h1>"
                    f'<iframe id="portal" src="{embedder.src}" width="900" height="700">'
                    f"</iframe>"
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_portal_shows_in_an_iframe_only_from_an_allowed_origin(
    page, kurir, client, runtime, settings
):
    from app.web import create_app

    allowed, other = _Embedder(free_port()), _Embedder(free_port())
    framed = create_app(
        runtime=Runtime(
            settings.with_overrides(
                portal_frame_ancestors=allowed.url.rstrip("/"), cookie_secure=True
            ),
            database=runtime.db,
        )
    )
    try:
        with LiveServer(framed) as server:
            # Kurir as "localhost", the dashboards as "127.0.0.1": another site, so the portal
            # cookie is a third-party one (SameSite=None; Secure; Partitioned).
            kurir_base = server.url.replace("127.0.0.1", "localhost")
            allowed.src = magic_link(client, kurir, "acme", base=kurir_base)
            page.goto(allowed.url)
            frame = page.frame_locator("#portal")
            frame.locator("[data-testid=partner]").wait_for()
            assert frame.locator("[data-testid=partner]").inner_text() == "Acme"
            frame.locator("nav a:has-text('Event catalog')").click()
            frame.locator("text=order.created").first.wait_for()  # the session holds

            other.src = magic_link(client, kurir, "acme", base=kurir_base)
            refused: list[str] = []
            page.on("console", lambda message: refused.append(message.text))
            page.goto(other.url)
            page.wait_for_load_state("load")
            wait_for(
                lambda: any("frame-ancestors" in m for m in refused),
                timeout_s=10,
                message="Chromium to refuse the frame",
            )
            child = next(f for f in page.frames if f != page.main_frame)
            assert "Acme" not in child.content()
    finally:
        allowed.close()
        other.close()
