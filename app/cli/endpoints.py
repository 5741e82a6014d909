"""`kurir endpoints`: partners' endpoints from the command line — list, show, enable, disable,
the ordering keys one holds, and resending a window of what failed. The same services as the
API and the UI decide and audit (as `cli:<user>`)."""

from __future__ import annotations

import json
from typing import Any

import click

from app.cli.common import cli_actor, echo_fields, echo_table, fail, make_runtime
from app.errors import KurirError
from app.services import endpoints, partners
from app.vocabulary import EndpointState, values
from app.web.api.serializers import blocked_key_json, endpoint_json

_ACTOR = click.option(
    "--actor",
    default=None,
    help="Name recorded in the audit trail as cli:<name> (default: your user).",
)


@click.group("endpoints")
def endpoints_group() -> None:
    """Endpoints: list, show, enable, disable, blocked ordering keys, recover a window."""


@endpoints_group.command("ls")
@click.option("--partner", "uid", default=None, metavar="UID", help="One partner's only.")
@click.option("--state", type=click.Choice(values(EndpointState)), default=None)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 250))
@click.option("--cursor", default=None, help="Continue from a previous page.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def endpoints_ls(
    uid: str | None, state: str | None, limit: int, cursor: str | None, as_json: bool
) -> None:
    """List live endpoints (of every partner, or of one), newest first."""
    runtime = make_runtime()
    actor = cli_actor()
    try:
        with runtime.db.begin() as session:
            rows, following = endpoints.page(
                session, actor, uid, state=state, limit=limit, cursor=cursor
            )
            names = partners.uids(session, {e.partner_id for e in rows})
            shown = [endpoint_json(e, names.get(e.partner_id, "")) for e in rows]
    except KurirError as exc:
        fail(exc.message, 2)
    if as_json:
        for row in shown:
            click.echo(json.dumps(row))
        return
    if not shown:
        click.echo("no endpoints match")
        return
    echo_table(
        ("ID", "PARTNER", "STATE", "MODE", "FAILURES", "URL"),
        [
            (
                e["id"],
                e["partner"],
                e["state"],
                e["mode"],
                str(e["consecutive_failures"]),
                e["url"] or "-",
            )
            for e in shown
        ],
    )
    if following:
        click.echo(f"more: --cursor {following}")


def _shown(endpoint_id: str) -> dict[str, Any]:
    runtime = make_runtime()
    with runtime.db.begin() as session:
        endpoint = endpoints.by_id(session, cli_actor(), endpoint_id)
        uid = partners.uids(session, {endpoint.partner_id}).get(endpoint.partner_id, "")
        shown = endpoint_json(endpoint, uid)
        shown["deleted_at"] = (
            None if endpoint.deleted_at is None else endpoint.deleted_at.isoformat()
        )
    return shown


@endpoints_group.command("show")
@click.argument("endpoint_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (the API's shape).")
def endpoints_show(endpoint_id: str, as_json: bool) -> None:
    """Show one endpoint (a deleted one too, with when it was deleted)."""
    try:
        shown = _shown(endpoint_id)
    except KurirError as exc:
        fail(exc.message)
    if as_json:
        click.echo(json.dumps(shown))
        return
    echo_fields(
        {
            name: shown[name]
            for name in (
                "id",
                "partner",
                "url",
                "mode",
                "state",
                "disabled_reason",
                "disabled_by",
                "disabled_at",
                "event_types",
                "filter",
                "versions",
                "ordering",
                "on_dead",
                "signature",
                "timeout_s",
                "rate_limit_per_s",
                "consecutive_failures",
                "last_success_at",
                "last_failure_at",
                "created_at",
                "deleted_at",
            )
        }
    )


