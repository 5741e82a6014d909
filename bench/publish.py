"""Publish throughput and latency of `kurir api` (PostgreSQL), against a bare ceiling.

    .venv/bin/python bench/publish.py [-n 5000] [--workers 2] [--threads 8] [--server S]
    .venv/bin/python bench/publish.py --url http://127.0.0.1:8080 --token kurir_... [...]

Without --url the script owns BENCH_DATABASE_URL (default: the `kurir_publish_bench`
database, which it WIPES and migrates) and starts two servers under the same HTTP server
(--server: `kurir api`'s default, granian, or gunicorn) with the same worker count:
`kurir api`, and a bare Flask app whose one endpoint parses the same JSON body and INSERTs
the same `events` row — the ceiling for a Python publish endpoint on this machine.
bench/servers.py compares the servers themselves.
Endpoints point at 127.0.0.1 (KURIR_ALLOW_PRIVATE_TARGETS=1); nothing needs to receive them,
and no worker runs: the deliveries simply stay queued.

It measures, in one run (issue 3, item 9):
  1. N publishes with 1 and with 8 concurrent clients (threads, one kept-alive connection
     each, prebuilt requests: bench/rawhttp.py): events/s, p50, p99 — for Kurir and for the
     bare endpoint;
  2. p50/p99 at a paced 500 events/s (open loop: latency counted from the scheduled send time);
  3. publishing one event to a partner with 1,000 subscribed endpoints;
  4. the same, version 3 published to 1,000 endpoints pinned over 3 versions (a third each on
     v1, v2 and v3): every publish makes v2 and v1 through the chain of downgrades, validates
     them and stores each once;
  5. publishing to 1,000 endpoints that each have a filter (a thousand different texts, every
     one of which matches: each is evaluated, every delivery is still written), in turns with
     the unfiltered fan-out of 3.
Targets on a 2-core machine: >= 800 events/s with 8 clients, >= 60 % of bare, p99 <= 50 ms at
500/s, 1,000-endpoint fan-out <= 200 ms, <= 200 ms over 3 pinned versions, and the filtered
fan-out at most 1.3 x the unfiltered one. `--fanout-only` runs 3 and 5 alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402

from app.config import HTTP_SERVERS, Settings  # noqa: E402
from app.ports import free_port  # noqa: E402
from bench import rawhttp, wsgi_servers  # noqa: E402
from bench.fresh_db import fresh_database  # noqa: E402
from tests.support.processes import stop_group  # noqa: E402

try:
    import psutil
except ImportError:  # a dev dependency; without it the CPU accounting is skipped
    psutil = None

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_publish_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/3"
SCHEMA = {
    "type": "object",
    "required": ["order_id", "amount", "currency"],
    "properties": {
        "order_id": {"type": "string", "maxLength": 64},
        "amount": {"type": "integer", "minimum": 0},
        "currency": {"type": "string", "enum": ["EUR", "USD", "NOK"]},
        "customer": {"type": "object", "properties": {"email": {"type": "string"}}},
        "lines": {"type": "array", "items": {"type": "object"}},
    },
}


def body_for(i: int, type_name: str) -> bytes:
    return json.dumps(
        {
            "type": type_name,
            "version": 1,
            "data": {
                "order_id": f"ord_{i:08d}",
                "amount": 1000 + i % 977,
                "currency": "EUR",
                "customer": {"email": f"c{i % 1000}@example.com"},
                "lines": [{"sku": "A-1", "qty": 1}, {"sku": "B-2", "qty": 2}],
            },
            "resource": {"type": "order", "id": f"ord_{i:08d}", "version": 1},
            "correlation_id": f"bench-{i}",
        }
    ).encode()


# ---------------------------------------------------------------------------- the bare ceiling


def bare_app() -> Any:
    """`bench.publish:bare_app` (a factory): parse the body, INSERT one events row, commit."""
    from flask import Flask, request
    from sqlalchemy import insert

    from app.clock import isoformat, utcnow
    from app.config import normalise_database_url
    from app.db import make_engine
    from app.ids import new_id
    from app.models import Event

    engine = make_engine(normalise_database_url(os.environ["BARE_DATABASE_URL"]), pool_size=10)
    partner_id = os.environ["BARE_PARTNER_ID"]
    table = Event.__table__
    app = Flask(__name__)

    @app.post("/bare/events")
    def publish() -> tuple[str, int, dict[str, str]]:
        body = json.loads(request.get_data())
        now = utcnow()
        event_id = new_id("evt")
        payload = json.dumps(
            {
                "id": event_id,
                "type": body["type"],
                "version": body["version"],
                "occurred_at": isoformat(now),
                "partner": "bare",
                "resource": body.get("resource"),
                "correlation_id": body.get("correlation_id"),
                "data": body["data"],
            },
            separators=(",", ":"),
        )
        resource = body.get("resource") or {}
        with engine.begin() as connection:
            connection.execute(
                insert(table).values(
                    id=event_id,
                    partner_id=partner_id,
                    type=body["type"],
                    version=body["version"],
                    data=body["data"],
                    payload=payload,
                    occurred_at=now,
                    resource_type=resource.get("type"),
                    resource_id=resource.get("id"),
                    resource_version=resource.get("version"),
                    correlation_id=body.get("correlation_id"),
                    created_at=now,
                )
            )
        return json.dumps({"id": event_id}), 202, {"Content-Type": "application/json"}

    return app


# ---------------------------------------------------------------------------- servers


def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise SystemExit(f"bench: {url} did not come up")


@contextmanager
def server(
    args: list[str], env: dict[str, str], ready_url: str
) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(args, env=env, cwd=ROOT, start_new_session=True)
    try:
        wait_ready(ready_url)
        yield process
    finally:
        stop_group(process, timeout_s=15)


# ---------------------------------------------------------------------------- load


class CpuMeter:
    """CPU seconds used by a server's process tree, its PostgreSQL backends, Redis, and us.

    On a shared, oversubscribed machine wall-clock rates swing with the neighbours' load;
    CPU per request is what each side costs, and predicts the rate on an idle box.
    """

    def __init__(self, server_pid: int | None, database: str) -> None:
        self.server_pid = server_pid
        self.database = database

    def snapshot(self) -> dict[str, float]:
        if psutil is None:
            return {}
        totals = {"server": 0.0, "postgres": 0.0, "redis": 0.0, "client": time.process_time()}
        if self.server_pid is not None:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(self.server_pid)
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        totals["server"] += sum(proc.cpu_times()[:2])
        for proc in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["name"] == "redis-server":
                    totals["redis"] += sum(proc.cpu_times()[:2])
                elif self.database in " ".join(proc.info["cmdline"] or ()):
                    totals["postgres"] += sum(proc.cpu_times()[:2])
        return totals


@dataclass
class Result:
    label: str
    count: int
    errors: int
    seconds: float
    latencies_ms: list[float]
    cpu_ms: dict[str, float] | None = None

    def cpu_line(self) -> str:
        if not self.cpu_ms:
            return ""
        parts = " ".join(f"{k} {v:.2f}" for k, v in self.cpu_ms.items())
        return f"      cpu ms/request: {parts} (redis is the whole shared server)"

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def pct(self, p: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))
        return ordered[index]

    def line(self) -> str:
        return (
            f"{self.label:<38} {self.rate:8.0f}/s  p50 {self.pct(50):6.1f} ms  "
            f"p99 {self.pct(99):6.1f} ms  max {max(self.latencies_ms or [0]):6.1f} ms"
            f"  n={self.count} errors={self.errors}"
        )


def measured(meter: CpuMeter | None, run: Callable[[], Result]) -> Result:
    before = meter.snapshot() if meter else {}
    result = run()
    if meter and before:
        after = meter.snapshot()
        per = {k: (after[k] - before[k]) * 1000 / max(1, result.count) for k in before}
        per["total"] = sum(per.values())
        result.cpu_ms = per
    return result


def _result(label: str, outcome: tuple[list[float], list[int], float], expect: int) -> Result:
    latencies, statuses, elapsed = outcome
    errors = sum(1 for status in statuses if status != expect)
    return Result(label, len(latencies), errors, elapsed, latencies)


def closed_loop(
    label: str,
    url: str,
    headers: dict[str, str],
    bodies: list[bytes],
    clients: int,
    expect: int = 202,
) -> Result:
    """`clients` connections, each sending its share back to back."""
    prebuilt = [rawhttp.request_bytes(url, body, headers) for body in bodies]
    return _result(label, rawhttp.run_clients(url, prebuilt, clients), expect)


def paced(
    label: str,
    url: str,
    headers: dict[str, str],
    bodies: list[bytes],
    rate: float,
    senders: int = 32,
) -> Result:
    """Open loop at `rate`/s: request i is due at i/rate; latency counts from when it was due."""
    prebuilt = [rawhttp.request_bytes(url, body, headers) for body in bodies]
    return _result(label, rawhttp.run_clients(url, prebuilt, senders, due=lambda i: i / rate), 202)


# ---------------------------------------------------------------------------- setup


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    def post(
        self, path: str, body: dict[str, Any] | None = None, ok: tuple[int, ...] = (200, 201, 202)
    ) -> dict[str, Any]:
        response = self.http.post(self.base + path, json=body or {}, timeout=60)
        if response.status_code not in ok:
            raise SystemExit(f"bench: POST {path} -> {response.status_code} {response.text}")
        return response.json()  # type: ignore[no-any-return]


def create_token(url: str) -> str:
    from app.accounts import create_api_key
    from app.config import normalise_database_url
    from app.db import Database

    db = Database(normalise_database_url(url), pool_size=1)
    with db.begin() as session:
        _, token = create_api_key(session, "bench", ["admin"])
    db.dispose()
    return token


def partner_id_of(url: str, uid: str) -> str:
    from sqlalchemy import select

    from app.config import normalise_database_url
    from app.db import Database
    from app.models import Partner

    db = Database(normalise_database_url(url), pool_size=1)
    with db.Session() as session:
        value = session.scalar(select(Partner.id).where(Partner.uid == uid))
    db.dispose()
    assert value is not None
    return value


def pinned_setup(api: Api, run: str, type_name: str, fanout: int) -> str:
    """Versions 2 and 3 of the type (each downgrading to the one below), and a partner whose
    endpoints are pinned a third each to v1, v2 and v3."""
    for version in (2, 3):
        api.post(
            "/v1/event-types",
            {
                "name": type_name,
                "version": version,
                "schema": SCHEMA,
                "downgrade": "merge(@, `{}`)",
            },
        )
    pinned = f"bench-pinned-{run}"
    api.post("/v1/partners", {"uid": pinned, "name": f"bench, {fanout} pinned endpoints"})
    for i in range(fanout):
        api.post(
            f"/v1/partners/{pinned}/endpoints",
            {
                "url": f"http://127.0.0.1:9/pinned/{i}",
                "event_types": [type_name],
                "versions": {type_name: 1 + i % 3},
            },
        )
    return pinned


def filtered_setup(api: Api, run: str, type_name: str, fanout: int) -> str:
    """A partner whose endpoints each have their own filter, every one of which matches the
    bench's events (amounts are 1000 and up, in EUR)."""
    filtered = f"bench-filtered-{run}"
    api.post("/v1/partners", {"uid": filtered, "name": f"bench, {fanout} filtered endpoints"})
    for i in range(fanout):
        api.post(
            f"/v1/partners/{filtered}/endpoints",
            {
                "url": f"http://127.0.0.1:9/filtered/{i}",
                "event_types": [type_name],
                "filter": f"data.amount >= `{i % 1000}` && data.currency == 'EUR'",
            },
        )
    return filtered


