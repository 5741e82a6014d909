"""The archive writer without a database: rows round-trip through a line, batches append
gzip members to one day file, a failed write leaves nothing behind, and a file is checked
against its manifest before it is appended to or restored."""

from __future__ import annotations

import gzip
import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.ids import id_at
from app.lifecycle import archive

T0 = datetime(2026, 3, 1, 23, 59, 59, 123456, tzinfo=UTC)


def _audit(at: datetime, n: int = 0) -> dict[str, object]:
    return {
        "id": id_at("aud", at),
        "actor": "cli",
        "actor_partner_id": None,
        "action": "x",
        "subject_type": "x",
        "subject_id": str(n),
        "partner_id": None,
        "details": {"n": n, "list": [1, None, "é"]},
        "created_at": at,
    }


def test_a_row_round_trips_through_its_line():
    table = archive.table_of("attempts")
    columns = archive.encodings(table)
    row = {
        "id": id_at("att", T0),
        "delivery_id": "dlv_x",
        "n": 3,
        "started_at": T0,
        "duration_ms": 12,
        "url": "https://example.com/hook",
        "request_headers": {"webhook-id": "msg_1"},
        "response_status": None,
        "response_body": b"\x00\xff\xfe",
        "response_headers": None,
        "error": "timeout",
        "created_at": T0,
    }
    line = archive.encode(columns, row)
    assert line["created_at"] == "2026-03-01T23:59:59.123456Z"
    assert line["response_body"] == "AP/+"
    assert archive.decode(columns, line) == row
    with pytest.raises(archive.ArchiveError, match="not in the table"):
        archive.decode(columns, {**line, "gone": 1})


def test_a_table_without_a_time_column_is_dated_by_its_key():
    table = archive.table_of("event_versions")
    row = {"event_id": id_at("evt", T0), "version": 2, "data": {}, "payload": "{}", "source": "x"}
    assert archive.day_of(table, row) == "2026-03-01"
    assert archive.key_of(table, row) == f"{row['event_id']}/2"


def test_batches_append_gzip_members_to_one_day_file_with_its_manifest(tmp_path: Path):
    writer = archive.Writer(tmp_path)
    writer.write("audit_records", [_audit(T0, 1), _audit(T0, 2)])
    # Another writer (the next run) reads the file once and goes on appending.
    archive.write(
        tmp_path, "audit_records", [_audit(T0, 3), _audit(T0 + timedelta(milliseconds=500), 4)]
    )

    data_file = tmp_path / "audit_records" / "2026-03-01.jsonl.gz"
    manifest = archive.verify(data_file)
    raw = data_file.read_bytes()
    assert manifest.sha256 == hashlib.sha256(raw).hexdigest() and manifest.bytes == len(raw)
    assert manifest.rows == 4
    rows = list(archive.read(data_file))
    assert [r["subject_id"] for r in rows] == ["1", "2", "3", "4"]
    assert (manifest.first_id, manifest.last_id) == (
        min(r["id"] for r in rows),
        max(r["id"] for r in rows),
    )
    assert manifest.columns["created_at"] == "datetime"
    assert manifest.columns["details"] == "json"
    # `zcat` reads it as one stream.
    assert gzip.decompress(raw).count(b"\n") == 4
    # A second later is the next day: its own file.
    archive.write(tmp_path, "audit_records", [_audit(T0 + timedelta(seconds=1), 5)])
    assert archive.verify(tmp_path / "audit_records" / "2026-03-02.jsonl.gz").rows == 1


def test_a_failed_write_leaves_every_file_as_it_was(tmp_path: Path):
    archive.write(tmp_path, "audit_records", [_audit(T0)])
    data_file = tmp_path / "audit_records" / "2026-03-01.jsonl.gz"
    before = (data_file.read_bytes(), archive.manifest_path(data_file).read_text())
    (tmp_path / "operational_events").write_text("")  # where that table's folder should be

    with pytest.raises(archive.ArchiveError, match="cannot write the archive"):
        archive.Writer(tmp_path).write_batch(
            {
                "audit_records": [_audit(T0, 2)],
                "operational_events": [{"id": id_at("ope", T0), "kind": "x", "created_at": T0}],
            }
        )

    assert (data_file.read_bytes(), archive.manifest_path(data_file).read_text()) == before
    assert archive.verify(data_file).rows == 1


def test_an_interrupted_tail_is_cut_off_but_a_changed_file_is_refused(tmp_path: Path):
    archive.write(tmp_path, "audit_records", [_audit(T0)])
    data_file = tmp_path / "audit_records" / "2026-03-01.jsonl.gz"
    with data_file.open("ab") as handle:  # a member written, its manifest never replaced
        handle.write(gzip.compress(b'{"id": "aud_never"}\n'))

    archive.write(tmp_path, "audit_records", [_audit(T0, 2)])
    assert [r["subject_id"] for r in archive.read(data_file)] == ["0", "2"]

    raw = bytearray(data_file.read_bytes())
    raw[-9] ^= 0x01
    data_file.write_bytes(bytes(raw))
    with pytest.raises(archive.ArchiveError, match="checksum mismatch"):
        archive.verify(data_file)
    with pytest.raises(archive.ArchiveError, match="sha256"):
        archive.write(tmp_path, "audit_records", [_audit(T0, 3)])
    assert data_file.read_bytes() == bytes(raw)


def test_two_writers_on_one_archive_keep_its_manifests_true(tmp_path: Path):
    """The purge and a partition drop may both write: neither trusts a stale checksum."""
    first, second = archive.Writer(tmp_path), archive.Writer(tmp_path)
    first.write("audit_records", [_audit(T0, 1)])
    second.write("audit_records", [_audit(T0, 2)])
    first.write("audit_records", [_audit(T0, 3)])

    data_file = tmp_path / "audit_records" / "2026-03-01.jsonl.gz"
    assert archive.verify(data_file).rows == 3
    assert [r["subject_id"] for r in archive.read(data_file)] == ["1", "2", "3"]
