"""The archive as an operator uses it: list what retention archived (`KURIR_ARCHIVE_DIR`),
and restore day files into the database, audited. The files themselves are
`app.lifecycle.archive`'s; loading them is `app.lifecycle.restore`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.errors import NotFound, ValidationFailed
from app.lifecycle import restore as restoring
from app.lifecycle.archive import DATA_SUFFIX, ArchiveError, Manifest, manifest_path, verify
from app.lifecycle.restore import Restored
from app.runtime import Runtime
from app.services import audit
from app.services.actor import Actor

__all__ = ["ArchiveFile", "Restored", "files", "restore"]


@dataclass(frozen=True)
class ArchiveFile:
    """One day file: its manifest, or why it could not be read (or failed its check)."""

    path: Path
    manifest: Manifest | None
    error: str | None = None
    verified: bool = False


def files(directory: Path, *, check: bool = False) -> list[ArchiveFile]:
    """Every day file under `directory`, by table and day; with `check`, each file's size
    and sha256 compared with its manifest (reads every file)."""
    if not directory.is_dir():
        raise NotFound(f"no archive at {directory}")
    found = []
    for path in sorted(directory.glob(f"*/*{DATA_SUFFIX}")):
        try:
            manifest = verify(path) if check else Manifest.load(manifest_path(path))
        except ArchiveError as exc:
            found.append(ArchiveFile(path, None, str(exc)))
        else:
            found.append(ArchiveFile(path, manifest, verified=check))
    return found


def restore(runtime: Runtime, actor: Actor, paths: Sequence[Path]) -> list[Restored]:
    """Load archived day files back into the database (parents first, rows already there
    skipped) and audit what was loaded.

    Raises:
        ValidationFailed (`archive_invalid`): a file fails its manifest (nothing is loaded),
            or a row cannot be loaded (its parent missing).
    """
    actor.require("admin")
    try:
        results = restoring.restore(runtime.db, paths)
    except ArchiveError as exc:
        raise ValidationFailed(str(exc), code="archive_invalid") from exc
    with runtime.db.begin() as session:
        for result in results:
            audit.record(
                session,
                actor,
                "archive.restore",
                "table",
                result.table,
                file=result.file.name,
                day=result.day,
                restored=result.restored,
                skipped=result.skipped,
            )
    return results