def run_endpoint_setup(api: Api, run: str, fanout: int) -> tuple[str, str, str]:
    type_name = f"bench.order.{run}"
    api.post("/v1/event-types", {"name": type_name, "version": 1, "schema": SCHEMA})
    one = f"bench-one-{run}"
    api.post("/v1/partners", {"uid": one, "name": "bench, one endpoint"})
    api.post(
        f"/v1/partners/{one}/endpoints",
        {"url": "http://127.0.0.1:9/hook", "event_types": [type_name]},
    )
    many = f"bench-fan-{run}"
    api.post("/v1/partners", {"uid": many, "name": f"bench, {fanout} endpoints"})
    for i in range(fanout):
        api.post(
            f"/v1/partners/{many}/endpoints",
            {"url": f"http://127.0.0.1:9/fan/{i}", "event_types": [type_name]},
        )
    return type_name, one, many


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--events", type=int, default=5000)
    parser.add_argument("--url", help="an already running `kurir api` (then --token)")
    parser.add_argument("--token", help="an admin API key for --url")
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument(
        "--server",
        choices=HTTP_SERVERS,
        default=Settings().http_server,
        help="the HTTP server under Kurir and bare alike (default: `kurir api`'s)",
    )
    parser.add_argument("--clients", default="1,8")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="Kurir and bare take turns this many times; medians are kept "
        "(so background load hits both alike)",
    )
    parser.add_argument("--paced-rate", type=float, default=500.0)
    parser.add_argument("--paced-seconds", type=float, default=10.0)
    parser.add_argument("--fanout", type=int, default=1000)
    parser.add_argument("--fanout-repeat", type=int, default=10)
    parser.add_argument("--no-bare", action="store_true", help="skip the bare ceiling")
    parser.add_argument(
        "--fanout-only",
        action="store_true",
        help="only the 1,000-endpoint fan-out, unfiltered and filtered",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    run = str(int(time.time()))
    if args.url and not args.token:
        raise SystemExit("bench: --url needs --token (an admin API key)")

    env = dict(
        os.environ,
        DATABASE_URL=args.database_url,
        REDIS_URL=args.redis_url,
        KURIR_ALLOW_PRIVATE_TARGETS="1",
        KURIR_SECRET_KEY=os.environ.get("KURIR_SECRET_KEY", "bench-secret-key"),
        KURIR_DATA_DIR=str(ROOT / "var" / "bench"),
        PYTHONPATH=str(ROOT),
        # One partner gets `--fanout` endpoints (an external Kurir needs the same).
        KURIR_MAX_ENDPOINTS_PER_PARTNER=str(max(50, args.fanout)),
    )
    python = sys.executable
    figures: dict[str, Any] = {
        "events": args.events,
        "workers": args.workers,
        "threads": args.threads,
        "server": args.server,
        "cpus": os.cpu_count(),
        "load_average_before": os.getloadavg(),
    }
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.server} "
        f"{args.workers} workers x {args.threads} threads for Kurir and for bare",
        flush=True,
    )
    results: list[Result] = []

    database = args.database_url.rsplit("/", 1)[-1]
    ratios: list[float] = []
    target = _external(args) if args.url else _own_kurir(args, env, python)
    with target as (base, token, kurir_pid):
        kurir_meter = CpuMeter(kurir_pid, database) if kurir_pid else None
        api = Api(base, token)
        print(f"setting up: event type, partners, 1 + {args.fanout} endpoints ...", flush=True)
        type_name, one, many = run_endpoint_setup(api, run, args.fanout)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        bare_headers = {"Content-Type": "application/json"}
        publish_url = f"{base}/v1/partners/{one}/events"
        bare_url, bare_meter = None, None
        with contextlib.ExitStack() as stack:
            if args.fanout_only:
                clients = []
            if not args.no_bare and not args.fanout_only:
                bare_url, bare_pid = stack.enter_context(
                    _bare_server(args, env, partner_id_of(args.database_url, one))
                )
                bare_meter = CpuMeter(bare_pid, database)
            warm = [body_for(i, type_name) for i in range(50 if args.fanout_only else 500)]
            closed_loop("warm-up", publish_url, headers, warm, 8)
            if bare_url:
                closed_loop("warm-up", bare_url, bare_headers, warm, 8)
            bodies = [body_for(i, type_name) for i in range(args.events)]
            for c in clients:
                kurir_rounds, bare_rounds = [], []
                for _ in range(args.rounds):
                    kurir_rounds.append(
                        measured(
                            kurir_meter,
                            lambda c=c: closed_loop(
                                f"kurir publish, {c} client(s)", publish_url, headers, bodies, c
                            ),
                        )
                    )
                    _show(kurir_rounds[-1])
                    if bare_url:
                        bare_rounds.append(
                            measured(
                                bare_meter,
                                lambda c=c: closed_loop(
                                    f"bare insert, {c} client(s)", bare_url, bare_headers, bodies, c
                                ),
                            )
                        )
                        _show(bare_rounds[-1])
                        if c == max(clients):
                            ratios.append(kurir_rounds[-1].rate / bare_rounds[-1].rate)
                results.append(_median(kurir_rounds))
                if bare_rounds:
                    results.append(_median(bare_rounds))
        paced_result = None
        if not args.fanout_only:
            paced_n = int(args.paced_rate * args.paced_seconds)
            paced_result = measured(
                kurir_meter,
                lambda: paced(
                    f"kurir publish, paced {args.paced_rate:.0f}/s",
                    publish_url,
                    headers,
                    [body_for(i, type_name) for i in range(paced_n)],
                    args.paced_rate,
                ),
            )
            _show(paced_result)
            results.append(paced_result)
        fan_url = f"{base}/v1/partners/{many}/events"
        check = requests.post(fan_url, data=body_for(0, type_name), headers=headers, timeout=60)
        figures["fanout_deliveries"] = len(check.json()["deliveries"])
        fan = measured(
            kurir_meter,
            lambda: closed_loop(
                f"fan-out to {figures['fanout_deliveries']} endpoints",
                fan_url,
                headers,
                [body_for(i, type_name) for i in range(args.fanout_repeat)],
                1,
            ),
        )
        _show(fan)
        results.append(fan)
        filtered = filtered_setup(api, run, type_name, args.fanout)
        filtered_url = f"{base}/v1/partners/{filtered}/events"
        check = requests.post(
            filtered_url, data=body_for(0, type_name), headers=headers, timeout=60
        )
        figures["filtered_deliveries"] = len(check.json()["deliveries"])
        plain_rounds, filtered_rounds = [], []
        for _ in range(args.rounds):
            plain_rounds.append(
                measured(
                    kurir_meter,
                    lambda: closed_loop(
                        f"fan-out to {figures['fanout_deliveries']} endpoints, unfiltered",
                        fan_url,
                        headers,
                        [body_for(i, type_name) for i in range(args.fanout_repeat)],
                        1,
                    ),
                )
            )
            filtered_rounds.append(
                measured(
                    kurir_meter,
                    lambda: closed_loop(
                        f"fan-out to {figures['filtered_deliveries']} filtered endpoints",
                        filtered_url,
                        headers,
                        [body_for(i, type_name) for i in range(args.fanout_repeat)],
                        1,
                    ),
                )
            )
            _show(plain_rounds[-1])
            _show(filtered_rounds[-1])
        plain_fan = _median(plain_rounds)
        filtered_fan = _median(filtered_rounds)
        results.append(filtered_fan)
        # Paired: each filtered round against the unfiltered round just before it.
        paired = [f.pct(50) / p.pct(50) for p, f in zip(plain_rounds, filtered_rounds, strict=True)]
        filter_ratio = statistics.median(paired)
        figures["filtered_fanout_ratio"] = round(filter_ratio, 3)
        figures["filtered_fanout_ratio_rounds"] = [round(r, 3) for r in paired]
        if plain_fan.cpu_ms and filtered_fan.cpu_ms:
            figures["filtered_fanout_cpu_ms"] = {
                "unfiltered": plain_fan.cpu_ms,
                "filtered": filtered_fan.cpu_ms,
            }
        if args.fanout_only:
            for text_, ok in [
                (
                    f"filtered fan-out <= 1.3 x unfiltered: {filter_ratio:.2f} x (median of "
                    f"paired rounds {', '.join(f'{r:.2f}' for r in paired)})",
                    filter_ratio <= 1.3,
                )
            ]:
                print(f"  [{'ok' if ok else 'MISSED'}] {text_}")
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(figures, indent=2))
            return 0 if filter_ratio <= 1.3 else 1
        pinned = pinned_setup(api, run, type_name, args.fanout)
        pinned_url = f"{base}/v1/partners/{pinned}/events"

        def v3(i: int) -> bytes:
            return body_for(i, type_name).replace(b'"version": 1,', b'"version": 3,', 1)

        check = requests.post(pinned_url, data=v3(0), headers=headers, timeout=60)
        delivered = check.json()["deliveries"]
        figures["pinned_versions"] = sorted({d["version"] for d in delivered})
        pinned_fan = measured(
            kurir_meter,
            lambda: closed_loop(
                f"fan-out to {len(delivered)} endpoints over 3 pinned versions",
                pinned_url,
                headers,
                [v3(i) for i in range(args.fanout_repeat)],
                1,
            ),
        )
        _show(pinned_fan)
        results.append(pinned_fan)

    assert paced_result is not None
    print("\nmedian of rounds")
    for result in results:
        _show(result)
    by_label = {r.label: r for r in results}
    top = max(clients)
    kurir_top = by_label[f"kurir publish, {top} client(s)"]
    figures["load_average_after"] = os.getloadavg()
    figures["results"] = {
        r.label: {
            "rate": round(r.rate, 1),
            "p50_ms": round(r.pct(50), 2),
            "p99_ms": round(r.pct(99), 2),
            "errors": r.errors,
            "n": r.count,
            "cpu_ms_per_request": r.cpu_ms,
        }
        for r in results
    }
    print("targets")
    checks: list[tuple[str, bool]] = [
        (f"{top} clients >= 800 events/s: {kurir_top.rate:.0f}", kurir_top.rate >= 800),
        (
            f"paced {args.paced_rate:.0f}/s p99 <= 50 ms: {paced_result.pct(99):.1f} ms",
            paced_result.pct(99) <= 50,
        ),
        (
            f"fan-out to {args.fanout} endpoints <= 200 ms (p50 {fan.pct(50):.0f} ms, max "
            f"{max(fan.latencies_ms):.0f} ms)",
            fan.pct(50) <= 200,
        ),
        (
            f"fan-out to {args.fanout} endpoints over 3 pinned versions <= 200 ms (p50 "
            f"{pinned_fan.pct(50):.0f} ms, max {max(pinned_fan.latencies_ms):.0f} ms)",
            pinned_fan.pct(50) <= 200,
        ),
        (
            f"filtered fan-out <= 1.3 x unfiltered: {filter_ratio:.2f} x",
            filter_ratio <= 1.3,
        ),
    ]
    bare_top = by_label.get(f"bare insert, {top} client(s)")
    if bare_top is not None and ratios:
        # Paired: each Kurir round against the bare round right after it, then the median.
        ratio = statistics.median(ratios)
        figures["ratio_to_bare"] = round(ratio, 3)
        figures["ratio_to_bare_rounds"] = [round(r, 3) for r in ratios]
        checks.insert(
            1,
            (
                f">= 60 % of bare: {ratio:.0%} (median of rounds "
                f"{', '.join(f'{r:.0%}' for r in ratios)})",
                ratio >= 0.6,
            ),
        )
        if kurir_top.cpu_ms and bare_top.cpu_ms:
            cpu_ratio = bare_top.cpu_ms["total"] / kurir_top.cpu_ms["total"]
            figures["cpu_ratio_to_bare"] = round(cpu_ratio, 3)
            print(
                f"  (by CPU per request, whole machine: Kurir costs "
                f"{kurir_top.cpu_ms['total']:.2f} ms, bare {bare_top.cpu_ms['total']:.2f} ms:"
                f" {cpu_ratio:.0%})"
            )
    for text_, ok in checks:
        print(f"  [{'ok' if ok else 'MISSED'}] {text_}")
    if any(r.errors for r in results):
        print("  [MISSED] some requests failed:", {r.label: r.errors for r in results if r.errors})
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0 if all(ok for _, ok in checks) else 1


