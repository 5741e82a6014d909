"""What both web faces show as delivered, read in a real Chromium (Playwright).

The real engine sends one published v2 event to a receiver on 127.0.0.1: to two endpoints
pinned to v1 (one dies into a dead letter) and to one unpinned endpoint. An operator and the
partner then read the body sent, the delivered version and the pins as a browser renders them.
Chromium is Debian's (`apt-get install chromium`); without it these tests skip, saying so.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from app.accounts import create_operator
from tests.browser.test_portal_browser import enter
from tests.browser.test_ui_browser import EMAIL, PASSWORD, chromium  # noqa: F401
from tests.support import delivered as kit
from tests.support.factories import Receiver, WorkerThread

pytestmark = pytest.mark.browser


@pytest.fixture
def settings(settings: Any) -> Any:
    return settings.with_overrides(**kit.SETTINGS)


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:  # noqa: F811
    chromium.clear_cookies()
    tab = chromium.new_page()
    yield tab
    tab.close()


@pytest.fixture
def operator(runtime: Any) -> None:
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)


@pytest.fixture
def scene(
    client: Any, auth: dict[str, str], runtime: Any, live_server: Any, operator: None
) -> kit.Scene:
    with Receiver(reply=kit.reply) as receiver, WorkerThread(runtime):
        return kit.build(client, auth, runtime, receiver)


class Faces:
    """The operator's and the partner's browser tabs on the live server."""

    def __init__(self, page: Any, url: str, client: Any, auth: dict[str, str]) -> None:
        self.page, self.url, self.client, self.auth = page, url, client, auth
        self.in_portal = False

    def operator(self, path: str) -> Any:
        self.page.goto(self.url + path)
        if "/ui/login" in self.page.url:
            self.page.fill("input[name=email]", EMAIL)
            self.page.fill("input[name=password]", PASSWORD)
            self.page.click("button:has-text('Sign in')")
            self.page.wait_for_url(re.compile(re.escape(self.url + path.split("?")[0])))
        return self.page

    def partner(self, path: str) -> Any:
        if not self.in_portal:
            answer = self.client.post("/v1/partners/acme/portal-links", headers=self.auth)
            assert answer.status_code == 201
            enter(self.page, self.url + "/" + answer.get_json()["url"].split("/", 3)[3])
            self.in_portal = True
        self.page.goto(self.url + path)
        return self.page


@pytest.fixture
def faces(page: Any, live_server: Any, client: Any, auth: dict[str, str]) -> Faces:
    return Faces(page, live_server.url, client, auth)


def test_x1_the_body_shown_is_the_bytes_received_with_an_indented_view_beside(faces, scene):
    pinned_dead, latest = scene.deliveries["/pinned-dead"], scene.deliveries["/latest"]
    views = [
        ("/pinned-dead", faces.operator, f"/ui/dead-letters/{scene.letter_id}"),
        ("/pinned-dead", faces.operator, f"/ui/deliveries/{pinned_dead}"),
        ("/latest", faces.operator, f"/ui/deliveries/{latest}"),
        ("/pinned-ok", faces.partner, f"/portal/deliveries/{scene.deliveries['/pinned-ok']}"),
        ("/latest", faces.partner, f"/portal/deliveries/{latest}"),
    ]
    for path, face, url in views:
        tab = face(url)
        raw = tab.text_content("[data-testid=payload]")
        assert raw.encode("utf-8") == scene.captured[path], f"{url}: not the bytes {path} got"
        # The indented view waits behind its summary, and is the same document.
        pretty = tab.locator("[data-testid=payload-pretty]")
        assert not pretty.is_visible()
        tab.click("[data-testid=payload-pretty-view] summary")
        assert pretty.is_visible() and "\n  " in pretty.text_content()
    # What the pinned endpoint got is v1 as the downgrade made it, with the HTML as text.
    tab = faces.partner(f"/portal/deliveries/{scene.deliveries['/pinned-ok']}")
    raw = tab.text_content("[data-testid=payload]")
    assert '"version":1' in raw and '"amount":4242' in raw
    assert "<b>Zoë & " in raw and "&amp;" not in raw  # unescaped once, by the browser
    assert tab.locator("[data-testid=payload] b").count() == 0  # no markup from the data


def test_x2_logs_lists_and_facts_name_the_delivered_version(faces, scene):
    pinned, dead, latest = (scene.deliveries[p] for p in kit.PATHS)

    def version_in_row(tab: Any, delivery_id: str) -> str:
        return tab.inner_text(f"tr[data-delivery='{delivery_id}'] [data-testid=delivered-version]")

    tab = faces.operator("/ui/deliveries")
    assert version_in_row(tab, pinned) == "v1 (pinned)"
    assert version_in_row(tab, dead) == "v1 (pinned)"
    assert version_in_row(tab, latest) == "v2"
    tab = faces.operator("/ui/dead-letters")
    row = tab.locator("table.letters tbody tr", has_text=scene.letter_id)
    assert "payment.succeeded v1" in row.inner_text()
    tab = faces.operator(f"/ui/dead-letters/{scene.letter_id}")
    assert tab.inner_text(".facts [data-testid=delivered-version]") == "v1"
    assert "published as v2" in tab.inner_text(".facts")
    tab = faces.operator(f"/ui/deliveries/{latest}")
    assert tab.inner_text(".facts [data-testid=delivered-version]") == "v2"
    tab = faces.operator(f"/ui/events/{scene.event_id}")
    shown = tab.locator("td[data-testid=delivered-version]").all_inner_texts()
    assert sorted(shown) == ["v1 (pinned)", "v1 (pinned)", "v2"]

    tab = faces.partner("/portal/deliveries")
    assert version_in_row(tab, pinned) == "v1 (pinned)"
    assert version_in_row(tab, latest) == "v2"
    tab = faces.partner(f"/portal/endpoints/{scene.endpoints['/pinned-ok']}")
    assert version_in_row(tab, pinned) == "v1 (pinned)"  # "Recent deliveries"
    tab = faces.partner(f"/portal/deliveries/{pinned}")
    assert tab.inner_text(".facts [data-testid=delivered-version]") == "v1"


@pytest.fixture
def pinned(client: Any, auth: dict[str, str], live_server: Any, operator: None) -> Any:
    return kit.setup(client, auth, "http://127.0.0.1:9")


def test_x3_both_endpoint_pages_show_pins_with_deprecation_and_sunset(faces, pinned):
    endpoints, sunset = pinned
    day = sunset.strftime("%Y-%m-%d")
    for face, prefix in ((faces.operator, "/ui"), (faces.partner, "/portal")):
        tab = face(f"{prefix}/endpoints/{endpoints['/pinned-ok']}")
        pins = tab.inner_text("[data-testid=pins]")
        assert "payment.succeeded v1" in pins and "deprecated" in pins
        assert f"sunset on {day}" in pins and "newest is v2" in pins
        notice = tab.locator("[data-testid=pin-notice]")
        assert notice.is_visible() and "payment.succeeded v1 is deprecated" in notice.inner_text()
        tab = face(f"{prefix}/endpoints/{endpoints['/latest']}")
        assert "every type arrives in the version published" in tab.inner_text("[data-testid=pins]")
        assert tab.locator("[data-testid=pin-notice]").count() == 0
