"""Hostile endpoints against one `kurir worker`: bounded attempts, flat memory, healthy flow.

    .venv/bin/python bench/hostile.py [-n 100] [--rate 20] [--timeout 2]
                                      [--db postgresql://...] [--redis redis://...]

The script owns --db (default: the `kurir_hostile_bench` PostgreSQL database, which it WIPES
and migrates) and --redis (flushed). It runs the hostile server of tests/support/hostile.py in
this process (one endpoint per misbehaviour: a one-byte-a-second answer, a 1 GiB body, a gzip
bomb, 10,000 headers, a 1 MiB header, silence, garbage, a redirect loop, a close mid-answer),
a healthy receiver in its own process, one `kurir worker` process (default settings, a first
retry an hour away so each delivery is one attempt) and the sweeper in this process.

  1. baseline: healthy events published at --rate/s to 5 endpoints for --baseline-s seconds,
     no hostile traffic: publish->receipt p50/p99, worker CPU per delivery;
  2. hostile: -n deliveries to each hostile endpoint, enqueued at once, while the healthy
     events go on at the same rate: per kind the error classes, the longest attempt, the most
     bytes kept; the healthy p50/p99/max, and p99 per 10 s window; the worker's RSS before,
     at its peak and after; the worker's CPU per unit of work (attempt or delivery) beside
     the baseline's CPU per delivery.

Claims checked (the issue's figures): every attempt ends within timeout + 1 s, keeps
<= 4 KiB, the worker's RSS grows < 50 MB, the healthy p99 stays < 1 s. The exit status is 1
when one does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench.deliver import Kurir, ReceiverProcess, percentile  # noqa: E402
from bench.fresh_db import fresh_database  # noqa: E402
from tests.support.hostile import HOSTILE_PATHS, HostileServer  # noqa: E402

DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/kurir_hostile_bench"
DEFAULT_REDIS = "redis://127.0.0.1:6379/5"
HEALTHY_ENDPOINTS = 5
MAX_KEPT = 4096


class Sampler:
    """RSS and CPU of one process, sampled on a thread; the peak RSS is kept."""

    def __init__(self, pid: int, every_s: float = 0.1) -> None:
        self.process = psutil.Process(pid)
        self.every_s = every_s
        self.peak = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def cpu(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def reset_peak(self) -> None:
        self.peak = self.rss()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.peak = max(self.peak, self.rss())
            except psutil.Error:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


class PacedPublisher:
    """Healthy events at a fixed rate (open loop) until stopped; event id -> commit time."""

    def __init__(self, kurir: Kurir, uid: str, rate: float) -> None:
        self.kurir = kurir
        self.uid = uid
        self.rate = rate
        self.published: dict[str, float] = {}
        self.late = 0  # sends that started behind schedule (the publisher could not keep up)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PacedPublisher:
        self._thread.start()
        return self

    def _run(self) -> None:
        start = time.monotonic()
        i = 0
        while not self._stop.is_set():
            delay = start + i / self.rate - time.monotonic()
            if delay > 0:
                if self._stop.wait(delay):
                    return
            elif delay < -0.05:
                self.late += 1
            event_id, at = self.kurir.publish(self.uid, i)
            self.published[event_id] = at
            i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _healthy_latencies(published: dict[str, float], records: list[Any]) -> list[float]:
    return [
        (at - published[msg_id]) * 1000
        for msg_id, path, at in records
        if msg_id in published and path.startswith("/ok")
    ]


def _windows(published: dict[str, float], records: list[Any], width_s: float = 10.0) -> list[float]:
    """p99 of the healthy latencies per `width_s` window of publish time: where a stall was."""
    if not published:
        return []
    start = min(published.values())
    buckets: dict[int, list[float]] = {}
    for msg_id, path, at in records:
        if msg_id in published and path.startswith("/ok"):
            index = int((published[msg_id] - start) // width_s)
            buckets.setdefault(index, []).append((at - published[msg_id]) * 1000)
    return [round(percentile(buckets[i], 99), 1) for i in sorted(buckets)]


def _attempt_rows(kurir: Kurir, partner_uid: str) -> list[tuple[str, Any, Any, int, int]]:
    from sqlalchemy import func, select

    from app.models import Attempt, Delivery, Endpoint, Partner

    with kurir.runtime.db.begin() as session:
        return [
            tuple(row)
            for row in session.execute(  # type: ignore[misc]
                select(
                    Endpoint.url,
                    Attempt.response_status,
                    Attempt.error,
                    Attempt.duration_ms,
                    func.coalesce(func.length(Attempt.response_body), 0),
                )
                .join(Delivery, Delivery.id == Attempt.delivery_id)
                .join(Endpoint, Endpoint.id == Delivery.endpoint_id)
                .join(Partner, Partner.id == Endpoint.partner_id)
                .where(Partner.uid == partner_uid)
            )
        ]


def _make_partner(kurir: Kurir, uid: str, urls: list[str], timeout_s: int) -> None:
    from app.registry import endpoints as service
    from app.registry import partners

    with kurir.runtime.db.begin() as session:
        partner = partners.create_partner(session, {"uid": uid, "name": uid})
        for url in urls:
            service.create_endpoint(
                session,
                partner,
                {"url": url, "timeout_s": timeout_s},
                kurir.settings,
                kurir.runtime.secret_box,
            )


def run(args: argparse.Namespace) -> int:
    from sender.dispatch import enqueue_now

    fresh_database(args.db)
    receiver = ReceiverProcess()
    results: dict[str, Any] = {
        "n_per_kind": args.n,
        "timeout_s": args.timeout,
        "healthy_rate_per_s": args.rate * HEALTHY_ENDPOINTS,
    }
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, HostileServer() as hostile:
        kurir = Kurir(args.db, args.redis, 1, Path(tmp))
        kurir.env["KURIR_RETRY_SCHEDULE"] = "3600"  # one attempt per delivery in this run
        _make_partner(
            kurir,
            "healthy",
            [f"{receiver.url}/ok{i}" for i in range(HEALTHY_ENDPOINTS)],
            args.timeout,
        )
        _make_partner(kurir, "hostile", [hostile.url + p for p in HOSTILE_PATHS], args.timeout)
        kurir.start()
        sampler = Sampler(kurir.workers[0].pid)
        try:
            # Warm-up: the worker's pools, caches and threads exist before anything counts.
            warm = PacedPublisher(kurir, "healthy", args.rate).start()
            time.sleep(3)
            warm.stop()
            receiver.wait_for(len(warm.published) * HEALTHY_ENDPOINTS, timeout_s=60)
            receiver.dump()

            # 1. Baseline: healthy traffic alone.
            cpu0 = sampler.cpu()
            baseline = PacedPublisher(kurir, "healthy", args.rate).start()
            time.sleep(args.baseline_s)
            baseline.stop()
            expected = len(baseline.published) * HEALTHY_ENDPOINTS
            receiver.wait_for(expected, timeout_s=60)
            base_cpu_per_delivery = (sampler.cpu() - cpu0) / max(1, expected)
            base_lat = _healthy_latencies(baseline.published, receiver.dump())
            results["baseline"] = {
                "deliveries": expected,
                "received": len(base_lat),
                "p50_ms": round(percentile(base_lat, 50), 1),
                "p99_ms": round(percentile(base_lat, 99), 1),
                "worker_cpu_ms_per_delivery": round(base_cpu_per_delivery * 1000, 3),
                "publisher_late_sends": baseline.late,
            }
            print(
                f"baseline, healthy only: {expected} deliveries at {args.rate * 5}/s, "
                f"publish->receipt p50 {percentile(base_lat, 50):.1f} ms, "
                f"p99 {percentile(base_lat, 99):.1f} ms; worker CPU "
                f"{base_cpu_per_delivery * 1000:.2f} ms per delivery"
            )

            # 2. Hostile: n deliveries to each hostile endpoint, healthy traffic continuing.
            rss_before = sampler.rss()
            sampler.reset_peak()
            hostile_ids = kurir.publish_quietly("hostile", args.n)
            cpu0, wall0 = sampler.cpu(), time.monotonic()
            healthy = PacedPublisher(kurir, "healthy", args.rate).start()
            for start in range(0, len(hostile_ids), 100):
                enqueue_now(kurir.runtime.redis, hostile_ids[start : start + 100])
            deadline = time.monotonic() + args.n * args.timeout * 2 + 120
            while len(_attempt_rows(kurir, "hostile")) < len(hostile_ids):
                if time.monotonic() > deadline:
                    failures.append("not every hostile delivery was attempted in time")
                    break
                time.sleep(0.5)
            healthy.stop()
            hostile_wall = time.monotonic() - wall0
            expected = len(healthy.published) * HEALTHY_ENDPOINTS
            receiver.wait_for(expected, timeout_s=60)
            phase_cpu = sampler.cpu() - cpu0
            rss_peak, rss_after = sampler.peak, sampler.rss()
            lat_records = receiver.dump()
            lat = _healthy_latencies(healthy.published, lat_records)
            rows = _attempt_rows(kurir, "hostile")
            per_kind: dict[str, Any] = {}
            for path in HOSTILE_PATHS:
                mine = [r for r in rows if r[0].endswith(path)]
                outcomes = Counter(f"{status}/{error}" for _, status, error, _, _ in mine)
                per_kind[path] = {
                    "attempts": len(mine),
                    "outcomes": dict(outcomes),
                    "max_duration_ms": max((r[3] for r in mine), default=0),
                    "max_kept_bytes": max((r[4] for r in mine), default=0),
                }
            results["hostile"] = {
                "attempts": len(rows),
                "wall_s": round(hostile_wall, 1),
                "per_kind": per_kind,
                # Both kinds of work share the phase: its CPU per unit, beside the baseline's.
                "worker_cpu_ms_per_unit": round(phase_cpu / max(1, len(rows) + expected) * 1000, 3),
            }
            windows = _windows(healthy.published, lat_records)
            results["healthy_p99_ms_per_10s"] = windows
            results["healthy_during_hostile"] = {
                "deliveries": expected,
                "received": len(lat),
                "p50_ms": round(percentile(lat, 50), 1),
                "p99_ms": round(percentile(lat, 99), 1),
                "max_ms": round(max(lat, default=float("nan")), 1),
                "publisher_late_sends": healthy.late,
            }
            results["worker_rss_mb"] = {
                "before": round(rss_before / 2**20, 1),
                "peak": round(rss_peak / 2**20, 1),
                "after": round(rss_after / 2**20, 1),
                "growth_to_peak": round((rss_peak - rss_before) / 2**20, 1),
            }
        finally:
            sampler.stop()
            kurir.stop()
            receiver.close()

    print(
        f"hostile: {len(rows)} attempts ({args.n} per kind) in {hostile_wall:.0f}s beside "
        f"{results['healthy_during_hostile']['deliveries']} healthy deliveries; worker CPU "
        f"{results['hostile']['worker_cpu_ms_per_unit']:.2f} ms per attempt or delivery "
        f"(baseline {results['baseline']['worker_cpu_ms_per_delivery']:.2f} ms per delivery)"
    )
    for path, kind in per_kind.items():
        print(
            f"  {path:15} {kind['attempts']:4d} attempts  {kind['outcomes']}  longest "
            f"{kind['max_duration_ms']} ms  kept <= {kind['max_kept_bytes']} B"
        )
        if kind["attempts"] < args.n:
            failures.append(f"{path}: {kind['attempts']} attempts")
        if kind["max_duration_ms"] > (args.timeout + 1) * 1000:
            failures.append(f"{path}: an attempt took {kind['max_duration_ms']} ms")
        if kind["max_kept_bytes"] > MAX_KEPT:
            failures.append(f"{path}: kept {kind['max_kept_bytes']} bytes")
    healthy_fig = results["healthy_during_hostile"]
    rss = results["worker_rss_mb"]
    print(
        f"healthy during hostile: {healthy_fig['received']}/{healthy_fig['deliveries']} "
        f"received, p50 {healthy_fig['p50_ms']} ms, p99 {healthy_fig['p99_ms']} ms, max "
        f"{healthy_fig['max_ms']} ms"
    )
    print(f"healthy p99 per 10 s of the hostile phase: {results['healthy_p99_ms_per_10s']}")
    print(
        f"worker RSS: {rss['before']} MiB before, {rss['peak']} MiB peak, {rss['after']} MiB "
        f"after (+{rss['growth_to_peak']} MiB)"
    )
    if healthy_fig["received"] < healthy_fig["deliveries"]:
        failures.append("healthy deliveries missing")
    if healthy_fig["p99_ms"] >= 1000:
        failures.append(f"healthy p99 {healthy_fig['p99_ms']} ms")
    if rss["growth_to_peak"] >= 50:
        failures.append(f"worker RSS grew {rss['growth_to_peak']} MiB")
    results["failures"] = failures
    print(json.dumps(results))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=100, help="attempts per hostile kind")
    parser.add_argument(
        "--rate", type=float, default=20, help="healthy events per second (each to 5 endpoints)"
    )
    parser.add_argument("--timeout", type=int, default=2, help="every endpoint's timeout_s")
    parser.add_argument("--baseline-s", type=float, default=10)
    parser.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    parser.add_argument("--redis", default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS))
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
