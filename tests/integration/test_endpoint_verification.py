"""Endpoint ownership verification end to end, on both databases: real receivers on
127.0.0.1, the real worker and send job, the scheduler's pass with an injected clock.

An endpoint with `verify` is sent only its signed `kurir.endpoint.verify` challenge until it
echoes it or posts it back; events published meanwhile wait (no attempt, no failure) and flow
once it is verified, in order; unanswered for 72 h it is disabled as unverified.
"""

from __future__ import annotations

import json
import re
import threading
from datetime import timedelta
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook

from app import operational
from app.accounts import create_operator
from app.clock import isoformat
from app.models import DeadLetter, Delivery, Endpoint, OperationalEvent
from app.services import endpoints as endpoint_service
from app.services import verification
from app.services.actor import Actor
from sender import verification as mechanism
from tests.support.factories import Received, Receiver, SweeperThread, WorkerThread, wait_for
from tests.support.publish import error_of, make_event_type, make_partner, order

BASE = "/v1/partners/acme/endpoints"


@pytest.fixture
def acme(client, auth) -> None:
    make_event_type(client, auth, "order.created")
    make_partner(client, auth, "acme")


def _echo(received: Received, _count: int) -> tuple[int, dict[str, str], bytes]:
    """A receiver that answers a challenge by echoing it, and takes every event."""
    body = received.json
    if body["type"] == mechanism.EVENT_TYPE:
        answer = json.dumps({"challenge": body["data"]["challenge"]}).encode()
        return 200, {"content-type": "application/json"}, answer
    return 204, {}, b""


def _no_echo(_received: Received, _count: int) -> tuple[int, dict[str, str], bytes]:
    return 200, {}, b"ok"


def _create(client: Any, auth: dict[str, str], url: str, **fields: Any) -> dict[str, Any]:
    created = client.post(BASE, headers=auth, json={"url": url, **fields})
    assert created.status_code == 201, created.get_json()
    return created.get_json()


def _publish(client: Any, auth: dict[str, str], n: int, **extra: Any) -> list[str]:
    ids = []
    for i in range(n):
        published = client.post(
            "/v1/partners/acme/events", headers=auth, json=order(f"o-{i}", **extra)
        )
        assert published.status_code == 202, published.get_json()
        [delivery] = published.get_json()["deliveries"]
        assert delivery["state"] == "pending"
        ids.append(delivery["id"])
    return ids


def _deliveries(runtime: Any, ids: list[str]) -> list[Delivery]:
    with runtime.db.begin() as session:
        rows = [session.get_one(Delivery, i) for i in ids]
        session.expunge_all()
    return rows


def _endpoint(runtime: Any, endpoint_id: str) -> Endpoint:
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, endpoint_id)
        session.expunge(endpoint)
    return endpoint


def _challenges(receiver: Receiver) -> list[Received]:
    return [r for r in receiver.requests if r.json["type"] == mechanism.EVENT_TYPE]


def _held(runtime: Any, ids: list[str]) -> bool:
    return all(
        d.state == "pending" and d.next_attempt_at is None and d.attempt_count == 0
        for d in _deliveries(runtime, ids)
    )


def test_an_echoing_endpoint_is_verified_and_gets_what_waited_in_order(client, auth, runtime, acme):
    with Receiver(_echo) as receiver:
        ep = _create(client, auth, receiver.url + "/hook", verify=True, ordering="key")
        assert (ep["verify"], ep["state"], ep["verified_at"]) == (
            True,
            "pending_verification",
            None,
        )
        assert ep["verification"]["challenge_sent_at"] is None
        secret = ep["secret"]
        ids = _publish(client, auth, 4, ordering_key="cart-1")
        assert _held(runtime, ids)

        with WorkerThread(runtime):
            wait_for(
                lambda: all(d.state == "succeeded" for d in _deliveries(runtime, ids)),
                message="the held deliveries to be delivered after the echo",
            )
        [challenge, *events] = receiver.requests
    # The challenge first, signed with the endpoint's own secret (Standard Webhooks)...
    sent = Webhook(secret).verify(challenge.body, challenge.headers)
    assert sent["type"] == "kurir.endpoint.verify" and sent["partner"] == "acme"
    assert sent["data"]["endpoint"] == ep["id"] and len(sent["data"]["challenge"]) >= 32
    # ... then every event published while it waited, in publish order.
    assert [r.json["data"]["order_id"] for r in events] == ["o-0", "o-1", "o-2", "o-3"]
    assert all(r.json["type"] == "order.created" for r in events)
    read = client.get(f"{BASE}/{ep['id']}", headers=auth).get_json()
    assert read["state"] == "enabled" and read["verified_at"] is not None
    assert read["verification"] is None and read["consecutive_failures"] == 0
    assert [d.attempt_count for d in _deliveries(runtime, ids)] == [1, 1, 1, 1]
    with runtime.db.begin() as session:
        stored = session.get_one(Endpoint, ep["id"])
        assert stored.challenge_hash is None and stored.challenge_encrypted is None
        kinds = session.scalars(
            select(OperationalEvent.kind).where(OperationalEvent.subject_id == ep["id"])
        ).all()
    assert "endpoint.verified" in kinds


