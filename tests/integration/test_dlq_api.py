"""`/v1/dead-letters`: shapes, scopes, search, resend (one, ids, filter) and discard."""

from __future__ import annotations

import pytest
from rq import Queue

from app.accounts import create_api_key
from app.models import Delivery
from app.queues import DEFAULT, DELIVERIES
from dlq import resend as resend_mod
from tests.support.dlq_factories import letters_for, make_scene


def _token(runtime, name: str, *scopes: str) -> dict[str, str]:
    with runtime.db.begin() as session:
        _, token = create_api_key(session, name, scopes)
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def scene(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box, uid="acme")
        ids = letters_for(session, scene, 3, data=lambda i: {"sku": f"widget-{i}"}, attempts=2)
    return scene, ids


def test_list_has_the_spec_shape_and_links(client, auth, scene):
    sc, ids = scene
    response = client.get("/v1/dead-letters", headers=auth)
    assert response.status_code == 200
    body = response.get_json()
    assert body["next_cursor"] is None
    assert [d["id"] for d in body["data"]] == sorted(ids, reverse=True)
    first = body["data"][0]
    assert {
        "id",
        "delivery",
        "event",
        "endpoint",
        "partner",
        "type",
        "reason",
        "last_status_code",
        "last_error",
        "state",
        "created_at",
        "audit",
    } <= set(first)
    assert first["partner"] == "acme" and first["endpoint"] == sc.endpoint_id
    assert first["state"] == "open" and first["reason"] == "retries_exhausted"
    assert first["created_at"].endswith("Z")
    assert first["audit"][0] == {
        "actor": "system",
        "action": "park",
        "outcome": "retries_exhausted",
        "note": None,
        "at": first["audit"][0]["at"],
    }
    assert first["links"]["event"] == f"/v1/events/{first['event']}"
    assert first["links"]["delivery"] == f"/v1/deliveries/{first['delivery']}"
    assert first["attempt_count"] == 2


def test_search_by_payload_word_and_pagination(client, auth, scene):
    _, ids = scene
    found = client.get("/v1/dead-letters?q=widget-1", headers=auth).get_json()["data"]
    assert [d["id"] for d in found] == [ids[1]]
    page = client.get("/v1/dead-letters?limit=2", headers=auth).get_json()
    assert len(page["data"]) == 2 and page["next_cursor"]
    rest = client.get(
        f"/v1/dead-letters?limit=2&cursor={page['next_cursor']}", headers=auth
    ).get_json()
    assert [d["id"] for d in page["data"] + rest["data"]] == sorted(ids, reverse=True)
    bad = client.get("/v1/dead-letters?status_code=teapot", headers=auth)
    assert bad.status_code == 400
    assert bad.get_json()["error"]["code"] == "invalid_parameter"


def test_get_one_includes_attempts_and_404s_cleanly(client, auth, scene):
    _, ids = scene
    body = client.get(f"/v1/dead-letters/{ids[0]}", headers=auth).get_json()
    assert [a["n"] for a in body["attempts"]] == [1, 2]
    assert body["attempts"][0]["response_status"] == 500
    missing = client.get("/v1/dead-letters/dl_nope", headers=auth)
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "not_found"


def test_read_scope_reads_but_cannot_act_and_actor_is_the_key_name(client, runtime, scene):
    _, ids = scene
    reader = _token(runtime, "dashboards", "read")
    writer = _token(runtime, "oncall-bot", "dlq:write")
    assert client.get("/v1/dead-letters", headers=reader).status_code == 200
    denied = client.post(f"/v1/dead-letters/{ids[0]}/resend", headers=reader)
    assert denied.status_code == 403
    assert client.post(f"/v1/dead-letters/{ids[0]}/discard", headers=reader).status_code == 403
    assert client.get("/v1/dead-letters").status_code == 401
    done = client.post(f"/v1/dead-letters/{ids[0]}/resend", headers=writer)
    assert done.status_code == 200, done.get_json()
    body = done.get_json()
    assert body["state"] == "resent" and body["run"] == 2 and body["delivery_state"] == "pending"
    assert body["audit"][-1]["actor"] == "key:oncall-bot"


def test_resend_one_refuses_a_disabled_endpoint_unless_forced(client, auth, runtime, redis_client):
    with runtime.db.begin() as session:
        off = make_scene(session, runtime.secret_box, state="disabled")
        (letter_id,) = letters_for(session, off, 1, reason="endpoint_disabled")
    refused = client.post(f"/v1/dead-letters/{letter_id}/resend", headers=auth)
    assert refused.status_code == 409
    assert refused.get_json()["error"]["code"] == "endpoint_disabled"
    forced = client.post(f"/v1/dead-letters/{letter_id}/resend", json={"force": True}, headers=auth)
    assert forced.status_code == 200 and forced.get_json()["state"] == "resent"
    again = client.post(f"/v1/dead-letters/{letter_id}/resend", headers=auth)
    assert again.status_code == 409
    assert again.get_json()["error"]["code"] == "dead_letter_not_open"
    jobs = Queue(DELIVERIES, connection=redis_client).get_jobs()
    with runtime.db.begin() as session:
        delivery_id = session.query(Delivery.id).scalar()
    assert [j.args[0] for j in jobs] == [[delivery_id]]


def test_resend_few_ids_happens_now_with_skips_reported(client, auth, scene):
    _, ids = scene
    client.post(f"/v1/dead-letters/{ids[0]}/discard", json={"note": "dup"}, headers=auth)
    response = client.post(
        "/v1/dead-letters/resend", json={"ids": [ids[1], ids[2], ids[0], "dl_nope"]}, headers=auth
    )
    assert response.status_code == 200
    body = response.get_json()
    assert body["count"] == 2 and body["job_id"].startswith("bop_")
    assert sorted(body["resent"]) == sorted(ids[1:])
    assert {s["id"]: s["reason"] for s in body["skipped"]} == {
        ids[0]: "dead_letter_not_open",
        "dl_nope": "not_found",
    }
    job = client.get(body["status_url"], headers=auth).get_json()
    assert (job["state"], job["total"], job["done"], job["failed"]) == ("succeeded", 4, 2, 2)