@endpoints_group.command("enable")
@click.argument("endpoint_id")
@_ACTOR
def endpoints_enable(endpoint_id: str, actor: str | None) -> None:
    """Enable an endpoint: deliveries start again (what it held back stays in the dead
    letters: `kurir dlq resend --endpoint ID`)."""
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            endpoint = endpoints.by_id(session, cli_actor(actor), endpoint_id, "endpoints:write")
            changed = endpoints.enable(session, cli_actor(actor), endpoint)
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"endpoint {endpoint_id}: {'enabled' if changed else 'already enabled'}")


@endpoints_group.command("disable")
@click.argument("endpoint_id")
@click.option("--reason", default=None, help="Why, shown to the partner (200 characters).")
@_ACTOR
def endpoints_disable(endpoint_id: str, reason: str | None, actor: str | None) -> None:
    """Disable an endpoint: its new events are parked as dead letters until it is enabled
    (an operator's disable, which the partner cannot undo)."""
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            endpoint = endpoints.by_id(session, cli_actor(actor), endpoint_id, "endpoints:write")
            changed = endpoints.disable(session, cli_actor(actor), endpoint, reason)
    except KurirError as exc:
        fail(exc.message)
    click.echo(f"endpoint {endpoint_id}: {'disabled' if changed else 'already disabled'}")


@endpoints_group.command("blocked-keys")
@click.argument("endpoint_id")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 250))
@click.option("--cursor", default=None, help="Continue from a previous page.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def endpoints_blocked_keys(endpoint_id: str, limit: int, cursor: str | None, as_json: bool) -> None:
    """The ordering keys an `on_dead: block` endpoint holds behind a dead delivery; resend
    or discard the named dead letter (`kurir dlq`) to release one."""
    runtime = make_runtime()
    actor = cli_actor()
    try:
        with runtime.db.begin() as session:
            endpoint = endpoints.by_id(session, actor, endpoint_id)
            uid = partners.uids(session, {endpoint.partner_id})[endpoint.partner_id]
            rows, following = endpoints.blocked_keys(
                session, actor, uid, endpoint_id, cursor=cursor, limit=limit
            )
            shown = [blocked_key_json(row) for row in rows]
    except KurirError as exc:
        fail(exc.message)
    if as_json:
        for row in shown:
            click.echo(json.dumps(row))
        return
    if not shown:
        click.echo(f"endpoint {endpoint_id} holds no ordering key")
        return
    echo_table(
        ("KEY", "SEQ", "WAITING", "DEAD LETTER", "REASON"),
        [
            (
                r["ordering_key"],
                str(r["sequence"]),
                str(r["waiting"]),
                r["dead_letter"],
                r["reason"],
            )
            for r in shown
        ],
    )
    if following:
        click.echo(f"more: --cursor {following}")


COMMANDS = (endpoints_group,)


@endpoints_group.command("recover")
@click.argument("endpoint_id")
@click.option("--since", required=True, help="published at or after (RFC 3339)")
@click.option("--until", default=None, help="published before (RFC 3339); default: now")
@click.option("--actor", "actor_name", default=None, help="name for the audit trail")
def recover(endpoint_id: str, since: str, until: str | None, actor_name: str | None) -> None:
    """Resend, in publish order and one after the other, every delivery of ENDPOINT_ID
    published in the window that did not succeed (open dead letters, deliveries still
    retrying). A worker runs the operation; this prints its id."""
    runtime = make_runtime()
    actor = cli_actor(actor_name)
    body: dict[str, Any] = {"since": since}
    if until is not None:
        body["until"] = until
    try:
        with runtime.db.begin() as session:
            endpoint = endpoints.by_id(session, actor, endpoint_id, "endpoints:write")
            if endpoint.deleted_at is not None:
                fail(f"endpoint {endpoint_id} was deleted", 2)
            job = endpoints.recover_window(session, runtime, actor, endpoint, body)
            job_id, total = job.id, job.total
    except KurirError as exc:
        fail(exc.message, 2)
    click.echo(
        f"operation {job_id}: {total} to resend in publish order; "
        f"follow it with GET /v1/operations/{job_id}"
    )