def test_a_receiver_that_cannot_echo_verifies_through_the_api(client, auth, runtime, acme):
    with Receiver(_no_echo) as receiver:
        ep = _create(client, auth, receiver.url + "/hook", verify=True)
        ids = _publish(client, auth, 2)
        sent = mechanism.send(runtime, ep["id"])
        assert sent is not None and sent.reached and not sent.verified
        [challenge] = _challenges(receiver)
        value = challenge.json["data"]["challenge"]
        pending = client.get(f"{BASE}/{ep['id']}", headers=auth).get_json()
        assert pending["state"] == "pending_verification"
        assert pending["verification"]["challenge_sent_at"] is not None
        assert pending["verification"]["next_send_at"] is None  # it reached the receiver
        assert "echo" in pending["verification"]["last_error"]
        assert _held(runtime, ids)

        wrong = client.post(f"{BASE}/{ep['id']}/verify", headers=auth, json={"challenge": "x" * 32})
        assert wrong.status_code == 422
        assert error_of(wrong)["code"] == "challenge_mismatch"
        assert _endpoint(runtime, ep["id"]).state == "pending_verification"
        bad = client.post(f"{BASE}/{ep['id']}/verify", headers=auth, json={"challenge": 7})
        assert bad.status_code == 422 and error_of(bad)["details"]["field"] == "challenge"

        right = client.post(f"{BASE}/{ep['id']}/verify", headers=auth, json={"challenge": value})
        assert right.status_code == 200, right.get_json()
        assert right.get_json()["state"] == "enabled"
        assert right.get_json()["verified_at"] is not None
        again = client.post(f"{BASE}/{ep['id']}/verify", headers=auth, json={"challenge": value})
        assert again.status_code == 409
        assert error_of(again)["code"] == "not_pending_verification"
        with WorkerThread(runtime):
            wait_for(
                lambda: all(d.state == "succeeded" for d in _deliveries(runtime, ids)),
                message="the released deliveries",
            )
    assert sorted(r.json["data"]["order_id"] for r in receiver.requests[1:]) == ["o-0", "o-1"]


def test_a_receiver_that_does_not_echo_stays_pending_and_gets_nothing_else(
    client, auth, runtime, acme
):
    with Receiver(_no_echo) as receiver:
        ep = _create(client, auth, receiver.url + "/hook", verify=True)
        ids = _publish(client, auth, 3)
        with WorkerThread(runtime), SweeperThread(runtime) as sweeper:
            wait_for(lambda: _challenges(receiver), message="the challenge")
            # Later passes of the sweeper and of the verification find nothing to send.
            verification.tick(runtime)
            passes = sweeper.passes
            wait_for(lambda: sweeper.passes >= passes + 3, message="three more sweeps")
            verification.tick(runtime)
        assert len(receiver.requests) == 1
    assert _held(runtime, ids)
    endpoint = _endpoint(runtime, ep["id"])
    assert endpoint.state == "pending_verification"
    assert endpoint.consecutive_failures == 0 and endpoint.challenge_next_at is None
    test = client.post(f"{BASE}/{ep['id']}/test", headers=auth)
    assert test.status_code == 409 and error_of(test)["code"] == "pending_verification"
    enable = client.post(f"{BASE}/{ep['id']}/enable", headers=auth)
    assert enable.status_code == 409 and error_of(enable)["code"] == "pending_verification"