def test_resend_by_filter_is_a_background_job_with_progress(
    client, auth, runtime, scene, redis_client
):
    _, ids = scene
    response = client.post(
        "/v1/dead-letters/resend", json={"filter": {"partner": "acme", "q": "widget"}}, headers=auth
    )
    assert response.status_code == 202
    body = response.get_json()
    assert body["count"] == 3 and body["job_id"].startswith("bop_")
    status = client.get(body["status_url"], headers=auth).get_json()
    assert (status["state"], status["total"], status["done"]) == ("pending", 3, 0)
    assert status["filter"] == {"partner": "acme", "q": "widget", "state": "open"}
    (job,) = Queue(DEFAULT, connection=redis_client).get_jobs()
    job.perform()  # what the worker does, in this thread
    status = client.get(body["status_url"], headers=auth).get_json()
    assert (status["state"], status["done"], status["failed"]) == ("succeeded", 3, 0)
    listed = client.get("/v1/dead-letters?state=resent", headers=auth).get_json()["data"]
    assert sorted(d["id"] for d in listed) == sorted(ids)


def test_many_ids_go_to_the_background(client, auth, runtime, monkeypatch):
    monkeypatch.setattr(resend_mod, "INLINE_LIMIT", 2)
    with runtime.db.begin() as session:
        sc = make_scene(session, runtime.secret_box)
        ids = letters_for(session, sc, 3)
    response = client.post("/v1/dead-letters/resend", json={"ids": ids}, headers=auth)
    assert response.status_code == 202
    assert response.get_json()["count"] == 3


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"ids": [], "filter": {}},
        {"ids": "dl_1"},
        {"ids": []},
        {"filter": "x"},
        {"filter": {"partnr": "acme"}},
        {"filter": {"state": "resent"}},
        {"ids": ["a"], "x": 1},
        {"ids": ["a"], "force": "maybe"},
    ],
)
def test_malformed_bulk_resend_bodies_are_rejected(client, auth, runtime, body):
    response = client.post("/v1/dead-letters/resend", json=body, headers=auth)
    assert response.status_code in (400, 422), response.get_json()
    assert response.get_json()["error"]["code"] == "invalid_parameter"


def test_discard_keeps_the_note_and_unknown_job_is_404(client, auth, scene):
    _, ids = scene
    response = client.post(
        f"/v1/dead-letters/{ids[0]}/discard",
        json={"note": "partner confirmed manually"},
        headers=auth,
    )
    assert response.status_code == 200
    body = response.get_json()
    assert body["state"] == "discarded" and body["note"] == "partner confirmed manually"
    assert body["audit"][-1]["action"] == "discard"
    assert client.post(f"/v1/dead-letters/{ids[0]}/discard", headers=auth).status_code == 409
    assert client.get("/v1/dead-letters/resend-jobs/bop_x", headers=auth).status_code == 404


@pytest.mark.parametrize("flt", [{}, {"state": "open"}, {"partner": "", "q": "  "}, {"all": False}])
def test_resend_by_an_empty_filter_is_refused(client, auth, scene, redis_client, flt):
    response = client.post("/v1/dead-letters/resend", json={"filter": flt}, headers=auth)
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["code"] == "invalid_parameter" and error["details"] == {"parameter": "filter"}
    assert "at least one criterion" in error["message"] and '"all": true' in error["message"]
    assert Queue(DEFAULT, connection=redis_client).get_jobs() == []
    listed = client.get("/v1/dead-letters?state=open", headers=auth).get_json()["data"]
    assert len(listed) == 3


def test_resend_all_must_be_a_boolean(client, auth, scene):
    response = client.post("/v1/dead-letters/resend", json={"filter": {"all": "yes"}}, headers=auth)
    assert response.status_code == 422
    assert response.get_json()["error"]["details"] == {"parameter": "filter.all"}


def test_resend_all_says_so_explicitly_and_resends_every_open_letter(
    client, auth, runtime, scene, redis_client
):
    _, ids = scene
    with runtime.db.begin() as session:
        other = make_scene(session, runtime.secret_box, uid="initech")
        more = letters_for(session, other, 2)
    client.post(f"/v1/dead-letters/{ids[0]}/discard", headers=auth)
    response = client.post("/v1/dead-letters/resend", json={"filter": {"all": True}}, headers=auth)
    assert response.status_code == 202, response.get_json()
    body = response.get_json()
    assert body["count"] == 4
    (job,) = Queue(DEFAULT, connection=redis_client).get_jobs()
    job.perform()
    status = client.get(body["status_url"], headers=auth).get_json()
    assert (status["state"], status["done"], status["filter"]) == (
        "succeeded",
        4,
        {"state": "open"},
    )
    listed = client.get("/v1/dead-letters?state=resent", headers=auth).get_json()["data"]
    assert sorted(d["id"] for d in listed) == sorted([*ids[1:], *more])


def test_resend_all_with_criteria_still_narrows(client, auth, runtime, scene):
    with runtime.db.begin() as session:
        other = make_scene(session, runtime.secret_box, uid="initech")
        letters_for(session, other, 2)
    response = client.post(
        "/v1/dead-letters/resend",
        json={"filter": {"all": True, "partner": "initech"}},
        headers=auth,
    )
    assert response.status_code == 202 and response.get_json()["count"] == 2
