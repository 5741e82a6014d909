"""What the web faces and the API show as delivered is what was delivered.

A real worker sends one published v2 event to a receiver on 127.0.0.1 three times over: twice
to endpoints pinned to v1 (one of them dies into a dead letter) and once unpinned. Every page
that shows "the body sent" (operator delivery and dead-letter pages, portal delivery page) must
show exactly the bytes the receiver got and checked the signature over; every list and fact
that names a delivery's version names the delivered one; both endpoint pages show the pins
with their deprecation and sunset.
"""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta

import pytest

from app.models import Endpoint
from app.services import pins
from app.services.actor import Actor
from tests.integration.test_portal import sign_in
from tests.integration.test_ui_operator_pages import ui  # noqa: F401 - the signed-in operator
from tests.support import delivered as kit
from tests.support.factories import Receiver, WorkerThread

_RAW = re.compile(r'<pre[^>]* data-testid="payload">(.*?)</pre>', re.S)
_PRETTY = re.compile(r'<pre class="code" data-testid="payload-pretty">(.*?)</pre>', re.S)


@pytest.fixture
def settings(settings):
    return settings.with_overrides(**kit.SETTINGS)


@pytest.fixture
def scene(client, auth, runtime) -> kit.Scene:
    with Receiver(reply=kit.reply) as receiver, WorkerThread(runtime):
        return kit.build(client, auth, runtime, receiver)


@pytest.fixture
def pinned(client, auth) -> tuple[dict[str, str], datetime]:
    """The endpoints and contracts alone: the pins need nothing sent."""
    return kit.setup(client, auth, "http://127.0.0.1:9")


@pytest.fixture
def open_portal(app, auth):
    """The partner's browser, signed in to acme's portal (acme must exist first)."""
    return lambda: sign_in(app.test_client(), auth)


def raw_body(page: str) -> str:
    """The raw view's text as a browser reads it (the HTML escapes undone)."""
    found = _RAW.findall(page)
    assert len(found) == 1, "the page has no single raw body view"
    return html.unescape(found[0])


def pretty_body(page: str) -> str:
    (found,) = _PRETTY.findall(page)
    return html.unescape(found)


def row_of(page: str, delivery_id: str) -> str:
    match = re.search(rf'<tr data-delivery="{delivery_id}">(.*?)</tr>', page, re.S)
    assert match, f"no row for {delivery_id}"
    return match.group(1)


def shown_version(fragment: str) -> str:
    match = re.search(r'data-testid="delivered-version"[^>]*>\s*(v\d+)', fragment)
    assert match, "no delivered version shown"
    return match.group(1)


# ---------------------------------------------------------------------------- X1: the body


def test_every_page_shows_the_bytes_the_endpoint_received(ui, open_portal, scene):  # noqa: F811
    portal = open_portal()
    pages = {
        "/pinned-ok": [
            ui.get(f"/ui/deliveries/{scene.deliveries['/pinned-ok']}"),
            portal.get(f"/portal/deliveries/{scene.deliveries['/pinned-ok']}"),
        ],
        "/pinned-dead": [
            ui.get(f"/ui/deliveries/{scene.deliveries['/pinned-dead']}"),
            ui.get(f"/ui/dead-letters/{scene.letter_id}"),
            portal.get(f"/portal/deliveries/{scene.deliveries['/pinned-dead']}"),
        ],
        "/latest": [
            ui.get(f"/ui/deliveries/{scene.deliveries['/latest']}"),
            portal.get(f"/portal/deliveries/{scene.deliveries['/latest']}"),
        ],
    }
    for path, answers in pages.items():
        captured = scene.captured[path]
        for answer in answers:
            assert answer.status_code == 200
            page = answer.text
            shown = raw_body(page)
            assert shown.encode("utf-8") == captured, f"{path}: not the bytes sent"
            assert f'data-testid="body-size">{len(captured)} bytes' in page
            # The HTML in the data is text on the page, never markup.
            assert "<b>Zoë" not in page and "&lt;b&gt;Zoë" in page
            # The indented view beside it is the same document, for reading.
            assert pretty_body(page) != shown and "\n  " in pretty_body(page)
    # The pinned endpoints got v1 as made by the downgrade; the unpinned one the v2 published.
    assert b'"version":1' in scene.captured["/pinned-ok"]
    assert b'"amount":4242' in scene.captured["/pinned-ok"]
    assert b'"version":2' in scene.captured["/latest"]
    assert b'"amount_minor":4242' in scene.captured["/latest"]


