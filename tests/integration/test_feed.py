"""The feed: every event once, in commit order, under concurrent publishers; seen through an
endpoint; pull endpoints, acknowledgements and lag; cursors that expire; partner scoping."""

from __future__ import annotations

import base64
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import requests
from sqlalchemy import func, select

from app.clock import parse_time, utcnow
from app.feed import cursor as cursors
from app.feed.sequencer import sequence
from app.ids import new_id
from app.intake.envelope import PublishRequest, payload_json
from app.models import AuditRecord, Delivery, Event, Partner
from app.web import metrics
from tests.support.factories import wait_for
from tests.support.publish import (
    error_of,
    make_endpoint,
    make_event_type,
    make_partner,
    old_event,
    order,
)

# Run once more through PgBouncer in transaction mode (tests/conftest.py).
pytestmark = pytest.mark.pgbouncer

V2_SCHEMA = {
    "type": "object",
    "required": ["order_id", "total"],
    "properties": {"order_id": {"type": "string"}, "total": {"type": "integer"}},
    "additionalProperties": False,
}


def _feed(client: Any, auth: dict[str, str], uid: str = "acme", **params: Any) -> Any:
    query = "&".join(f"{k}={v}" for k, v in params.items() if v is not None)
    return client.get(f"/v1/partners/{uid}/feed?{query}", headers=auth)


def _drain(
    client: Any, auth: dict[str, str], uid: str = "acme", **params: Any
) -> tuple[list[dict[str, Any]], str]:
    """Every event after `after`, page by page; the items and the last cursor."""
    items: list[dict[str, Any]] = []
    while True:
        response = _feed(client, auth, uid, **params)
        assert response.status_code == 200, response.get_json()
        body = response.get_json()
        items += body["data"]
        params["after"] = body["next_cursor"]
        if not body["data"]:
            return items, body["next_cursor"]


@pytest.fixture
def acme(client: Any, auth: dict[str, str]) -> str:
    make_event_type(client, auth)
    make_partner(client, auth, "acme")
    return "acme"


# ---------------------------------------------------------------------------- exactly once


