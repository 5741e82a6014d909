"""Archive before purge: the rows retention is about to delete, written first as gzip JSON
Lines, so purged history can still be read or restored (`KURIR_ARCHIVE_DIR`).

Layout: one file per table and creation day (UTC), and its manifest beside it::

    <dir>/<table>/<YYYY-MM-DD>.jsonl.gz
    <dir>/<table>/<YYYY-MM-DD>.manifest.json

Every write appends one gzip member to each day file it touches (a multi-member gzip file
is one stream to `gzip`, `zcat` and Python), so the batches of many runs share a day's file.
A line is one row, every column by name: datetimes as RFC 3339 UTC, bytes as base64, JSON
columns as JSON. The manifest records the rows, the first and last id, the bytes covered
and their sha256, and each column's encoding.

A write is all or nothing and durable before it returns: members appended and fsynced, then
each manifest replaced atomically (temporary file, fsync, rename, directory fsync). If any
step fails, what it appended is cut off again, the old manifests come back, and
`ArchiveError` is raised — the caller has not committed its delete, so the rows stay.

A day file is checked against its manifest the first time a writer touches it: bytes past
the manifest (a write interrupted before its manifest was replaced, whose rows were never
deleted) are cut off; bytes that do not match its sha256 stop the writer with
`ArchiveError` rather than bless a tampered file with a new checksum.

`write(directory, table, rows)` is the whole interface for a caller that has the rows (a
partition about to be dropped: read it with `select_rows`, or in chunks through one
`Writer`, each `write` one member); `capture` collects what a purge's bulk deletes remove.
"""

from __future__ import annotations

import base64
import fcntl
import gzip
import hashlib
import json
import logging
import os
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, DateTime, LargeBinary, Table, event, select
from sqlalchemy.orm import ORMExecuteState, Session
from sqlalchemy.sql import Delete

from app.clock import isoformat, parse_time, utcnow
from app.ids import moment_of
from app.models import Base

log = logging.getLogger(__name__)

FORMAT = "kurir-archive/1"
DATA_SUFFIX = ".jsonl.gz"
MANIFEST_SUFFIX = ".manifest.json"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# The creation time of a row, in the order looked for; a table without one (event versions)
# is dated by the time in its key (its event's id).
_DAY_COLUMNS = ("created_at", "received_at")
_READ_CHUNK = 1 << 20
# zlib's default: most of level 9's ratio at a fraction of its time, which the batch pays
# while it holds the writer.
_LEVEL = 6


class ArchiveError(Exception):
    """An archive could not be written, or a file does not match its manifest."""


# ---------------------------------------------------------------------------- rows


def table_of(name: str) -> Table:
    """The table called `name` in Kurir's schema.

    Raises:
        ArchiveError: no such table.
    """
    table = Base.metadata.tables.get(name)
    if table is None:
        raise ArchiveError(f"no table {name!r} in Kurir's schema")
    return table


def encodings(table: Table) -> dict[str, str]:
    """Each column's encoding in a line: `datetime`, `bytes`, `json` or `plain`."""
    found: dict[str, str] = {}
    for column in table.columns:
        kind = column.type
        if isinstance(kind, DateTime) or isinstance(getattr(kind, "impl", None), DateTime):
            found[column.name] = "datetime"
        elif isinstance(kind, LargeBinary):
            found[column.name] = "bytes"
        elif isinstance(kind, JSON):
            found[column.name] = "json"
        else:
            found[column.name] = "plain"
    return found