# ---------------------------------------------------------------------------- X2: the version


def test_every_list_and_fact_names_the_delivered_version(
    ui,  # noqa: F811
    open_portal,
    client,
    auth,  # noqa: F811
    scene,
):
    portal = open_portal()
    pinned, dead, latest = (scene.deliveries[p] for p in kit.PATHS)
    log = ui.get("/ui/deliveries").text
    assert shown_version(row_of(log, pinned)) == "v1" and "(pinned)" in row_of(log, pinned)
    assert shown_version(row_of(log, dead)) == "v1"
    assert shown_version(row_of(log, latest)) == "v2" and "(pinned)" not in row_of(log, latest)

    letters = ui.get("/ui/dead-letters").text
    (letter_row,) = re.findall(
        r"<tr>(?:(?!</tr>).)*?" + scene.letter_id + r".*?</tr>", letters, re.S
    )
    assert shown_version(letter_row) == "v1"

    letter_page = ui.get(f"/ui/dead-letters/{scene.letter_id}").text
    assert shown_version(letter_page) == "v1" and "published as v2" in letter_page
    for delivery_id, version in ((pinned, "v1"), (latest, "v2")):
        for page in (
            ui.get(f"/ui/deliveries/{delivery_id}").text,
            portal.get(f"/portal/deliveries/{delivery_id}").text,
        ):
            assert shown_version(page) == version
            assert ("published as v2" in page) == (version == "v1")

    event_page = ui.get(f"/ui/events/{scene.event_id}").text
    shown = re.findall(r'data-testid="delivered-version">(v\d)', event_page)
    assert sorted(shown) == ["v1", "v1", "v2"]

    portal_log = portal.get("/portal/deliveries").text
    assert shown_version(row_of(portal_log, pinned)) == "v1"
    assert shown_version(row_of(portal_log, latest)) == "v2"
    recent = portal.get(f"/portal/endpoints/{scene.endpoints['/pinned-ok']}").text
    assert shown_version(row_of(recent, pinned)) == "v1"

    # The API says the same.
    assert client.get(f"/v1/deliveries/{pinned}", headers=auth).get_json()["version"] == 1
    assert client.get(f"/v1/deliveries/{latest}", headers=auth).get_json()["version"] == 2
    letter = client.get(f"/v1/dead-letters/{scene.letter_id}", headers=auth).get_json()
    assert (letter["type"], letter["version"]) == ("payment.succeeded", 1)
    listed = client.get("/v1/dead-letters", headers=auth).get_json()["data"]
    assert [(row["id"], row["version"]) for row in listed] == [(scene.letter_id, 1)]


# ---------------------------------------------------------------------------- X3: the pins


def test_both_endpoint_pages_show_pins_with_deprecation_and_sunset(
    ui,  # noqa: F811
    open_portal,
    pinned,
):
    endpoints, when = pinned
    sunset = when.strftime("%Y-%m-%d")
    portal = open_portal()
    for page in (
        ui.get(f"/ui/endpoints/{endpoints['/pinned-ok']}").text,
        portal.get(f"/portal/endpoints/{endpoints['/pinned-ok']}").text,
    ):
        block = re.search(r'data-testid="pins">(.*?)</dd>', page, re.S).group(1)
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", block))
        assert "payment.succeeded v1" in text and "deprecated" in text
        assert f"sunset on {sunset}" in text and "newest is v2" in text
        notice = re.search(r'data-testid="pin-notice">(.*?)</section>', page, re.S).group(1)
        assert "payment.succeeded v1" in notice and sunset in notice
    unpinned = endpoints["/latest"]
    for page in (
        ui.get(f"/ui/endpoints/{unpinned}").text,
        portal.get(f"/portal/endpoints/{unpinned}").text,
    ):
        assert "every type arrives in the version published" in page
        assert 'data-testid="pin-notice"' not in page


def test_a_pin_past_its_sunset_says_so(runtime, pinned):
    endpoints, sunset = pinned
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, endpoints["/pinned-ok"])
        before = pins.of_endpoint(
            session, Actor.system(), endpoint, now=sunset - timedelta(seconds=1)
        )
        after = pins.of_endpoint(session, Actor.system(), endpoint, now=sunset)
    assert [(p.type, p.version, p.deprecated, p.newest) for p in after] == [
        ("payment.succeeded", 1, True, 2)
    ]
    assert (before[0].sunset_passed, after[0].sunset_passed) == (False, True)
