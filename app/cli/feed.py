"""`kurir feed UID`: read a partner's feed from a terminal — one envelope per line — and, for
a pull endpoint, acknowledge what was printed."""

from __future__ import annotations

import time

import click

from app.cli.common import cli_actor, fail, make_runtime
from app.errors import KurirError
from app.services import feed


@click.command("feed")
@click.argument("uid")
@click.option(
    "--endpoint",
    default=None,
    metavar="ID",
    help="As this endpoint receives it (subscription, version pins); a pull "
    "endpoint starts after its last acknowledgement.",
)
@click.option("--after", default=None, metavar="CURSOR", help="Continue from a cursor.")
@click.option(
    "--limit", default=250, show_default=True, type=click.IntRange(1, 250), help="Events per page."
)
@click.option("--follow", is_flag=True, help="Keep polling (every --interval) until Ctrl-C.")
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.05),
    help="Seconds between polls when nothing is new (with --follow).",
)
@click.option(
    "--ack", is_flag=True, help="Acknowledge each page once printed (a pull --endpoint only)."
)
@click.option(
    "--skip-expired",
    is_flag=True,
    help="First move the pull --endpoint past its unacknowledged events older than "
    "the retention period (after a backlog_expired refusal); audited.",
)
def feed_command(
    uid: str,
    endpoint: str | None,
    after: str | None,
    limit: int,
    follow: bool,
    interval: float,
    ack: bool,
    skip_expired: bool,
) -> None:
    """Print partner UID's events in commit order, one JSON envelope per line (exactly the
    body a push carries); the cursor to continue from goes to stderr."""
    if (ack or skip_expired) and endpoint is None:
        fail("--ack and --skip-expired need --endpoint (a pull endpoint)", 2)
    runtime = make_runtime()
    actor = cli_actor()
    cursor = after
    try:
        if skip_expired and endpoint is not None:
            with runtime.db.begin() as session:
                gone = feed.skip_expired(session, runtime.settings, actor, uid, endpoint).backlog
            click.echo(
                "nothing past retention to skip"
                if gone is None
                else f"skipped {gone.skipped} event(s) past retention, the oldest "
                f"{gone.oldest_event}",
                err=True,
            )
        while True:
            page = feed.read(runtime, actor, uid, after=cursor, limit=limit, endpoint_id=endpoint)
            for payload in page.payloads:
                click.echo(payload)
            cursor = page.next_cursor
            if ack and page.payloads and endpoint is not None:
                with runtime.db.begin() as session:
                    feed.ack(session, runtime.settings, actor, uid, endpoint, {"cursor": cursor})
            if len(page.payloads) == limit:
                continue
            if not follow:
                break
            time.sleep(interval)
    except KurirError as exc:
        fail(f"{exc.message} ({exc.code})", 2)
    except KeyboardInterrupt:
        pass
    finally:
        runtime.close()
    click.echo(f"next cursor: {cursor}", err=True)


COMMANDS = [feed_command]