def test_a_failed_send_is_tried_again_with_backoff(client, auth, runtime, acme):
    def reply(received: Received, count: int) -> tuple[int, dict[str, str], bytes]:
        return (503, {}, b"busy") if count == 1 else _echo(received, count)

    with Receiver(reply) as receiver:
        ep = _create(client, auth, receiver.url + "/hook", verify=True)
        start = _endpoint(runtime, ep["id"]).verification_started_at
        assert start is not None
        first = mechanism.send(runtime, ep["id"], now=start)
        assert first is not None and first.status == 503 and not first.verified
        endpoint = _endpoint(runtime, ep["id"])
        assert endpoint.challenge_next_at == start + timedelta(seconds=10)
        assert endpoint.challenge_error == "HTTP 503" and endpoint.challenge_attempts == 1
        assert mechanism.send(runtime, ep["id"], now=start + timedelta(seconds=5)) is None
        assert len(receiver.requests) == 1
        # The scheduler's pass enqueues the send once it is due; the job sends it.
        later = start + timedelta(seconds=11)
        with runtime.db.begin() as session:
            assert mechanism.due_sends(session, start + timedelta(seconds=5)) == []
            assert mechanism.due_sends(session, later) == [ep["id"]]
        second = mechanism.send(runtime, ep["id"], now=later)
        assert second is not None and second.verified
        first_body, second_body = (r.json for r in receiver.requests)
    # A retry sends the same challenge under the same webhook-id.
    assert first_body["data"]["challenge"] == second_body["data"]["challenge"]
    assert receiver.requests[0].headers["webhook-id"] == receiver.requests[1].headers["webhook-id"]
    assert _endpoint(runtime, ep["id"]).state == "enabled"


def test_an_endpoint_unverified_for_72_hours_is_disabled_as_unverified(client, auth, runtime, acme):
    ep = _create(client, auth, "http://127.0.0.1:9/hook", verify=True)
    ids = _publish(client, auth, 2)
    start = _endpoint(runtime, ep["id"]).verification_started_at
    assert start is not None
    assert verification.tick(runtime, start + timedelta(hours=71))["expired"] == 0
    assert _endpoint(runtime, ep["id"]).state == "pending_verification"
    assert verification.tick(runtime, start + timedelta(hours=72, seconds=1))["expired"] == 1

    read = client.get(f"{BASE}/{ep['id']}", headers=auth).get_json()
    assert (read["state"], read["disabled_reason"], read["disabled_by"]) == (
        "disabled",
        "unverified",
        "verification",
    )
    assert [d.state for d in _deliveries(runtime, ids)] == ["dead", "dead"]
    assert [d.attempt_count for d in _deliveries(runtime, ids)] == [0, 0]
    with runtime.db.begin() as session:
        reasons = session.scalars(
            select(DeadLetter.reason).where(DeadLetter.delivery_id.in_(ids))
        ).all()
        disabled = session.scalars(
            select(OperationalEvent).where(
                OperationalEvent.subject_id == ep["id"],
                OperationalEvent.kind == "endpoint.disabled",
            )
        ).one()
        assert disabled.data["disabled_by"] == "verification"
        assert disabled.data["parked_deliveries"] == 2
        failed = session.scalars(
            select(OperationalEvent).where(
                OperationalEvent.subject_id == ep["id"],
                OperationalEvent.kind == "endpoint.verification_failed",
            )
        ).one()
        assert failed.data["reason"] == "unverified"
        assert failed.data["requested_at"] == isoformat(start)
        for row in (disabled, failed):  # each as its published contract says
            Draft202012Validator(operational.CATALOG[row.kind].schema).validate(row.data)
        # Kurir probes what it disabled for failures; an unverified endpoint waits for a person.
        assert session.get_one(Endpoint, ep["id"]).probe_next_at is None
    assert reasons == ["endpoint_disabled", "endpoint_disabled"]

    # Enabling it again asks for a new verification rather than trusting it.
    enabled = client.post(f"{BASE}/{ep['id']}/enable", headers=auth)
    assert enabled.status_code == 200, enabled.get_json()
    assert enabled.get_json()["state"] == "pending_verification"
    again = _endpoint(runtime, ep["id"])
    assert again.verification_started_at is not None and again.verification_started_at > start


