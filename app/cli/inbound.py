"""`kurir sources …` and `kurir inbound …`: configure partner callbacks, reconcile by hand."""

from __future__ import annotations

import click

from app.cli.common import cli_actor, fail, make_runtime
from app.errors import KurirError
from app.services import sources

# CLI option -> mapping field. A PATH of "none" switches the preset's field off.
_MAPPING_OPTIONS = (
    ("event_id", "--event-id"),
    ("event_type", "--event-type"),
    ("resource_id", "--resource-id"),
    ("resource_version", "--resource-version"),
    ("occurred_at", "--occurred-at"),
    ("status", "--status"),
    ("resource_type", "--resource-type"),
)


@click.group("sources")
def sources_group() -> None:
    """Inbound sources: partners whose signed callbacks Kurir receives."""


def _mapping_options(func: click.decorators.FC) -> click.decorators.FC:
    for field, flag in reversed(_MAPPING_OPTIONS):
        func = click.option(
            flag,
            field,
            metavar="PATH",
            default=None,
            help=f"Where {field} is: a JSON pointer (/data/id) or header:NAME; "
            "'none' switches the preset off.",
        )(func)
    return func


@sources_group.command("create")
@click.argument("name")
@click.option(
    "--scheme",
    required=True,
    type=click.Choice(sources.SCHEMES),
    help="How the partner signs its callbacks.",
)
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    required=True,
    help="Verification secret (repeatable: several are valid during a rotation; "
    "the first is the newest).",
)
@click.option(
    "--tolerance",
    type=int,
    default=None,
    help="Seconds a signed timestamp may be from now [KURIR_INBOUND_TOLERANCE_SECONDS,"
    " default 300].",
)
@_mapping_options
@click.option(
    "--reconcile-url",
    default=None,
    metavar="URL",
    help="Provider API answering GET URL?resource_id=… with {id, version, status}.",
)
@click.option(
    "--no-gaps",
    is_flag=True,
    help="Quarantine an event whose version skips one (default: gaps allowed).",
)
@click.option(
    "--handler",
    "handlers",
    multiple=True,
    metavar="NAME|PATH",
    help="Handler run for every applied event: a name registered in "
    "KURIR_INBOUND_HANDLERS, or package.module:function (repeatable).",
)
def sources_create(
    name: str,
    scheme: str,
    secrets: tuple[str, ...],
    tolerance: int | None,
    reconcile_url: str | None,
    no_gaps: bool,
    handlers: tuple[str, ...],
    **paths: str | None,
) -> None:
    """Create source NAME; callbacks are then accepted at POST /inbound/NAME."""
    mapping = {
        field: (None if value.lower() == "none" else value)
        for field, value in paths.items()
        if value is not None
    }
    runtime = make_runtime()
    body = {
        "name": name,
        "scheme": scheme,
        "secrets": list(secrets),
        "tolerance_s": tolerance,
        "mapping": mapping,
        "allow_gaps": not no_gaps,
        "handlers": list(handlers),
        "reconcile_url": reconcile_url,
    }
    try:
        with runtime.db.begin() as session:
            source = sources.create(session, runtime, cli_actor(), body)
            shown = sources.describe(source)
    except KurirError as exc:
        fail(exc.message)
    click.echo(
        f"created source {shown['name']} ({shown['id']}), scheme {shown['scheme']}, "
        f"{len(shown['secrets'])} secret(s), tolerance {shown['tolerance_s']} s"
    )
    for field, path in shown["mapping"].items():
        click.echo(f"  {field:<17} {path if path is not None else '-'}")
    click.echo(f"receive at: POST {shown['receive_path']}")


@sources_group.command("ls")
def sources_ls() -> None:
    """List the sources."""
    runtime = make_runtime()
    with runtime.db.begin() as session:
        rows = [sources.describe(s) for s in sources.every(session, cli_actor())]
    if not rows:
        click.echo("no sources")
        return
    click.echo(f"{'NAME':<24} {'SCHEME':<18} {'SECRETS':>7} {'TOL':>5} {'GAPS':<5} RECONCILE")
    for row in rows:
        active = sum(1 for s in row["secrets"] if s["active"])
        click.echo(
            f"{row['name']:<24} {row['scheme']:<18} {active:>7} {row['tolerance_s']:>5} "
            f"{'yes' if row['allow_gaps'] else 'no':<5} {row['reconcile_url'] or '-'}"
        )


@sources_group.command("add-secret")
@click.argument("name")
@click.option("--secret", required=True, help="The new secret.")
@click.option(
    "--rotate",
    is_flag=True,
    help="Retire the other secrets after KURIR_SECRET_ROTATION_OVERLAP_SECONDS.",
)
def sources_add_secret(name: str, secret: str, rotate: bool) -> None:
    """Add a verification secret to source NAME."""
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            sources.add_secret(session, runtime, cli_actor(), name, secret, rotate=rotate)
    except KurirError as exc:
        fail(exc.message)
    click.echo(
        f"added a secret to {name}" + (" (others retire after the overlap)" if rotate else "")
    )


@click.group("inbound")
def inbound_group() -> None:
    """Inbound processing: reconciliation with the providers' APIs."""


@inbound_group.command("reconcile")
@click.option("--source", "source_name", default=None, help="Only this source.")
def inbound_reconcile(source_name: str | None) -> None:
    """Pull the providers' current state now and apply it (sources with --reconcile-url)."""
    runtime = make_runtime()
    if source_name is not None:
        try:
            with runtime.db.begin() as session:
                if not sources.get(session, cli_actor(), source_name).reconcile_url:
                    fail(f"source {source_name!r} has no reconcile URL")
        except KurirError as exc:
            fail(exc.message)
    outcomes = sources.reconcile_now(runtime, cli_actor(), source_name=source_name)
    failed = 0
    for outcome in outcomes:
        line = f"{outcome.request_id}: {outcome.state}"
        if outcome.error:
            line += f" ({outcome.error})"
            failed += outcome.state == sources.RECONCILE_FAILED
        else:
            line += f", {outcome.applied} state(s) moved, {outcome.resolved} event(s) resolved"
        click.echo(line)
    click.echo(f"{len(outcomes)} reconcile request(s) run")
    if failed:
        raise SystemExit(1)


COMMANDS = (sources_group, inbound_group)
