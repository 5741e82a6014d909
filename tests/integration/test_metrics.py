"""`/metrics`: Prometheus text with deliveries, attempts, latency, queues, dead letters,
inbound, pull lag and blocked keys; what it may show without a token, what a render costs, and
how long it is kept."""

from __future__ import annotations

import logging
import re
from typing import Any

import redis as redis_lib
from rq import Queue
from sqlalchemy import event

from app.models import InboundEvent, InboundSource
from app.queues import DELIVERIES
from app.web import metrics
from tests.support.dlq_factories import letters_for, make_scene
from tests.support.publish import (
    blocked_endpoint,
    make_endpoint,
    make_event_type,
    make_partner,
    order,
)

_SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? (-?[0-9.e+]+)$")


def parse(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not Prometheus text: {line!r}"
        samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def test_metrics_report_the_stores(client, runtime, redis_client):
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        letters_for(session, scene, 2, attempts=3)  # durations 40, 80, 120 ms; status 500
        letters_for(session, scene, 1, status_code=None, error="timeout")
        source = InboundSource(name="gh", scheme="github", mapping={})
        session.add(source)
        session.flush()
        session.add(
            InboundEvent(
                source_id=source.id, event_id="e1", status="quarantined", raw_body=b"{}", headers={}
            )
        )
    Queue(DELIVERIES, connection=redis_client).enqueue("os.getcwd")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain; version=0.0.4")
    assert "# TYPE kurir_attempt_duration_seconds histogram" in response.text
    m = parse(response.text)
    assert m['kurir_deliveries{state="dead"}'] == 3
    assert m['kurir_deliveries{state="succeeded"}'] == 0
    assert m['kurir_attempts{outcome="http_error"}'] == 6
    assert m['kurir_attempts{outcome="network_error"}'] == 1
    assert m['kurir_attempts{outcome="success"}'] == 0
    assert m['kurir_attempt_duration_seconds_bucket{le="0.05"}'] == 3
    assert m['kurir_attempt_duration_seconds_bucket{le="0.1"}'] == 5
    assert m['kurir_attempt_duration_seconds_bucket{le="+Inf"}'] == 7
    assert m["kurir_attempt_duration_seconds_count"] == 7
    assert abs(m["kurir_attempt_duration_seconds_sum"] - 0.52) < 1e-9
    assert m['kurir_dead_letters{state="open"}'] == 3
    assert m['kurir_inbound_events{status="quarantined"}'] == 1
    assert m['kurir_queue_depth{queue="kurir-deliveries"}'] == 1
    assert m['kurir_queue_oldest_job_age_seconds{queue="kurir-deliveries"}'] >= 0
    assert m["kurir_redis_up"] == 1 and m["kurir_database_up"] == 1


def test_metrics_survive_redis_being_down(client, runtime, monkeypatch):
    down = redis_lib.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    monkeypatch.setattr(type(runtime), "redis", property(lambda self: down), raising=False)
    response = client.get("/metrics")
    assert response.status_code == 200
    m = parse(response.text)
    assert m["kurir_redis_up"] == 0 and m["kurir_database_up"] == 1


def test_with_a_metrics_token_a_scrape_must_bear_it(client, runtime, monkeypatch):
    monkeypatch.setattr(
        runtime, "settings", runtime.settings.with_overrides(metrics_token="scrape-s3cret")
    )
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "scrape-s3cret"}):
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 401, headers
        assert refused.get_json()["error"]["code"] == "unauthorized"
    allowed = client.get("/metrics", headers={"Authorization": "Bearer scrape-s3cret"})
    assert allowed.status_code == 200 and "kurir_database_up 1" in allowed.text
    assert client.get("/healthz").status_code == 200  # probes stay open


# ------------------------------------------------------------------ labels, cost, cache


def _scrape(client: Any, headers: dict[str, str] | None = None) -> str:
    """A fresh render (the last one is otherwise served again for a few seconds)."""
    metrics.cache_of(client.application).clear()
    response = client.get("/metrics", headers=headers or {})
    assert response.status_code == 200
    return response.text


def _pull_and_blocked(
    client: Any, auth: dict[str, str], uid: str, pulls: int, blocked: int
) -> list[str]:
    """`pulls` pull endpoints of partner `uid` (the odd ones subscribed to `order.created`
    only), then `blocked` endpoints subscribed to `stock.changed`, each made holding a key of
    its own (the ones made before it, disabled too, hold that key as well); their ids."""
    ids = []
    for n in range(pulls):
        types = {"event_types": ["order.created"]} if n % 2 else {}
        ids.append(make_endpoint(client, auth, uid, url=None, mode="pull", **types)["id"])
    for n in range(blocked):
        ids.append(
            blocked_endpoint(
                client,
                auth,
                uid,
                keys=(f"{uid}-k{n}",),
                event_type="stock.changed",
                event_types=["stock.changed"],
            )["id"]
        )
    return ids


def _contracts(client: Any, auth: dict[str, str]) -> None:
    make_event_type(client, auth)
    make_event_type(client, auth, "stock.changed")


def _statements(runtime: Any, client: Any, headers: dict[str, str]) -> int:
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(runtime.db.engine, "before_cursor_execute", count)
    try:
        _scrape(client, headers)
    finally:
        event.remove(runtime.db.engine, "before_cursor_execute", count)
    return len(seen)


