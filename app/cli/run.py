"""Process commands: `up` for a laptop, `api`/`worker`/`scheduler` one process each."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import time
from types import FrameType

import click

from app import __version__, migrate
from app.budget import ProcessKind
from app.cli.common import cli_actor, fail, make_runtime
from app.config import HTTP_SERVERS
from app.embedded_redis import EmbeddedRedis, EmbeddedRedisError, die_with_parent
from app.services import keys

CHILD_STOP_TIMEOUT_S = 15.0


@click.command("api")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option(
    "--server",
    type=click.Choice(HTTP_SERVERS),
    default=None,
    help="the HTTP server [KURIR_HTTP_SERVER, default granian]",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="server worker processes [KURIR_API_WORKERS, default 2]",
)
@click.option(
    "--threads", type=int, default=None, help="threads per worker [KURIR_API_THREADS, default 8]"
)
def api_command(
    host: str, port: int, server: str | None, workers: int | None, threads: int | None
) -> None:
    """Serve the REST API, UI and inbound receiver (gunicorn or granian)."""
    from app.cli import http_servers

    settings = make_runtime().settings
    chosen = server or settings.http_server
    problem = http_servers.missing(chosen)
    if problem:
        fail(problem)
    http_servers.serve(
        chosen,
        settings,
        host,
        port,
        workers or settings.api_workers,
        threads or settings.api_threads,
    )


@click.command("worker")
@click.option("--burst", is_flag=True, help="Exit when the queues are empty.")
def worker_command(burst: bool) -> None:
    """Run an RQ worker for deliveries and inbound processing (as many as you like)."""
    from app.processes.worker import run_worker

    runtime = make_runtime(ProcessKind.WORKER)
    gc.freeze()  # as in `kurir api`: full collections skip what lives as long as the process
    run_worker(runtime, burst=burst)


@click.command("scheduler")
def scheduler_command() -> None:
    """Run the periodic jobs: sweeper, reconciliation, retention (one per node; one is active)."""
    from app.processes.scheduler import run_scheduler

    run_scheduler(make_runtime(ProcessKind.SCHEDULER))


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )  # noqa: PLW1509


def _stop_all(children: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in children.values():
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + CHILD_STOP_TIMEOUT_S
    for name, process in children.items():
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            click.echo(f"kurir: {name} did not stop in time, killing it", err=True)
            process.kill()
            process.wait()


@click.command("up")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=int,
    help="How many `kurir worker` processes to run.",
)
def up_command(host: str, port: int, workers: int) -> None:
    """Migrate, then run api + worker(s) + scheduler until Ctrl-C."""
    runtime = make_runtime()
    settings = runtime.settings
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.resolved_database_url)
    runtime.secret_box  # noqa: B018 - creates the dev key once, before children race for it
    env = dict(os.environ)
    env["KURIR_DATA_DIR"] = str(settings.data_dir.resolve())
    env["DATABASE_URL"] = settings.resolved_database_url
    embedded: EmbeddedRedis | None = None
    if not settings.redis_url:
        embedded = EmbeddedRedis(settings.data_dir)
        try:
            env["REDIS_URL"] = embedded.start()
        except EmbeddedRedisError as exc:
            fail(str(exc))
    with runtime.db.begin() as session:
        has_keys = keys.any_exist(session, cli_actor())

    stopping = False

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    children: dict[str, subprocess.Popen[bytes]] = {
        "api": _spawn(["api", "--host", host, "--port", str(port)], env),
        "scheduler": _spawn(["scheduler"], env),
    }
    for n in range(workers):
        children[f"worker-{n + 1}"] = _spawn(["worker"], env)

    url = f"http://{host}:{port}"
    click.echo(f"Kurir {__version__} is up: {url}  (UI: {url}/ui, health: {url}/readyz)")
    click.echo(f"  database: {_redact(settings.resolved_database_url)}")
    redis_url = env["REDIS_URL"] if embedded else settings.resolved_redis_url
    click.echo(f"  redis:    {'embedded ' if embedded else ''}{_redact(redis_url)}")
    if not has_keys:
        click.echo("First run: create an API key with")
        click.echo("  kurir keys create --name my-service")
        click.echo("and an operator for the UI with")
        click.echo("  kurir operators create --email you@example.com")
    click.echo("Press Ctrl-C to stop.")
    exit_code = 0
    try:
        while not stopping:
            for name, process in children.items():
                if process.poll() is not None:
                    click.echo(
                        f"kurir: {name} exited with {process.returncode}; stopping", err=True
                    )
                    stopping = True
                    exit_code = 1
                    break
            time.sleep(0.2)
    finally:
        click.echo("Stopping Kurir...")
        _stop_all(children)
        if embedded is not None:
            embedded.stop()
        runtime.close()
    click.echo("Kurir stopped.")
    sys.exit(exit_code)


def _redact(url: str) -> str:
    """Hide a password in a URL before printing it."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        if ":" in creds:
            return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url


COMMANDS = (up_command, api_command, worker_command, scheduler_command)
