"""Self-healing endpoints over the API: `auto_recover`, the probe fields, and probe-now."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select

from app.clock import utcnow
from app.models import AuditRecord, Delivery, EndpointProbe
from app.recovery import due
from app.recovery.probe import PROBE_EVENT
from sender import health
from tests.support.factories import Receiver, WorkerThread, wait_for
from tests.support.publish import make_endpoint, make_partner


def _key(client, auth, uid: str) -> dict[str, str]:
    key = client.post(f"/v1/partners/{uid}/keys", headers=auth, json={"name": f"{uid}-robot"})
    return {"Authorization": f"Bearer {key.get_json()['key']}"}


def test_auto_recover_is_read_set_at_create_and_patched(client, auth):
    make_partner(client, auth, "acme")
    created = make_endpoint(client, auth, "acme")
    assert created["auto_recover"] is True
    assert (created["probe_next_at"], created["probe_count"]) == (None, 0)
    off = make_endpoint(client, auth, "acme", auto_recover=False)
    assert off["auto_recover"] is False
    url = f"/v1/partners/acme/endpoints/{created['id']}"
    patched = client.patch(url, headers=auth, json={"auto_recover": False})
    assert patched.status_code == 200 and patched.get_json()["auto_recover"] is False
    assert client.get(url, headers=auth).get_json()["auto_recover"] is False
    bad = client.patch(url, headers=auth, json={"auto_recover": "yes"})
    assert bad.status_code == 422
    assert bad.get_json()["error"]["details"]["field"] == "auto_recover"


def test_probe_now_202_for_a_failure_disabled_endpoint_409_otherwise(client, auth, runtime):
    make_partner(client, auth, "acme")
    make_partner(client, auth, "other")
    with Receiver(lambda r, c: (500, {}, b"")) as receiver:
        endpoint = make_endpoint(client, auth, "acme", url=receiver.url + "/h")
        other = make_endpoint(client, auth, "other", url=receiver.url + "/o")
        url = f"/v1/partners/acme/endpoints/{endpoint['id']}/probe"
        # Enabled: nothing to probe.
        refused = client.post(url, headers=auth)
        assert refused.status_code == 409
        assert refused.get_json()["error"]["code"] == "endpoint_not_probed"
        # Disabled by an operator: not Kurir's to probe either.
        client.post(f"/v1/partners/acme/endpoints/{endpoint['id']}/disable", headers=auth)
        assert client.post(url, headers=auth).status_code == 409
        client.post(f"/v1/partners/acme/endpoints/{endpoint['id']}/enable", headers=auth)
        now = utcnow()
        with runtime.db.begin() as session:
            for endpoint_id in (endpoint["id"], other["id"]):
                health.disable(session, endpoint_id, "failing", now, probe=True)
        shown = client.get(f"/v1/partners/acme/endpoints/{endpoint['id']}", headers=auth)
        assert shown.get_json()["probe_next_at"] is not None
        own_key, other_key = _key(client, auth, "acme"), _key(client, auth, "other")
        # Another partner's key does not find it; the partner's own key and an admin's may.
        assert client.post(url, headers=other_key).status_code == 404
        answer = client.post(url, headers=own_key)
        assert answer.status_code == 202, answer.get_json()
        assert answer.get_json()["state"] == "disabled"
        with WorkerThread(runtime):
            wait_for(lambda: len(receiver.on("/h")) == 1, message="the probe")
            assert client.post(url, headers=auth).status_code == 202
            wait_for(lambda: len(receiver.on("/h")) == 2, message="the second probe")
            wait_for(lambda: _probes(runtime) == 2, message="both recorded")
        assert [r.json["type"] for r in receiver.on("/h")] == [PROBE_EVENT] * 2
        assert receiver.on("/o") == []
    shown = client.get(f"/v1/partners/acme/endpoints/{endpoint['id']}", headers=auth).get_json()
    assert (shown["state"], shown["probe_count"]) == ("disabled", 2)
    assert shown["probe_next_at"] is not None
    with runtime.db.begin() as session:
        assert session.scalar(select(func.count()).select_from(Delivery)) == 0
        actions = session.scalars(
            select(AuditRecord.action).where(AuditRecord.subject_id == endpoint["id"])
        ).all()
        assert actions.count("endpoint.probe_requested") == 2
    # Past the probe window the endpoint is probed no more, by hand neither.
    days = runtime.settings.probe_days
    with runtime.db.begin() as session:
        assert due.claim(session, now + timedelta(days=days, minutes=1), 10, days) == []
    assert client.post(url, headers=auth).status_code == 409


def _probes(runtime) -> int:
    with runtime.db.begin() as session:
        return session.scalar(select(func.count()).select_from(EndpointProbe))
