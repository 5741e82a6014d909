"""Archive before purge on both databases, with an injected clock: with KURIR_ARCHIVE_DIR set
every row retention deletes is first written to a day file with a manifest, `kurir archive
restore` brings the rows back exactly (and only once), a tampered file is refused, nothing
is written without the setting, and a write that fails keeps the rows."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from sqlalchemy import func, select

from app.cli import cli
from app.clock import utcnow
from app.config import load_settings
from app.feed.sequencer import sequence
from app.ids import id_at
from app.lifecycle import archive, purge
from app.models import (
    DEAD,
    DL_DISCARDED,
    SUCCEEDED,
    AuditRecord,
    EventVersion,
    InboundEvent,
    InboundSource,
    OperationalEvent,
    ReconcileRequest,
    ResendJob,
)
from app.runtime import Runtime
from tests.integration.test_lifecycle import DAY, History, _audit_rows, _quiet

# Every table a retention run deletes from.
PURGED_TABLES = (
    "events",
    "event_versions",
    "deliveries",
    "attempts",
    "dead_letters",
    "dead_letter_audit",
    "bulk_operations",
    "inbound_events",
    "reconcile_requests",
    "audit_records",
    "operational_events",
)


def _archiving(runtime: Runtime, directory: Path) -> Runtime:
    """The same database, with KURIR_ARCHIVE_DIR set."""
    return Runtime(replace(runtime.settings, archive_dir=directory), database=runtime.db)


def _run(runtime: Runtime, now: datetime) -> purge.Report:
    return purge.run(runtime, now=now, sleep=_quiet)


def _snapshot(runtime: Runtime) -> dict[str, dict[str, dict[str, Any]]]:
    """Every row of every purged table, by key, every column as the database returns it."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    with runtime.db.begin() as session:
        for name in PURGED_TABLES:
            table = archive.table_of(name)
            rows = archive.select_rows(session, table, True)
            found[name] = {
                archive.key_of(table, row): row
                for row in rows
                if row.get("action") != "archive.restore"  # the restore's own audit
            }
    return found


def _env(runtime: Runtime) -> dict[str, str]:
    settings = runtime.settings
    return {
        "DATABASE_URL": str(settings.database_url),
        "REDIS_URL": str(settings.redis_url),
        "KURIR_DATA_DIR": str(settings.data_dir),
        "KURIR_SECRET_KEY": str(settings.secret_key),
    }


def _history(runtime: Runtime, t0: datetime, now: datetime) -> None:
    """Finished history of every purged kind (bytes, JSON and nulls among it), and a young
    event that stays (it holds the feed's head)."""
    with runtime.db.begin() as session:
        h = History(session)
        push = h.endpoint()
        event_id, delivery_id = h.story(push, SUCCEEDED, t0)
        session.add(
            EventVersion(event_id=event_id, version=2, data={"v": [1, 2]}, payload="{}", source="x")
        )
        h.story(push, DEAD, t0 - 40 * DAY, letter=DL_DISCARDED, resolved_at=t0 - 40 * DAY)
        attempt = h.attempt(h.delivery(h.event(t0), push, SUCCEEDED, t0), t0, n=1)
        attempt.response_body = b"\x00\xffnot utf-8"
        attempt.response_status = 200
        attempt.request_headers = {"webhook-id": "x", "n": [1, None, "é"]}
        attempt.response_headers = {"content-type": "text/plain"}
        source = InboundSource(name="psp", scheme="standard")
        session.add(source)
        session.flush()
        session.add(
            InboundEvent(
                id=id_at("ine", t0),
                source_id=source.id,
                event_id="in-1",
                status="applied",
                raw_body=b'{"a": 1}\n',
                headers={"x-sig": "abc"},
                received_at=t0,
                updated_at=t0,
            )
        )
        session.add(
            ReconcileRequest(
                id=id_at("rcn", t0), source_id=source.id, state="done", created_at=t0, updated_at=t0
            )
        )
        session.add(
            ResendJob(
                id=id_at("bop", t0 - 40 * DAY),
                kind="resend",
                actor="ops",
                params={"all": True},
                state="succeeded",
                finished_at=t0 - 40 * DAY,
                created_at=t0 - 40 * DAY,
            )
        )
        session.add(
            OperationalEvent(
                id=id_at("ope", t0 - 310 * DAY),
                kind="x",
                data={"k": 1},
                created_at=t0 - 310 * DAY,
            )
        )
        h.story(push, SUCCEEDED, now - DAY)
    _audit_rows(runtime, 2, t0 - 310 * DAY)
    sequence(runtime.db)