def test_a_new_host_asks_for_verification_again_a_new_path_does_not(client, auth, runtime, acme):
    with Receiver(_echo) as receiver:
        ep = _create(client, auth, receiver.url + "/a", verify=True)
        assert mechanism.send(runtime, ep["id"]).verified  # type: ignore[union-attr]
        moved = client.patch(
            f"{BASE}/{ep['id']}", headers=auth, json={"url": receiver.url + "/b?x=1"}
        )
        assert moved.status_code == 200 and moved.get_json()["state"] == "enabled"
        assert moved.get_json()["verified_at"] is not None

        other_host = f"http://localhost:{receiver.port}/b"
        rehosted = client.patch(f"{BASE}/{ep['id']}", headers=auth, json={"url": other_host})
        assert rehosted.status_code == 200, rehosted.get_json()
        body = rehosted.get_json()
        assert (body["state"], body["verified_at"]) == ("pending_verification", None)
        ids = _publish(client, auth, 1)
        assert _held(runtime, ids)
        sent = mechanism.send(runtime, ep["id"])
        assert sent is not None and sent.verified and sent.released == tuple(ids)
        assert receiver.requests[-1].path == "/b"
    refused = client.patch(f"{BASE}/{ep['id']}", headers=auth, json={"verify": False})
    assert refused.status_code == 422 and error_of(refused)["code"] == "verify_immutable"
    same = client.patch(f"{BASE}/{ep['id']}", headers=auth, json={"verify": True})
    assert same.status_code == 200


def test_a_resend_replaces_the_challenge(client, auth, runtime, acme):
    with Receiver(_no_echo) as receiver:
        ep = _create(client, auth, receiver.url + "/hook", verify=True)
        mechanism.send(runtime, ep["id"])
        resent = client.post(f"{BASE}/{ep['id']}/verify/resend", headers=auth)
        assert resent.status_code == 202, resent.get_json()
        assert resent.get_json()["verification"]["challenge_attempts"] == 0
        mechanism.send(runtime, ep["id"])
        old, new = (r.json["data"]["challenge"] for r in _challenges(receiver))
    assert old != new
    stale = client.post(f"{BASE}/{ep['id']}/verify", headers=auth, json={"challenge": old})
    assert stale.status_code == 422 and error_of(stale)["code"] == "challenge_mismatch"
    fresh = client.post(f"{BASE}/{ep['id']}/verify", headers=auth, json={"challenge": new})
    assert fresh.status_code == 200
    done = client.post(f"{BASE}/{ep['id']}/verify/resend", headers=auth)
    assert done.status_code == 409 and error_of(done)["code"] == "not_pending_verification"


def test_the_setting_makes_verification_the_default_for_new_push_endpoints(
    make_rt, client, auth, acme
):
    rt = make_rt(verify_endpoints=True)
    with rt.db.begin() as session:
        default = endpoint_service.create(
            session, rt, Actor.cli(), "acme", {"url": "http://127.0.0.1:9/a"}
        ).endpoint
        opted_out = endpoint_service.create(
            session, rt, Actor.cli(), "acme", {"url": "http://127.0.0.1:9/b", "verify": False}
        ).endpoint
        pull = endpoint_service.create(session, rt, Actor.cli(), "acme", {"mode": "pull"}).endpoint
        states = [(e.verify, e.state) for e in (default, opted_out, pull)]
    assert states == [
        (True, "pending_verification"),
        (False, "enabled"),
        (False, "enabled"),
    ]
    off = make_rt(verify_endpoints=False)
    with off.db.begin() as session:
        plain = endpoint_service.create(
            session, off, Actor.cli(), "acme", {"url": "http://127.0.0.1:9/c"}
        ).endpoint
        assert (plain.verify, plain.state) == (False, "enabled")
    refused = client.post(BASE, headers=auth, json={"mode": "pull", "verify": True})
    assert refused.status_code == 422 and error_of(refused)["details"]["field"] == "verify"