def test_a_consumer_sees_every_event_once_in_commit_order_under_eight_publishers(
    live_server, auth, acme, client
):
    """8 threads publish over real HTTP (half with an Idempotency-Key, which takes the longer
    transactional path, so ids and commits interleave); a consumer pages every 50 ms."""
    publishers, per_thread = 8, 30
    published: dict[str, tuple[float, float, int, int]] = {}  # id -> sent, answered, thread, n
    lock = threading.Lock()
    done = threading.Event()
    errors: list[str] = []

    def publish(thread: int) -> None:
        with requests.Session() as http:
            for n in range(per_thread):
                headers = dict(auth)
                if n % 2:
                    headers["Idempotency-Key"] = f"t{thread}-{n}"
                sent = time.monotonic()
                answer = http.post(
                    f"{live_server.url}/v1/partners/acme/events",
                    json=order(f"o-{thread}-{n}"),
                    headers=headers,
                    timeout=30,
                )
                answered = time.monotonic()
                if answer.status_code != 202:
                    errors.append(answer.text)
                    return
                with lock:
                    published[answer.json()["id"]] = (sent, answered, thread, n)

    seen: list[tuple[str, float]] = []  # id, when the consumer received it

    def consume() -> None:
        cursor = None
        with requests.Session() as http:
            while True:
                finished = done.is_set()  # read before the page: a page after it is final
                params = {"limit": 25, **({"after": cursor} if cursor else {})}
                answer = http.get(
                    f"{live_server.url}/v1/partners/acme/feed",
                    params=params,
                    headers=auth,
                    timeout=30,
                )
                if answer.status_code != 200:
                    errors.append(answer.text)
                    return
                body = answer.json()
                now = time.monotonic()
                seen.extend((item["id"], now) for item in body["data"])
                cursor = body["next_cursor"]
                if finished and not body["data"]:
                    return
                if not body["data"]:
                    time.sleep(0.05)

    consumer = threading.Thread(target=consume)
    consumer.start()
    threads = [threading.Thread(target=publish, args=(i,)) for i in range(publishers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    done.set()
    consumer.join(120)
    assert not errors, errors[:3]
    assert not consumer.is_alive()

    ids = [event_id for event_id, _ in seen]
    assert len(ids) == len(set(ids)), "an event was seen twice"
    assert set(ids) == set(published), (
        f"missed {len(set(published) - set(ids))}, unknown {len(set(ids) - set(published))}"
    )
    assert len(ids) == publishers * per_thread
    position = {event_id: i for i, event_id in enumerate(ids)}
    # Commit order, as far as it can be observed from outside: an event whose 202 came back
    # before another was sent committed first, so it must come first in the feed.
    by_answer = sorted(published.items(), key=lambda item: item[1][1])
    for event_id, (_, answered, thread, n) in by_answer:
        for other, (sent, _, other_thread, other_n) in published.items():
            if sent > answered:
                assert position[event_id] < position[other], (
                    f"{event_id} (thread {thread} #{n}) committed before {other} "
                    f"(thread {other_thread} #{other_n}) was sent, yet comes after it"
                )


def test_an_event_committing_after_a_newer_one_is_not_skipped(client, auth, acme, runtime):
    """The outbox-polling gap: an event whose id is older commits after a newer one that the
    consumer has already read past. Its position is given at commit, so it is after the
    cursor."""
    early_id = new_id("evt")  # made first: an older id, as a slow publish would have
    assert (
        client.post("/v1/partners/acme/events", headers=auth, json=order("o-late-id")).status_code
        == 202
    )
    seen, cursor = _drain(client, auth)
    assert [item["data"]["order_id"] for item in seen] == ["o-late-id"]

    now = utcnow()
    with runtime.db.begin() as session:
        partner = session.scalars(select(Partner).where(Partner.uid == "acme")).one()
        request = PublishRequest(
            "order.created", 1, {"order_id": "o-early-id", "amount": 1}, now, None, None
        )
        session.add(
            Event(
                id=early_id,
                partner_id=partner.id,
                type="order.created",
                version=1,
                data=request.data,
                occurred_at=now,
                created_at=now,
                payload=payload_json(early_id, request, "acme", now),
            )
        )
    later, _ = _drain(client, auth, after=cursor)
    assert [item["id"] for item in later] == [early_id]
    assert early_id < seen[0]["id"]  # older id, later in the feed


@pytest.mark.parametrize("backend", ["postgresql"])
def test_an_open_transaction_holds_no_position_until_it_commits(client, auth, acme, runtime):
    """PostgreSQL: an uncommitted event is invisible to the sequencer; newer events numbered
    meanwhile do not push the cursor past it."""
    now = utcnow()
    session = runtime.db.Session()
    try:
        session.begin()
        partner_id = session.scalars(select(Partner.id).where(Partner.uid == "acme")).one()
        held_id = new_id("evt")
        request = PublishRequest(
            "order.created", 1, {"order_id": "o-held", "amount": 1}, now, None, None
        )
        session.add(
            Event(
                id=held_id,
                partner_id=partner_id,
                type="order.created",
                version=1,
                data=request.data,
                occurred_at=now,
                created_at=now,
                payload=payload_json(held_id, request, "acme", now),
            )
        )
        session.flush()
        assert (
            client.post("/v1/partners/acme/events", headers=auth, json=order("o-after")).status_code
            == 202
        )
        seen, cursor = _drain(client, auth)
        assert [item["data"]["order_id"] for item in seen] == ["o-after"]
        session.commit()
    finally:
        session.close()
    later, _ = _drain(client, auth, after=cursor)
    assert [item["id"] for item in later] == [held_id]


def test_the_feed_carries_the_exact_body_a_push_sends(client, auth, acme, runtime):
    response = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json=order(
            "o-env",
            resource={"type": "order", "id": "o-env", "version": 3},
            correlation_id="corr-1",
        ),
    )
    event_id = response.get_json()["id"]
    raw = _feed(client, auth).get_data(as_text=True)
    with runtime.db.begin() as session:
        payload = session.get_one(Event, event_id).payload
    assert raw.startswith('{"data":[' + payload + "]")
    item = _feed(client, auth).get_json()["data"][0]
    assert set(item) == {
        "id",
        "type",
        "version",
        "occurred_at",
        "partner",
        "resource",
        "correlation_id",
        "data",
    }


def test_sequencer_numbers_a_backlog_in_batches_without_gaps(client, auth, acme, runtime):
    for n in range(7):
        client.post("/v1/partners/acme/events", headers=auth, json=order(f"o-{n}"))
    assert sequence(runtime.db, batch=3) == 7
    assert sequence(runtime.db) == 0
    with runtime.db.begin() as session:
        positions = session.scalars(select(Event.feed_seq).order_by(Event.feed_seq)).all()
    assert positions == list(range(1, 8))


# ---------------------------------------------------------------------------- through an endpoint


def test_feed_through_an_endpoint_honours_its_subscription_and_pins(client, auth, acme):
    make_event_type(
        client,
        auth,
        "order.created",
        2,
        schema=V2_SCHEMA,
        downgrade="{order_id: order_id, amount: total}",
    )  # a pin needs a chain
    make_event_type(client, auth, "order.cancelled", 1)
    pinned = make_endpoint(
        client,
        auth,
        url=None,
        mode="pull",
        event_types=["order.created"],
        versions={"order.created": 1},
    )
    everything = make_endpoint(client, auth, url=None, mode="pull")
    v2 = {
        "type": "order.created",
        "version": 2,
        "data": {"order_id": "o-2", "total": 5},
        "renditions": {"1": {"order_id": "o-2", "amount": 5}},
    }
    assert client.post("/v1/partners/acme/events", headers=auth, json=v2).status_code == 202
    cancelled = dict(order("o-c"), type="order.cancelled")
    assert client.post("/v1/partners/acme/events", headers=auth, json=cancelled).status_code == 202

    through_pin, _ = _drain(client, auth, endpoint=pinned["id"])
    assert [(i["type"], i["version"], i["data"]) for i in through_pin] == [
        ("order.created", 1, {"order_id": "o-2", "amount": 5})
    ]
    through_all, _ = _drain(client, auth, endpoint=everything["id"])
    assert [(i["type"], i["version"]) for i in through_all] == [
        ("order.created", 2),
        ("order.cancelled", 1),
    ]
    published, _ = _drain(client, auth)
    assert [(i["type"], i["version"]) for i in published] == [
        ("order.created", 2),
        ("order.cancelled", 1),
    ]
    assert through_pin[0]["id"] == published[0]["id"]


def test_a_push_endpoint_feed_follows_its_subscription(client, auth, acme):
    make_event_type(client, auth, "order.cancelled", 1)
    push = make_endpoint(client, auth, event_types=["order.cancelled"])
    client.post("/v1/partners/acme/events", headers=auth, json=order("o-1"))
    client.post(
        "/v1/partners/acme/events", headers=auth, json=dict(order("o-2"), type="order.cancelled")
    )
    items, _ = _drain(client, auth, endpoint=push["id"])
    assert [i["type"] for i in items] == ["order.cancelled"]


# ---------------------------------------------------------------------------- pull endpoints


def test_a_pull_endpoint_has_no_url_and_is_never_pushed_to(client, auth, acme, runtime):
    pull = make_endpoint(client, auth, url=None, mode="pull")
    assert pull["mode"] == "pull" and pull["url"] is None
    push = make_endpoint(client, auth)
    assert push["mode"] == "push"
    answer = client.post("/v1/partners/acme/events", headers=auth, json=order()).get_json()
    assert [d["endpoint"] for d in answer["deliveries"]] == [push["id"]]
    with runtime.db.begin() as session:
        assert (
            session.scalar(
                select(func.count()).select_from(Delivery).where(Delivery.endpoint_id == pull["id"])
            )
            == 0
        )
    # Nor can anything be sent to it by hand, and its mode and url stay as created.
    base = f"/v1/partners/acme/endpoints/{pull['id']}"
    assert error_of(client.post(f"{base}/test", headers=auth))["code"] == "pull_endpoint"
    assert (
        error_of(client.patch(base, headers=auth, json={"mode": "push"}))["code"]
        == "mode_immutable"
    )
    assert (
        error_of(client.patch(base, headers=auth, json={"url": "http://127.0.0.1:9/x"}))["code"]
        == "invalid_field"
    )
    refused = client.post(
        "/v1/partners/acme/endpoints",
        headers=auth,
        json={"mode": "pull", "url": "http://127.0.0.1:9/x"},
    )
    assert refused.status_code == 422 and error_of(refused)["details"] == {"field": "url"}
    assert error_of(
        client.post("/v1/partners/acme/endpoints", headers=auth, json={"mode": "poll"})
    )["details"] == {"field": "mode"}


def _metric(client: Any, name: str) -> float:
    """An unlabelled series of a fresh scrape (the render is otherwise kept a few seconds)."""
    metrics.cache_of(client.application).clear()
    for line in client.get("/metrics").get_data(as_text=True).splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_ack_moves_forward_only_and_lag_shows_in_api_ui_and_metrics(client, auth, acme):
    client.post("/v1/partners/acme/events", headers=auth, json=order("before"))
    pull = make_endpoint(client, auth, url=None, mode="pull")
    base = f"/v1/partners/acme/endpoints/{pull['id']}"
    lag = client.get(base, headers=auth).get_json()["lag"]
    assert lag["events"] == 0 and lag["oldest_unacknowledged_at"] is None
    for n in range(3):
        client.post("/v1/partners/acme/events", headers=auth, json=order(f"o-{n}"))
    lag = client.get(base, headers=auth).get_json()["lag"]
    assert lag["events"] == 3 and lag["oldest_unacknowledged_age_s"] >= 0
    assert _metric(client, "kurir_pull_lag_events") == 3
    assert _metric(client, "kurir_pull_lag_max_seconds") >= 0

    # Without a cursor the endpoint's feed starts after its last acknowledgement.
    first = _feed(client, auth, endpoint=pull["id"], limit=2).get_json()
    assert [i["data"]["order_id"] for i in first["data"]] == ["o-0", "o-1"]
    acked = client.post(f"{base}/ack", headers=auth, json={"cursor": first["next_cursor"]})
    assert acked.status_code == 200
    assert acked.get_json()["lag"]["events"] == 1
    assert acked.get_json()["lag"]["acknowledged_at"] is not None
    assert _metric(client, "kurir_pull_lag_events") == 1
    rest = _feed(client, auth, endpoint=pull["id"]).get_json()
    assert [i["data"]["order_id"] for i in rest["data"]] == ["o-2"]

    # An older cursor acknowledged late changes nothing.
    stale = client.post(f"{base}/ack", headers=auth, json={"cursor": first["next_cursor"]})
    assert stale.status_code == 200 and stale.get_json()["lag"]["events"] == 1
    done = client.post(f"{base}/ack", headers=auth, json={"cursor": rest["next_cursor"]})
    assert done.get_json()["lag"]["events"] == 0
    assert _metric(client, "kurir_pull_lag_events") == 0
    again = client.post(f"{base}/ack", headers=auth, json={"cursor": first["next_cursor"]})
    assert again.get_json()["lag"]["events"] == 0


def test_ack_refuses_push_endpoints_and_bad_cursors(client, auth, acme):
    push = make_endpoint(client, auth)
    pull = make_endpoint(client, auth, url=None, mode="pull")
    cursor = _feed(client, auth).get_json()["next_cursor"]
    refused = client.post(
        f"/v1/partners/acme/endpoints/{push['id']}/ack", headers=auth, json={"cursor": cursor}
    )
    assert refused.status_code == 409 and error_of(refused)["code"] == "push_endpoint"
    base = f"/v1/partners/acme/endpoints/{pull['id']}/ack"
    for body, status, code in [
        ({}, 422, "invalid_field"),
        ({"cursor": "garbage"}, 400, "invalid_cursor"),
        ({"cursor": cursors.encode(10**6, utcnow())}, 400, "invalid_cursor"),  # beyond head
        ({"cursor": cursor, "extra": 1}, 422, "unknown_field"),
    ]:
        response = client.post(base, headers=auth, json=body)
        assert (response.status_code, error_of(response)["code"]) == (status, code), body


# ---------------------------------------------------------------------------- cursors


def test_a_cursor_older_than_retention_is_gone(client, auth, acme, runtime):
    client.post("/v1/partners/acme/events", headers=auth, json=order())
    days = runtime.settings.retain_events_days
    old = cursors.encode(0, utcnow() - timedelta(days=days, minutes=1))
    response = _feed(client, auth, after=old)
    assert response.status_code == 410
    assert error_of(response)["code"] == "cursor_expired"
    fresh = cursors.encode(0, utcnow() - timedelta(days=days) + timedelta(minutes=5))
    assert _feed(client, auth, after=fresh).status_code == 200


def test_a_pull_endpoint_behind_retention_gets_backlog_expired_not_a_silent_skip(
    client, auth, acme, runtime
):
    """The unacknowledged events past retention are neither served nor skipped silently: the
    read is refused with what would be lost, lag counts them, and the consumer moves past
    them on purpose (skip-expired, audited; or acknowledging a later cursor)."""
    skipper = make_endpoint(client, auth, url=None, mode="pull")
    acker = make_endpoint(client, auth, url=None, mode="pull")
    retention = timedelta(days=runtime.settings.retain_events_days)
    old_id = old_event(runtime, "acme", "o-old", retention + timedelta(hours=1))
    # Created earlier still, but committed (so placed in the feed) after it.
    old_event(runtime, "acme", "o-older", retention + timedelta(hours=2))
    client.post("/v1/partners/acme/events", headers=auth, json=order("o-new"))
    # A feed that is nobody's backlog still starts within retention.
    fresh, later_cursor = _drain(client, auth)
    assert [i["data"]["order_id"] for i in fresh] == ["o-new"]

    before = utcnow()
    for pull in (skipper, acker):
        refused = _feed(client, auth, endpoint=pull["id"])
        assert refused.status_code == 410, refused.get_json()
        error = error_of(refused)
        assert error["code"] == "backlog_expired"
        horizon = parse_time(error["details"].pop("horizon"))
        assert before - retention - timedelta(seconds=5) <= horizon <= utcnow() - retention
        assert error["details"] == {"skipped": 2, "oldest_event": old_id}
        lag = client.get(f"/v1/partners/acme/endpoints/{pull['id']}", headers=auth).get_json()[
            "lag"
        ]
        assert (lag["events"], lag["expired_events"]) == (3, 2)
        assert parse_time(lag["oldest_unacknowledged_at"]) < horizon
    # A cursor the consumer holds still reads on: only the read that would skip is refused.
    assert _feed(client, auth, endpoint=acker["id"], after=later_cursor).status_code == 200

    base = f"/v1/partners/acme/endpoints/{skipper['id']}"
    skipped = client.post(f"{base}/skip-expired", headers=auth)
    assert skipped.status_code == 200, skipped.get_json()
    assert (skipped.get_json()["lag"]["events"], skipped.get_json()["lag"]["expired_events"]) == (
        1,
        0,
    )
    through, _ = _drain(client, auth, endpoint=skipper["id"])
    assert [i["data"]["order_id"] for i in through] == ["o-new"]
    assert client.post(f"{base}/skip-expired", headers=auth).status_code == 200  # idempotent
    with runtime.db.begin() as session:
        records = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "endpoint.backlog_skipped")
        ).all()
        assert [
            (r.subject_id, r.details["skipped"], r.details["oldest_event"]) for r in records
        ] == [(skipper["id"], 2, old_id)]

    acked = client.post(
        f"/v1/partners/acme/endpoints/{acker['id']}/ack",
        headers=auth,
        json={"cursor": later_cursor},
    )
    lag = acked.get_json()["lag"]
    assert (lag["events"], lag["expired_events"]) == (0, 0)
    assert _feed(client, auth, endpoint=acker["id"]).get_json()["data"] == []

    push = make_endpoint(client, auth)
    refused = client.post(f"/v1/partners/acme/endpoints/{push['id']}/skip-expired", headers=auth)
    assert refused.status_code == 409 and error_of(refused)["code"] == "push_endpoint"


