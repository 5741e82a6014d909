"""`kurir dlq`: dead letters for operators without a browser — list, resend, discard."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import click

from app.cli.common import cli_actor, fail, make_runtime
from app.clock import isoformat
from app.errors import KurirError
from app.models import DL_STATES
from app.runtime import Runtime
from app.services import dead_letters
from app.services.actor import Actor
from app.vocabulary import ResendSkip

FILTER_OPTIONS: list[tuple[str, str, str]] = [
    ("--partner", "partner", "partner uid"),
    ("--endpoint", "endpoint", "endpoint id"),
    ("--type", "type", "event type name"),
    ("--reason", "reason", "retries_exhausted, endpoint_disabled, blocked_address, ..."),
    ("--status-code", "status_code", "last HTTP status, or 'none' for no answer"),
    ("--error", "error", "text in the last error"),
    ("--q", "q", "words in the payload"),
    ("--since", "since", "created at or after (RFC 3339)"),
    ("--until", "until", "created before (RFC 3339)"),
]


def filter_options(with_state: bool) -> Callable[[Any], Any]:
    def decorate(func: Any) -> Any:
        if with_state:
            func = click.option(
                "--state", type=click.Choice(DL_STATES), help="open, resent or discarded"
            )(func)
        for flag, dest, help_text in reversed(FILTER_OPTIONS):
            func = click.option(flag, dest, default=None, help=help_text)(func)
        return func

    return decorate


def _filter(values: dict[str, Any]) -> dead_letters.DeadLetterFilter:
    """The filter the options give, all of it or nothing: a value that does not parse stops
    the command rather than widening it."""
    form = dead_letters.parse_filter(
        {k: v for k, v in values.items() if v is not None}, strict=True
    )
    if not form.valid:
        for name, message in form.errors.items():
            click.echo(f"kurir: --{name.replace('_', '-')}: {message}", err=True)
        fail("the filter is not valid; nothing was done", 2)
    return form.filter


@click.group("dlq")
def dlq_group() -> None:
    """Dead letters: list, resend, discard."""


@dlq_group.command("ls")
@filter_options(with_state=True)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 250))
@click.option("--cursor", default=None, help="Continue from a previous page.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def dlq_ls(limit: int, cursor: str | None, as_json: bool, **values: Any) -> None:
    """List dead letters, newest first."""
    flt = _filter(values)
    runtime = make_runtime()
    try:
        with runtime.db.begin() as session:
            page = dead_letters.page(
                session, cli_actor(), flt, limit=limit, cursor=cursor, options=()
            )
            rows: list[dict[str, Any]] = [
                {
                    "id": dl.id,
                    "created_at": isoformat(dl.created_at),
                    "partner": page.partner_uids.get(dl.partner_id, ""),
                    "endpoint": dl.endpoint_id,
                    "event": dl.event_id,
                    "type": dl.event_type,
                    "reason": dl.reason,
                    "last_status_code": dl.last_status_code,
                    "last_error": dl.last_error,
                    "state": dl.state,
                }
                for dl in page.letters
            ]
    except KurirError as exc:
        fail(exc.message, 2)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no dead letters match" + ("" if flt.is_empty() else " this filter"))
        return
    header = ("ID", "CREATED", "PARTNER", "TYPE", "REASON", "STATUS", "ERROR", "STATE")
    table: list[tuple[str, ...]] = [header] + [
        (
            r["id"],
            r["created_at"] or "",
            r["partner"],
            r["type"],
            r["reason"],
            str(r["last_status_code"] or "-"),
            (r["last_error"] or "-")[:40],
            r["state"],
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}")


def _resend_ids(
    runtime: Runtime, ids: list[str], *, actor: Actor, force: bool
) -> tuple[list[str], list[str], dict[str, str]]:
    """Resend the named letters in pages small enough to be done at once, keeping each id's
    outcome for the report (a background job only counts skips by reason); returns the job
    ids, the letters resent and why the others were not."""
    jobs: list[str] = []
    resent: list[str] = []
    skipped: dict[str, str] = {}
    with click.progressbar(
        length=len(ids), label="resending", show_pos=True, file=sys.stderr
    ) as bar:
        for start in range(0, len(ids), dead_letters.inline_limit()):
            page = ids[start : start + dead_letters.inline_limit()]
            with runtime.db.begin() as session:
                outcome = dead_letters.resend_ids(session, runtime, actor, page, force=force)
                jobs.append(outcome.job.id)
            resent += outcome.resent
            skipped.update(outcome.skipped)
            bar.update(len(page))
    return jobs, resent, skipped


def _summary(done: int, total: int, job_id: str, skipped: Mapping[str, int]) -> None:
    click.echo(f"resent {done} of {total} (job {job_id})")
    if skipped:
        click.echo(
            "skipped: " + ", ".join(f"{reason} {n}" for reason, n in sorted(skipped.items()))
        )
        if skipped.get(ResendSkip.ENDPOINT_DISABLED):
            click.echo("hint: enable the endpoint first, or pass --force")


@dlq_group.command("resend")
@click.option("--id", "ids", multiple=True, help="A dead letter id (repeatable).")
@filter_options(with_state=False)
@click.option("--all", "all_open", is_flag=True, help="Resend every open dead letter.")
@click.option("--force", is_flag=True, help="Resend even to disabled endpoints.")
@click.option(
    "--actor",
    default=None,
    help="Name recorded in the audit trail as cli:<name> (default: your user).",
)
def dlq_resend(
    ids: tuple[str, ...], all_open: bool, force: bool, actor: str | None, **values: Any
) -> None:
    """Resend dead letters by id, or every open one matching the filters, with progress.

    Exits 1 when a letter named with --id was not resent; a filter that skips some of the
    letters it matches (e.g. disabled endpoints) still exits 0.
    """
    flt = _filter(values)
    if ids and not flt.is_empty():
        fail("give either --id or filters, not both", 2)
    if not ids and flt.is_empty() and not all_open:
        fail("nothing selected: give --id, filters, or --all to resend every open letter", 2)
    who = cli_actor(actor)
    runtime = make_runtime()
    if ids:
        wanted = list(dict.fromkeys(i.strip() for i in ids if i.strip()))
        if not wanted:
            fail("--id must not be empty", 2)
        try:
            jobs, resent, skipped = _resend_ids(runtime, wanted, actor=who, force=force)
        except KurirError as exc:
            fail(exc.message, 2)
        for letter_id in resent:
            click.echo(f"resent {letter_id}")
        for letter_id, reason in skipped.items():
            click.echo(f"kurir: {letter_id}: not resent: {reason}", err=True)
        _summary(len(resent), len(wanted), ", ".join(jobs), Counter(skipped.values()))
        if skipped:
            raise SystemExit(1)
        return
    try:
        with runtime.db.begin() as session:
            job = dead_letters.resend_matching(
                session,
                runtime,
                who,
                dead_letters.FilterForm(flt),
                everything=all_open,
                force=force,
                enqueue=False,
            )
            job_id, total = job.id, job.total
        if total == 0:
            click.echo("no open dead letters match")
        with click.progressbar(
            length=total, label="resending", show_pos=True, file=sys.stderr
        ) as bar:
            job = dead_letters.run_resend_job(runtime, job_id, progress=bar.update)
    except KurirError as exc:
        fail(exc.message, 2)
    _summary(job.done, job.total, job.id, job.params.get("skipped") or {})


@dlq_group.command("discard")
@click.option("--id", "ids", multiple=True, required=True, help="A dead letter id (repeatable).")
@click.option("--note", default=None, help="Why it will never be resent.")
@click.option(
    "--actor",
    default=None,
    help="Name recorded in the audit trail as cli:<name> (default: your user).",
)
def dlq_discard(ids: tuple[str, ...], note: str | None, actor: str | None) -> None:
    """Discard dead letters: they stay searchable but will not be resent."""
    who = cli_actor(actor)
    runtime = make_runtime()
    failed = 0
    for letter_id in ids:
        try:
            with runtime.db.begin() as session:
                dead_letters.discard(session, who, letter_id, note=note, rt=runtime)
            click.echo(f"discarded {letter_id}")
        except KurirError as exc:
            failed += 1
            click.echo(f"kurir: {letter_id}: {exc.message}", err=True)
    if failed:
        raise SystemExit(1)


COMMANDS = (dlq_group,)
