"""`kurir endpoints`: what an operator does to one endpoint from a shell — recover a window."""

from __future__ import annotations

from typing import Any

import click

from app.cli.common import cli_actor, fail, make_runtime
from app.errors import KurirError
from app.services import endpoints


@click.group("endpoints")
def endpoints_group() -> None:
    """One endpoint's recovery."""


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


COMMANDS = (endpoints_group,)
