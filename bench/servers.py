"""The HTTP server under `kurir api`, chosen by measurement: gunicorn (sync, gthread) and granian.

    .venv/bin/python bench/servers.py [-n 2000] [--rounds 2] [--servers gthread,granian,sync]

The script owns BENCH_DATABASE_URL (default: the `kurir_servers_bench` database, which it
WIPES and migrates) and, for each server, starts three apps under it with the same worker
and thread counts as `kurir api` (2 × 8 by default):

  hello   a plain WSGI function that reads the body and answers 202: the server's own cost;
  bare    bench/publish.py's bare Flask endpoint (parse the body, INSERT one events row);
  kurir   `kurir api --server …` publishing to a partner with one endpoint (gunicorn sync
          serves `app.web:create_app()` through gunicorn's own command line: `kurir api`
          does not offer it).

Then, with 1 and with 8 clients (one kept-alive connection each, prebuilt requests), it
sends N requests to every app under every server, in turns (round after round, the server
order rotating), so that a noisy neighbour hits all of them alike; the median round is kept.
Each line: requests/s, server CPU per request (the server's process tree, psutil), p50, p99,
and the server's memory after the runs (RSS and USS summed over its processes).

gunicorn sync runs `--sync-workers` processes (default 2 × CPUs + 1, gunicorn's own advice)
of one thread each, and closes every connection after its answer (it has no keep-alive).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.ports import free_port  # noqa: E402
from bench import publish, wsgi_servers  # noqa: E402
from bench.fresh_db import fresh_database  # noqa: E402
from bench.support import api_env  # noqa: E402

try:
    import psutil
except ImportError:  # a dev dependency; without it no CPU or memory figures
    psutil = None

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_servers_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/3"
SERVERS = ("gthread", "granian", "sync")
APPS = ("hello", "bare", "kurir")
JSON = "application/json"


def hello_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """The server's own cost: read the body, answer 202 with a small JSON body."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    body = b'{"id":"evt_hello"}'
    start_response("202 Accepted", [("Content-Type", JSON), ("Content-Length", str(len(body)))])
    return [body]


def hello_factory() -> Any:
    """For `granian --factory` and gunicorn's `module:factory()`."""
    return hello_app


# ---------------------------------------------------------------------------- servers


@dataclass
class Running:
    server: str
    app: str
    url: str
    pid: int


def _command(server: str, app: str, port: int, args: argparse.Namespace, python: str) -> list[str]:
    """The command line that serves `app` under `server` on `port`."""
    if app == "kurir" and server != "sync":
        return [python, "-m", "app.cli", "api", "--server", wsgi_servers.KURIR_NAMES[server],
                "--port", str(port), "--workers", str(args.workers),
                "--threads", str(args.threads)]  # fmt: skip
    target = {
        "hello": "bench.servers:hello_factory",
        "bare": "bench.publish:bare_app",
        "kurir": "app.web:create_app",
    }[app]
    return wsgi_servers.command(
        server, target, port, args.workers, args.threads, sync_workers=args.sync_workers
    )


@contextmanager
def serve_all(
    args: argparse.Namespace, env: dict[str, str], partner_id: str
) -> Iterator[list[Running]]:
    """Every app under every server, all at once (idle ones cost next to nothing)."""
    python = sys.executable
    app_env = dict(env, BARE_DATABASE_URL=args.database_url, BARE_PARTNER_ID=partner_id)
    with contextlib.ExitStack() as stack:
        running = []
        for server in args.servers:
            for app in args.apps:
                port = free_port()
                process = stack.enter_context(
                    publish.server(
                        _command(server, app, port, args, python),
                        app_env,
                        f"http://127.0.0.1:{port}/healthz",
                    )
                )
                running.append(Running(server, app, f"http://127.0.0.1:{port}", process.pid))
        yield running


