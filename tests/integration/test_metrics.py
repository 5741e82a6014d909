"""`/metrics`: Prometheus text with deliveries, attempts, latency, queues, dead letters, inbound."""

from __future__ import annotations

import re

import redis as redis_lib
from rq import Queue

from app.models import InboundEvent, InboundSource
from app.queues import DELIVERIES
from tests.dlq_factories import letters_for, make_scene

_SAMPLE = re.compile(r'^([a-z_]+)(\{[^}]*\})? (-?[0-9.e+]+)$')


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
        session.add(InboundEvent(source_id=source.id, event_id="e1", status="quarantined",
                                 raw_body=b"{}", headers={}))
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
    monkeypatch.setattr(runtime, "settings",
                        runtime.settings.with_overrides(metrics_token="scrape-s3cret"))
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "scrape-s3cret"}):
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 401, headers
        assert refused.get_json()["error"]["code"] == "unauthorized"
    allowed = client.get("/metrics", headers={"Authorization": "Bearer scrape-s3cret"})
    assert allowed.status_code == 200 and "kurir_database_up 1" in allowed.text
    assert client.get("/healthz").status_code == 200  # probes stay open
