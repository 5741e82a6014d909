"""Helpers shared by the CLI commands."""

from __future__ import annotations

import getpass

import click

from app import telemetry
from app.budget import ProcessKind
from app.config import load_settings
from app.logs import configure as configure_logging
from app.runtime import Runtime
from app.services.actor import Actor


def make_runtime(kind: ProcessKind = ProcessKind.CLI) -> Runtime:
    """The process's Runtime, with logging and (when settings ask for it) tracing set up;
    its pools are those of `kind`'s budget (app/budget.py)."""
    settings = load_settings()
    configure_logging(settings.log_level, settings.log_format)
    telemetry.configure(settings)
    return Runtime(settings, kind=kind)


def fail(message: str, code: int = 1) -> None:
    click.echo(f"kurir: {message}", err=True)
    raise SystemExit(code)


def cli_actor(name: str | None = None) -> Actor:
    """The command line as an actor, audited as `cli:<user>` (or the name given)."""
    if name is None:
        try:
            name = getpass.getuser()
        except (KeyError, OSError):
            name = ""
    return Actor.cli(name)


def echo_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Rows under a header, each column as wide as its widest cell."""
    table = [header, *rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )


def echo_fields(fields: dict[str, object]) -> None:
    """`name: value` lines, names aligned (None shows as `-`)."""
    width = max(len(name) for name in fields)
    for name, value in fields.items():
        shown = "-" if value is None or value == [] or value == {} else value
        if isinstance(shown, list):
            shown = ", ".join(map(str, shown))
        elif isinstance(shown, dict):
            shown = ", ".join(f"{k}={v}" for k, v in shown.items())
        click.echo(f"{name.ljust(width)}  {shown}")
