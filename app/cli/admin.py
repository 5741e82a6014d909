"""Administrative commands: migrations, API keys, operator accounts."""

from __future__ import annotations

import sys

import click

from app import migrate
from app.accounts import create_api_key, create_operator
from app.cli.common import fail, make_runtime
from app.errors import KurirError
from app.models import SCOPES


@click.group("db")
def db_group() -> None:
    """Database schema management."""


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def db_upgrade(revision: str) -> None:
    """Apply Alembic migrations to DATABASE_URL (or the embedded SQLite)."""
    runtime = make_runtime()
    migrate.upgrade(runtime.settings.resolved_database_url, revision)
    click.echo(f"database at revision {revision}")


@click.group("keys")
def keys_group() -> None:
    """API keys for internal services."""


@keys_group.command("create")
@click.option("--name", required=True, help="Who the key is for, e.g. billing-service.")
@click.option("--scope", "scopes", multiple=True, type=click.Choice(SCOPES),
              help="Grant a scope (repeatable). Default: admin.")
def keys_create(name: str, scopes: tuple[str, ...]) -> None:
    """Create an API key; it is printed once, alone on the last line."""
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            key, token = create_api_key(session, name, scopes)
            granted = ", ".join(key.scopes)
            key_id = key.id
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"created API key {key_id} for {name!r} with scopes: {granted}")
    click.echo("store it now; it cannot be shown again:")
    click.echo(token)


@click.group("operators")
def operators_group() -> None:
    """Operator accounts for the web UI."""


@operators_group.command("create")
@click.option("--email", required=True, help="Login email of the operator.")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from stdin (also automatic when stdin is not a TTY).")
def operators_create(email: str, password_stdin: bool) -> None:
    """Create an operator; the password is read from stdin or prompted for."""
    if password_stdin or not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            operator = create_operator(session, email, password)
            operator_id = operator.id
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"created operator {operator_id} <{email.strip().lower()}>")


COMMANDS = (db_group, keys_group, operators_group)