def memory_mb(pid: int) -> dict[str, float]:
    """RSS and USS (what the tree alone holds, shared pages not counted twice) in MB."""
    if psutil is None:
        return {}
    rss = uss = 0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                info = proc.memory_full_info()
                rss += info.rss
                uss += info.uss
    return {"rss_mb": round(rss / 2**20, 1), "uss_mb": round(uss / 2**20, 1)}


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--requests", type=int, default=2000)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--sync-workers", type=int, default=2 * (os.cpu_count() or 1) + 1)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    args.servers = [s for s in args.servers.split(",") if s]
    args.apps = [a for a in args.apps.split(",") if a]
    clients = [int(c) for c in args.clients.split(",")]
    unknown = set(args.servers) - set(SERVERS) | set(args.apps) - set(APPS)
    if unknown:
        raise SystemExit(f"bench: unknown {', '.join(sorted(unknown))}")

    env = api_env(args.database_url, args.redis_url)
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.workers} workers "
        f"x {args.threads} threads (sync: {args.sync_workers} workers); "
        f"servers {', '.join(args.servers)}; apps {', '.join(args.apps)}",
        flush=True,
    )
    print(f"preparing {args.database_url} (wiped and migrated) ...", flush=True)
    fresh_database(args.database_url)
    token = publish.create_token(args.database_url)
    run = str(int(time.time()))
    database = args.database_url.rsplit("/", 1)[-1]
    kurir_headers = {"Authorization": f"Bearer {token}", "Content-Type": JSON}
    figures: dict[str, Any] = {
        "requests": args.requests,
        "workers": args.workers,
        "threads": args.threads,
        "sync_workers": args.sync_workers,
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "results": {},
    }

    # The partner and event type exist before any server starts: the bare app needs the id.
    with publish.server(
        [sys.executable, "-m", "app.cli", "api", "--port", str(port := free_port())],
        env,
        f"http://127.0.0.1:{port}/healthz",
    ):
        setup = publish.Api(f"http://127.0.0.1:{port}", token)
        type_name, one, _ = publish.run_endpoint_setup(setup, run, fanout=0)
    partner_id = publish.partner_id_of(args.database_url, one)

    def path_of(app: str) -> tuple[str, dict[str, str]]:
        if app == "kurir":
            return f"/v1/partners/{one}/events", kurir_headers
        return ("/bare/events" if app == "bare" else "/hello"), {"Content-Type": JSON}

    rounds: dict[tuple[str, str, int], list[publish.Result]] = {}
    memory: dict[tuple[str, str], dict[str, float]] = {}
    with serve_all(args, env, partner_id) as running:
        warm = [publish.body_for(i, type_name) for i in range(300)]
        for target in running:
            path, headers = path_of(target.app)
            publish.closed_loop("warm-up", target.url + path, headers, warm, 8)
        bodies = [publish.body_for(i, type_name) for i in range(args.requests)]
        for r in range(args.rounds):
            for c in clients:
                for app in args.apps:
                    order = [t for t in running if t.app == app]
                    order = order[r % len(order) :] + order[: r % len(order)]
                    for target in order:
                        path, headers = path_of(app)
                        meter = publish.CpuMeter(target.pid, database)
                        label = f"{app} under {target.server}, {c} client(s)"
                        result = publish.measured(
                            meter,
                            lambda t=target, p=path, h=headers, c=c, label=label: (
                                publish.closed_loop(label, t.url + p, h, bodies, c)
                            ),
                        )
                        _show(result)
                        rounds.setdefault((app, target.server, c), []).append(result)
        for target in running:
            memory[(target.app, target.server)] = memory_mb(target.pid)

    print("\nmedian of rounds (server CPU ms per request; memory after the runs)")
    header = f"{'app':<6} {'server':<8} {'clients':>7} {'req/s':>7} {'cpu ms':>7} " + (
        f"{'p50 ms':>7} {'p99 ms':>7} {'rss MB':>7} {'uss MB':>7} {'errors':>6}"
    )
    print(header)
    for (app, server, c), results in rounds.items():
        median = sorted(results, key=lambda x: x.rate)[len(results) // 2]
        cpu = statistics.median(
            x.cpu_ms["server"] for x in results if x.cpu_ms
        ) if all(x.cpu_ms for x in results) else float("nan")  # fmt: skip
        mem = memory.get((app, server), {})
        errors = sum(x.errors for x in results)
        print(
            f"{app:<6} {server:<8} {c:>7} {median.rate:>7.0f} {cpu:>7.2f} "
            f"{median.pct(50):>7.1f} {median.pct(99):>7.1f} "
            f"{mem.get('rss_mb', float('nan')):>7.0f} {mem.get('uss_mb', float('nan')):>7.0f} "
            f"{errors:>6}"
        )
        figures["results"][f"{app} {server} {c}"] = {
            "rate": round(median.rate, 1),
            "rates": [round(x.rate, 1) for x in results],
            "server_cpu_ms": round(cpu, 3),
            "server_cpu_ms_rounds": [round(x.cpu_ms["server"], 3) for x in results if x.cpu_ms],
            "p50_ms": round(median.pct(50), 2),
            "p99_ms": round(median.pct(99), 2),
            "errors": errors,
            **mem,
        }
    figures["load_average_after"] = os.getloadavg()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2))
    failed = [key for key, value in figures["results"].items() if value["errors"]]
    if failed:
        print("some requests failed:", ", ".join(failed))
    return 1 if failed else 0


def _show(result: publish.Result) -> None:
    server_cpu = f"  server {result.cpu_ms['server']:.2f} ms CPU" if result.cpu_ms else ""
    print(f"  {result.line()}{server_cpu}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