def test_only_the_partner_or_an_operator_may_answer_its_challenge(client, auth, runtime, acme):
    make_partner(client, auth, "bravo")
    keys = {
        uid: client.post(f"/v1/partners/{uid}/keys", headers=auth, json={"name": uid}).get_json()[
            "key"
        ]
        for uid in ("acme", "bravo")
    }
    with Receiver(_no_echo) as receiver:
        ep = _create(client, auth, receiver.url + "/hook", verify=True)
        mechanism.send(runtime, ep["id"])
        [challenge] = _challenges(receiver)
    value = challenge.json["data"]["challenge"]
    route = f"{BASE}/{ep['id']}/verify"
    bravo = {"Authorization": f"Bearer {keys['bravo']}"}
    stolen = client.post(route, headers=bravo, json={"challenge": value})
    assert stolen.status_code == 404, stolen.get_json()
    assert client.post(route + "/resend", headers=bravo).status_code == 404
    assert _endpoint(runtime, ep["id"]).state == "pending_verification"
    own = client.post(
        route, headers={"Authorization": f"Bearer {keys['acme']}"}, json={"challenge": value}
    )
    assert own.status_code == 200, own.get_json()
    assert own.get_json()["state"] == "enabled"


# ---------------------------------------------------------------------------- the pages

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def _csrf(browser: Any, path: str) -> str:
    match = _CSRF.search(browser.get(path).text)
    assert match, f"no CSRF token on {path}"
    return match.group(1)


@pytest.fixture
def portal(app, client, auth, acme) -> Any:
    """The partner's browser, signed in to acme's portal."""
    link = client.post("/v1/partners/acme/portal-links", headers=auth).get_json()
    browser = app.test_client()
    path = "/" + link["url"].split("/", 3)[3]
    browser.get(path)
    assert browser.post(path).status_code == 302
    return browser


def test_the_partner_pastes_its_challenge_in_the_portal(portal, client, auth, runtime):
    with Receiver(_no_echo) as receiver:
        assert 'data-testid="verify"' in portal.get("/portal/endpoints/new").text
        created = portal.post(
            "/portal/endpoints/new",
            data={
                "csrf_token": _csrf(portal, "/portal/endpoints/new"),
                "url": receiver.url + "/hook",
                "verify": "1",
                "all_types": "1",
                "timeout_s": "15",
            },
        )
        assert created.status_code == 302, created.text
        ep = {"id": created.headers["Location"].rsplit("/", 1)[1]}
        assert _endpoint(runtime, ep["id"]).state == "pending_verification"
        mechanism.send(runtime, ep["id"])
        [challenge] = _challenges(receiver)
    page_path = f"/portal/endpoints/{ep['id']}"
    page = portal.get(page_path).text
    assert 'data-testid="verification"' in page and 'data-testid="verify-form"' in page
    assert 'data-testid="challenge-sent"' in page and "not yet" not in page
    assert 'data-testid="resend-challenge"' in page and "Send test event" not in page

    wrong = portal.post(
        f"{page_path}/verify", data={"csrf_token": _csrf(portal, page_path), "challenge": "nope"}
    )
    assert wrong.status_code == 302
    assert "not the endpoint&#39;s current challenge" in portal.get(page_path).text
    assert _endpoint(runtime, ep["id"]).state == "pending_verification"

    resent = portal.post(
        f"{page_path}/verify/resend", data={"csrf_token": _csrf(portal, page_path)}
    )
    assert resent.status_code == 302
    with Receiver(_no_echo) as second:
        client.patch(f"{BASE}/{ep['id']}", headers=auth, json={"url": second.url + "/hook"})
        mechanism.send(runtime, ep["id"])
        [fresh] = _challenges(second)
    value = fresh.json["data"]["challenge"]
    assert value != challenge.json["data"]["challenge"]
    right = portal.post(
        f"{page_path}/verify", data={"csrf_token": _csrf(portal, page_path), "challenge": value}
    )
    assert right.status_code == 302
    after = portal.get(page_path).text
    assert 'data-testid="verification"' not in after
    assert _endpoint(runtime, ep["id"]).state == "enabled"