def test_only_subscribed_types_make_a_backlog_expire(client, auth, acme, runtime):
    make_event_type(client, auth, "order.shipped")
    pull = make_endpoint(client, auth, url=None, mode="pull", event_types=["order.shipped"])
    old_event(
        runtime, "acme", "o-old", timedelta(days=runtime.settings.retain_events_days, hours=1)
    )
    page = _feed(client, auth, endpoint=pull["id"])
    assert page.status_code == 200 and page.get_json()["data"] == []
    lag = client.get(f"/v1/partners/acme/endpoints/{pull['id']}", headers=auth).get_json()
    assert (lag["lag"]["events"], lag["lag"]["expired_events"]) == (0, 0)


@pytest.mark.parametrize(
    "bad",
    [
        "nope",
        base64.urlsafe_b64encode(b"f1.x.1").decode(),
        "f1.1.1",
        "%00",
    ],
)
def test_a_malformed_cursor_or_limit_is_a_clear_400(client, auth, acme, bad):
    response = _feed(client, auth, after=bad)
    assert response.status_code == 400
    assert error_of(response)["code"] in ("invalid_cursor", "invalid_parameter")


def test_an_empty_feed_still_hands_out_a_cursor_that_keeps_its_place(client, auth, acme):
    first = _feed(client, auth).get_json()
    assert first == {"data": [], "next_cursor": first["next_cursor"]}
    client.post("/v1/partners/acme/events", headers=auth, json=order("o-new"))
    items, _ = _drain(client, auth, after=first["next_cursor"])
    assert [i["data"]["order_id"] for i in items] == ["o-new"]


