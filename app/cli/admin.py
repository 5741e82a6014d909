"""Administrative commands: migrations, API keys, operator accounts (and their sessions),
the master key."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from app import migrate
from app.cli.common import cli_actor, fail, make_runtime
from app.clock import isoformat
from app.errors import KurirError
from app.models import SCOPES
from app.services import keys, lifecycle, operators, secret_keys


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


@db_group.command("stats")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def db_stats(as_json: bool) -> None:
    """Rows (and bytes, on PostgreSQL) per table, and per kind of history its retention:
    days kept, horizon, rows purged, oldest row kept. A PostgreSQL table of 100,000 rows or
    more shows its statistics' estimate (`~` before it; `rows_exact` false in JSON)."""
    runtime = make_runtime()
    with runtime.db.begin() as session:
        found = lifecycle.storage(session, runtime.settings, cli_actor())
    tables: list[dict[str, Any]] = [
        {"table": t.table, "rows": t.rows, "rows_exact": t.exact, "bytes": t.bytes}
        for t in found.tables
    ]
    kinds: list[dict[str, Any]] = [
        {
            "kind": k.kind.value,
            "days": k.days,
            "horizon": isoformat(k.horizon),
            "rows_purged": k.mark.purged_total,
            "last_purged": k.mark.last_purged,
            "oldest_kept_at": isoformat(k.mark.oldest_kept_at),
            "last_run_at": isoformat(k.mark.last_run_at),
        }
        for k in found.kinds
    ]
    if as_json:
        click.echo(json.dumps({"tables": tables, "retention": kinds}, indent=2))
        return
    _print_table(
        ("TABLE", "ROWS", "BYTES"),
        [
            (
                t["table"],
                f"{'' if t['rows_exact'] else '~'}{t['rows']}",
                "-" if t["bytes"] is None else str(t["bytes"]),
            )
            for t in tables
        ],
    )
    click.echo("")
    _print_table(
        ("KIND", "DAYS", "HORIZON", "PURGED", "OLDEST KEPT", "LAST RUN"),
        [
            (
                k["kind"],
                str(k["days"]),
                k["horizon"] or "-",
                str(k["rows_purged"]),
                k["oldest_kept_at"] or "-",
                k["last_run_at"] or "never",
            )
            for k in kinds
        ],
    )


def _print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    table = [header, *rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


@click.group("keys")
def keys_group() -> None:
    """API keys for internal services (and for partners: --partner)."""


@keys_group.command("create")
@click.option("--name", required=True, help="Who the key is for, e.g. billing-service.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(SCOPES),
    help="Grant a scope (repeatable). Default: admin (a partner key: read, "
    "endpoints:write, dlq:write).",
)
@click.option(
    "--partner",
    "partner_uid",
    default=None,
    metavar="UID",
    help="Bind the key to one partner: it reaches only that partner's resources.",
)
def keys_create(name: str, scopes: tuple[str, ...], partner_uid: str | None) -> None:
    """Create an API key; it is printed once, alone on the last line."""
    runtime = make_runtime()
    if not scopes and partner_uid is None:
        click.echo(
            "kurir: no --scope given: the key gets admin (every permission); pass "
            "--scope read, --scope events:write, ... for less",
            err=True,
        )
    try:
        with runtime.db.begin() as session:
            view, token = keys.create(session, cli_actor(), name, scopes, partner_uid=partner_uid)
            granted = ", ".join(view.key.scopes)
            key_id = view.key.id
    except KurirError as exc:
        fail(exc.message)
    bound = f" bound to partner {partner_uid!r}" if partner_uid else ""
    click.echo(f"created API key {key_id} for {name!r}{bound} with scopes: {granted}")
    click.echo("store it now; it cannot be shown again:")
    click.echo(token)


@keys_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def keys_ls(as_json: bool) -> None:
    """List API keys (never the keys themselves), newest first."""
    runtime = make_runtime()
    rows: list[dict[str, Any]] = []
    with runtime.db.begin() as session:
        cursor = None
        while True:
            views, cursor = keys.page(session, cli_actor(), limit=250, cursor=cursor)
            rows += [
                {
                    "id": v.key.id,
                    "name": v.key.name,
                    "prefix": v.key.prefix,
                    "scopes": list(v.key.scopes or []),
                    "partner": v.partner_uid,
                    "created_at": isoformat(v.key.created_at),
                    "last_used_at": isoformat(v.key.last_used_at),
                    "revoked_at": isoformat(v.key.revoked_at),
                }
                for v in views
            ]
            if cursor is None:
                break
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no API keys")
        return
    header = ("ID", "NAME", "PREFIX", "SCOPES", "PARTNER", "LAST USED", "REVOKED")
    table: list[tuple[str, ...]] = [header] + [
        (
            r["id"],
            r["name"],
            r["prefix"] + "…",
            ",".join(r["scopes"]),
            r["partner"] or "-",
            r["last_used_at"] or "never",
            r["revoked_at"] or "-",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


@keys_group.command("revoke")
@click.argument("key_id")
def keys_revoke(key_id: str) -> None:
    """Revoke key KEY_ID: every API process refuses it within a second."""
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            view = keys.revoke(session, cli_actor(), key_id)
            name = view.key.name
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"revoked API key {key_id} ({name!r})")


@click.group("operators")
def operators_group() -> None:
    """Operator accounts for the web UI."""


def _read_password(from_stdin: bool) -> str:
    if from_stdin or not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    return str(click.prompt("Password", hide_input=True, confirmation_prompt=True))


@operators_group.command("create")
@click.option("--email", required=True, help="Login email of the operator.")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from stdin (also automatic when stdin is not a TTY).",
)
def operators_create(email: str, password_stdin: bool) -> None:
    """Create an operator; the password is read from stdin or prompted for."""
    password = _read_password(password_stdin)
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            operator = operators.create(session, cli_actor(), email, password)
            operator_id = operator.id
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"created operator {operator_id} <{email.strip().lower()}>")


