"""Shared pieces of the fuzz tests: the error-shape check, the tally, the seeded scene."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from app.runtime import Runtime
from tests.support.dlq_factories import make_dead_letter, make_event
from tests.support.inbound import create_source, signed_callback
from tests.support.publish import make_endpoint, make_event_type, make_partner

MAX_REPORTED = 20


def error_shape_problem(status: int, content_type: str | None, raw: bytes) -> str | None:
    """Why an error answer is not `{"error": {"code", "message", "details"}}` (None if it is)."""
    if not (content_type or "").startswith("application/json"):
        return f"{status} with content type {content_type!r}"
    try:
        body = json.loads(raw)
    except ValueError:
        return f"{status} whose body is not JSON: {raw[:120]!r}"
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return f"{status} not in the error shape: {raw[:200]!r}"
    error = body["error"]
    if set(error) != {"code", "message", "details"}:
        return f"{status} error keys {sorted(error)}"
    if not isinstance(error["code"], str) or not isinstance(error["message"], str):
        return f"{status} error code/message not strings: {raw[:200]!r}"
    return None


class Tally:
    """Requests tried and the answers that broke the rules (the first few, with their case)."""

    def __init__(self) -> None:
        self.requests = 0
        self.by_status: dict[int, int] = {}
        self.problems: list[str] = []
        self.problem_count = 0
        self.ungenerable: list[str] = []

    def check(self, label: str, status: int, content_type: str | None, raw: bytes) -> None:
        self.requests += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        problem = None
        if status >= 500:
            problem = f"{status}: {raw[:300]!r}"
        elif status >= 400:
            problem = error_shape_problem(status, content_type, raw)
        if problem is not None:
            self.problem_count += 1
            if os.environ.get("FUZZ_DEBUG"):
                print(f"PROBLEM {label[:300]} -> {problem[:300]}")
            if len(self.problems) < MAX_REPORTED:
                self.problems.append(f"{label} -> {problem}")


@pytest.fixture
def seeded(runtime: Runtime, app: Any, client: Any, auth: dict[str, str]) -> dict[str, str]:
    """One of everything, so fuzzed requests can reach past the lookups."""
    make_event_type(client, auth, name="order.created", version=1)
    make_partner(client, auth, uid="acme")
    endpoint = make_endpoint(client, auth, uid="acme")
    published = client.post(
        "/v1/partners/acme/events",
        headers=auth,
        json={"type": "order.created", "version": 1, "data": {"order_id": "o1", "amount": 5}},
    )
    assert published.status_code == 202, published.get_json()
    event = published.get_json()
    from app.models import Endpoint, Partner

    with runtime.db.begin() as session:
        ep = session.get_one(Endpoint, endpoint["id"])
        dead_event = make_event(session, session.get_one(Partner, ep.partner_id))
        letter_id = make_dead_letter(session, ep, dead_event).id
    create_source(runtime, "shop", "github")
    body, headers = signed_callback("github", event_id="gh-1", resource_id="101", version=1)
    received = client.post("/inbound/shop", data=body, headers=headers)
    assert received.status_code == 202, received.get_json()
    inbound_id = received.get_json()["id"]
    return {
        "uid": "acme",
        "endpoint_id": endpoint["id"],
        "event_id": event["id"],
        "delivery_id": event["deliveries"][0]["id"],
        "letter_id": letter_id,
        "source": "shop",
        "resource_id": "101",
        "job_id": "op_unknown",
        "inbound_event_id": inbound_id,
    }


def known_path_parameters(path: str, seeded: dict[str, str]) -> dict[str, Any]:
    """Existing resources for each path parameter of `path`."""
    if path.startswith("/v1/event-types/"):
        return {"name": "order.created", "version": 1}
    if path.startswith("/v1/sources/"):
        return {"name": "shop", "resource_id": "101"}
    if path.startswith("/v1/inbound-events/"):
        return {"event_id": seeded["inbound_event_id"]}
    known = dict(seeded)
    return known
