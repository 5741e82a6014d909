"""At-least-once under chaos, CI-sized: `bench/chaos.py` with 1,000 deliveries per backend.

Workers are SIGKILLed every 2-5 s and started again, Redis is restarted twice (once after a
FLUSHALL), and on PostgreSQL every backend of the run's own database is terminated once,
while receivers fail 10 % of requests. Nothing published may be lost; duplicates are
allowed (at-least-once) and reported. The run owns its stores: a redis-server on a free
port, and on PostgreSQL a database named after TEST_DATABASE_URL's with `_chaos` appended.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import chaos

pytestmark = pytest.mark.slow


def _chaos_database() -> str:
    raw = os.environ.get("TEST_DATABASE_URL")
    if not raw:
        pytest.skip("PostgreSQL: TEST_DATABASE_URL is unset")
    base, name = raw.rsplit("/", 1)
    return f"{base}/{name}_chaos"


@pytest.mark.parametrize("store", ["postgresql", "sqlite"])
def test_nothing_published_is_lost_under_kills_restarts_and_dropped_connections(
    store: str, tmp_path: Path
) -> None:
    database_url = _chaos_database() if store == "postgresql" else ""
    report = chaos.run(
        chaos.ChaosConfig(
            events=1000,
            endpoints=20,
            backend=store,
            database_url=database_url,
            publish_seconds=12,
            drain_timeout_s=300,
            work_dir=tmp_path,
        )
    )
    print(report.text())  # the figures, for the CI log (pytest -s / -rP)
    # The faults really happened.
    assert report.kills >= 2
    assert report.redis_restarts == 2
    if store == "postgresql":
        assert report.backends_terminated >= 3  # api, scheduler and workers held connections
    assert report.failed_answers > 0
    # Everything acknowledged was delivered, nothing is left undecided.
    assert report.published == 1000
    assert report.lost == 0, report.lost_examples
    assert report.delivered == report.published
    assert report.dead_letters == 0
    assert report.unexpected == 0
    assert set(report.delivery_states) == {"succeeded"}
