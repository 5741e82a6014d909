"""`kurir partners`: partners from the command line — list them, show one with its endpoints."""

from __future__ import annotations

import json

import click

from app.cli.common import cli_actor, echo_fields, echo_table, fail, make_runtime
from app.errors import KurirError
from app.services import endpoints, partners
from app.web.api.serializers import endpoint_json, partner_json

# Endpoints listed with a partner (`kurir endpoints ls --partner UID` pages through all).
SHOWN_ENDPOINTS = 100


@click.group("partners")
def partners_group() -> None:
    """Partners: list, show."""


@partners_group.command("ls")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 250))
@click.option("--cursor", default=None, help="Continue from a previous page.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def partners_ls(limit: int, cursor: str | None, as_json: bool) -> None:
    """List partners, newest first."""
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            rows, following = partners.page(session, cli_actor(), limit=limit, cursor=cursor)
            shown = [partner_json(p) for p in rows]
    except KurirError as exc:
        fail(exc.message, 2)
    if as_json:
        for row in shown:
            click.echo(json.dumps(row))
        return
    if not shown:
        click.echo("no partners")
        return
    echo_table(
        ("UID", "NAME", "ID", "CREATED"),
        [(p["uid"], p["name"], p["id"], p["created_at"] or "") for p in shown],
    )
    if following:
        click.echo(f"more: --cursor {following}")


@partners_group.command("show")
@click.argument("uid")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, its endpoints included.")
def partners_show(uid: str, as_json: bool) -> None:
    """Show partner UID and its endpoints."""
    runtime = make_runtime()
    actor = cli_actor()
    try:
        with runtime.db.begin() as session:
            partner = partners.get(session, actor, uid)
            rows, more = endpoints.page(session, actor, uid, limit=SHOWN_ENDPOINTS, cursor=None)
            shown = {
                **partner_json(partner),
                "endpoints": [endpoint_json(e, uid) for e in rows],
            }
    except KurirError as exc:
        fail(exc.message)
    if as_json:
        click.echo(json.dumps(shown))
        return
    echo_fields({k: shown[k] for k in ("uid", "name", "id", "created_at")})
    click.echo("")
    if not shown["endpoints"]:
        click.echo("no endpoints")
        return
    echo_table(
        ("ENDPOINT", "STATE", "MODE", "URL"),
        [(e["id"], e["state"], e["mode"], e["url"] or "-") for e in shown["endpoints"]],
    )
    if more:
        click.echo(f"more: kurir endpoints ls --partner {uid}")


COMMANDS = (partners_group,)
