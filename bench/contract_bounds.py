"""What the contract bounds cost at their worst: the most hostile downgrades and schemas tried,
registered, published and shown in the portal catalog, measured in this process.

    .venv/bin/python bench/contract_bounds.py [--db URL] [--redis URL] [--repeat 3]

The script owns --db (default: a SQLite file in a temporary folder; a PostgreSQL URL is WIPED
and migrated) and --redis (its database is flushed: publishes enqueue there, nothing works
them). Every case goes through the real Flask app with its default KURIR_MAX_PAYLOAD_BYTES
(256 KiB), one request at a time, and is measured twice: CPU time of the request (the best of
--repeat runs, without tracing) and the peak of Python memory allocated while it ran
(tracemalloc, in a separate run, since tracing slows everything down). Claim checked: every
case answers (no 500) within 2 s of CPU and 64 MiB of peak allocation; exit status 1 when one
does not. Before the bounds, the worst of these took the process down (measured in the
security review: 20 stages of doubling made a 23 MB body in 1.5 s, 30 exhausted memory; a
50-property self-referencing schema made 6.4 M values, 208 MB, in 2.8 s per catalog view).
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fresh_db import fresh_database  # noqa: E402

DEFAULT_REDIS = "redis://127.0.0.1:6379/7"
CPU_LIMIT_S = 2.0
MEMORY_LIMIT = 64 * 2**20
LOOSE = {"type": "object"}
BODY = 256 * 1024
ZEROS = "`[" + ",".join(["0"] * 600) + "]`"

# name -> (expression, what it tries)
REGISTRATIONS: dict[str, tuple[str, str]] = {
    "pipe-of-doubling-30": ("|".join(["{a: @, b: @}"] * 30), "2^30 values from anything"),
    "to_string-x10-5-stages": (
        "|".join(["to_string([@, @, @, @, @, @, @, @, @, @])"] * 5),
        "a 10^5-fold string",
    ),
    "parentheses-1000": ("(" * 1000 + "@" + ")" * 1000, "the parser's recursion"),
    "literal-600^3": (
        f"map(&map(&{ZEROS}, {ZEROS}), {ZEROS})",
        "copies no input: 216 M zeros from literals alone",
    ),
    "join-amplifier": (
        "|".join(["join('', [@, @, @, @])"] * 3) + "| join('', [@, @, @, @])",
        "4^4-fold string (copies: refused statically)",
    ),
}


def _examples_for_work_bomb() -> list[dict[str, Any]]:
    """As many items as one 256 KiB registration can carry, for a wide projection."""
    return [{"items": list(range(12_000))} for _ in range(3)]


WIDE = "items[*].{" + ", ".join(f"k{i}: `1`" for i in range(60)) + "}"


class Bench:
    def __init__(self, db_url: str, redis_url: str, data_dir: Path) -> None:
        from app.accounts import create_api_key
        from app.config import Settings
        from app.runtime import Runtime
        from app.web import create_app

        settings = Settings(
            data_dir=data_dir,
            database_url=db_url,
            redis_url=redis_url,
            secret_key=secrets.token_urlsafe(32),
            allow_private_targets=True,
        )
        self.runtime = Runtime(settings)
        self.runtime.redis.flushdb()
        with self.runtime.db.begin() as session:
            _, token = create_api_key(session, "bench", ["admin"])
        self.auth = {"Authorization": f"Bearer {token}"}
        self.app = create_app(runtime=self.runtime)
        self.client = self.app.test_client()

    def post(self, path: str, body: Any) -> Any:
        return self.client.post(path, headers=self.auth, json=body)

    def portal(self) -> Any:
        link = self.post("/v1/partners/acme/portal-links", None).get_json()["url"]
        browser = self.app.test_client()
        path = "/" + link.split("/", 3)[3]
        browser.get(path)
        browser.post(path)
        return browser


def measure(run: Callable[[], Any], repeat: int) -> dict[str, Any]:
    """CPU time (best of `repeat`) and peak traced allocation of one call of `run`."""
    best = float("inf")
    answer = None
    for _ in range(repeat):
        started = time.process_time()
        answer = run()
        best = min(best, time.process_time() - started)
    tracemalloc.start()
    tracemalloc.reset_peak()
    run()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    status = getattr(answer, "status_code", None)
    body = answer.get_json(silent=True) if answer is not None else None
    code = (body or {}).get("error", {}).get("code") if isinstance(body, dict) else None
    details = (body or {}).get("error", {}).get("details") if isinstance(body, dict) else None
    return {
        "status": status,
        "code": code,
        "details": details,
        "cpu_ms": round(best * 1000, 1),
        "peak_mib": round(peak / 2**20, 2),
        "response_bytes": len(answer.data) if answer is not None else 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default=None, help="default: SQLite in a temporary folder")
    parser.add_argument("--redis", default=DEFAULT_REDIS)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = fresh_database(args.db or f"sqlite:///{tmp}/bench.db")
        bench = Bench(url, args.redis, Path(tmp) / "data")
        assert (
            bench.post("/v1/event-types", {"name": "t", "version": 1, "schema": LOOSE}).status_code
            == 201
        )
        bench.post("/v1/partners", {"uid": "acme", "name": "Acme"})

        # Registration: every hostile expression, refused.
        for name, (expression, tries) in REGISTRATIONS.items():
            results[f"register {name}"] = dict(
                measure(
                    lambda e=expression: bench.post(
                        "/v1/event-types",
                        {
                            "name": "t",
                            "version": 2,
                            "schema": LOOSE,
                            "downgrade": e,
                            "examples": [{"x": 1}],
                        },
                    ),
                    args.repeat,
                ),
                tries=tries,
            )
        results["register wide projection on 3 x 12,000 items"] = dict(
            measure(
                lambda: bench.post(
                    "/v1/event-types",
                    {
                        "name": "t",
                        "version": 2,
                        "schema": LOOSE,
                        "downgrade": WIDE,
                        "examples": _examples_for_work_bomb(),
                    },
                ),
                args.repeat,
            ),
            tries="the work budget: 60 keys for each of 36,000 items",
        )

        # Publish: the worst expression registration lets through (four copies), on the
        # largest data a publish may carry, to an endpoint pinned below it.
        assert (
            bench.post(
                "/v1/event-types",
                {
                    "name": "t",
                    "version": 2,
                    "schema": LOOSE,
                    "downgrade": "{a: @, b: @} | {a: @, b: @}",
                    "examples": [{"note": "small"}],
                },
            ).status_code
            == 201
        )
        bench.post(
            "/v1/partners/acme/endpoints", {"url": "http://127.0.0.1:9/", "versions": {"t": 1}}
        )
        note = "n" * (BODY - 1024)
        results["publish 4 copies of 255 KiB"] = dict(
            measure(
                lambda: bench.post(
                    "/v1/partners/acme/events", {"type": "t", "version": 2, "data": {"note": note}}
                ),
                args.repeat,
            ),
            tries="a version 4x the limit",
        )
        # A stored expression from before the static bounds, only the metered run between it
        # and 2^30 values.
        from sqlalchemy import select

        from app.models import EventType

        with bench.runtime.db.begin() as session:
            row = session.scalars(
                select(EventType).where(EventType.name == "t", EventType.version == 2)
            ).one()
            row.downgrade = REGISTRATIONS["pipe-of-doubling-30"][0]
        from app import event_types

        event_types.compiled_downgrades._items.clear()
        results["publish a stored 30-stage doubling"] = dict(
            measure(
                lambda: bench.post(
                    "/v1/partners/acme/events", {"type": "t", "version": 2, "data": {"x": 1}}
                ),
                args.repeat,
            ),
            tries="2^30 values, stopped by the size budget",
        )
        with bench.runtime.db.begin() as session:
            row = session.scalars(
                select(EventType).where(EventType.name == "t", EventType.version == 2)
            ).one()
            row.downgrade = WIDE
        event_types.compiled_downgrades._items.clear()
        results["publish a wide projection on 20,000 items"] = dict(
            measure(
                lambda: bench.post(
                    "/v1/partners/acme/events",
                    {"type": "t", "version": 2, "data": {"items": list(range(20_000))}},
                ),
                args.repeat,
            ),
            tries="stopped by the work budget",
        )
        # The longest chain a pin may need, each link carrying the largest data.
        for version in range(1, event_types.MAX_DOWNGRADE_HOPS + 2):
            bench.post(
                "/v1/event-types",
                {
                    "name": "chain",
                    "version": version,
                    "schema": LOOSE,
                    **({"downgrade": "@"} if version > 1 else {}),
                },
            )
        bench.post(
            "/v1/partners/acme/endpoints", {"url": "http://127.0.0.1:9/c", "versions": {"chain": 1}}
        )
        results[f"publish through {event_types.MAX_DOWNGRADE_HOPS} downgrades, 255 KiB"] = dict(
            measure(
                lambda: bench.post(
                    "/v1/partners/acme/events",
                    {
                        "type": "chain",
                        "version": event_types.MAX_DOWNGRADE_HOPS + 1,
                        "data": {"note": note},
                    },
                ),
                args.repeat,
            ),
            tries="every link run, sized, validated and stored",
        )

        # The catalog: the self-referencing schemas of the review, and a 2,000-property one.
        for properties in (50, 120, 2000):
            bench.post(
                "/v1/event-types",
                {
                    "name": f"wide{properties}",
                    "version": 1,
                    "schema": {
                        "type": "object",
                        "properties": {f"p{i}": {"$ref": "#"} for i in range(properties)},
                    },
                },
            )
        # No recursion, but each definition refers 30 times to the next: 30^6 values.
        layers = {
            f"d{n}": {
                "type": "object",
                "properties": {f"p{i}": {"$ref": f"#/$defs/d{n + 1}"} for i in range(30)},
            }
            for n in range(6)
        }
        layers["d6"] = {"type": "string", "minLength": 200}
        bench.post(
            "/v1/event-types",
            {"name": "layers", "version": 1, "schema": {"$defs": layers, "$ref": "#/$defs/d0"}},
        )
        browser = bench.portal()
        from app.services import event_types

        made = event_types.examples.made
        results["portal catalog, first view"] = dict(
            measure(lambda: browser.get("/portal/catalog"), 1),
            tries="self-referencing schemas of 50, 120 and 2,000 properties; 30^6 layers",
        )
        results["portal catalog, first view"]["examples_made"] = event_types.examples.made - made
        results["portal catalog, later views"] = dict(
            measure(lambda: browser.get("/portal/catalog"), args.repeat),
            tries="the examples are made once per version",
        )
        bench.runtime.close()

    width = max(len(name) for name in results)
    for name, figures in results.items():
        print(
            f"{name:<{width}}  {figures['status']} {figures['code'] or '':<20} "
            f"CPU {figures['cpu_ms']:>7.1f} ms  peak {figures['peak_mib']:>6.2f} MiB  "
            f"answer {figures['response_bytes']:,} B"
            + (f"  examples made {figures['examples_made']}" if "examples_made" in figures else "")
        )
        if figures["status"] is None or figures["status"] >= 500:
            failures.append(f"{name}: status {figures['status']}")
        if figures["cpu_ms"] > CPU_LIMIT_S * 1000:
            failures.append(f"{name}: {figures['cpu_ms']} ms of CPU")
        if figures["peak_mib"] * 2**20 > MEMORY_LIMIT:
            failures.append(f"{name}: {figures['peak_mib']} MiB peak")
    print(json.dumps({"results": results, "failures": failures}, default=str))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
