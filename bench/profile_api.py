"""Where an API request's CPU goes: py-spy samples `kurir api` under load, and every sampled
stack is put in one bucket (HTTP, Flask, auth, JSON, schema, SQL, enqueue, logging, ...).

    .venv/bin/python bench/profile_api.py [--path publish|inbound|both] [--seconds 20]
        [--clients 8] [--database-url postgresql://…/<own database>] [--redis-url redis://…/<db>]

py-spy (`pip install py-spy`; not a dependency of Kurir) records the API's worker processes
while `--clients` kept-alive connections publish (`POST /v1/partners/{uid}/events`, one
endpoint) or send signed callbacks (`POST /inbound/{source}`, Standard Webhooks). Only the
thread holding the GIL is sampled (`--gil`), so a sample is Python CPU, not a thread waiting
for PostgreSQL; granian's HTTP layer runs in Rust without the GIL and shows up as the part of
the server's CPU (psutil) that no sample covers. The script WIPES the database it is given.

Prints, per path: server CPU per request, the share of it each bucket took, and the twenty
functions with the most samples of their own.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from app.ports import free_port  # noqa: E402
from bench import inbound as inbound_bench  # noqa: E402
from bench import publish as publish_bench  # noqa: E402
from bench import rawhttp, wsgi_servers  # noqa: E402
from bench.fresh_db import fresh_database  # noqa: E402
from bench.support import api_env  # noqa: E402

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_profile_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/7"

# (bucket, pattern). What Kurir does goes by the stack: the first of these buckets any of
# whose frames matches, in this order (so JSON encoded for a bound parameter counts as JSON,
# not SQL, and a log call made from anywhere as logging).
WORK: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in [
        ("logging", r"/logging/|app/logs\.py"),
        ("telemetry (tracing off)", r"app/telemetry\.py|opentelemetry/"),
        ("auth (API key)", r"app/web/auth\.py|app/services/keys\.py"),
        ("idempotency", r"app/intake/idempotency\.py"),
        ("HMAC verification", r"app/inbound/verify\.py|app/inbound/sources\.py"),
        ("schema validation", r"jsonschema|fastjsonschema|app/event_types/schema\.py"),
        ("JSON parse", r"json/decoder|orjson|jsonstrict|loads \("),
        ("JSON dump", r"json/encoder|jsonify|dumps \(|payload_json"),
        ("enqueue (Redis)", r"app/queues\.py|sender/dispatch\.py|/redis/"),
        ("targets (cached plan inputs)", r"app/intake/targets\.py"),
        ("SQL: build + execute (SQLAlchemy, psycopg)", r"sqlalchemy/|psycopg"),
    ]
]
# The rest goes by the innermost frame that matches one of these: the frame doing the work
# (the keep-alive guard and Flask are on every stack, below the work).
LAYERS: list[tuple[str, re.Pattern[str]]] = [
    (name, re.compile(pattern))
    for name, pattern in [
        ("request body read", r"get_data \(|werkzeug/wsgi\.py|_get_stream|LimitedStream"),
        ("response building", r"make_response|wrappers/response\.py|sansio/response\.py"),
        ("envelope, plan, ids", r"app/intake/|app/ids\.py|app/clock\.py|app/inbound/"),
        ("keep-alive guard, environ", r"app/web/keepalive\.py|app/cli/http_servers\.py"),
        ("Flask/Werkzeug dispatch", r"flask/|werkzeug/"),
        ("granian's Python side", r"granian/"),
        ("bench's bare app", r"bench/"),
    ]
]
OTHER = "other"

# py-spy's raw format: `frame;frame;…;leaf count`, a frame `function (path:line)`.
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)$")


def bucket_of(frames: list[str]) -> str:
    """`frames` root first."""
    for name, pattern in WORK:
        if any(pattern.search(frame) for frame in frames):
            return name
    for frame in reversed(frames):
        for name, pattern in LAYERS:
            if pattern.search(frame):
                return name
    return OTHER


def short(frame: str) -> str:
    """`func (…/site-packages/pkg/mod.py:12)` → `pkg/mod.py:func`."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker.startswith("/lib/python3"):
                path = path.split("/", 1)[-1]
    return f"{path}:{match['func']}"


