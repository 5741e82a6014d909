"""Self-healing endpoints on the operator's and the partner's endpoint pages: the probe
history, the next probe, "Probe now" and the auto_recover box of the shared form."""

from __future__ import annotations

from rq import Queue

from app.clock import utcnow
from app.models import Endpoint
from app.queues import DEFAULT
from app.recovery.probe import send_probe
from sender import health
from tests.integration.test_portal import csrf, sign_in
from tests.integration.test_ui import token
from tests.integration.test_ui_operator_pages import ui  # noqa: F401 - the fixture
from tests.support.factories import Receiver
from tests.support.publish import make_endpoint, make_partner


def _probe_jobs(runtime) -> list[str]:
    return [j for j in Queue(DEFAULT, connection=runtime.redis).job_ids if j.startswith("probe-")]


def test_operator_page_shows_probes_and_probes_now(ui, auth, runtime):  # noqa: F811
    make_partner(ui, auth, "acme")
    with Receiver(lambda r, c: (502, {}, b"")) as receiver:
        endpoint = make_endpoint(ui, auth, "acme", url=receiver.url + "/h")
        url = f"/ui/endpoints/{endpoint['id']}"
        page = ui.get(url).text
        assert 'data-testid="probes-card"' not in page  # enabled: nothing probed
        assert 'data-testid="auto-recover"' in page
        with runtime.db.begin() as session:
            health.disable(session, endpoint["id"], "failing", utcnow(), probe=True)
        page = ui.get(url).text
        assert 'data-testid="probe-next"' in page and 'data-testid="probe-now"' in page
        probed = ui.post(f"{url}/probe", data={"csrf_token": token(ui, url)})
        assert probed.status_code == 302
        assert len(_probe_jobs(runtime)) == 1
        send_probe(runtime, endpoint["id"])  # what the queued job does
    page = ui.get(url).text
    assert 'data-testid="probes"' in page and "502" in page
    # The shared form's box turns auto_recover off.
    form = ui.get(f"{url}/edit").text
    assert 'data-testid="auto-recover"' in form and 'name="auto_recover-shown"' in form
    saved = ui.post(
        f"{url}/edit",
        data={
            "csrf_token": token(ui, url),
            "url": receiver.url + "/h",
            "all_types": "1",
            "timeout_s": "15",
            "auto_recover-shown": "1",
        },
    )
    assert saved.status_code == 302, saved.text
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, endpoint["id"]).auto_recover is False
    assert "Automatic re-enabling is off" in ui.get(url).text


def test_portal_page_shows_probes_and_probes_now(client, auth, app, runtime):
    make_partner(client, auth, "acme")
    endpoint = make_endpoint(client, auth, "acme", url="http://127.0.0.1:9/acme")
    portal = sign_in(app.test_client(), auth)
    url = f"/portal/endpoints/{endpoint['id']}"
    assert 'data-testid="probes-card"' not in portal.get(url).text
    refused = portal.post(f"{url}/probe", data={"csrf_token": csrf(portal, url)})
    assert refused.status_code in (302, 409)  # not failure-disabled: said, nothing queued
    assert _probe_jobs(runtime) == []
    with runtime.db.begin() as session:
        health.disable(session, endpoint["id"], "failing", utcnow(), probe=True)
    page = portal.get(url).text
    assert 'data-testid="probe-next"' in page
    probed = portal.post(f"{url}/probe", data={"csrf_token": csrf(portal, url)})
    assert probed.status_code == 302
    assert len(_probe_jobs(runtime)) == 1
    send_probe(runtime, endpoint["id"])
    assert 'data-testid="probes"' in portal.get(url).text
    edit = portal.get(f"{url}/edit").text
    assert 'data-testid="auto-recover"' in edit


def test_recover_since_from_the_operator_page_and_the_portal(ui, auth, app, runtime):  # noqa: F811
    from sqlalchemy import select

    from app.models import ResendJob

    make_partner(ui, auth, "acme")
    endpoint = make_endpoint(ui, auth, "acme", url="http://127.0.0.1:9/acme")
    url = f"/ui/endpoints/{endpoint['id']}"
    assert 'data-testid="recover-card"' in ui.get(url).text
    bad = ui.post(f"{url}/recover", data={"csrf_token": token(ui, url), "since": "soon"})
    assert bad.status_code == 302 and "RFC 3339" in ui.get(url).text
    done = ui.post(
        f"{url}/recover", data={"csrf_token": token(ui, url), "since": "2020-01-01T00:00:00Z"}
    )
    assert done.status_code == 302
    portal = sign_in(app.test_client(), auth)
    purl = f"/portal/endpoints/{endpoint['id']}"
    assert 'data-testid="recover-card"' in portal.get(purl).text
    started = portal.post(
        f"{purl}/recover", data={"csrf_token": csrf(portal, purl), "since": "2020-01-01T00:00:00Z"}
    )
    assert started.status_code == 302
    with runtime.db.begin() as session:
        jobs = session.scalars(select(ResendJob)).all()
        assert [j.params["purpose"] for j in jobs] == ["recover_window"] * 2