def _show(result: Result) -> None:
    print("  " + result.line(), flush=True)
    if result.cpu_ms:
        print(result.cpu_line(), flush=True)


def _median(rounds: list[Result]) -> Result:
    return sorted(rounds, key=lambda r: r.rate)[len(rounds) // 2]


@contextmanager
def _external(args: argparse.Namespace) -> Iterator[tuple[str, str, int | None]]:
    yield args.url.rstrip("/"), args.token, None


@contextmanager
def _own_kurir(
    args: argparse.Namespace, env: dict[str, str], python: str
) -> Iterator[tuple[str, str, int | None]]:
    print(f"preparing {args.database_url} (wiped and migrated) ...", flush=True)
    fresh_database(args.database_url)
    token = create_token(args.database_url)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with server(
        [
            python,
            "-m",
            "app.cli",
            "api",
            "--server",
            args.server,
            "--port",
            str(port),
            "--workers",
            str(args.workers),
            "--threads",
            str(args.threads),
        ],
        env,
        f"{base}/healthz",
    ) as process:
        yield base, token, process.pid


@contextmanager
def _bare_server(
    args: argparse.Namespace, env: dict[str, str], partner_id: str
) -> Iterator[tuple[str, int]]:
    """The ceiling, under the same server and settings as `kurir api` (app/cli/http_servers.py)."""
    port = free_port()
    bare_env = dict(env, BARE_DATABASE_URL=args.database_url, BARE_PARTNER_ID=partner_id)
    command = wsgi_servers.command(
        args.server, "bench.publish:bare_app", port, args.workers, args.threads
    )
    with server(command, bare_env, f"http://127.0.0.1:{port}/") as process:
        yield f"http://127.0.0.1:{port}/bare/events", process.pid


if __name__ == "__main__":
    raise SystemExit(main())