def test_purged_rows_are_archived_first_and_restored_exactly_once(runtime, tmp_path):
    t0 = utcnow()
    now = t0 + 60 * DAY
    _history(runtime, t0, now)
    before = _snapshot(runtime)
    directory = tmp_path / "archive"

    report = _run(_archiving(runtime, directory), now)

    assert report.archive_error is None
    # On PostgreSQL the deliveries' and attempts' days go whole, archived all the same.
    dropped = any(b.source.startswith("drop:") and b.purged for b in report.batches)
    assert dropped == runtime.db.is_postgres
    after = _snapshot(runtime)
    gone = {name: set(before[name]) - set(after[name]) for name in PURGED_TABLES}
    assert all(gone.values()), gone  # every table lost rows, so every table is archived
    for name in PURGED_TABLES:
        files = sorted((directory / name).glob("*.jsonl.gz"))
        assert files, name
        archived: set[str] = set()
        for data_file in files:
            manifest = archive.Manifest.load(archive.manifest_path(data_file))
            raw = data_file.read_bytes()
            assert manifest.sha256 == hashlib.sha256(raw).hexdigest()
            assert manifest.bytes == len(raw)
            keys = [archive.key_of(archive.table_of(name), row) for row in archive.read(data_file)]
            assert manifest.rows == len(keys)
            assert (manifest.first_id, manifest.last_id) == (min(keys), max(keys))
            archived |= set(keys)
        assert archived == gone[name], name
    # A row's file is its creation day.
    event_files = {p.name for p in (directory / "events").glob("*.jsonl.gz")}
    assert f"{t0.date().isoformat()}.jsonl.gz" in event_files
    assert f"{(t0 - 40 * DAY).date().isoformat()}.jsonl.gz" in event_files

    every_file = sorted(directory.glob("*/*.jsonl.gz"), reverse=True)  # children first
    result = CliRunner().invoke(
        cli, ["archive", "restore", *map(str, every_file)], env=_env(runtime)
    )
    assert result.exit_code == 0, result.output
    total = sum(len(keys) for keys in gone.values())
    assert f"{total} row(s) restored, 0 skipped" in result.output
    assert _snapshot(runtime) == before
    with runtime.db.begin() as session:
        audited = session.scalars(
            select(AuditRecord.subject_id).where(AuditRecord.action == "archive.restore")
        ).all()
    assert sorted(set(audited)) == sorted(PURGED_TABLES)

    again = CliRunner().invoke(
        cli, ["archive", "restore", *map(str, every_file)], env=_env(runtime)
    )
    assert again.exit_code == 0, again.output
    assert f"0 row(s) restored, {total} skipped" in again.output
    assert _snapshot(runtime) == before

    listed = CliRunner().invoke(
        cli, ["archive", "list", "--verify", "--dir", str(directory)], env=_env(runtime)
    )
    assert listed.exit_code == 0, listed.output
    assert "attempts" in listed.output and "inbound_events" in listed.output


def test_later_batches_append_to_the_same_day_file_as_new_gzip_members(runtime, tmp_path):
    t0 = utcnow()
    directory = tmp_path / "archive"
    _audit_rows(runtime, 3, t0)
    _run(_archiving(runtime, directory), t0 + 400 * DAY)
    _audit_rows(runtime, 2, t0)
    _run(_archiving(runtime, directory), t0 + 400 * DAY)

    (data_file,) = (directory / "audit_records").glob("*.jsonl.gz")
    manifest = archive.verify(data_file)
    assert manifest.rows == 5 == len(list(archive.read(data_file)))
    assert data_file.read_bytes().count(b"\x1f\x8b\x08") >= 2  # two gzip members


def test_a_tampered_file_is_refused_and_not_appended_to(runtime, tmp_path):
    t0 = utcnow()
    directory = tmp_path / "archive"
    _audit_rows(runtime, 3, t0)
    _run(_archiving(runtime, directory), t0 + 400 * DAY)
    (data_file,) = (directory / "audit_records").glob("*.jsonl.gz")
    raw = bytearray(data_file.read_bytes())
    raw[20] ^= 0xFF
    data_file.write_bytes(bytes(raw))

    result = CliRunner().invoke(cli, ["archive", "restore", str(data_file)], env=_env(runtime))
    assert result.exit_code == 1
    assert "checksum mismatch" in result.output
    with runtime.db.begin() as session:
        assert session.scalar(select(func.count()).select_from(AuditRecord)) == 0

    # Retention will not bless the changed file with a new checksum: the rows stay.
    _audit_rows(runtime, 2, t0)
    report = _run(_archiving(runtime, directory), t0 + 400 * DAY)
    assert report.archive_error is not None and "sha256" in report.archive_error
    with runtime.db.begin() as session:
        assert session.scalar(select(func.count()).select_from(AuditRecord)) == 2


def test_nothing_is_archived_without_the_setting(runtime, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_settings({}).archive_dir is None
    assert load_settings({"KURIR_ARCHIVE_DIR": "/srv/a"}).archive_dir == Path("/srv/a")
    assert runtime.settings.archive_dir is None
    t0 = utcnow()
    _audit_rows(runtime, 3, t0)

    report = _run(runtime, t0 + 400 * DAY)

    assert report.total == 3 and report.archive_error is None
    assert not list(tmp_path.rglob("*.jsonl.gz"))
    assert not list(tmp_path.rglob("*.manifest.json"))


def test_an_archive_that_cannot_be_written_keeps_the_rows_and_says_so(runtime, tmp_path, caplog):
    t0 = utcnow()
    _audit_rows(runtime, 3, t0)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # a file where the archive's folder should be: unwritable, even as root

    with caplog.at_level(logging.ERROR, logger="app.lifecycle.purge"):
        report = _run(_archiving(runtime, blocker / "archive"), t0 + 400 * DAY)

    assert report.archive_error is not None and "audit_records" in report.archive_error
    assert report.total == 0
    assert any("archive could not be written" in r.getMessage() for r in caplog.records)
    with runtime.db.begin() as session:
        assert session.scalar(select(func.count()).select_from(AuditRecord)) == 3

    # Once the archive can be written, the same rows are archived and purged.
    report = _run(_archiving(runtime, tmp_path / "archive"), t0 + 400 * DAY)
    assert report.archive_error is None and report.total == 3
    (data_file,) = (tmp_path / "archive" / "audit_records").glob("*.jsonl.gz")
    assert archive.verify(data_file).rows == 3
