"""Restore archived rows (`kurir archive restore FILE...`): every file checked against its
manifest before any row is loaded, the files loaded parents first, each row inserted only if
its key is not there yet — so a restore can be repeated, or resumed after a failure, without
doubling anything.

Parents first means the schema's foreign-key order (`TABLE_ORDER`, read from the models so
it follows the schema): events before their versions and deliveries, deliveries before their
attempts and dead letters, dead letters before their audit; within a table, by day.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from app.db import Database
from app.lifecycle.archive import (
    ArchiveError,
    Manifest,
    decode,
    encodings,
    key_of,
    read,
    table_of,
    verify,
)
from app.models import Base

# Rows per transaction, and per IN (...) list looking for those already there.
CHUNK = 500

# Every table, parents before children.
TABLE_ORDER: tuple[str, ...] = tuple(table.name for table in Base.metadata.sorted_tables)


@dataclass(frozen=True)
class Restored:
    """One file loaded: rows put back, and rows skipped because their key was there."""

    file: Path
    table: str
    day: str
    restored: int
    skipped: int


def ordered(files: Iterable[Path]) -> list[tuple[Path, Manifest]]:
    """The files checked against their manifests, parents' tables first, then by day.

    Raises:
        ArchiveError: the first file that fails its check (no row is loaded then).
    """
    checked = [(Path(file), verify(Path(file))) for file in files]
    for file, manifest in checked:
        if manifest.table not in TABLE_ORDER:
            raise ArchiveError(f"{file}: no table {manifest.table!r} in Kurir's schema")
    return sorted(checked, key=lambda pair: (TABLE_ORDER.index(pair[1].table), pair[1].day))


def restore(db: Database, files: Sequence[Path]) -> list[Restored]:
    """Load archived rows back into their tables, skipping those already present.

    Raises:
        ArchiveError: a file fails its check (nothing loaded), or a row cannot be loaded
            (a parent missing: restore its table's files first); chunks already loaded
            stay, and running the restore again finishes it.
    """
    return [_restore_file(db, file, manifest) for file, manifest in ordered(files)]


def _chunks(rows: Iterator[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    while chunk := list(islice(rows, CHUNK)):
        yield chunk


def _restore_file(db: Database, file: Path, manifest: Manifest) -> Restored:
    table = table_of(manifest.table)
    columns = encodings(table)
    pk = list(table.primary_key.columns)
    restored = skipped = 0
    for records in _chunks(read(file)):
        rows = [decode(columns, record) for record in records]
        with db.begin() as session:
            present = {
                key_of(table, dict(row._mapping))
                for row in session.execute(
                    select(*pk).where(pk[0].in_({row[pk[0].name] for row in rows}))
                )
            }
            fresh: dict[str, dict[str, Any]] = {}
            for row in rows:
                key = key_of(table, row)
                if key not in present and key not in fresh:
                    fresh[key] = row
            skipped += len(rows) - len(fresh)
            if fresh:
                try:
                    session.execute(insert(table), list(fresh.values()))
                except IntegrityError as exc:
                    raise ArchiveError(
                        f"{file}: cannot restore {table.name} rows (a parent row missing? "
                        f"restore its table's files first): {exc.orig}"
                    ) from exc
        restored += len(fresh)
    return Restored(file, table.name, manifest.day, restored, skipped)
