"""Endpoint health in a real Chromium: failing endpoints and blocked ordering keys on the
dashboard, red and amber states sorted worst first, the success chart, the partner's
"your endpoint is failing" banner, and a delivery held behind a blocked key that says so.

The rows are what the engine would have written (attempts, a dead letter parked by
`sender.park`); no worker runs, so nothing changes under the pages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from app.accounts import create_operator
from app.clock import utcnow
from tests.browser.test_ui_browser import EMAIL, PASSWORD, chromium, page  # noqa: F401
from tests.support.dlq_factories import (
    make_dead_letter,
    make_delivery,
    make_endpoint,
    make_event,
    make_partner,
)

pytestmark = pytest.mark.browser


@dataclass
class Scene:
    url: str
    hooks: str  # failing: 8 failures in a row, 0 %
    ok: str  # healthy
    held: str  # a delivery behind a blocked key
    head_event: str


@pytest.fixture
def scene(runtime: Any, live_server: Any) -> Scene:
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)
        globex = make_partner(session, "globex")
        hooks, _ = make_endpoint(
            session, runtime.secret_box, globex, url="http://127.0.0.1:9/hooks"
        )
        ok, _ = make_endpoint(session, runtime.secret_box, globex, url="http://127.0.0.1:9/ok")
        ledger, _ = make_endpoint(
            session, runtime.secret_box, globex, url="http://127.0.0.1:9/ledger"
        )
        ledger.ordering, ledger.on_dead = "key", "block"
        hooks.consecutive_failures = 8
        ok.last_success_at = utcnow()
        make_delivery(session, hooks, make_event(session, globex), "retrying", [500] * 8)
        make_delivery(session, ok, make_event(session, globex), "succeeded", [200, 200, 200])
        first = make_event(session, globex)
        letter = make_dead_letter(session, ledger, first)
        letter.delivery.ordering_key, letter.delivery.ordering_seq = "cust-7", 1
        held = make_delivery(
            session,
            ledger,
            make_event(session, globex),
            "pending",
            [],
            ordering_key="cust-7",
            ordering_seq=2,
            previous_event_id=first.id,
        )
        ids = Scene(live_server.url, hooks.id, ok.id, held.id, first.id)
    return ids


def _login(page: Any, scene: Scene) -> None:  # noqa: F811
    page.goto(scene.url + "/ui/")
    page.fill("input[name=email]", EMAIL)
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(re.compile(r"/ui/$"))


def test_failing_endpoints_and_blocked_keys_are_visible_to_operators(page, scene):  # noqa: F811
    _login(page, scene)
    # Dashboard: the failing endpoint is listed; the held delivery is not "in flight".
    assert page.inner_text("[data-testid=failing-count]") == "1"
    assert "127.0.0.1:9/hooks" in page.inner_text("[data-testid=dashboard-failing]")
    assert page.inner_text("[data-testid=held-count]") == "1"
    assert page.inner_text("[data-testid=in-flight]") == "1"  # the retrying one only
    assert page.locator("[data-testid=dashboard-blocked-keys]").is_visible()

    # Endpoints, worst health first: red before green.
    page.goto(scene.url + "/ui/endpoints")
    page.select_option("select[name=sort]", "health")
    page.click("button:has-text('Show')")
    page.wait_for_url(re.compile(r"sort=health"))
    first = page.locator("table tbody tr").first
    assert first.get_attribute("data-endpoint") == scene.hooks
    assert first.locator("[data-testid=health]").inner_text() == "failing"
    color = first.locator("[data-testid=success-rate]").evaluate("e => getComputedStyle(e).color")
    assert color == "rgb(180, 35, 24)"  # the danger red
    ok_row = page.locator(f"tr[data-endpoint={scene.ok}]")
    assert ok_row.locator("[data-testid=health]").inner_text() == "healthy"

    # The failing endpoint's page: a banner and a success chart, 24 h then 7 d.
    page.click(f"tr[data-endpoint={scene.hooks}] a")
    assert "8 failed attempts in a row" in page.inner_text("[data-testid=failing-banner]")
    assert page.locator("[data-testid=chart-bar]").count() >= 1
    page.click("[data-testid=success-chart] a:has-text('7 d')")
    page.wait_for_url(re.compile(r"range=7d"))
    assert "last 7 days" in page.inner_text("[data-testid=success-chart] h2")
    assert page.inner_text("[data-testid=chart-rate]") == "0 %"

    # A delivery behind the blocked key says it is held, and does not refresh itself.
    page.goto(f"{scene.url}/ui/deliveries/{scene.held}")
    held = page.inner_text("[data-testid=held]")
    assert scene.head_event in held and "cust-7" in held
    assert page.locator("[data-testid=in-flight]").count() == 0
    assert page.locator("meta[http-equiv=refresh]").count() == 0
    assert page.locator("[data-testid=retry]").count() == 0
    page.click("[data-testid=held] a")
    page.wait_for_url(re.compile(r"/ui/dead-letters/dl_"))


def test_a_partner_is_told_its_endpoint_is_failing(page, scene, client, auth):  # noqa: F811
    answer = client.post("/v1/partners/globex/portal-links", headers=auth)
    page.goto(scene.url + "/" + answer.get_json()["url"].split("/", 3)[3])
    page.wait_for_url(re.compile(r"/portal/$"))
    banner = page.locator("[data-testid=failing-banner]")
    assert banner.count() == 1 and "127.0.0.1:9/hooks" in banner.inner_text()
    assert "1 delivery is waiting for a retry" in banner.inner_text()
    row = page.locator(f"tr[data-endpoint={scene.hooks}]")
    assert row.locator("[data-testid=health]").inner_text() == "failing"
    banner.locator("a").click()
    page.wait_for_url(re.compile(f"/portal/endpoints/{scene.hooks}"))
    assert page.locator("[data-testid=failing-banner]").is_visible()
    assert page.inner_text("[data-testid=chart-rate]") == "0 %"
    page.goto(f"{scene.url}/portal/deliveries/{scene.held}")
    assert scene.head_event in page.inner_text("[data-testid=held]")
    assert page.locator("meta[http-equiv=refresh]").count() == 0
