"""The partner portal from the command line: withdraw a partner's access at once."""

from __future__ import annotations

import click

from app.cli.common import cli_actor, fail, make_runtime
from app.errors import KurirError
from app.services import portal


@click.group("portal")
def portal_group() -> None:
    """The partner portal (/portal) and its magic links."""


@portal_group.command("revoke")
@click.argument("uid")
def portal_revoke(uid: str) -> None:
    """End every portal session of partner UID and revoke its unused links.

    Takes effect at once in every API process; audited as `portal.revoked`.
    """
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            stopped = portal.revoke_partner(session, cli_actor(), uid)
    except KurirError as exc:
        fail(exc.message)
    click.echo(
        f"partner {uid}: {stopped.ended} portal session(s) ended, "
        f"{stopped.revoked} unused link(s) revoked"
    )


COMMANDS = (portal_group,)
