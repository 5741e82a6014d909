"""`kurir archive`: what retention archived before purging (`KURIR_ARCHIVE_DIR`) — list the
day files with their manifests, and restore files into the database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from app.cli.common import cli_actor, echo_table, fail, make_runtime
from app.config import load_settings
from app.errors import KurirError
from app.services import archive


@click.group("archive")
def archive_group() -> None:
    """Rows retention archived before purging them (KURIR_ARCHIVE_DIR)."""


@archive_group.command("list")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The archive to read (default: KURIR_ARCHIVE_DIR).",
)
@click.option("--verify", "check", is_flag=True, help="Check each file against its manifest.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def archive_list(directory: Path | None, check: bool, as_json: bool) -> None:
    """Every day file of the archive: table, day, rows, first and last id, bytes."""
    directory = directory or load_settings().archive_dir
    if directory is None:
        fail("no archive: set KURIR_ARCHIVE_DIR or pass --dir", 2)
        return
    try:
        listed = archive.files(Path(directory), check=check)
    except KurirError as exc:
        fail(exc.message, 1)
        return
    found: list[dict[str, Any]] = []
    for item in listed:
        entry: dict[str, Any] = {"file": str(item.path)}
        if item.manifest is None:
            entry["error"] = item.error
        else:
            m = item.manifest
            entry.update(
                table=m.table,
                day=m.day,
                rows=m.rows,
                first_id=m.first_id,
                last_id=m.last_id,
                bytes=m.bytes,
                sha256=m.sha256,
                verified=item.verified,
            )
        found.append(entry)
    if as_json:
        click.echo(json.dumps(found, indent=2))
    else:
        echo_table(
            ("FILE", "TABLE", "DAY", "ROWS", "FIRST ID", "LAST ID", "BYTES"),
            [
                (
                    e["file"],
                    e.get("table", "-"),
                    e.get("day", "-"),
                    str(e.get("rows", "-")),
                    e.get("first_id") or "-",
                    e.get("last_id") or "-",
                    str(e.get("bytes", "-")),
                )
                for e in found
            ],
        )
        for e in found:
            if "error" in e:
                click.echo(f"kurir: {e['error']}", err=True)
    if any("error" in e for e in found):
        raise SystemExit(1)


@archive_group.command("restore")
@click.argument(
    "files",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
def archive_restore(files: tuple[Path, ...]) -> None:
    """Load archived day FILES (`<table>/<day>.jsonl.gz`) back into DATABASE_URL.

    Every file is checked against its manifest first (one that does not match: nothing is
    loaded). Files are loaded parents first whatever order they are given in; rows whose
    key is already there are skipped, so running it twice doubles nothing.
    """
    runtime = make_runtime()
    try:
        results = archive.restore(runtime, cli_actor(), files)
    except KurirError as exc:
        fail(exc.message, 1)
        return
    finally:
        runtime.close()
    for result in results:
        click.echo(
            f"{result.table} {result.day}: {result.restored} restored, "
            f"{result.skipped} skipped (already present)"
        )
    click.echo(
        f"{sum(r.restored for r in results)} row(s) restored, "
        f"{sum(r.skipped for r in results)} skipped"
    )


COMMANDS = [archive_group]