def encode(columns: Mapping[str, str], row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as one JSON object (the inverse of `decode`)."""
    record: dict[str, Any] = {}
    for name, how in columns.items():
        value = row.get(name)
        if value is not None and how == "datetime":
            value = isoformat(value)
        elif value is not None and how == "bytes":
            value = base64.b64encode(value).decode("ascii")
        record[name] = value
    return record


def decode(columns: Mapping[str, str], record: Mapping[str, Any]) -> dict[str, Any]:
    """A line back into the values the table takes (the inverse of `encode`).

    Raises:
        ArchiveError: a column the table no longer has.
    """
    unknown = set(record) - set(columns)
    if unknown:
        raise ArchiveError(f"columns not in the table: {', '.join(sorted(unknown))}")
    row: dict[str, Any] = {}
    for name, value in record.items():
        how = columns[name]
        if value is not None and how == "datetime":
            value = parse_time(value)
        elif value is not None and how == "bytes":
            value = base64.b64decode(value)
        row[name] = value
    return row


def key_of(table: Table, row: Mapping[str, Any]) -> str:
    """A row's primary key as one string (`a/b` for a composite key)."""
    return "/".join(str(row[column.name]) for column in table.primary_key.columns)


def day_of(table: Table, row: Mapping[str, Any]) -> str:
    """The UTC day a row was created, which names its file.

    Raises:
        ArchiveError: the row carries no time (no creation column, no id that holds one).
    """
    for name in _DAY_COLUMNS:
        value = row.get(name)
        if isinstance(value, datetime):
            return value.astimezone(UTC).date().isoformat()
    for column in table.primary_key.columns:
        value = row.get(column.name)
        moment = moment_of(value) if isinstance(value, str) else None
        if moment is not None:
            return moment.date().isoformat()
    raise ArchiveError(f"a {table.name} row carries no creation time: {key_of(table, row)}")


def select_rows(session: Session, table: Table, where: Any) -> list[dict[str, Any]]:
    """Every column of the rows `where` selects, in key order, as `write` takes them."""
    stmt = select(table).where(where).order_by(*table.primary_key.columns)
    return [dict(row) for row in session.connection().execute(stmt).mappings()]


# ---------------------------------------------------------------------------- manifests


@dataclass
class Manifest:
    """What a day file holds; `sha256` and `bytes` cover the whole file."""

    table: str
    day: str
    file: str
    rows: int = 0
    first_id: str | None = None
    last_id: str | None = None
    bytes: int = 0
    sha256: str = _EMPTY_SHA256
    columns: dict[str, str] = field(default_factory=dict)
    updated_at: str | None = None
    format: str = FORMAT

    @classmethod
    def load(cls, path: Path) -> Manifest:
        """The manifest at `path`.

        Raises:
            ArchiveError: unreadable, or not a manifest of this format.
        """
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ArchiveError(f"{path}: cannot read the manifest: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ArchiveError(f"{path}: not a {FORMAT} manifest")
        try:
            return cls(**raw)
        except TypeError as exc:
            raise ArchiveError(f"{path}: malformed manifest: {exc}") from exc

    def dumps(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def manifest_path(data_file: Path) -> Path:
    """The manifest beside a day file."""
    name = data_file.name
    stem = name[: -len(DATA_SUFFIX)] if name.endswith(DATA_SUFFIX) else name
    return data_file.with_name(stem + MANIFEST_SUFFIX)


def data_path(directory: Path, table: str, day: str) -> Path:
    return directory / table / f"{day}{DATA_SUFFIX}"


def sha256_of(path: Path, length: int | None = None) -> tuple[Any, int]:
    """The running sha256 of a file's first `length` bytes (all of it by default), and how
    many bytes it read."""
    digest = hashlib.sha256()
    read = 0
    with path.open("rb") as handle:
        while length is None or read < length:
            want = _READ_CHUNK if length is None else min(_READ_CHUNK, length - read)
            chunk = handle.read(want)
            if not chunk:
                break
            digest.update(chunk)
            read += len(chunk)
    return digest, read


def verify(data_file: Path) -> Manifest:
    """A day file's manifest, once the file is checked against it.

    Raises:
        ArchiveError: no manifest, or the file's size or sha256 differs from it.
    """
    manifest_file = manifest_path(data_file)
    if not manifest_file.exists():
        raise ArchiveError(f"{data_file}: no manifest ({manifest_file.name}) beside it")
    manifest = Manifest.load(manifest_file)
    if not data_file.exists():
        raise ArchiveError(f"{data_file}: no such file")
    size = data_file.stat().st_size
    digest, _ = sha256_of(data_file)
    if size != manifest.bytes or digest.hexdigest() != manifest.sha256:
        raise ArchiveError(
            f"{data_file}: checksum mismatch: the file has {size} bytes, sha256 "
            f"{digest.hexdigest()}; its manifest says {manifest.bytes} bytes, sha256 "
            f"{manifest.sha256} (changed or truncated since it was written)"
        )
    return manifest


def read(data_file: Path) -> Iterator[dict[str, Any]]:
    """Every line of a day file, every member, in the order written."""
    with gzip.open(data_file, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` atomically and durably."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_dir(path.parent)


# ---------------------------------------------------------------------------- writing


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One writer at a time in an archive (the purge and a partition drop may both write,
    from threads or processes): an exclusive lock on `<dir>/.lock`."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@dataclass
class _Append:
    """One day file touched by a write: what to put back if the write fails."""

    path: Path
    old: Manifest
    new: Manifest | None = None
    digest: Any = None


class Writer:
    """Appends rows to day files; keeps each file's running sha256 between writes, so a
    file is read once per writer (once per retention run), not once per batch."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._digests: dict[Path, Any] = {}

    def write(self, table: str, rows: Sequence[Mapping[str, Any]]) -> list[Manifest]:
        """Archive one table's rows (all of them durable when this returns).

        Raises:
            ArchiveError: nothing of this write is kept.
        """
        return self.write_batch({table: rows})

    def write_batch(self, batch: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Manifest]:
        """Archive several tables' rows at once: all of them, or (raising) none.

        Raises:
            ArchiveError: nothing of this write is kept.
        """
        if not any(batch.values()):
            return []
        touched: list[_Append] = []
        try:
            with _locked(self.directory):
                try:
                    self._write(batch, touched)
                except BaseException:
                    self._undo(touched)
                    raise
        except (OSError, ValueError, TypeError, ArchiveError) as exc:
            if isinstance(exc, ArchiveError):
                raise
            raise ArchiveError(f"cannot write the archive in {self.directory}: {exc}") from exc
        for step in touched:
            self._digests[step.path] = step.digest
        return [step.new for step in touched if step.new is not None]

    def _write(
        self, batch: Mapping[str, Sequence[Mapping[str, Any]]], touched: list[_Append]
    ) -> None:
        for name, rows in batch.items():
            if not rows:
                continue
            table = table_of(name)
            by_day: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
            for row in rows:
                by_day[day_of(table, row)].append(row)
            for day in sorted(by_day):
                self._append(table, day, by_day[day], touched)
        for step in touched:
            if step.new is not None:
                _replace(manifest_path(step.path), step.new.dumps())

    def _append(
        self, table: Table, day: str, rows: Sequence[Mapping[str, Any]], touched: list[_Append]
    ) -> None:
        path = data_path(self.directory, table.name, day)
        old, digest = self._open(path, table, day)
        step = _Append(path, old)
        touched.append(step)
        columns = encodings(table)
        lines = "".join(
            json.dumps(encode(columns, row), ensure_ascii=False, separators=(",", ":")) + "\n"
            for row in rows
        )
        member = gzip.compress(lines.encode("utf-8"), compresslevel=_LEVEL, mtime=0)
        with path.open("ab") as handle:
            handle.write(member)
            handle.flush()
            os.fsync(handle.fileno())
        digest = digest.copy()
        digest.update(member)
        keys = [key_of(table, row) for row in rows]
        firsts = [k for k in (old.first_id, min(keys)) if k is not None]
        lasts = [k for k in (old.last_id, max(keys)) if k is not None]
        step.digest = digest
        step.new = Manifest(
            table=table.name,
            day=day,
            file=path.name,
            rows=old.rows + len(rows),
            first_id=min(firsts),
            last_id=max(lasts),
            bytes=old.bytes + len(member),
            sha256=digest.hexdigest(),
            columns=columns,
            updated_at=isoformat(utcnow()),
        )

    def _open(self, path: Path, table: Table, day: str) -> tuple[Manifest, Any]:
        """The day file's manifest and running sha256, the file checked (or started)."""
        manifest_file = manifest_path(path)
        cached = self._digests.get(path)
        if cached is not None and manifest_file.exists():
            manifest = Manifest.load(manifest_file)
            if manifest.sha256 == cached.hexdigest():  # nobody else appended meanwhile
                return manifest, cached
        if not manifest_file.exists():
            if path.exists() and path.stat().st_size:
                raise ArchiveError(f"{path}: has no manifest; move it aside to go on")
            path.parent.mkdir(parents=True, exist_ok=True)
            # The manifest first: a file never exists without one, so any bytes past what
            # a manifest covers are known to be an interrupted write's.
            empty = Manifest(table=table.name, day=day, file=path.name, columns=encodings(table))
            _replace(manifest_file, empty.dumps())
            path.touch()
            _fsync_dir(path.parent)
            return empty, hashlib.sha256()
        manifest = Manifest.load(manifest_file)
        size = path.stat().st_size if path.exists() else 0
        if size < manifest.bytes:
            raise ArchiveError(f"{path}: shorter ({size} bytes) than its manifest says")
        if size > manifest.bytes:
            log.warning(
                "archive file longer than its manifest: cutting off an interrupted write",
                extra={"file": str(path), "bytes": size, "manifest_bytes": manifest.bytes},
            )
            os.truncate(path, manifest.bytes)
        digest, _ = sha256_of(path, manifest.bytes)
        if digest.hexdigest() != manifest.sha256:
            raise ArchiveError(f"{path}: does not match its manifest's sha256; not appending to it")
        return manifest, digest

    def _undo(self, touched: list[_Append]) -> None:
        for step in reversed(touched):
            try:
                os.truncate(step.path, step.old.bytes)
                _replace(manifest_path(step.path), step.old.dumps())
            except OSError:
                log.exception("could not undo an archive write", extra={"file": str(step.path)})
            self._digests.pop(step.path, None)


def write(directory: Path, table: str, rows: Sequence[Mapping[str, Any]]) -> list[Manifest]:
    """Archive `rows` of `table` under `directory`, durable when this returns.

    Raises:
        ArchiveError: nothing of this write is kept.
    """
    return Writer(directory).write(table, rows)


# ---------------------------------------------------------------------------- purges


@contextmanager
def capture(session: Session, writer: Writer) -> Iterator[None]:
    """Archive what the bulk deletes run through `session` inside the block remove.

    Each delete's rows are read just before it runs; on leaving the block they are written
    as one all-or-nothing batch — before the caller commits. Watching the session rather
    than each call site means no delete a purge makes can skip the archive.

    Raises:
        ArchiveError: on leaving the block; the caller's transaction must roll back.
    """
    captured: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def before_delete(state: ORMExecuteState) -> None:
        statement = state.statement
        if not isinstance(statement, Delete):
            return
        table = statement.table
        if not isinstance(table, Table) or statement.whereclause is None:
            raise ArchiveError(f"cannot archive an unconditional delete of {table}")
        captured[table.name].extend(select_rows(state.session, table, statement.whereclause))

    event.listen(session, "do_orm_execute", before_delete)
    try:
        yield
    finally:
        event.remove(session, "do_orm_execute", before_delete)
    writer.write_batch(captured)
