"""Tracing end to end, on both databases: one publish, its deliveries and an inbound callback
become spans of the caller's trace, recorded by the OpenTelemetry SDK's in-memory exporter.

The API (Flask test client), a real worker thread and real receivers on 127.0.0.1 run in
this process; the spans join across them only through what the database stores
(`events.trace_context`, `inbound_events.trace_context`), as they would across processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from app import telemetry
from app.models import SUCCEEDED, Delivery, Event, InboundEvent
from app.runtime import Runtime
from tests.support import inbound as kit
from tests.support.factories import Receiver, WorkerThread, wait_for
from tests.support.publish import error_of, make_endpoint, make_event_type, make_partner, order

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
otel_trace = pytest.importorskip("opentelemetry.trace")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
INCOMING = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
FAST = (1, 1, 1)
SW = "standard-webhooks"


@pytest.fixture
def provider() -> Iterator[tuple[Any, Any]]:
    """A tracer provider exporting to memory, not installed globally (tracing is left off)."""
    exporter = in_memory.InMemorySpanExporter()
    made = sdk_trace.TracerProvider()
    made.add_span_processor(export.SimpleSpanProcessor(exporter))
    yield made, exporter
    telemetry.disable()
    made.shutdown()


@pytest.fixture
def spans(provider: tuple[Any, Any]) -> Any:
    """Tracing on in this process, every finished span in the returned exporter."""
    made, exporter = provider
    telemetry.enable(made)
    return exporter


def _hex(number: int, width: int) -> str:
    return format(number, f"0{width}x")


def _named(exporter: Any, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _worker_rt(runtime: Runtime) -> Runtime:
    return Runtime(runtime.settings.with_overrides(retry_schedule=FAST), database=runtime.db)


def _delivered(runtime: Runtime, event_id: str, expected: int) -> bool:
    with runtime.db.begin() as session:
        states = session.scalars(select(Delivery.state).where(Delivery.event_id == event_id)).all()
    return len(states) == expected and all(s == SUCCEEDED for s in states)


def _fails_once(received: Any, count: int) -> tuple[int, dict[str, str], bytes]:
    if received.path == "/flaky" and count == 1:
        return 500, {}, b"not yet"
    return 200, {}, b"ok"


def test_one_publish_to_two_endpoints_is_one_trace_of_publish_enqueue_and_attempts(
    runtime, client, auth, spans
):
    make_event_type(client, auth)
    make_partner(client, auth)
    with Receiver(_fails_once) as receiver:
        flaky = make_endpoint(client, auth, url=receiver.url + "/flaky", send_traceparent=True)
        steady = make_endpoint(client, auth, url=receiver.url + "/steady")
        assert flaky["send_traceparent"] is True
        assert steady["send_traceparent"] is False
        spans.clear()  # only the publish's trace from here on

        published = client.post(
            "/v1/partners/acme/events", headers={**auth, "traceparent": INCOMING}, json=order()
        )
        assert published.status_code == 202, published.get_json()
        event_id = published.get_json()["id"]
        with WorkerThread(_worker_rt(runtime)):
            wait_for(lambda: _delivered(runtime, event_id, 2), message="both delivered")
            wait_for(lambda: len(_named(spans, "kurir.attempt")) == 3, message="three attempts")
        flaky_requests, steady_requests = receiver.on("/flaky"), receiver.on("/steady")

    [publish] = _named(spans, "kurir.publish")
    [enqueue] = _named(spans, "kurir.enqueue")
    attempts = _named(spans, "kurir.attempt")
    # One trace: the publisher's.
    assert {_hex(s.context.trace_id, 32) for s in [publish, enqueue, *attempts]} == {TRACE_ID}
    # The publish is the caller's child; the enqueue and every attempt are the publish's.
    assert _hex(publish.parent.span_id, 16) == CALLER_SPAN
    assert publish.parent.is_remote
    assert publish.kind == otel_trace.SpanKind.SERVER
    assert publish.attributes["kurir.event.id"] == event_id
    assert publish.attributes["kurir.deliveries"] == 2
    assert enqueue.parent.span_id == publish.context.span_id
    assert enqueue.kind == otel_trace.SpanKind.PRODUCER
    assert enqueue.attributes["kurir.deliveries"] == 2
    for span in attempts:
        assert span.parent.span_id == publish.context.span_id
        assert span.kind == otel_trace.SpanKind.CLIENT
        assert span.attributes["kurir.event.id"] == event_id
        assert isinstance(span.attributes["kurir.attempt.duration_ms"], int)
        assert span.attributes["kurir.attempt.duration_ms"] >= 0
    seen = sorted(
        (
            s.attributes["kurir.endpoint.id"],
            s.attributes["kurir.attempt.number"],
            s.attributes["http.response.status_code"],
            s.status.status_code.name,
        )
        for s in attempts
    )
    assert seen == sorted(
        [
            (flaky["id"], 1, 500, "ERROR"),
            (flaky["id"], 2, 200, "UNSET"),
            (steady["id"], 1, 200, "UNSET"),
        ]
    )
    # The stored context is the publish span's: what let the worker's spans join.
    with runtime.db.begin() as session:
        stored = session.scalar(select(Event.trace_context).where(Event.id == event_id))
    assert stored == f"00-{TRACE_ID}-{_hex(publish.context.span_id, 16)}-01"
    # The endpoint that opted in got each attempt's own context; the other got nothing.
    by_number = {
        s.attributes["kurir.attempt.number"]: s
        for s in attempts
        if s.attributes["kurir.endpoint.id"] == flaky["id"]
    }
    assert [r.headers.get("traceparent") for r in flaky_requests] == [
        f"00-{TRACE_ID}-{_hex(by_number[n].context.span_id, 16)}-01" for n in (1, 2)
    ]
    assert [r.headers.get("traceparent") for r in steady_requests] == [None]
    assert all("tracestate" not in r.headers for r in flaky_requests + steady_requests)


def test_without_tracing_nothing_is_recorded_stored_or_sent(runtime, client, auth, provider):
    _, exporter = provider  # a provider exists but tracing was never turned on
    assert not telemetry.enabled()
    make_event_type(client, auth)
    make_partner(client, auth)
    with Receiver() as receiver:
        make_endpoint(client, auth, url=receiver.url + "/hook", send_traceparent=True)
        published = client.post(
            "/v1/partners/acme/events", headers={**auth, "traceparent": INCOMING}, json=order()
        )
        assert published.status_code == 202
        event_id = published.get_json()["id"]
        with WorkerThread(_worker_rt(runtime)):
            wait_for(lambda: _delivered(runtime, event_id, 1), message="delivered")
        [request] = receiver.on("/hook")
    assert "traceparent" not in request.headers
    assert exporter.get_finished_spans() == ()
    with runtime.db.begin() as session:
        assert session.scalar(select(Event.trace_context).where(Event.id == event_id)) is None


def test_an_inbound_callback_is_received_and_applied_in_the_callers_trace(runtime, client, spans):
    kit.create_source(runtime, "payments", SW)
    body, headers = kit.callback(SW, event_id="cb-1", resource_id="pay-1", version=1)
    signed = kit.sign(SW, kit.SECRETS[SW], body, headers)
    answer = client.post(
        "/inbound/payments", data=body, headers=[*signed, ("traceparent", INCOMING)]
    )
    assert answer.status_code == 202, answer.get_json()
    inbound_id = answer.get_json()["id"]
    with WorkerThread(runtime):
        wait_for(lambda: _named(spans, "kurir.inbound.apply"), message="the apply span")

    [receive] = _named(spans, "kurir.inbound.receive")
    [apply] = _named(spans, "kurir.inbound.apply")
    assert {_hex(receive.context.trace_id, 32), _hex(apply.context.trace_id, 32)} == {TRACE_ID}
    assert _hex(receive.parent.span_id, 16) == CALLER_SPAN
    assert receive.attributes["kurir.inbound.event.id"] == inbound_id
    assert receive.attributes["kurir.inbound.source"] == "payments"
    assert apply.parent.span_id == receive.context.span_id
    assert apply.kind == otel_trace.SpanKind.CONSUMER
    assert apply.attributes["kurir.inbound.event.id"] == inbound_id
    assert apply.attributes["kurir.inbound.status"] == "applied"
    with runtime.db.begin() as session:
        stored = session.scalar(
            select(InboundEvent.trace_context).where(InboundEvent.id == inbound_id)
        )
    assert stored == f"00-{TRACE_ID}-{_hex(receive.context.span_id, 16)}-01"


def test_send_traceparent_is_an_operators_choice(client, auth):
    make_partner(client, auth)
    endpoint = make_endpoint(client, auth)
    key = client.post("/v1/partners/acme/keys", headers=auth, json={"name": "robot"}).get_json()
    partner = {"Authorization": f"Bearer {key['key']}"}
    path = f"/v1/partners/acme/endpoints/{endpoint['id']}"

    refused = client.patch(path, headers=partner, json={"send_traceparent": True})
    assert refused.status_code == 403
    assert error_of(refused)["code"] == "operator_only_field"
    created = client.post(
        "/v1/partners/acme/endpoints",
        headers=partner,
        json={"url": "http://127.0.0.1:9/other", "send_traceparent": True},
    )
    assert created.status_code == 403
    assert error_of(created)["code"] == "operator_only_field"
    not_a_flag = client.patch(path, headers=auth, json={"send_traceparent": "yes"})
    assert not_a_flag.status_code == 422
    assert error_of(not_a_flag)["details"] == {"field": "send_traceparent"}

    turned_on = client.patch(path, headers=auth, json={"send_traceparent": True})
    assert turned_on.status_code == 200
    assert turned_on.get_json()["send_traceparent"] is True
    # The partner may send the value back as it is, and turn it off.
    same = client.patch(path, headers=partner, json={"send_traceparent": True, "timeout_s": 5})
    assert same.status_code == 200, same.get_json()
    off = client.patch(path, headers=partner, json={"send_traceparent": False})
    assert off.status_code == 200
    assert client.get(path, headers=auth).get_json()["send_traceparent"] is False