def test_the_operator_page_shows_the_challenge_and_sends_a_new_one(client, auth, runtime, acme):
    with runtime.db.begin() as session:
        create_operator(session, "ops@example.com", "correct horse battery staple")
    login = client.post(
        "/ui/login",
        data={
            "email": "ops@example.com",
            "password": "correct horse battery staple",
            "csrf_token": _csrf(client, "/ui/login"),
        },
    )
    assert login.status_code == 302
    ep = _create(client, auth, "http://127.0.0.1:9/hook", verify=True)
    page_path = f"/ui/endpoints/{ep['id']}"
    page = client.get(page_path).text
    assert 'data-testid="verification"' in page and "not yet" in page
    assert 'data-testid="verify-form"' not in page and 'data-testid="verified"' in page
    before = _endpoint(runtime, ep["id"]).challenge_hash
    resent = client.post(
        f"{page_path}/verify/resend", data={"csrf_token": _csrf(client, page_path)}
    )
    assert resent.status_code == 302
    assert _endpoint(runtime, ep["id"]).challenge_hash != before
    listed = client.get("/ui/endpoints?state=pending_verification").text
    assert ep["id"] in listed


def test_deliveries_already_queued_when_the_host_changes_wait_instead_of_dying(
    client, auth, runtime, acme
):
    # The new host's challenge is answered only once the test has seen the deliveries held:
    # otherwise hold, verify and release can all fall between two looks.
    seen_held = threading.Event()
    challenges = []

    def echo_once_held(received: Received, count: int) -> tuple[int, dict[str, str], bytes]:
        if received.json["type"] == mechanism.EVENT_TYPE:
            challenges.append(count)
            if len(challenges) > 1:
                seen_held.wait(30)
        return _echo(received, count)

    with Receiver(echo_once_held) as receiver:
        ep = _create(client, auth, receiver.url + "/hook", verify=True)
        assert mechanism.send(runtime, ep["id"]).verified  # type: ignore[union-attr]
        ids = _publish(client, auth, 2)  # enabled: due now, and on the queue
        assert not _held(runtime, ids)
        moved = client.patch(
            f"{BASE}/{ep['id']}",
            headers=auth,
            json={"url": f"http://localhost:{receiver.port}/hook"},
        )
        assert moved.get_json()["state"] == "pending_verification"
        with WorkerThread(runtime):
            # The claim does not take them, and the guard holds them rather than parking.
            wait_for(lambda: _held(runtime, ids), message="the queued deliveries to be held")
            seen_held.set()
            wait_for(
                lambda: _endpoint(runtime, ep["id"]).state == "enabled",
                message="the echo to verify the new host",
            )
            wait_for(
                lambda: all(d.state == "succeeded" for d in _deliveries(runtime, ids)),
                message="the held deliveries after the new verification",
            )
        kinds = [r.json["type"] for r in receiver.requests]
    assert kinds == [mechanism.EVENT_TYPE] * 2 + ["order.created"] * 2
    assert [d.attempt_count for d in _deliveries(runtime, ids)] == [1, 1]
    with runtime.db.begin() as session:
        assert session.scalars(select(DeadLetter.id)).all() == []


def test_disabling_or_deleting_a_waiting_endpoint_parks_what_waited(client, auth, runtime, acme):
    first = _create(client, auth, "http://127.0.0.1:9/a", verify=True)
    second = _create(client, auth, "http://127.0.0.1:9/b", verify=True)
    published = client.post("/v1/partners/acme/events", headers=auth, json=order())
    assert published.status_code == 202
    held = {d["endpoint"]: d["id"] for d in published.get_json()["deliveries"]}
    assert set(held) == {first["id"], second["id"]}
    assert _held(runtime, list(held.values()))
    disabled = client.post(f"{BASE}/{first['id']}/disable", headers=auth)
    assert disabled.status_code == 200 and disabled.get_json()["state"] == "disabled"
    assert client.delete(f"{BASE}/{second['id']}", headers=auth).status_code == 204
    rows = _deliveries(runtime, list(held.values()))
    assert [d.state for d in rows] == ["dead", "dead"]
    assert [d.attempt_count for d in rows] == [0, 0]


def test_the_scheduler_runs_the_verification_pass(runtime):
    from app.processes.scheduler import periodic_jobs, verify_endpoints

    jobs = {job.name: job for job in periodic_jobs(runtime)}
    assert jobs["verify-endpoints"].run is verify_endpoints
    assert verify_endpoints(runtime) == {"expired": 0, "sent": 0, "released": 0}
