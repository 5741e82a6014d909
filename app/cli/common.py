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
