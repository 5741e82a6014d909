"""`kurir dlq ls | resend | discard` against the real stores."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from rq import Queue
from sqlalchemy import select

from app.cli import cli
from app.clock import utcnow
from app.models import DeadLetter, DeadLetterAudit, Endpoint, ResendJob
from app.queues import DELIVERIES
from tests.support.dlq_factories import letters_for, make_scene


@pytest.fixture
def run(settings):
    env = {
        "DATABASE_URL": settings.database_url,
        "REDIS_URL": settings.redis_url,
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": settings.secret_key,
    }

    def invoke(*args: str):
        return CliRunner().invoke(cli, ["dlq", *args], env=env)

    return invoke


@pytest.fixture
def letters(runtime):
    with runtime.db.begin() as session:
        acme = make_scene(session, runtime.secret_box, uid="acme")
        off = make_scene(session, runtime.secret_box, uid="initech", state="disabled")
        a = letters_for(session, acme, 3, data=lambda i: {"city": ["Oslo", "Lima", "Oslo"][i]})
        b = letters_for(
            session, off, 2, status_code=None, error="timeout", reason="endpoint_disabled"
        )
    return a, b


def test_ls_lists_and_filters(run, letters):
    a, b = letters
    result = run("ls")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["ID", "CREATED", "PARTNER"]
    assert len(lines) == 6
    oslo = run("ls", "--q", "oslo", "--partner", "acme", "--json")
    assert sorted(json.loads(line)["id"] for line in oslo.output.splitlines()) == sorted(
        [a[0], a[2]]
    )
    none = run("ls", "--status-code", "none", "--json")
    assert sorted(json.loads(line)["id"] for line in none.output.splitlines()) == sorted(b)
    paged = run("ls", "--limit", "2")
    assert "more: --cursor" in paged.output
    assert "no dead letters match this filter" in run("ls", "--type", "nope").output
    bad = run("ls", "--since", "last tuesday")
    assert bad.exit_code == 2 and "since" in bad.output


def test_resend_by_filter_shows_progress_and_reports_skips(run, runtime, letters, redis_client):
    a, b = letters
    result = run("resend", "--status-code", "none", "--actor", "ops@example.com")
    assert result.exit_code == 0, result.output
    assert "resent 0 of 2" in result.output
    assert "endpoint_disabled 2" in result.output and "--force" in result.output
    result = run("resend", "--partner", "acme")
    assert "resending" in result.output  # the progress bar
    assert "resent 3 of 3" in result.output
    with runtime.db.begin() as session:
        states = dict(session.execute(select(DeadLetter.id, DeadLetter.state)).all())
        actors = set(
            session.scalars(select(DeadLetterAudit.actor).where(DeadLetterAudit.action == "resend"))
        )
    assert {states[i] for i in a} == {"resent"} and {states[i] for i in b} == {"open"}
    assert "cli:ops@example.com" in actors and any(x.startswith("cli:") for x in actors)
    assert len(Queue(DELIVERIES, connection=redis_client).get_jobs()) == 1


def test_resend_by_id_with_force_and_refusals(run, letters):
    _, b = letters
    assert run("resend").exit_code == 2  # nothing selected
    assert run("resend", "--id", b[0], "--partner", "x").exit_code == 2
    result = run("resend", "--id", b[0], "--id", b[1], "--force")
    assert result.exit_code == 0, result.output
    assert "resent 2 of 2" in result.output, result.output
    assert f"resent {b[0]}" in result.output and f"resent {b[1]}" in result.output


def test_resend_by_id_exits_1_naming_each_id_not_resent(run, runtime, letters):
    a, b = letters
    result = run("resend", "--id", a[0], "--id", "dl_nope", "--id", b[0])
    assert result.exit_code == 1, result.output
    assert f"resent {a[0]}" in result.output
    assert "kurir: dl_nope: not resent: not_found" in result.output
    assert f"kurir: {b[0]}: not resent: endpoint_disabled" in result.output
    assert "resent 1 of 3" in result.output
    assert "endpoint_disabled 1, not_found 1" in result.output and "--force" in result.output
    again = run("resend", "--id", a[0])
    assert again.exit_code == 1
    assert f"{a[0]}: not resent: dead_letter_not_open" in again.output
    with runtime.db.begin() as session:
        states = dict(session.execute(select(DeadLetter.id, DeadLetter.state)).all())
        session.get_one(
            Endpoint, session.get_one(DeadLetter, a[1]).endpoint_id
        ).deleted_at = utcnow()
    assert (states[a[0]], states[b[0]]) == ("resent", "open")
    gone = run("resend", "--id", a[1], "--force")
    assert gone.exit_code == 1 and "not resent: endpoint_deleted" in gone.output
    assert run("resend", "--id", " ").exit_code == 2


def test_resend_by_id_records_a_finished_job(run, runtime, letters):
    a, _ = letters
    result = run("resend", "--id", a[0], "--id", a[1])
    assert result.exit_code == 0, result.output
    job_id = result.output.split("(job ")[1].split(")")[0]
    with runtime.db.begin() as session:
        job = session.get_one(ResendJob, job_id)
        assert (job.state, job.total, job.done, job.failed) == ("succeeded", 2, 2, 0)


def test_discard_with_a_note(run, runtime, letters):
    a, _ = letters
    result = run("discard", "--id", a[0], "--note", "sent by hand")
    assert result.exit_code == 0 and f"discarded {a[0]}" in result.output
    with runtime.db.begin() as session:
        letter = session.get_one(DeadLetter, a[0])
        assert (letter.state, letter.note) == ("discarded", "sent by hand")
    again = run("discard", "--id", a[0])
    assert again.exit_code == 1
