"""`kurir partners ls|show` and `kurir endpoints ls|show|enable|disable|blocked-keys` against
the configured database, with what they change seen through the API."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from app.cli import cli
from app.models import AuditRecord
from tests.support.publish import blocked_endpoint, make_endpoint, make_event_type, make_partner


@pytest.fixture
def run(settings):
    env = {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }

    def invoke(*args: str):
        return CliRunner().invoke(cli, list(args), env=env)

    return invoke


@pytest.fixture
def scene(client, auth):
    make_event_type(client, auth, "order.created")
    make_partner(client, auth, "acme")
    make_partner(client, auth, "globex")
    hook = make_endpoint(
        client, auth, "acme", url="http://127.0.0.1:9/acme", filter="data.amount > `10`"
    )
    other = make_endpoint(client, auth, "globex", url="http://127.0.0.1:9/globex")
    return {"hook": hook["id"], "other": other["id"]}


def _lines(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


def test_partners_ls_and_show(run, scene):
    listed = run("partners", "ls")
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert lines[0].split() == ["UID", "NAME", "ID", "CREATED"]
    assert [line.split()[0] for line in lines[1:]] == ["globex", "acme"]  # newest first
    assert [p["uid"] for p in _lines(run("partners", "ls", "--json"))] == ["globex", "acme"]
    paged = run("partners", "ls", "--limit", "1")
    assert "more: --cursor" in paged.output
    shown = run("partners", "show", "acme")
    assert (
        shown.exit_code == 0
        and scene["hook"] in shown.output
        and scene["other"] not in shown.output
    )
    [full] = _lines(run("partners", "show", "acme", "--json"))
    assert full["uid"] == "acme" and [e["id"] for e in full["endpoints"]] == [scene["hook"]]
    assert full["endpoints"][0]["filter"] == "data.amount > `10`"
    missing = run("partners", "show", "nobody")
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_endpoints_ls_and_show(run, scene, client, auth):
    everyone = _lines(run("endpoints", "ls", "--json"))
    assert {(e["id"], e["partner"]) for e in everyone} == {
        (scene["hook"], "acme"),
        (scene["other"], "globex"),
    }
    api = client.get(f"/v1/partners/acme/endpoints/{scene['hook']}", headers=auth).get_json()
    [acme] = _lines(run("endpoints", "ls", "--partner", "acme", "--json"))
    assert acme == api  # the API's shape, from the same services
    table = run("endpoints", "ls", "--partner", "globex").output.splitlines()
    assert table[0].split()[:3] == ["ID", "PARTNER", "STATE"] and scene["other"] in table[1]
    assert "no endpoints match" in run("endpoints", "ls", "--state", "disabled").output
    shown = run("endpoints", "show", scene["hook"])
    assert shown.exit_code == 0 and "data.amount > `10`" in shown.output
    [one] = _lines(run("endpoints", "show", scene["hook"], "--json"))
    assert one["id"] == scene["hook"] and one["deleted_at"] is None
    client.delete(f"/v1/partners/acme/endpoints/{scene['hook']}", headers=auth)
    [gone] = _lines(run("endpoints", "show", scene["hook"], "--json"))
    assert gone["deleted_at"] is not None and gone["state"] == "disabled"
    missing = run("endpoints", "show", "ep_nope")
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_endpoints_disable_and_enable_are_seen_by_the_api_and_audited(
    run, scene, client, auth, runtime
):
    url = f"/v1/partners/acme/endpoints/{scene['hook']}"
    off = run("endpoints", "disable", scene["hook"], "--reason", "maintenance", "--actor", "ops")
    assert off.exit_code == 0 and "disabled" in off.output
    state = client.get(url, headers=auth).get_json()
    assert (state["state"], state["disabled_reason"], state["disabled_by"]) == (
        "disabled",
        "maintenance",
        "operator",
    )
    assert "already disabled" in run("endpoints", "disable", scene["hook"]).output
    assert [e["id"] for e in _lines(run("endpoints", "ls", "--state", "disabled", "--json"))] == [
        scene["hook"]
    ]
    on = run("endpoints", "enable", scene["hook"], "--actor", "ops")
    assert on.exit_code == 0 and "enabled" in on.output
    assert client.get(url, headers=auth).get_json()["state"] == "enabled"
    with runtime.db.Session() as session:
        actors = session.execute(
            select(AuditRecord.action, AuditRecord.actor).where(
                AuditRecord.subject_id == scene["hook"],
                AuditRecord.action.in_(("endpoint.disabled", "endpoint.enabled")),
            )
        ).all()
    assert ("endpoint.disabled", "cli:ops") in actors and ("endpoint.enabled", "cli:ops") in actors
    bad = run("endpoints", "disable", scene["hook"], "--reason", "x" * 300)
    assert bad.exit_code == 1 and "reason" in bad.output
    missing = run("endpoints", "enable", "ep_nope")
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_endpoints_blocked_keys(run, client, auth):
    make_event_type(client, auth, "order.created")
    make_partner(client, auth, "acme")
    held = blocked_endpoint(client, auth, keys=("stock:1", "stock:2"))
    rows = _lines(run("endpoints", "blocked-keys", held["id"], "--json"))
    api = client.get(
        f"/v1/partners/acme/endpoints/{held['id']}/blocked-keys", headers=auth
    ).get_json()["data"]
    assert rows == api and {r["ordering_key"] for r in rows} == {"stock:1", "stock:2"}
    table = run("endpoints", "blocked-keys", held["id"], "--limit", "1")
    assert table.output.splitlines()[0].split()[:3] == ["KEY", "SEQ", "WAITING"]
    assert "more: --cursor" in table.output
    plain = make_endpoint(client, auth)
    assert "holds no ordering key" in run("endpoints", "blocked-keys", plain["id"]).output
