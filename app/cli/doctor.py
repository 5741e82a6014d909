"""`kurir doctor`: does a fleet of this size fit the servers' connection limits?"""

from __future__ import annotations

import json
import sys

import click

from app import doctor
from app.budget import ProcessKind
from app.cli.common import make_runtime


@click.command("doctor")
@click.option("--api", "apis", default=2, show_default=True, help="`kurir api` processes.")
@click.option("--workers", default=4, show_default=True, help="`kurir worker` processes.")
@click.option("--schedulers", default=2, show_default=True, help="`kurir scheduler` processes.")
@click.option(
    "--cli", "clis", default=1, show_default=True, help="commands run beside them (this one)."
)
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
def doctor_command(apis: int, workers: int, schedulers: int, clis: int, as_json: bool) -> None:
    """Each process kind's PostgreSQL and Redis connections, the fleet's total against
    PostgreSQL's max_connections and Redis's maxclients. Exits 1 when the fleet needs more
    than a server allows, 2 when a store does not answer."""
    for name, value in (("--api", apis), ("--workers", workers), ("--schedulers", schedulers)):
        if value < 0:
            raise click.BadParameter("must be 0 or more", param_hint=name)
    settings = make_runtime().settings
    counts = {
        ProcessKind.API: apis,
        ProcessKind.WORKER: workers,
        ProcessKind.SCHEDULER: schedulers,
        ProcessKind.CLI: max(clis, 0),
    }
    report = doctor.check(settings, counts)
    if as_json:
        click.echo(json.dumps(report.as_json()))
    else:
        _print(report)
    sys.exit(report.exit_code)


def _print(report: doctor.Report) -> None:
    pg_now = report.postgres.in_use if report.postgres else {}
    redis_now = report.redis.in_use if report.redis else {}
    click.echo(
        f"{'kind':<10} {'count':>5} {'PG each':>9} {'PG':>5} {'Redis each':>11} {'Redis':>6}"
        f" {'now PG':>7} {'now Redis':>10}"
    )
    for line in report.fleet.lines:
        budget = line.budget
        times = f"{budget.processes}×" if budget.processes > 1 else ""
        kind = budget.kind.value
        click.echo(
            f"{kind:<10} {line.count:>5} {times + str(budget.postgres):>9} {line.postgres:>5}"
            f" {times + str(budget.redis):>11} {line.redis:>6}"
            f" {pg_now.get(kind, 0):>7} {redis_now.get(kind, 0):>10}"
        )
    click.echo(
        f"{'fleet':<10} {'':>5} {'':>9} {report.fleet.postgres:>5} {'':>11} {report.fleet.redis:>6}"
    )
    if report.sqlite:
        click.echo("PostgreSQL: not used (SQLite has no connection limit)")
    elif report.postgres is not None:
        pg = report.postgres
        verdict = (
            "OVER BUDGET"
            if report.postgres_over
            else f"fits, {pg.room - report.fleet.postgres} spare"
        )
        click.echo(
            f"PostgreSQL: {report.fleet.postgres} of {pg.room} (max_connections "
            f"{pg.max_connections} less {pg.reserved} reserved): {verdict}"
        )
    if report.redis is not None:
        r = report.redis
        verdict = (
            "OVER BUDGET"
            if report.redis_over
            else f"fits, {r.maxclients - report.fleet.redis} spare"
        )
        click.echo(f"Redis: {report.fleet.redis} of {r.maxclients} (maxclients): {verdict}")
    for problem in report.unreachable:
        click.echo(f"kurir: {problem}", err=True)


COMMANDS = (doctor_command,)
