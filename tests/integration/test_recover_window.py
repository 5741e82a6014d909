"""Recover since T: `POST …/endpoints/{id}/recover {since, until?}` resends once, in publish
order, what of the endpoint did not succeed in the window, as one operation."""

from __future__ import annotations

from datetime import timedelta

from app.clock import isoformat, utcnow
from app.models import RETRYING, SUCCEEDED, Delivery
from app.vocabulary import DeadLetterReason
from sender.park import park
from tests.support.factories import (
    Receiver,
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)


def _scene(runtime, url: str):
    """Events published one second apart: what became of each one's delivery, and the
    start of the window (after the first, `old`)."""
    base = utcnow() - timedelta(minutes=10)
    with runtime.db.begin() as session:
        partner = make_partner(session, "acme")
        make_partner(session, "other")
        endpoint = make_endpoint(session, partner, url, runtime.secret_box)
        ids = {}
        for i, fate in enumerate(("old", "ok", "dead", "retrying", "dead2", "discarded")):
            event, [delivery] = make_event_with_deliveries(session, partner, [endpoint])
            event.created_at = base + timedelta(seconds=i)
            ids[fate] = event.id
            if fate == "ok":
                delivery.state = SUCCEEDED
            elif fate == "retrying":
                delivery.state = RETRYING
                delivery.next_attempt_at = utcnow() + timedelta(days=1)
            else:
                letter = park(
                    session, delivery, event, endpoint, DeadLetterReason.RETRIES_EXHAUSTED
                )
                if fate == "discarded":
                    letter.state = "discarded"
        return endpoint.id, ids, base + timedelta(seconds=1)


def _operation(client, headers, job_id: str) -> dict:
    return client.get(f"/v1/operations/{job_id}", headers=headers).get_json()


def test_recover_resends_what_failed_in_the_window_in_order_once(client, auth, runtime):
    with Receiver() as receiver:
        endpoint_id, ids, since = _scene(runtime, receiver.url + "/h")
        url = f"/v1/partners/acme/endpoints/{endpoint_id}/recover"
        own = client.post("/v1/partners/acme/keys", headers=auth, json={"name": "acme-robot"})
        own_key = {"Authorization": f"Bearer {own.get_json()['key']}"}
        other = client.post("/v1/partners/other/keys", headers=auth, json={"name": "o-robot"})
        other_key = {"Authorization": f"Bearer {other.get_json()['key']}"}
        assert (
            client.post(url, headers=other_key, json={"since": isoformat(since)}).status_code == 404
        )
        bad = client.post(url, headers=auth, json={"since": "yesterday"})
        assert bad.status_code == 422 and bad.get_json()["error"]["details"]["field"] == "since"
        reversed_ = {"since": isoformat(since), "until": isoformat(since - timedelta(1))}
        assert client.post(url, headers=auth, json=reversed_).status_code == 422
        started = client.post(url, headers=own_key, json={"since": isoformat(since)})
        assert started.status_code == 202, started.get_json()
        operation = started.get_json()["operation"]
        assert operation["total"] == 3 and operation["ordered"] is True
        assert operation["purpose"] == "recover_window"
        with WorkerThread(runtime):
            wait_for(
                lambda: _operation(client, own_key, operation["id"])["state"] == "succeeded",
                message="the operation ends",
            )
            wait_for(lambda: len(receiver.on("/h")) == 3, message="three resent")
            wait_for(lambda: _states(runtime) == {SUCCEEDED}, message="all recorded")
            # Once more over the same window: everything in it has succeeded since.
            again = client.post(url, headers=auth, json={"since": isoformat(since)})
            assert again.status_code == 202 and again.get_json()["operation"]["total"] == 0
            done = again.get_json()["operation"]["id"]
            wait_for(lambda: _operation(client, auth, done)["state"] == "succeeded")
        assert receiver.event_ids("/h") == [ids["dead"], ids["retrying"], ids["dead2"]]
        # The other partner's key does not read acme's operation.
        assert client.get(f"/v1/operations/{operation['id']}", headers=other_key).status_code == 404
        progress = _operation(client, own_key, operation["id"])
        assert (progress["done"], progress["failed"]) == (3, 0)


def _states(runtime) -> set[str]:
    from sqlalchemy import select

    with runtime.db.begin() as session:
        rows = session.scalars(select(Delivery.state)).all()
    # The discarded and the old one stay dead: they are outside what a recover resends.
    return set(rows) - {"dead"}


def test_recover_refuses_a_disabled_endpoint(client, auth, runtime):
    endpoint_id, _, since = _scene(runtime, "http://127.0.0.1:9/h")
    client.post(f"/v1/partners/acme/endpoints/{endpoint_id}/disable", headers=auth)
    refused = client.post(
        f"/v1/partners/acme/endpoints/{endpoint_id}/recover",
        headers=auth,
        json={"since": isoformat(since)},
    )
    assert refused.status_code == 409
    assert refused.get_json()["error"]["code"] == "endpoint_disabled"


def test_kurir_endpoints_recover_starts_the_operation(settings, runtime):
    from click.testing import CliRunner
    from rq import Queue
    from sqlalchemy import select

    from app.cli import cli
    from app.models import AuditRecord, ResendJob
    from app.queues import DEFAULT

    endpoint_id, _, since = _scene(runtime, "http://127.0.0.1:9/h")
    env = {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }
    runner = CliRunner()
    bad = runner.invoke(cli, ["endpoints", "recover", endpoint_id, "--since", "soon"], env=env)
    assert bad.exit_code == 2 and "since" in bad.output
    result = runner.invoke(
        cli, ["endpoints", "recover", endpoint_id, "--since", isoformat(since)], env=env
    )
    assert result.exit_code == 0, result.output
    assert "3 to resend" in result.output
    with runtime.db.begin() as session:
        job = session.scalars(select(ResendJob)).one()
        assert job.params["purpose"] == "recover_window" and job.total == 3
        assert session.scalars(
            select(AuditRecord.action).where(AuditRecord.subject_id == endpoint_id)
        ).all() == ["endpoint.recover_started"]
    assert f"bulk-{job.id}" in Queue(DEFAULT, connection=runtime.redis).job_ids