# ---------------------------------------------------------------------------- who may read


def test_a_partner_key_reads_its_own_feed_and_no_other(client, auth, acme):
    make_partner(client, auth, "bravo")
    client.post("/v1/partners/acme/events", headers=auth, json=order("acme-1"))
    client.post("/v1/partners/bravo/events", headers=auth, json=order("bravo-1"))
    own = client.post("/v1/partners/acme/keys", headers=auth, json={"name": "acme-robot"})
    key = {"Authorization": f"Bearer {own.get_json()['key']}"}
    items, cursor = _drain(client, key)
    assert [i["data"]["order_id"] for i in items] == ["acme-1"]
    other = _feed(client, key, "bravo")
    assert other.status_code == 404 and error_of(other)["code"] == "not_found"
    bravo_pull = make_endpoint(client, auth, "bravo", url=None, mode="pull")
    assert _feed(client, key, endpoint=bravo_pull["id"]).status_code == 404
    assert (
        client.post(
            f"/v1/partners/bravo/endpoints/{bravo_pull['id']}/ack",
            headers=key,
            json={"cursor": cursor},
        ).status_code
        == 404
    )
    # A cursor carries no partner: it only says where in the feed, never whose events. Read
    # from the very start (before both partners' events), acme's key still sees only acme's.
    from_start, _ = _drain(client, key, after=cursors.encode(0, utcnow()))
    assert [i["data"]["order_id"] for i in from_start] == ["acme-1"]


def test_the_scheduler_job_numbers_what_publishers_committed(client, auth, acme, runtime):
    from app.processes.scheduler import sequence_feed

    client.post("/v1/partners/acme/events", headers=auth, json=order())
    assert sequence_feed(runtime) == 1
    wait_for(lambda: _feed(client, auth).get_json()["data"], message="the event in the feed")