@operators_group.command("set-password")
@click.argument("email")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from stdin (also automatic when stdin is not a TTY).",
)
def operators_set_password(email: str, password_stdin: bool) -> None:
    """Give operator EMAIL a new password; every UI session of theirs ends at once."""
    password = _read_password(password_stdin)
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            ended = operators.set_password(session, cli_actor(), email, password)
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"new password for {email.strip().lower()}; {ended} UI session(s) ended")


@operators_group.command("disable")
@click.argument("email")
def operators_disable(email: str) -> None:
    """Disable operator EMAIL: they cannot sign in, and every UI session of theirs ends."""
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            ended = operators.set_disabled(session, cli_actor(), email, True)
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"disabled {email.strip().lower()}; {ended} UI session(s) ended")


@operators_group.command("enable")
@click.argument("email")
def operators_enable(email: str) -> None:
    """Let a disabled operator EMAIL sign in again."""
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            operators.set_disabled(session, cli_actor(), email, False)
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"enabled {email.strip().lower()}")


@click.group("secrets")
def secrets_group() -> None:
    """The master key (KURIR_SECRET_KEY) that encrypts signing secrets at rest."""


@secrets_group.command("reencrypt")
def secrets_reencrypt() -> None:
    """Re-encrypt every stored secret under the newest KURIR_SECRET_KEY.

    Put the new key first (KURIR_SECRET_KEY=new,old) on every process, run this, then drop the
    old key. Exits 1 if some secret could be read with none of the keys.
    """
    runtime = make_runtime()
    actor = cli_actor()
    progress = secret_keys.Progress()
    for table in secret_keys.TABLES:
        after = None
        while True:
            with runtime.db.begin() as session:
                after = secret_keys.reencrypt_page(session, runtime, actor, table, after, progress)
            if after is None:
                break
            click.echo(f"  {progress.seen} secrets read", err=True)
    with runtime.db.begin() as session:
        secret_keys.record(session, actor, progress)
    click.echo(
        f"re-encrypted {progress.reencrypted} of {progress.seen} secrets "
        f"({progress.seen - progress.reencrypted - progress.unreadable} were current)"
    )
    if progress.unreadable:
        fail(f"{progress.unreadable} secrets could not be decrypted with any configured key")


COMMANDS = (db_group, keys_group, operators_group, secrets_group)
