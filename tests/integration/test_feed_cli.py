"""`kurir feed UID` against the real stores: envelopes on stdout, the cursor on stderr, and
--ack moving a pull endpoint's acknowledgement."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from app.cli import cli
from app.models import AuditRecord, Endpoint
from tests.support.publish import (
    make_endpoint,
    make_event_type,
    make_partner,
    old_event,
    order,
)


@pytest.fixture
def run(settings):
    env = {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }

    def invoke(*args: str):
        return CliRunner().invoke(cli, ["feed", *args], env=env)

    return invoke


def test_feed_prints_envelopes_and_acks_a_pull_endpoint(run, client, auth, runtime):
    make_event_type(client, auth)
    make_partner(client, auth, "acme")
    pull = make_endpoint(client, auth, url=None, mode="pull")
    for n in range(3):
        client.post("/v1/partners/acme/events", headers=auth, json=order(f"o-{n}"))

    result = run("acme", "--limit", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [json.loads(line)["data"]["order_id"] for line in lines] == ["o-0", "o-1", "o-2"]
    assert "next cursor: " in result.stderr

    acked = run("acme", "--endpoint", pull["id"], "--ack")
    assert acked.exit_code == 0, acked.output
    assert len(acked.stdout.splitlines()) == 3
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, pull["id"]).acked_at is not None
    again = run("acme", "--endpoint", pull["id"])
    assert again.exit_code == 0 and again.stdout == ""


def test_feed_refuses_a_bad_cursor_and_ack_without_endpoint(run, client, auth):
    make_partner(client, auth, "acme")
    bad = run("acme", "--after", "nope")
    assert bad.exit_code == 2 and "invalid_cursor" in bad.stderr
    assert run("acme", "--ack").exit_code == 2
    assert run("ghost").exit_code == 2


def test_feed_says_backlog_expired_and_skips_it_on_request(run, client, auth, runtime):
    make_event_type(client, auth)
    make_partner(client, auth, "acme")
    pull = make_endpoint(client, auth, url=None, mode="pull")
    old_event(runtime, "acme", "o-old", timedelta(days=runtime.settings.retain_events_days + 1))
    client.post("/v1/partners/acme/events", headers=auth, json=order("o-new"))
    refused = run("acme", "--endpoint", pull["id"])
    assert refused.exit_code == 2 and "backlog_expired" in refused.stderr
    skipped = run("acme", "--endpoint", pull["id"], "--skip-expired")
    assert skipped.exit_code == 0, skipped.output
    assert "skipped 1 event(s) past retention" in skipped.stderr
    assert [json.loads(line)["data"]["order_id"] for line in skipped.stdout.splitlines()] == [
        "o-new"
    ]
    with runtime.db.begin() as session:
        actors = session.scalars(
            select(AuditRecord.actor).where(AuditRecord.action == "endpoint.backlog_skipped")
        ).all()
        assert len(actors) == 1 and actors[0].startswith("cli")
    assert run("acme", "--skip-expired").exit_code == 2  # needs --endpoint