def analyse(raw: str) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """Samples in all, per bucket, and per leaf function (samples of its own)."""
    buckets: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        n = int(count)
        total += n
        buckets[bucket_of(frames)] += n
        leaves[short(frames[-1])] += n
    return total, buckets, leaves


def tree_cpu(pid: int) -> float:
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += sum(proc.cpu_times()[:2])
    return total


def load_until(stop: threading.Event, batches: Callable[[], list[bytes]], url: str, clients: int,
               done: list[int]) -> None:  # fmt: skip
    while not stop.is_set():
        _, statuses, _ = rawhttp.run_clients(url, batches(), clients)
        done.append(len(statuses))
        bad = [s for s in statuses if s not in (200, 202)]
        if bad:
            print(f"  (unexpected statuses: {collections.Counter(bad)})", flush=True)


def profile(
    label: str, url: str, batches: Callable[[], list[bytes]], api_pid: int, args: Any
) -> dict[str, Any]:
    """Warm up, then sample the API for `args.seconds` under `args.clients` connections."""
    rawhttp.run_clients(url, batches()[:400], args.clients)
    stop, done = threading.Event(), []
    loader = threading.Thread(
        target=load_until, args=(stop, batches, url, args.clients, done), daemon=True
    )
    out = Path(tempfile.mkdtemp()) / "stacks.txt"
    loader.start()
    time.sleep(0.5)
    cpu_before = tree_cpu(api_pid)
    spy = subprocess.run(
        [args.py_spy, "record", "--pid", str(api_pid), "--subprocesses", "--gil",
         "--nonblocking", "--rate", str(args.rate), "--duration", str(args.seconds),
         "--format", "raw", "--output", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    cpu_seconds = tree_cpu(api_pid) - cpu_before
    stop.set()
    loader.join()
    if spy.returncode != 0 or not out.exists():
        raise SystemExit(f"py-spy failed: {spy.stderr.strip()[-400:]}")
    total, buckets, leaves = analyse(out.read_text())
    return {
        "label": label,
        "samples": total,
        "buckets": buckets,
        "leaves": leaves,
        "cpu_seconds": cpu_seconds,
    }


def measure_cpu(url: str, batches: Callable[[], list[bytes]], api_pid: int, clients: int,
                rounds: int = 2) -> tuple[float, float]:  # fmt: skip
    """Server CPU ms per request and requests/s without the profiler attached."""
    cpu, n, seconds = 0.0, 0, 0.0
    for _ in range(rounds):
        batch = batches()
        before = tree_cpu(api_pid)
        _, statuses, elapsed = rawhttp.run_clients(url, batch, clients)
        cpu += tree_cpu(api_pid) - before
        n += len(statuses)
        seconds += elapsed
    return cpu * 1000 / n, n / seconds


def report(result: dict[str, Any], cpu_ms: float, rate: float, hz: int) -> str:
    """A Markdown table of buckets (ms per request, share) and the top-20 own-time functions.

    Python's part of a request's CPU is the GIL samples' seconds over the server's CPU
    seconds in the same window; the rest of the server's CPU ran without the GIL.
    """
    total = result["samples"] or 1
    python_share = min(1.0, result["samples"] / hz / max(1e-9, result["cpu_seconds"]))
    python_ms = cpu_ms * python_share
    lines = [
        f"### {result['label']}",
        "",
        f"server CPU {cpu_ms:.2f} ms per request at {rate:,.0f}/s (profiler detached); "
        f"{result['samples']:,} GIL samples at {hz} Hz, {python_share:.0%} of the server's CPU "
        "in the same seconds",
        "",
        "| bucket | share of Python samples | ms per request (approx.) |",
        "|---|---|---|",
    ]
    for name, n in result["buckets"].most_common():
        lines.append(f"| {name} | {n / total:.1%} | {python_ms * n / total:.3f} |")
    lines.append(
        f"| *not under the GIL (granian's Rust HTTP layer, C without the GIL)* | — | "
        f"{max(0.0, cpu_ms - python_ms):.3f} |"
    )
    lines += ["", "| # | function (own samples) | share |", "|---|---|---|"]
    for i, (name, n) in enumerate(result["leaves"].most_common(20), 1):
        lines.append(f"| {i} | `{name}` | {n / total:.1%} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the two paths


@contextmanager
def kurir_api(env: dict[str, str], workers: int, threads: int) -> Iterator[tuple[str, int]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "app.cli", "api", "--port", str(port),
               "--workers", str(workers), "--threads", str(threads)]  # fmt: skip
    with publish_bench.server(command, env, f"{base}/readyz") as process:
        yield base, process.pid


def publish_path(args: Any, env: dict[str, str]) -> list[tuple[dict[str, Any], float, float]]:
    """Kurir's publish, then the bare Flask insert of bench/publish.py (same server, workers,
    bodies): what the same profile looks like for the ceiling."""
    fresh_database(args.database_url)
    token = publish_bench.create_token(args.database_url)
    results = []
    with kurir_api(env, args.workers, args.threads) as (base, pid):
        api = publish_bench.Api(base, token)
        type_name, one, _ = publish_bench.run_endpoint_setup(api, str(int(time.time())), 1)
        url = f"{base}/v1/partners/{one}/events"
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        bodies = [publish_bench.body_for(i, type_name) for i in range(args.batch)]
        prebuilt = [rawhttp.request_bytes(url, body, headers) for body in bodies]
        result = profile("publish, one endpoint", url, lambda: prebuilt, pid, args)
        results.append((result, *measure_cpu(url, lambda: prebuilt, pid, args.clients)))
    port = free_port()
    bare_env = dict(
        env,
        BARE_DATABASE_URL=args.database_url,
        BARE_PARTNER_ID=publish_bench.partner_id_of(args.database_url, one),
    )
    command = wsgi_servers.command(
        "granian", "bench.publish:bare_app", port, args.workers, args.threads
    )
    url = f"http://127.0.0.1:{port}/bare/events"
    with publish_bench.server(command, bare_env, f"http://127.0.0.1:{port}/") as process:
        headers = {"Content-Type": "application/json"}
        prebuilt = [rawhttp.request_bytes(url, body, headers) for body in bodies]
        result = profile("bare Flask insert (bench/publish.py)", url, lambda: prebuilt,
                         process.pid, args)  # fmt: skip
        results.append((result, *measure_cpu(url, lambda: prebuilt, process.pid, args.clients)))
    return results


def inbound_path(args: Any, env: dict[str, str]) -> list[tuple[dict[str, Any], float, float]]:
    from app.inbound.verify import standard_webhooks_key

    db = inbound_bench.prepare(args.database_url, args.redis_url)
    db.dispose()
    key = standard_webhooks_key(inbound_bench.SECRET)
    seed = [int(time.time())]

    def batch() -> list[bytes]:
        # Fresh event ids every time: a repeated one is a duplicate (200), another path.
        seed[0] += 1
        callbacks = inbound_bench.make_callbacks(args.batch, 500, seed[0])
        return [
            rawhttp.request_bytes(url, cb.body, inbound_bench.signed_headers(cb, key))
            for cb in callbacks
        ]

    with kurir_api(env, args.workers, args.threads) as (base, pid):
        url = f"{base}/inbound/{inbound_bench.SOURCE}"
        result = profile("inbound callback (Standard Webhooks)", url, batch, pid, args)
        return [(result, *measure_cpu(url, batch, pid, args.clients))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", choices=["publish", "inbound", "both"], default="both")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2000, help="requests per load round")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument(
        "--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    )
    args = parser.parse_args(argv)
    env = api_env(args.database_url, args.redis_url)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    paths = ["publish", "inbound"] if args.path == "both" else [args.path]
    for path in paths:
        run = publish_path if path == "publish" else inbound_path
        for result, cpu_ms, rate in run(args, env):
            print(report(result, cpu_ms, rate, args.rate) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
