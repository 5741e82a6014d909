"""The engine at everyday load: paced traffic through the HTTP API, not a backlog drained.

    .venv/bin/python bench/everyday.py [--rates 20,100,500] [--fanouts 1,5] [--seconds 10]
                                       [--phases 100x1,50x5] [--workers 2] [--publishers 4]
                                       [--flat-out 2000] [--kept-days 30] [--probe]

Most of a deployment's life is a trickle (10 million deliveries a day is 115 a second), where
every batch the engine claims holds one or two deliveries. This script measures that, the way
a deployment runs it: `kurir api` (its default server) and `kurir worker` processes, with
publishers in separate processes POSTing events over HTTP at a paced, open-loop rate, and a
receiver process answering 200.

It owns its database (default: `kurir_everyday_bench`, WIPED and migrated) and Redis db
(default 5, flushed). First, in the same run, the two bare ceilings every figure is held
against: N processes POSTing the same signed bodies in a bare `requests.Session` loop, and in a
bare urllib3 `HTTPConnectionPool` loop (what Kurir's transport is built on). Then, for every
rate x fan-out:

  worker CPU per delivery   user + system of the worker processes, all threads, from the
                            phase's first publish until every outcome is recorded
  API CPU per publish       the `kurir api` process tree
  PostgreSQL CPU per delivery  the backends of this database
  publish -> receipt        p50 / p99 / max, from the moment the publisher sent the request
                            to the receiver's arrival stamp, per delivery

`--phases RATExFANOUT,...` runs just those phases instead of every rate x fan-out.

On PostgreSQL the database first gets `--kept-days` (default 30) past days of daily
partitions, empty, as an installation that keeps a month of history has them: a statement
whose plan spans every partition costs here what it costs there (0: a fresh installation's
eight).

With --probe the workers run as `bench/worker_probe.py`, which counts what each delivery
costs (SQL statements by kind, commits, pool checkouts, Redis round trips, and CPU and wake-ups
per kind of thread): each phase then prints that breakdown per delivery as well. The counting
itself costs CPU: take the headline figures from a run without it.

Last, with --floor RATE (default 100), the floor: the same paced trip through
`bench/bare_pipeline.py` (a bare Flask publish writing one committed row and RPUSHing its id,
BLPOP + POST worker processes), the latency no publish -> receipt pipeline on this machine goes
under, beside its worker CPU per delivery.

and, with --flat-out N, the end-to-end rate through the API (N events from --publishers
processes in a closed loop, fan-out 5): deliveries/s against the bare requests loop's rate
with the same number of processes, worker CPU per delivery beside it.

Everything shares the machine's cores (receiver, PostgreSQL, Redis, API, workers, publishers):
rates move with the neighbours, CPU per unit of work much less. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.ports import free_port  # noqa: E402
from bench.deliver import Kurir, bare_ceiling, percentile  # noqa: E402
from bench.fresh_db import fresh_database  # noqa: E402
from bench.publish import CpuMeter, server  # noqa: E402
from bench.support import wait_for_workers  # noqa: E402
from tests.support.fast_receiver import ReceiverProcess  # noqa: E402

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_everyday_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/5"
SAMPLE = json.dumps(
    {
        "id": "evt_x",
        "type": "order.paid",
        "version": 1,
        "occurred_at": "2026-12-02T10:00:00Z",
        "partner": "bench",
        "resource": None,
        "correlation_id": "bench-1",
        "data": {"order_id": "ord_00000001", "amount": 1001},
    }
).encode()


def _publisher_main(
    url: str, token: str, first: int, count: int, rate: float | None, start_at: float, out: Any
) -> None:
    """POST `count` events, paced at `rate`/s from `start_at` (open loop: a late request is
    sent at once, never skipped), or back to back when `rate` is None; reports
    (event id, send time) per event and the refusals."""
    import requests

    session = requests.Session()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    sent: list[tuple[str, float]] = []
    refused: list[str] = []
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    for n in range(count):
        if rate is not None:
            delay = start_at + n / rate - time.time()
            if delay > 0:
                time.sleep(delay)
        i = first + n
        body = json.dumps(
            {
                "type": "order.paid",
                "version": 1,
                "data": {"order_id": f"ord_{i:08d}", "amount": 1000 + i},
                "correlation_id": f"everyday-{i}",
            }
        )
        at = time.time()
        answer = session.post(url, data=body, headers=headers, timeout=60)
        if answer.status_code == 202:
            sent.append((str(answer.json()["id"]), at))
        else:
            refused.append(f"{answer.status_code} {answer.text[:200]}")
    out.put((sent, refused))


def publish_through_api(
    url: str, token: str, events: int, processes: int, rate: float | None, first: int
) -> tuple[dict[str, float], list[str]]:
    """`events` from `processes` publisher processes, together at `rate`/s (or flat out)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    per = events // processes
    start_at = time.time() + 1.5  # every process started and connected by then
    procs = [
        ctx.Process(
            target=_publisher_main,
            args=(
                url,
                token,
                first + k * per,
                per,
                None if rate is None else rate / processes,
                start_at + (0 if rate is None else k / rate),
                out,
            ),
        )
        for k in range(processes)
    ]
    for proc in procs:
        proc.start()
    sent: dict[str, float] = {}
    refused: list[str] = []
    for _ in procs:
        got, bad = out.get(timeout=600)
        sent.update(got)
        refused += bad
    for proc in procs:
        proc.join()
    return sent, refused


