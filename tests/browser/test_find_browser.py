"""Finding things in a real Chromium: one search box (event id, resource id, correlation id,
payload words) in the operator's deliveries and events and the partner's delivery log;
pickers instead of ids; the dead letters' endpoint column; a filter value that names nothing
keeps the form and says so on every list; and times people can read and enter (local time
beside relative time, date-time inputs with presets), checked in a Berlin browser.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from app.accounts import create_operator
from app.clock import utcnow
from tests.browser.test_ui_browser import CHROMIUM, CHROMIUM_ARGS, EMAIL, PASSWORD, TIMEOUT_MS
from tests.support.dlq_factories import (
    make_dead_letter,
    make_delivery,
    make_endpoint,
    make_event,
    make_partner,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def berlin() -> Iterator[Any]:
    """A browser whose clock is in Berlin (UTC+1 in December)."""
    import os

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (see .ci/run)")
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory(prefix="kurir-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            timezone_id="Europe/Berlin",
        )
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        context.close()


@pytest.fixture
def tab(berlin: Any) -> Iterator[Any]:
    berlin.clear_cookies()
    page = berlin.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    yield page
    page.close()


@dataclass
class Scene:
    url: str
    event: str  # resource pay_00027, correlation corr-…, payload word "zebracorn"
    delivery: str
    hooks: str
    ledger: str
    old_delivery: str  # created three hours ago


@pytest.fixture
def scene(runtime: Any, live_server: Any) -> Scene:
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
        globex = make_partner(session, "globex")
        make_partner(session, "initech")
        hooks, _ = make_endpoint(
            session, runtime.secret_box, globex, url="http://127.0.0.1:9/hooks"
        )
        ledger, _ = make_endpoint(
            session, runtime.secret_box, globex, url="http://127.0.0.1:9/ledger"
        )
        ledger.description = "the ledger"
        event = make_event(session, globex, data={"order": "o-1", "note": "zebracorn parcel"})
        event.resource_type, event.resource_id = "payment", "pay_00027"
        event.correlation_id = "corr-" + "x" * 40
        delivery = make_delivery(session, hooks, event, "retrying", [500])
        for endpoint in (hooks, ledger):
            make_dead_letter(session, endpoint, make_event(session, globex))
        old = make_delivery(session, hooks, make_event(session, globex), "succeeded", [200])
        old.created_at = utcnow() - timedelta(hours=3)
        return Scene(live_server.url, event.id, delivery.id, hooks.id, ledger.id, old.id)


def _login(tab: Any, scene: Scene) -> None:
    tab.goto(scene.url + "/ui/")
    tab.fill("input[name=email]", EMAIL)
    tab.fill("input[name=password]", PASSWORD)
    tab.click("button:has-text('Sign in')")
    tab.wait_for_url(re.compile(r"/ui/$"))


def _rows(tab: Any) -> list[str]:
    return [r.get_attribute("data-delivery") for r in tab.locator("tr[data-delivery]").all()]


def _search(tab: Any, text: str) -> None:
    tab.fill("input[name=q]", text)
    tab.press("input[name=q]", "Enter")
    tab.wait_for_load_state()


def test_operators_search_pick_and_keep_their_filters(tab, scene):
    _login(tab, scene)
    # Deliveries: by resource id, event id, correlation id and payload word.
    tab.goto(scene.url + "/ui/deliveries")
    for text in ("pay_00027", scene.event, "corr-" + "x" * 40, "zebracorn"):
        _search(tab, text)
        assert _rows(tab) == [scene.delivery], text
    _search(tab, "nothing-has-this")
    assert _rows(tab) == []

    # The header lookup takes a resource id too, and lists its events.
    tab.fill("header input[name=id]", "pay_00027")
    tab.press("header input[name=id]", "Enter")
    tab.wait_for_load_state()
    assert scene.event in tab.inner_text("[data-testid=events]")

    # Dead letters: pick a partner and an endpoint by URL and description; the endpoint
    # column tells the two endpoints' letters apart.
    tab.goto(scene.url + "/ui/dead-letters")
    endpoints = tab.locator("[data-testid=letter-endpoint]").all_inner_texts()
    assert sorted(endpoints) == [
        "http://127.0.0.1:9/hooks",
        "http://127.0.0.1:9/ledger — the ledger",
    ]
    tab.click("summary:has-text('Filters')")
    tab.select_option("select[name=partner]", "globex")
    tab.select_option(
        "select[name=endpoint]", label="globex — http://127.0.0.1:9/ledger — the ledger"
    )
    tab.select_option("select[name=reason]", "retries_exhausted")
    tab.click("button:has-text('Apply filters')")
    tab.wait_for_url(re.compile(r"endpoint=" + scene.ledger))
    assert tab.inner_text("[data-testid=matching]") == "1"

    # A partner that does not exist: the same answer on every list, the form kept.
    for path in ("/ui/deliveries", "/ui/dead-letters", "/ui/events", "/ui/endpoints"):
        answer = tab.goto(f"{scene.url}{path}?partner=nonexistent&type=order.created")
        assert answer.status == 200, path
        assert "'nonexistent' does not exist" in tab.inner_text("[data-testid=filter-unknown]")
        picked = tab.locator("select[name=partner] option:checked").inner_text()
        assert picked == "nonexistent (unknown)", path


def test_times_are_local_and_filters_take_presets(tab, scene):
    _login(tab, scene)
    tab.goto(f"{scene.url}/ui/deliveries")
    # Beside "3 h ago", the absolute time in the reader's zone, to the second.
    stamp = tab.locator(f"tr[data-delivery={scene.old_delivery}] .abs").inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d Europe/Berlin", stamp), stamp
    assert "3 h ago" in tab.locator(f"tr[data-delivery={scene.old_delivery}] time").inner_text()
    # "Last 1 h" leaves out the delivery of three hours ago; the since field shows when
    # that was in Berlin time.
    tab.click("button:has-text('Last 1 h')")
    tab.wait_for_url(re.compile(r"since="))
    assert scene.old_delivery not in _rows(tab) and scene.delivery in _rows(tab)
    since = tab.input_value("input[name=since]")
    berlin_now = tab.evaluate("() => new Date().getHours()")
    assert int(since[11:13]) in ((berlin_now - 1) % 24, berlin_now), since
    # A local time typed by hand: four hours ago in Berlin takes the old one in again.
    four_hours_ago = tab.evaluate(
        """() => {
            const d = new Date(Date.now() - 4 * 3600e3);
            const p = n => String(n).padStart(2, '0');
            return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}`
                + `T${p(d.getHours())}:${p(d.getMinutes())}:00`;
        }"""
    )
    tab.fill("input[name=since]", four_hours_ago)
    tab.click("[data-testid=delivery-filters] button:has-text('Show')")
    tab.wait_for_load_state()
    assert scene.old_delivery in _rows(tab)
    # Detail lines: no microseconds anywhere.
    tab.goto(f"{scene.url}/ui/deliveries/{scene.old_delivery}")
    facts = tab.inner_text("section.facts") + tab.inner_text("[data-testid=attempt]")
    assert not re.search(r"\d\d:\d\d:\d\d\.\d{6}", facts)
    assert "Europe/Berlin" in facts


def test_a_partner_finds_a_delivery_by_webhook_id_or_resource(tab, scene, client, auth):
    link = client.post("/v1/partners/globex/portal-links", headers=auth).get_json()["url"]
    tab.goto(scene.url + "/" + link.split("/", 3)[3])
    tab.wait_for_url(re.compile(r"/portal/$"))
    tab.goto(scene.url + "/portal/deliveries")
    for text in (scene.event, "pay_00027", "zebracorn"):
        _search(tab, text)
        assert _rows(tab) == [scene.delivery], text
    answer = tab.goto(f"{scene.url}/portal/deliveries?endpoint=ep_nope")
    assert answer.status == 200
    assert "does not exist" in tab.inner_text("[data-testid=filter-unknown]")
    assert tab.locator("select[name=endpoint] option:checked").inner_text() == "ep_nope (unknown)"
