"""Partner-scoped keys: every route of /openapi.json, called with partner A's key on partner
B's resources, answers as the table says — and nothing of B's ever shows.

The table names every documented route, so a new route cannot ship without someone deciding
what a partner key gets from it. "Not found" is the only refusal: a 403 would confirm that
the other partner (or the thing asked for) exists.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from sqlalchemy import select

from app.models import AuditRecord, DeadLetter, Delivery, Endpoint, InboundEvent
from app.web.openapi import document
from tests.support.dlq_factories import make_dead_letter
from tests.support.dlq_factories import make_event as make_dl_event
from tests.support.publish import (
    make_endpoint,
    make_event_type,
    make_partner,
    order,
)

OWN, OTHER = "alpha-corp", "bravo-corp"
NOT_FOUND = 404

# What a key of partner A gets on each route, called with partner B's resources (or with no
# resource, for lists and global reads). Lists answer 200 with A's rows only: the leak check
# below holds every answer to that.
TABLE: dict[tuple[str, str], int] = {
    ("get", "/v1/me"): 200,  # its own key
    ("get", "/v1/keys"): NOT_FOUND,
    ("get", "/v1/keys/{key_id}"): NOT_FOUND,
    ("delete", "/v1/keys/{key_id}"): NOT_FOUND,
    ("get", "/v1/audit"): 200,  # A's records only
    ("post", "/v1/event-types"): NOT_FOUND,
    ("get", "/v1/event-types"): 200,  # the catalog is every subscriber's to read
    ("get", "/v1/event-types/{name}/{version}"): 200,
    # Adoption: a partner key counts its own pins and deliveries only.
    ("get", "/v1/event-types/{name}/versions"): 200,
    ("post", "/v1/event-types/{name}/{version}/deprecate"): NOT_FOUND,
    ("post", "/v1/partners"): NOT_FOUND,
    ("get", "/v1/partners"): 200,  # A alone
    ("get", "/v1/partners/{uid}"): NOT_FOUND,
    ("patch", "/v1/partners/{uid}"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/keys"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/portal-links"): NOT_FOUND,
    ("delete", "/v1/partners/{uid}/portal-sessions"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints"): NOT_FOUND,
    ("get", "/v1/partners/{uid}/endpoints"): NOT_FOUND,
    ("get", "/v1/partners/{uid}/endpoints/{endpoint_id}"): NOT_FOUND,
    ("patch", "/v1/partners/{uid}/endpoints/{endpoint_id}"): NOT_FOUND,
    ("delete", "/v1/partners/{uid}/endpoints/{endpoint_id}"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/enable"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/disable"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/secret/rotate"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/test"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/probe"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/recover"): NOT_FOUND,
    ("get", "/v1/partners/{uid}/endpoints/{endpoint_id}/secret"): NOT_FOUND,
    ("get", "/v1/partners/{uid}/endpoints/{endpoint_id}/blocked-keys"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/verify"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/verify/resend"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/filter-test"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/events"): NOT_FOUND,
    ("get", "/v1/partners/{uid}/events"): NOT_FOUND,
    ("get", "/v1/events/{event_id}"): NOT_FOUND,
    ("get", "/v1/partners/{uid}/feed"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/ack"): NOT_FOUND,
    ("post", "/v1/partners/{uid}/endpoints/{endpoint_id}/skip-expired"): NOT_FOUND,
    ("get", "/v1/deliveries"): 200,  # A's deliveries only
    ("get", "/v1/deliveries/{delivery_id}"): NOT_FOUND,
    ("post", "/v1/deliveries/{delivery_id}/retry"): NOT_FOUND,
    ("get", "/v1/dead-letters"): 200,  # A's letters only
    ("get", "/v1/dead-letters/{letter_id}"): NOT_FOUND,
    ("post", "/v1/dead-letters/{letter_id}/resend"): NOT_FOUND,
    # By ids: B's letter is skipped exactly as an id that does not exist is.
    ("post", "/v1/dead-letters/resend"): 200,
    ("get", "/v1/dead-letters/resend-jobs/{job_id}"): NOT_FOUND,
    ("get", "/v1/operations/{job_id}"): NOT_FOUND,
    ("post", "/v1/dead-letters/{letter_id}/discard"): NOT_FOUND,
    ("post", "/v1/sources"): NOT_FOUND,
    ("get", "/v1/sources"): NOT_FOUND,
    ("get", "/v1/inbound-handlers"): NOT_FOUND,
    ("get", "/v1/sources/{name}"): NOT_FOUND,
    ("post", "/v1/sources/{name}/secrets"): NOT_FOUND,
    ("get", "/v1/sources/{name}/resources/{resource_id}"): NOT_FOUND,
    ("get", "/v1/inbound-events"): NOT_FOUND,
    ("get", "/v1/inbound-events/{event_id}"): NOT_FOUND,
    ("post", "/v1/inbound-events/{event_id}/replay"): NOT_FOUND,
}
# Routes no API key is needed for: the inbound receiver authenticates the sender's signature.
NO_KEY = {("post", "/inbound/{source}")}

# Extra calls with query strings or bodies that name B while the path does not.
NAMED_IN_QUERY = [
    ("get", "/v1/deliveries?partner={uid}", NOT_FOUND),
    ("get", "/v1/deliveries?endpoint={endpoint_id}", 200),  # and empty
    ("get", "/v1/dead-letters?partner={uid}", NOT_FOUND),
    ("get", "/v1/dead-letters?endpoint={endpoint_id}", 200),  # and empty
    ("get", "/v1/audit?subject={endpoint_id}", 200),  # and empty
    ("get", "/v1/partners/{own}/feed?endpoint={endpoint_id}", NOT_FOUND),
]

# What a partner key can never do, even to its own partner.
NEVER_EVEN_OWN = [
    ("post", "/v1/partners/{own}/events"),
    ("post", "/v1/partners/{own}/keys"),
    ("post", "/v1/event-types"),
    ("post", "/v1/event-types/order.created/1/deprecate"),
    ("post", "/v1/partners"),
    ("get", "/v1/keys"),
    ("post", "/v1/sources"),
    ("delete", "/v1/partners/{own}/portal-sessions"),  # withdrawing portal access is admin's
]


def _body(method: str, template: str, b: dict[str, Any]) -> dict[str, Any] | None:
    """A valid body, so that only access, never validation, can refuse the call."""
    bodies = {
        "/v1/event-types": {"name": "sneaky.type", "version": 1, "schema": {"type": "object"}},
        "/v1/partners": {"uid": "sneaky", "name": "Sneaky"},
        "/v1/partners/{uid}": {"operational_events": True},
        "/v1/partners/{uid}/keys": {"name": "stolen"},
        "/v1/partners/{uid}/endpoints": {"url": "http://127.0.0.1:9/sneaky"},
        "/v1/partners/{uid}/endpoints/{endpoint_id}": {"description": "mine now"},
        "/v1/partners/{uid}/events": order(),
        "/v1/dead-letters/resend": {"ids": [b["letter_id"]]},
        "/v1/sources": {"name": "sneaky", "scheme": "github", "secret": "s" * 32},
        "/v1/sources/{name}/secrets": {"secret": "s" * 32},
        "/v1/partners/{uid}/endpoints/{endpoint_id}/ack": {"cursor": "ZjEuMC4w"},
        "/v1/partners/{uid}/endpoints/{endpoint_id}/recover": {"since": "2020-01-01T00:00:00Z"},
        "/v1/partners/{uid}/endpoints/{endpoint_id}/verify": {"challenge": "guessed"},
    }
    if method in ("post", "patch"):
        return bodies.get(template)
    return None


def _url(template: str, values: dict[str, str]) -> str:
    return re.sub(r"\{([a-z_]+)\}", lambda m: values[m.group(1)], template)


@pytest.fixture
def world(client, auth, runtime) -> dict[str, Any]:
    """Two partners with endpoints, events, deliveries, a dead letter, a resend job, keys,
    a source and an inbound event; A's key, and every identifier of B's."""
    make_event_type(client, auth)
    make_partner(client, auth, OWN)
    make_partner(client, auth, OTHER)
    own_endpoint = make_endpoint(client, auth, OWN, url="http://127.0.0.1:9/alpha-hook")
    other_endpoint = make_endpoint(client, auth, OTHER, url="http://127.0.0.1:9/bravo-hook")
    for uid in (OWN, OTHER):
        assert (
            client.post(f"/v1/partners/{uid}/events", headers=auth, json=order()).status_code == 202
        )
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, other_endpoint["id"])
        letter = make_dead_letter(
            session, endpoint, make_dl_event(session, endpoint.partner, type="order.created")
        )
        letter_id, dead_delivery = letter.id, letter.delivery_id
        own = session.get_one(Endpoint, own_endpoint["id"])
        make_dead_letter(session, own, make_dl_event(session, own.partner, type="order.created"))
    job = client.post(
        "/v1/dead-letters/resend", headers=auth, json={"filter": {"partner": OTHER}}
    ).get_json()
    other_key = client.post(
        f"/v1/partners/{OTHER}/keys", headers=auth, json={"name": "bravo-robot"}
    ).get_json()
    own_key = client.post(
        f"/v1/partners/{OWN}/keys", headers=auth, json={"name": "alpha-robot"}
    ).get_json()
    source = client.post(
        "/v1/sources",
        headers=auth,
        json={"name": "bravo-source", "scheme": "github", "secret": "g" * 32},
    ).get_json()
    with runtime.db.begin() as session:
        session.add(
            InboundEvent(
                source_id=source["id"],
                event_id="bravo-callback-1",
                resource_id="res-1",
                raw_body=b"{}",
                headers={},
            )
        )
    with runtime.db.begin() as session:
        inbound_id = session.scalars(select(InboundEvent.id)).one()
        other_event = session.scalars(
            select(Delivery.event_id).where(Delivery.endpoint_id == other_endpoint["id"])
        ).first()
    values = {
        "uid": OTHER,
        "endpoint_id": other_endpoint["id"],
        "event_id": other_event,
        "delivery_id": dead_delivery,
        "letter_id": letter_id,
        "job_id": job["job_id"],
        "key_id": other_key["id"],
        "name": "bravo-source",
        "resource_id": "res-1",
        "version": "1",
        "source": "bravo-source",
        "own": OWN,
    }
    secrets = [other_key["key"]]
    return {
        "values": values,
        "own_key": own_key["key"],
        "own_endpoint": own_endpoint,
        "inbound_id": inbound_id,
        "marks": [
            OTHER,
            "bravo-hook",
            "bravo-robot",
            "bravo-source",
            "bravo-callback",
            other_endpoint["id"],
            other_event,
            dead_delivery,
            letter_id,
            job["job_id"],
            other_key["id"],
            *secrets,
        ],
    }


def _call(client: Any, method: str, url: str, key: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {key}"}
    if body is None:
        return client.open(url, method=method.upper(), headers=headers)
    return client.open(url, method=method.upper(), headers=headers, json=body)


def _leaks(text: str, marks: list[str]) -> list[str]:
    return [mark for mark in marks if mark and mark in text]


GHOSTS = {
    "uid": "zulu-corp",
    "endpoint_id": "ep_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "event_id": "evt_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "delivery_id": "dlv_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "letter_id": "dl_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "job_id": "bop_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "key_id": "key_01ZZZZZZZZZZZZZZZZZZZZZZZZ",
    "name": "zulu-source",
    "source": "zulu-source",
    "resource_id": "res-1",
    "version": "1",
    "own": OWN,
}
_JOB_ID = re.compile(r"bop_[0-9A-Z]{26}")


def _values_for(template: str, values: dict[str, str], inbound_id: str) -> dict[str, str]:
    chosen = dict(values)
    if template.startswith("/v1/event-types"):
        chosen["name"] = "order.created"  # the catalog is shared; the name is not B's
    if template.startswith("/v1/inbound-events/"):
        chosen["event_id"] = inbound_id
    return chosen


def _as_if_absent(text: str, real: dict[str, str], ghost: dict[str, str]) -> str:
    """B's answer with B's identifiers swapped for ones that exist nowhere: a refusal that
    does not leak reads exactly like the answer about something that does not exist."""
    for key, value in real.items():
        if key in ghost and value and value != ghost[key]:
            text = text.replace(value, ghost[key])
    return _JOB_ID.sub("bop_X", text)


def test_the_table_names_every_documented_route():
    documented = {
        (method, path) for path, methods in document()["paths"].items() for method in methods
    }
    assert documented - NO_KEY == set(TABLE), (
        f"decide what a partner key gets: {sorted(documented - NO_KEY - set(TABLE))}; "
        f"no longer documented: {sorted(set(TABLE) - documented)}"
    )


def test_a_partner_key_reaches_nothing_of_another_partner(client, world, runtime):
    failures = []
    key = world["own_key"]
    calls = [(m, t, e, None) for (m, t), e in sorted(TABLE.items())]
    calls += [(m, t, e, "query") for m, t, e in NAMED_IN_QUERY]
    for method, template, expected, _kind in calls:
        real = _values_for(template, world["values"], world["inbound_id"])
        ghost = _values_for(template, GHOSTS, GHOSTS["event_id"])
        url = _url(template, real)
        body = _body(method, template, real)
        response = _call(client, method, url, key, body)
        text = response.get_data(as_text=True)
        if response.status_code != expected:
            failures.append(
                f"{method.upper()} {url}: {response.status_code}, expected {expected}: {text[:200]}"
            )
        if response.status_code == 403:
            failures.append(f"{method.upper()} {url}: 403 confirms the resource exists")
        # The same call about things that do not exist must answer the same, byte for byte.
        absent = _call(client, method, _url(template, ghost), key, _body(method, template, ghost))
        if (absent.status_code, _JOB_ID.sub("bop_X", absent.get_data(as_text=True))) != (
            response.status_code,
            _as_if_absent(text, real, ghost),
        ):
            failures.append(
                f"{method.upper()} {url} answers unlike a missing resource: "
                f"{text[:200]} vs {absent.get_data(as_text=True)[:200]}"
            )
        if not _leaks(url + json.dumps(body), world["marks"]):
            # The call named nothing of B's: nothing of B's may come back at all.
            leaked = _leaks(text, world["marks"])
            if leaked:
                failures.append(f"{method.upper()} {url} leaks {leaked}")
        if expected == NOT_FOUND and response.status_code == NOT_FOUND:
            assert response.get_json()["error"]["code"] == "not_found", url
    assert not failures, "\n".join(failures)
    # Nothing of B's changed behind the answers.
    with runtime.db.begin() as session:
        letter = session.get_one(DeadLetter, world["values"]["letter_id"])
        assert letter.state == "open"
        endpoint = session.get_one(Endpoint, world["values"]["endpoint_id"])
        assert endpoint.deleted_at is None and endpoint.description is None
        assert len(endpoint.secrets) == 1
        changed = session.scalars(
            select(AuditRecord.action).where(AuditRecord.actor == "key:alpha-robot")
        ).all()
        assert changed == []


def test_the_lists_show_a_partner_key_its_own_rows(client, world):
    key = world["own_key"]
    for url in (
        "/v1/partners",
        "/v1/deliveries",
        "/v1/dead-letters",
        f"/v1/partners/{OWN}/endpoints",
        f"/v1/partners/{OWN}/events",
    ):
        data = _call(client, "get", url, key, None).get_json()["data"]
        assert data, url
        assert OTHER not in json.dumps(data), url
    me = _call(client, "get", "/v1/me", key, None).get_json()
    assert me["partner"] == OWN and sorted(me["scopes"]) == ["dlq:write", "endpoints:write", "read"]
    # And it can do its own partner's work: change, test, read the secret, make a portal link.
    endpoint = world["own_endpoint"]["id"]
    base = f"/v1/partners/{OWN}/endpoints/{endpoint}"
    assert _call(client, "patch", base, key, {"description": "ours"}).status_code == 200
    assert _call(client, "post", f"{base}/test", key, None).status_code == 202
    assert _call(client, "get", f"{base}/secret", key, None).status_code == 200
    assert _call(client, "post", f"/v1/partners/{OWN}/portal-links", key, None).status_code == 201
    # ...but its links live an hour at most (a revoked key's unused links die with it).
    hour = _call(client, "post", f"/v1/partners/{OWN}/portal-links", key, {"expires_in_s": 3600})
    assert hour.status_code == 201
    day = _call(client, "post", f"/v1/partners/{OWN}/portal-links", key, {"expires_in_s": 86400})
    assert day.status_code == 422 and day.get_json()["error"]["details"]["max"] == 3600


def test_a_partner_key_never_publishes_nor_manages_contracts_sources_or_keys(client, world):
    for method, template in NEVER_EVEN_OWN:
        url = _url(template, world["values"])
        body = _body(method, template.replace("{own}", "{uid}"), world["values"])
        response = _call(client, method, url, world["own_key"], body)
        assert response.status_code == NOT_FOUND, (method, url, response.get_json())