def test_a_render_costs_the_same_statements_for_one_endpoint_or_many(
    client, auth, runtime, monkeypatch
):
    """Counted, not timed: the per-endpoint lag used to cost two statements per pull
    endpoint on every scrape."""
    monkeypatch.setattr(
        runtime, "settings", runtime.settings.with_overrides(metrics_token="scrape-s3cret")
    )
    scraper = {"Authorization": "Bearer scrape-s3cret"}
    _contracts(client, auth)
    make_partner(client, auth, "acme")
    _pull_and_blocked(client, auth, "acme", pulls=1, blocked=1)
    client.post("/v1/partners/acme/events", headers=auth, json=order("o-1"))
    one = _statements(runtime, client, scraper)
    for uid in ("bravo", "charlie"):
        make_partner(client, auth, uid)
        _pull_and_blocked(client, auth, uid, pulls=4, blocked=2)
        client.post(f"/v1/partners/{uid}/events", headers=auth, json=order("o-2"))
    many = _statements(runtime, client, scraper)
    assert one == many, (one, many)
    m = parse(_scrape(client, scraper))
    # Blocked: acme 1; bravo and charlie 2 + 1 each (the first endpoint holds both keys).
    assert m["kurir_pull_endpoints"] == 9 and m["kurir_blocked_keys"] == 7
    # Per endpoint, by subscription: every pull endpoint has its partner's order; those
    # taking every type also have the stock events published for the blocked endpoints
    # (2 per blocked endpoint): acme 1 + 2; bravo and charlie 1 + 4.
    lags = [v for k, v in m.items() if k.startswith("kurir_pull_endpoint_lag_events{")]
    assert sorted(lags) == [1, 1, 1, 1, 3, 5, 5, 5, 5]


def test_default_series_name_no_partner_nor_endpoint(client, auth, runtime, monkeypatch):
    _contracts(client, auth)
    make_partner(client, auth, "acme-secret-partner")
    ids = _pull_and_blocked(client, auth, "acme-secret-partner", pulls=2, blocked=1)
    client.post("/v1/partners/acme-secret-partner/events", headers=auth, json=order("o-1"))
    text = _scrape(client)
    assert "partner=" not in text and "endpoint=" not in text
    assert "acme-secret-partner" not in text and not any(i in text for i in ids)
    m = parse(text)
    # The pull endpoint taking every type also has the 2 stock events.
    assert (m["kurir_pull_endpoints"], m["kurir_pull_lag_events"]) == (2, 4)
    assert m["kurir_pull_lag_max_seconds"] >= 0
    assert (m["kurir_blocked_keys"], m["kurir_endpoints_with_blocked_keys"]) == (1, 1)
    assert m["kurir_pull_endpoints_backlog_expired"] == 0

    # An authenticated scraper also gets them per endpoint.
    monkeypatch.setattr(
        runtime, "settings", runtime.settings.with_overrides(metrics_token="scrape-s3cret")
    )
    m = parse(_scrape(client, {"Authorization": "Bearer scrape-s3cret"}))
    for pull, lag in zip(ids[:2], (3, 1), strict=True):
        labels = f'{{endpoint="{pull}",partner="acme-secret-partner"}}'
        assert m[f"kurir_pull_endpoint_lag_events{labels}"] == lag
        assert m[f"kurir_pull_endpoint_expired_events{labels}"] == 0
    for held in ids[2:]:
        labels = f'{{endpoint="{held}",partner="acme-secret-partner"}}'
        assert m[f"kurir_endpoint_blocked_keys{labels}"] == 1


def test_a_blocked_key_shows_whatever_the_endpoint_ordering_says_now(client, auth):
    make_event_type(client, auth)
    make_partner(client, auth, "acme")
    held = blocked_endpoint(client, auth, keys=("stock:1", "stock:2"))
    client.patch(
        f"/v1/partners/acme/endpoints/{held['id']}", headers=auth, json={"ordering": "none"}
    )
    assert parse(_scrape(client))["kurir_blocked_keys"] == 2
    # "skip" lets every key go: nothing is held any more.
    client.patch(
        f"/v1/partners/acme/endpoints/{held['id']}", headers=auth, json={"on_dead": "skip"}
    )
    assert parse(_scrape(client))["kurir_blocked_keys"] == 0


def test_a_render_is_kept_a_few_seconds_then_read_again(client, auth, runtime):
    now = [1000.0]
    client.application.extensions["kurir_metrics"] = metrics.RenderCache(clock=lambda: now[0])
    first = parse(client.get("/metrics").text)
    make_event_type(client, auth)
    make_partner(client, auth, "acme")
    make_endpoint(client, auth, url=None, mode="pull")
    assert _statements_of_unscraped(runtime, client) == 0
    assert parse(client.get("/metrics").text) == first
    now[0] += metrics.CACHE_TTL_S
    assert parse(client.get("/metrics").text)["kurir_pull_endpoints"] == 1


def _statements_of_unscraped(runtime: Any, client: Any) -> int:
    """Statements run by a scrape served as it comes (the cache left as it is)."""
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(runtime.db.engine, "before_cursor_execute", count)
    try:
        assert client.get("/metrics").status_code == 200
    finally:
        event.remove(runtime.db.engine, "before_cursor_execute", count)
    return len(seen)


def test_an_open_metrics_endpoint_on_postgresql_is_a_start_up_warning(runtime, caplog, monkeypatch):
    from app.web import create_app

    with caplog.at_level(logging.WARNING, logger="app.web.metrics"):
        create_app(runtime=runtime)
    warned = [r for r in caplog.records if "/metrics is open" in r.getMessage()]
    assert len(warned) == (0 if runtime.settings.is_sqlite else 1)
    caplog.clear()
    monkeypatch.setattr(
        runtime, "settings", runtime.settings.with_overrides(metrics_token="scrape-s3cret")
    )
    with caplog.at_level(logging.WARNING, logger="app.web.metrics"):
        create_app(runtime=runtime)
    assert not [r for r in caplog.records if "/metrics is open" in r.getMessage()]
