"""A small month of history through bench/lifecycle.py, as CI runs it (the full run's figures
are in docs/benchmarks.md): the bench loads ten days, runs retention with workers delivering
and publishes arriving, and exits 0 only if every unfinished row it planted (open dead
letters, retrying deliveries) is still there afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import make_url

from app.config import normalise_database_url
from app.embedded_redis import EmbeddedRedis

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_small_month_purges_finished_history_and_keeps_the_unfinished(
    database: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KURIR_", "BENCH_"))}
    env.pop("DATABASE_URL", None)
    if database == "postgresql":
        raw = os.environ.get("TEST_DATABASE_URL")
        if not raw:
            pytest.skip("PostgreSQL: TEST_DATABASE_URL is unset")
        own = make_url(normalise_database_url(raw))
        # The bench wipes what it is given: a database of its own beside the tests'.
        env["BENCH_DATABASE_URL"] = own.set(database=f"{own.database}_month").render_as_string(
            hide_password=False
        )
    redis = EmbeddedRedis(tmp_path / "redis")
    redis_url = redis.start()
    try:
        done = subprocess.run(
            [
                sys.executable,
                "bench/lifecycle.py",
                *("--days", "10", "--scale", "0.0005", "--retain-days", "7"),
                *("--publishes", "40", "--drain", "100", "--repeat", "3"),
                # A short look for autovacuum's cleanup after the purge (the full run waits
                # up to half an hour for it before its settled reads).
                *("--settle-s", "20"),
                # Retention as fast as it may go (SQLite's default pauses a hundred times
                # each batch's time): the test checks what is kept, not the pauses.
                *("--retention-yield", "1"),
                *("--redis", redis_url),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        redis.stop()
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    loaded = re.search(r"loaded 10 days .*?: ([\d,]+) events", out)
    assert loaded is not None, out
    assert int(loaded.group(1).replace(",", "")) == 10_000
    purged = re.search(r"retention: ([\d,]+) rows", out)
    assert purged is not None, out
    # Three of the ten days are past a seven-day horizon: about 3,000 events and their rows.
    assert int(purged.group(1).replace(",", "")) > 5_000, out
    kept = re.search(r"unfinished rows kept: (\d+) of (\d+) open dead letters, (\d+) of (\d+)", out)
    assert kept is not None, out
    assert kept.group(1) == kept.group(2) != "0"
    assert kept.group(3) == kept.group(4) != "0"
    for counted in ("from send", "from schedule"):
        assert re.search(rf"{counted}\s+p99 ratio \d+\.\d+ x", out), out
    if database == "postgresql":
        # The slowest publishes during retention, each beside what retention was doing.
        listed = re.findall(r"^\s+\+\s*\d+\.\d+ s\s+\d+\.\d+ ms\s+\S.*$", out, re.MULTILINE)
        assert listed, out
    assert "before p50/p95 ms" in out
    if database == "postgresql":
        assert re.search(r"^after the purge: (settled|still busy|vacuumed)", out, re.MULTILINE), out
