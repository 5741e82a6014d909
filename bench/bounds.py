"""Memory bounds under load: `kurir api` fed 256 KiB bodies, a worker draining a big backlog.

    .venv/bin/python bench/bounds.py [--seconds 60] [--clients 8] [-n 100000]
                                     [--skip-api] [--skip-worker]
                                     [--db postgresql://...] [--redis redis://...]

The script owns --db (default: the `kurir_bounds_bench` PostgreSQL database, which it WIPES
and migrates) and --redis (flushed). Two measurements, one run:

  1. API: `kurir api` (gunicorn, its default 2 workers x 8 threads) and --clients threads,
     each with its own keep-alive session, sending bodies of 256 KiB (the default
     KURIR_MAX_PAYLOAD_BYTES) for --seconds: publishes whose data fails its schema after a
     full parse (422), one byte over the limit (413), inbound callbacks with a wrong
     signature (401), and one in 16 a publish that is stored (202). RSS of every gunicorn
     process is sampled 4 times a second: idle (after warm-up) and peak, per process, with
     requests/s and the server's CPU per request.
  2. Worker: a committed backlog of -n deliveries (n / 10 events x 10 endpoints on a fast
     local receiver) enqueued at once, drained by one `kurir worker`: its RSS idle and peak,
     deliveries/s and CPU per delivery, beside a bare `requests.Session` loop to the same
     receiver (deliveries/s of one process, nothing else).

Claim checked: every process stays under 300 MB RSS (exit status 1 when one does not).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import requests  # noqa: E402

from bench.deliver import (  # noqa: E402
    SECRET_KEY,
    Kurir,
    ReceiverProcess,
    bare_ceiling,
)
from bench.fresh_db import fresh_database  # noqa: E402
from tests.support.processes import stop_group  # noqa: E402

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_bounds_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/6"
LIMIT_MB = 300
BODY_BYTES = 256 * 1024
SCHEMA = {
    "type": "object",
    "required": ["note"],
    "properties": {"note": {"type": "string"}, "pad": {"type": "string", "maxLength": 10}},
}


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


class TreeSampler:
    """Peak RSS per process of a process tree (a gunicorn master and its workers)."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.pid = pid
        self.every_s = every_s
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def now(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for proc in _tree(self.pid):
            with contextlib.suppress(psutil.Error):
                out[proc.pid] = int(proc.memory_info().rss)
        return out

    def cpu(self) -> float:
        total = 0.0
        for proc in _tree(self.pid):
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(psutil.Error):
                for pid, rss in self.now().items():
                    self.peak[pid] = max(self.peak.get(pid, 0), rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


def _mb(value: int) -> float:
    return round(value / 2**20, 1)


def _kurir_cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def _publish_body(stored: bool) -> bytes:
    """256 KiB: a publish that is stored, or one whose data fails its schema after parsing."""
    frame = {"type": "bounds.big", "version": 1, "data": {"note": "", "pad": ""}}
    room = BODY_BYTES - len(json.dumps(frame)) - 64
    data = {"note": "n" * room, "pad": "p"} if stored else {"note": "n", "pad": "p" * room}
    return json.dumps({**frame, "data": data}).encode()


def run_api(args: argparse.Namespace, results: dict[str, Any], failures: list[str]) -> None:
    from bench.publish import free_port, wait_ready

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(
            os.environ,
            DATABASE_URL=args.db,
            REDIS_URL=args.redis,
            KURIR_DATA_DIR=tmp,
            KURIR_SECRET_KEY=SECRET_KEY,
            KURIR_ALLOW_PRIVATE_TARGETS="1",
            KURIR_LOG_LEVEL="warning",
        )
        token = _kurir_cli("keys", "create", "--name", "bounds", env=env).strip().splitlines()[-1]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "api", "--port", str(port)],
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            wait_ready(f"{url}/healthz")
            auth = {"Authorization": f"Bearer {token}"}
            setup = requests.Session()
            for path, body in (
                ("/v1/event-types", {"name": "bounds.big", "version": 1, "schema": SCHEMA}),
                ("/v1/partners", {"uid": "bounds", "name": "Bounds"}),
                ("/v1/sources", {"name": "bounds", "scheme": "github", "secret": "bounds-secret"}),
            ):
                answer = setup.post(url + path, json=body, headers=auth, timeout=30)
                assert answer.status_code in (200, 201), answer.text
            kinds = {
                "publish-422": (
                    "/v1/partners/bounds/events",
                    _publish_body(False),
                    {**auth, "Content-Type": "application/json"},
                ),
                "publish-202": (
                    "/v1/partners/bounds/events",
                    _publish_body(True),
                    {**auth, "Content-Type": "application/json"},
                ),
                "publish-413": (
                    "/v1/partners/bounds/events",
                    b"x" * (BODY_BYTES + 1),
                    {**auth, "Content-Type": "application/json"},
                ),
                "inbound-401": (
                    "/inbound/bounds",
                    b"y" * BODY_BYTES,
                    {"X-Hub-Signature-256": "sha256=" + "0" * 64},
                ),
            }
            cycle = [
                "publish-422",
                "publish-413",
                "inbound-401",
                "publish-422",
                "publish-413",
                "inbound-401",
                "publish-422",
                "inbound-401",
            ] * 2
            cycle[-1] = "publish-202"  # one in 16 is stored
            for kind in kinds.values():  # warm-up: every path once
                setup.post(url + kind[0], data=kind[1], headers=kind[2], timeout=30)
            time.sleep(1)
            sampler = TreeSampler(process.pid)
            idle = sampler.now()
            sampler.start()
            cpu0 = sampler.cpu()
            statuses: dict[str, int] = {}
            lock = threading.Lock()
            stop_at = time.monotonic() + args.seconds

            def client(offset: int) -> None:
                session = requests.Session()
                i = offset
                while time.monotonic() < stop_at:
                    path, body, headers = kinds[cycle[i % len(cycle)]]
                    i += 1
                    try:
                        status = str(
                            session.post(
                                url + path, data=body, headers=headers, timeout=60
                            ).status_code
                        )
                    except requests.RequestException as exc:
                        status = type(exc).__name__
                    with lock:
                        statuses[status] = statuses.get(status, 0) + 1

            started = time.monotonic()
            threads = [threading.Thread(target=client, args=(n * 3,)) for n in range(args.clients)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - started
            cpu = sampler.cpu() - cpu0
            sampler.stop()
            total = sum(statuses.values())
            per_process = {
                str(pid): {"idle_mb": _mb(idle.get(pid, 0)), "peak_mb": _mb(peak)}
                for pid, peak in sorted(sampler.peak.items())
            }
            results["api"] = {
                "clients": args.clients,
                "seconds": round(elapsed, 1),
                "requests": total,
                "per_s": round(total / elapsed, 1),
                "statuses": statuses,
                "server_cpu_ms_per_request": round(cpu / max(total, 1) * 1000, 2),
                "mb_received": round(total * BODY_BYTES / 2**20),
                "rss": per_process,
            }
            print(
                f"API: {args.clients} clients x {args.seconds:.0f}s of 256 KiB bodies: "
                f"{total} requests ({total / elapsed:.1f}/s, {total * BODY_BYTES / 2**20:.0f} "
                f"MiB received), statuses {statuses}; server CPU "
                f"{cpu / max(total, 1) * 1000:.1f} ms per request"
            )
            for pid, fig in per_process.items():
                role = "master" if int(pid) == process.pid else "worker"
                print(
                    f"  gunicorn {role} {pid}: RSS {fig['idle_mb']} MiB idle, "
                    f"{fig['peak_mb']} MiB peak"
                )
                if fig["peak_mb"] >= LIMIT_MB:
                    failures.append(f"api {role} {pid} peaked at {fig['peak_mb']} MiB")
            if any(not s.isdigit() for s in statuses):
                failures.append(f"client errors: {statuses}")
        finally:
            stop_group(process)


def run_worker(args: argparse.Namespace, results: dict[str, Any], failures: list[str]) -> None:
    from sender.dispatch import enqueue_now

    receiver = ReceiverProcess()
    try:
        sample = json.dumps(
            {
                "id": "evt_x",
                "type": "order.paid",
                "version": 1,
                "occurred_at": "2026-12-02T10:00:00Z",
                "partner": "bench",
                "data": {"order_id": "ord_00000001", "amount": 1001},
            }
        ).encode()
        bare, _ = bare_ceiling(receiver.url, 1, min(args.n, 5000), sample)  # (POST/s, CPU ms)
        receiver.dump()
        with tempfile.TemporaryDirectory() as tmp:
            kurir = Kurir(args.db, args.redis, 1, Path(tmp))
            kurir.partner("backlog", [f"{receiver.url}/b{i}" for i in range(10)])
            kurir.start()
            kurir.stop_sweeper.set()  # nothing but the worker while it drains
            made = time.monotonic()
            ids = kurir.publish_quietly("backlog", args.n // 10)  # committed, not enqueued
            print(f"backlog of {len(ids):,} deliveries committed in {time.monotonic() - made:.0f}s")
            pid = kurir.workers[0].pid
            try:
                sampler = TreeSampler(pid)
                time.sleep(1)
                idle = sampler.now().get(pid, 0)
                sampler.start()
                cpu0 = sampler.cpu()
                first = time.time()
                for start in range(0, len(ids), 100):
                    enqueue_now(kurir.runtime.redis, ids[start : start + 100])
                done = receiver.wait_for(len(ids), timeout_s=max(600, len(ids) / 50))
                cpu = sampler.cpu() - cpu0
                records = receiver.dump()
                sampler.stop()
                last = max((at for _, _, at in records), default=first)
                unique = len({(m, p) for m, p, _ in records})
                rate = unique / max(last - first, 1e-9)
                peak = sampler.peak.get(pid, idle)
                results["worker"] = {
                    "backlog": len(ids),
                    "received": unique,
                    "duplicates": len(records) - unique,
                    "per_s": round(rate),
                    "cpu_ms_per_delivery": round(cpu / max(unique, 1) * 1000, 3),
                    "bare_per_s": round(bare),
                    "rss_idle_mb": _mb(idle),
                    "rss_peak_mb": _mb(peak),
                }
                print(
                    f"worker draining {len(ids):,}: {unique:,} received "
                    f"({len(records) - unique} duplicates), {rate:,.0f}/s, CPU "
                    f"{cpu / max(unique, 1) * 1000:.2f} ms per delivery (bare requests loop: "
                    f"{bare:,.0f}/s); RSS {_mb(idle)} MiB idle, {_mb(peak)} MiB peak"
                )
                if not done:
                    failures.append(f"only {unique} of {len(ids)} delivered")
                if _mb(peak) >= LIMIT_MB:
                    failures.append(f"worker peaked at {_mb(peak)} MiB")
            finally:
                kurir.stop()
    finally:
        receiver.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("-n", type=int, default=100_000, help="deliveries in the backlog")
    parser.add_argument("--skip-api", action="store_true")
    parser.add_argument("--skip-worker", action="store_true")
    parser.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    args = parser.parse_args()
    fresh_database(args.db)
    import redis

    redis.Redis.from_url(args.redis).flushdb()
    results: dict[str, Any] = {}
    failures: list[str] = []
    if not args.skip_api:
        run_api(args, results, failures)
    if not args.skip_worker:
        run_worker(args, results, failures)
    results["failures"] = failures
    print(json.dumps(results))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