class ProbedKurir(Kurir):
    """Kurir whose workers run as `bench/worker_probe.py`, counting what they do."""

    def __init__(self, *args: Any, probe_dir: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.probe_dir = probe_dir
        self.env["KURIR_PROBE_DIR"] = str(probe_dir)

    def start(self) -> None:
        from sender.sweeper import sweep

        sweep(self.runtime)
        probe = str(ROOT / "bench" / "worker_probe.py")
        for _ in range(self.workers_n):
            self.workers.append(
                subprocess.Popen([sys.executable, probe, str(self.probe_dir)], env=self.env)
            )
        wait_for_workers(self.runtime.redis, self.workers_n)
        self.start_sweeper()

    def read(self) -> dict[str, float]:
        """Every worker's counters, summed: `kind|thread`, `sql:STATEMENT`, `cpu|thread`..."""
        for proc in self.workers:
            (self.probe_dir / f"{proc.pid}.json").unlink(missing_ok=True)
            proc.send_signal(signal.SIGUSR1)
        total: dict[str, float] = {}
        for proc in self.workers:
            path = self.probe_dir / f"{proc.pid}.json"
            deadline = time.monotonic() + 10
            while not path.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            got = json.loads(path.read_text())
            for key, value in got["counts"].items():
                total[key] = total.get(key, 0) + value
            for thread, figures in got["threads"].items():
                for kind, value in figures.items():
                    key = f"{kind}|{thread}"
                    total[key] = total.get(key, 0) + value
        return total


def breakdown(before: dict[str, float], after: dict[str, float], deliveries: int) -> str:
    """The probe's counters over a phase, per delivery, as lines to print."""
    per = {k: (after.get(k, 0) - before.get(k, 0)) / max(deliveries, 1) for k in {*before, *after}}
    per = {k: v * (1000.0 if k.startswith("cpu|") else 1.0) for k, v in per.items()}
    per = {k: v for k, v in per.items() if abs(v) >= 0.005}
    lines = []
    for kind, unit in (
        ("cpu", "ms CPU"),
        ("wakes", "wake-ups"),
        ("sql", "SQL statements"),
        ("commits", "commits"),
        ("checkouts", "pool checkouts"),
        ("redis", "Redis round trips"),
    ):
        items = sorted(
            ((k.split("|", 1)[1], v) for k, v in per.items() if k.startswith(kind + "|")),
            key=lambda kv: -kv[1],
        )
        if items:
            total = sum(v for _, v in items)
            parts = ", ".join(f"{name} {v:.2f}" for name, v in items)
            lines.append(f"    {unit} per delivery: {total:.2f} ({parts})")
    statements = sorted(
        ((k.split(":", 1)[1], v) for k, v in per.items() if k.startswith("sql:")),
        key=lambda kv: -kv[1],
    )
    if statements:
        lines.append(
            "    statements per delivery: " + ", ".join(f"{s} {v:.2f}" for s, v in statements)
        )
    return "\n".join(lines)


class Phase:
    """One measured stretch: CPU of the workers, the API and PostgreSQL from its start."""

    def __init__(self, kurir: Kurir, meter: CpuMeter) -> None:
        self.kurir, self.meter = kurir, meter
        self.probe = kurir.read() if isinstance(kurir, ProbedKurir) else None
        self.worker = kurir.worker_cpu_s()
        self.cpu = meter.snapshot()

    def breakdown(self, deliveries: int) -> str:
        """The probe's per-delivery counts over the phase ("" without --probe)."""
        if self.probe is None or not isinstance(self.kurir, ProbedKurir):
            return ""
        return breakdown(self.probe, self.kurir.read(), deliveries)

    def finish(self) -> tuple[float, float, float]:
        """(worker, API, PostgreSQL) CPU seconds since the start."""
        now = self.meter.snapshot()
        return (
            self.kurir.worker_cpu_s() - self.worker,
            now.get("server", 0.0) - self.cpu.get("server", 0.0),
            now.get("postgres", 0.0) - self.cpu.get("postgres", 0.0),
        )


def past_partitions(url: str, days: int) -> int:
    """PostgreSQL: the daily partitions of `days` past days, empty, as an installation that
    keeps that much history has them (a fresh one has today's and a week ahead): a statement
    whose plan spans every partition costs what it costs there. 0 on SQLite."""
    from datetime import UTC, datetime, timedelta

    from app.db import Database
    from app.lifecycle import partitions

    db = Database(url, pool_size=1)
    try:
        if not db.is_postgres:
            return 0
        now = datetime.now(UTC)
        with db.engine.begin() as connection:
            for day in range(1, days + 1):
                for spec in partitions.SPECS:
                    partitions.create(connection, spec, now - timedelta(days=day))
        return days
    finally:
        db.dispose()


def run(args: argparse.Namespace) -> int:
    from app.accounts import create_api_key

    fresh_database(args.db)
    if args.kept_days:
        print(f"daily partitions for {past_partitions(args.db, args.kept_days)} past days")
    receiver = ReceiverProcess()
    results: dict[str, Any] = {"workers": args.workers, "publishers": args.publishers}
    try:
        bare_rate, bare_ms = bare_ceiling(receiver.url, args.workers, args.bare_n, SAMPLE)
        u3_rate, u3_ms = bare_ceiling(
            receiver.url, args.workers, args.bare_n, SAMPLE, client="urllib3"
        )
        receiver.dump()
        results.update(
            {
                "bare_requests_per_s": round(bare_rate),
                "bare_requests_cpu_ms": round(bare_ms, 3),
                "bare_urllib3_per_s": round(u3_rate),
                "bare_urllib3_cpu_ms": round(u3_ms, 3),
            }
        )
        print(
            f"bare POST loops, {args.workers} processes: requests.Session {bare_rate:,.0f}/s, "
            f"{bare_ms:.3f} ms CPU per POST; urllib3 pool {u3_rate:,.0f}/s, {u3_ms:.3f} ms"
        )
        with tempfile.TemporaryDirectory() as tmp:
            if args.probe:
                kurir: Kurir = ProbedKurir(
                    args.db, args.redis, args.workers, Path(tmp), probe_dir=Path(tmp)
                )
            else:
                kurir = Kurir(args.db, args.redis, args.workers, Path(tmp))
            phases = _phases(args)
            fanouts = sorted({f for _, f in phases})
            for fanout in {*fanouts, 5}:
                kurir.partner(
                    f"f{fanout}", [f"{receiver.url}/f{fanout}/{i}" for i in range(fanout)]
                )
            with kurir.runtime.db.begin() as session:
                _, token = create_api_key(session, "everyday", ["admin"])
            kurir.start()
            port = free_port()
            api_env = {**kurir.env, "KURIR_LOG_LEVEL": "warning"}
            base = f"http://127.0.0.1:{port}"
            command = [sys.executable, "-m", "app.cli", "api", "--host", "127.0.0.1"]
            with server([*command, "--port", str(port)], api_env, base + "/healthz") as api:
                meter = CpuMeter(api.pid, args.db.rsplit("/", 1)[1])
                recorded, first = 0, 0
                try:
                    # Warm up: each worker's first delivery loads the secret box (a key
                    # stretch of ~0.4 s of CPU) and fills caches; no phase should pay that.
                    for fanout in fanouts:
                        sent, _ = publish_through_api(
                            f"{base}/v1/partners/f{fanout}/events", token, 40, 2, 20.0, first
                        )
                        first += 40
                        recorded += len(sent) * fanout
                        receiver.wait_for(len(sent) * fanout, timeout_s=120)
                        kurir.wait_recorded(recorded)
                        receiver.dump()
                    for rate, fanout in phases:
                        events = rate * args.seconds
                        phase = Phase(kurir, meter)
                        sent, refused = publish_through_api(
                            f"{base}/v1/partners/f{fanout}/events",
                            token,
                            events,
                            args.publishers,
                            rate,
                            first,
                        )
                        first += events
                        expected = len(sent) * fanout
                        receiver.wait_for(expected, timeout_s=120)
                        recorded += expected
                        kurir.wait_recorded(recorded)
                        worker_s, api_s, pg_s = phase.finish()
                        records = receiver.dump()
                        lat = [(at - sent[m]) * 1000 for m, _, at in records if m in sent]
                        name = f"r{rate}_f{fanout}"
                        figures = {
                            "deliveries": len(records),
                            "refused": len(refused),
                            "worker_cpu_ms_per_delivery": round(
                                worker_s * 1000 / max(len(records), 1), 3
                            ),
                            "api_cpu_ms_per_publish": round(api_s * 1000 / max(len(sent), 1), 3),
                            "pg_cpu_ms_per_delivery": round(pg_s * 1000 / max(len(records), 1), 3),
                            "p50_ms": round(percentile(lat, 50), 1),
                            "p99_ms": round(percentile(lat, 99), 1),
                            "max_ms": round(max(lat, default=float("nan")), 1),
                        }
                        results[name] = figures
                        ratio = figures["worker_cpu_ms_per_delivery"] / bare_ms
                        print(
                            f"{rate:>4} events/s x fan-out {fanout}: "
                            f"{figures['deliveries']:,} deliveries, worker CPU "
                            f"{figures['worker_cpu_ms_per_delivery']:.3f} ms/delivery "
                            f"({ratio:.2f}x the bare requests POST, "
                            f"{figures['worker_cpu_ms_per_delivery'] / u3_ms:.2f}x urllib3), "
                            f"API {figures['api_cpu_ms_per_publish']:.3f} ms/publish, "
                            f"PostgreSQL {figures['pg_cpu_ms_per_delivery']:.3f} ms/delivery; "
                            f"publish->receipt p50 {figures['p50_ms']:.1f} ms, "
                            f"p99 {figures['p99_ms']:.1f} ms, max {figures['max_ms']:.1f} ms"
                            + (f"; {len(refused)} refused: {refused[0]}" if refused else "")
                        )
                        detail = phase.breakdown(len(records))
                        if detail:
                            print(detail)
                    if args.flat_out:
                        phase = Phase(kurir, meter)
                        started = time.time()
                        sent, refused = publish_through_api(
                            f"{base}/v1/partners/f5/events",
                            token,
                            args.flat_out,
                            args.publishers,
                            None,
                            first,
                        )
                        expected = len(sent) * 5
                        receiver.wait_for(expected, timeout_s=300)
                        recorded += expected
                        kurir.wait_recorded(recorded)
                        worker_s, api_s, _ = phase.finish()
                        records = receiver.dump()
                        last = max(at for _, _, at in records)
                        rate_s = len(records) / (last - started - 1.5)
                        per = worker_s * 1000 / max(len(records), 1)
                        results["flat_out_f5"] = {
                            "deliveries": len(records),
                            "deliveries_per_s": round(rate_s),
                            "share_of_bare": round(rate_s / bare_rate, 3),
                            "worker_cpu_ms_per_delivery": round(per, 3),
                            "api_cpu_ms_per_publish": round(api_s * 1000 / max(len(sent), 1), 3),
                        }
                        print(
                            f"flat out through the API, {args.publishers} publisher processes, "
                            f"fan-out 5, {args.workers} workers: {rate_s:,.0f} deliveries/s = "
                            f"{rate_s / bare_rate:.2f}x the bare requests loop; worker CPU "
                            f"{per:.3f} ms/delivery ({per / bare_ms:.2f}x the bare POST, "
                            f"{per / u3_ms:.2f}x urllib3)"
                        )
                finally:
                    kurir.stop()
        if args.floor:
            results["floor"] = floor_phase(args, receiver, bare_ms)
    finally:
        receiver.close()
    print(json.dumps(results))
    return 0


def floor_phase(args: argparse.Namespace, receiver: ReceiverProcess, bare_ms: float) -> dict:
    """The same paced publish -> receipt trip through `bench/bare_pipeline.py`: a bare Flask
    publish (one committed INSERT, one RPUSH) and BLPOP + POST workers. Kurir cannot go
    under its latency on this machine; its worker CPU per delivery is a bare POST's plus a
    BLPOP."""
    import psutil

    from bench import bare_pipeline

    bare_pipeline.prepare(args.db, args.redis)
    rate, port = args.floor, free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "bench.bare_pipeline"]
    api_cmd = [*command, "api", str(port), args.db, args.redis]
    workers = [
        subprocess.Popen([*command, "worker", args.db, args.redis, receiver.url], cwd=ROOT)
        for _ in range(args.workers)
    ]
    try:
        with server(api_cmd, dict(os.environ), base + "/v1/partners/x/events") as api:
            meter = CpuMeter(api.pid, args.db.rsplit("/", 1)[1])

            def worker_cpu() -> float:
                return sum(sum(psutil.Process(w.pid).cpu_times()[:2]) for w in workers)

            # Warm up (connections, imports), then measure.
            sent, _ = publish_through_api(base + "/v1/partners/f1/events", "-", 40, 2, 20.0, 0)
            receiver.wait_for(len(sent), timeout_s=60)
            receiver.dump()
            cpu, worker_s = meter.snapshot(), worker_cpu()
            sent, refused = publish_through_api(
                base + "/v1/partners/f1/events", "-", rate * args.seconds, args.publishers, rate, 0
            )
            receiver.wait_for(len(sent), timeout_s=120)
            worker_s = worker_cpu() - worker_s
            now = meter.snapshot()
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(10)
    records = receiver.dump()
    lat = [(at - sent[m]) * 1000 for m, _, at in records if m in sent]
    figures = {
        "deliveries": len(records),
        "refused": len(refused),
        "worker_cpu_ms_per_delivery": round(worker_s * 1000 / max(len(records), 1), 3),
        "api_cpu_ms_per_publish": round(
            (now.get("server", 0.0) - cpu.get("server", 0.0)) * 1000 / max(len(sent), 1), 3
        ),
        "p50_ms": round(percentile(lat, 50), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "max_ms": round(max(lat, default=float("nan")), 1),
    }
    print(
        f"floor, {rate} events/s through a bare Flask publish + BLPOP/POST workers: "
        f"{figures['deliveries']:,} deliveries, worker CPU "
        f"{figures['worker_cpu_ms_per_delivery']:.3f} ms/delivery "
        f"({figures['worker_cpu_ms_per_delivery'] / bare_ms:.2f}x the bare requests POST), "
        f"API {figures['api_cpu_ms_per_publish']:.3f} ms/publish; publish->receipt "
        f"p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, "
        f"max {figures['max_ms']:.1f} ms"
    )
    return figures


def _phases(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(events/s, fan-out) of each paced phase, in order."""
    if args.phases:
        pairs = [p.split("x") for p in args.phases.split(",")]
        return [(int(rate), int(fanout)) for rate, fanout in pairs]
    rates = [int(r) for r in args.rates.split(",")]
    return [(rate, int(f)) for f in args.fanouts.split(",") for rate in rates]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="20,100,500", help="events/s of the paced phases")
    parser.add_argument("--fanouts", default="1,5", help="endpoints per event, per phase")
    parser.add_argument("--seconds", type=int, default=10, help="length of each paced phase")
    parser.add_argument(
        "--phases", default="", help="RATExFANOUT,... instead of every rate x fan-out"
    )
    parser.add_argument(
        "--floor",
        type=int,
        default=100,
        help="events/s of the floor phase through bench/bare_pipeline.py (0: skip)",
    )
    parser.add_argument(
        "--probe", action="store_true", help="count SQL, commits, Redis, wake-ups per delivery"
    )
    parser.add_argument(
        "--kept-days",
        type=int,
        default=30,
        help="PostgreSQL: past daily partitions made first, as 30 days of kept history has",
    )
    parser.add_argument("--workers", type=int, default=2, help="kurir worker processes")
    parser.add_argument("--publishers", type=int, default=4, help="publisher processes")
    parser.add_argument("--bare-n", type=int, default=4000, help="POSTs of each bare loop")
    parser.add_argument(
        "--flat-out", type=int, default=2000, help="events of the flat-out phase (0: skip)"
    )
    parser.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
