"""The `kurir` command: run the processes and administer keys, operators and migrations."""

from __future__ import annotations

import sys

import click

from app import __version__
from app.cli import (
    admin,
    archive,
    dlq,
    doctor,
    endpoints,
    feed,
    inbound,
    listen,
    partners,
    portal,
    run,
)
from app.config import ConfigError, Settings, load_settings


class KurirGroup(click.Group):
    """Turns configuration errors into one clear line and exit code 2, not a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ConfigError as exc:
            click.echo(f"kurir: configuration error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=KurirGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kurir")
def cli() -> None:
    """Kurir: webhook delivery with signatures, retries, dead letters and a verifying receiver.

    Configuration comes from the environment (DATABASE_URL, REDIS_URL, KURIR_*): see
    docs/configuration.md.
    """


def settings_from_env() -> Settings:
    return load_settings()


for command in (
    *run.COMMANDS,
    *admin.COMMANDS,
    *archive.COMMANDS,
    *dlq.COMMANDS,
    *endpoints.COMMANDS,
    *inbound.COMMANDS,
    *listen.COMMANDS,
    *feed.COMMANDS,
    *portal.COMMANDS,
    *partners.COMMANDS,
    *doctor.COMMANDS,
):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="kurir")
