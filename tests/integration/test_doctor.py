"""`kurir doctor` against real PostgreSQL and Redis: fits, over budget, unreachable; and the
connections it counts are the ones Kurir's processes name on the servers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import text

from app.budget import ProcessKind
from app.config import Settings
from app.ports import free_port
from app.runtime import Runtime
from tests.support.factories import wait_for
from tests.support.scheduler_process import KURIR, kurir_env

pytestmark = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


def _doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own command
        [KURIR, "doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _env(settings: Settings, tmp_path: Path, **extra: str) -> dict[str, str]:
    return kurir_env(
        str(settings.database_url), str(settings.redis_url), tmp_path / "doctor", **extra
    )


def test_the_default_fleet_fits_and_each_kind_is_counted(
    settings: Settings, tmp_path: Path
) -> None:
    result = _doctor(_env(settings, tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    kinds = {row["kind"]: row for row in report["kinds"]}
    assert kinds["api"]["postgres"] == 2 * 2 * 10
    assert kinds["worker"]["postgres"] == 4 * 6
    assert kinds["scheduler"]["postgres"] == 2 * 5
    assert report["total"]["postgres"] == 76
    pg = report["postgresql"]
    assert pg["max_connections"] > 0 and pg["available"] == pg["max_connections"] - pg["reserved"]
    assert report["redis"]["maxclients"] > 0
    text_report = _doctor(_env(settings, tmp_path))
    assert text_report.returncode == 0
    assert "fits" in text_report.stdout and "max_connections" in text_report.stdout


def test_a_fleet_over_the_servers_limits_exits_1(settings: Settings, tmp_path: Path) -> None:
    small = _doctor(_env(settings, tmp_path), "--json")
    limits = json.loads(small.stdout)
    workers_over = limits["postgresql"]["available"] // 6 + 1
    result = _doctor(_env(settings, tmp_path), "--workers", str(workers_over), "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["postgresql"]["over_budget"] is True
    assert report["total"]["postgres"] > report["postgresql"]["available"]
    # A bigger pool per process says the same of a fleet that fitted before.
    threads = _doctor(
        _env(settings, tmp_path, KURIR_API_THREADS="256", KURIR_API_WORKERS="64"),
        "--api",
        "2",
    )
    assert threads.returncode == 1
    assert "OVER BUDGET" in threads.stdout
    # Redis: its maxclients, read from the server, bounds the fleet too.
    workers_over_redis = limits["redis"]["maxclients"] // 12 + 1
    many = _doctor(_env(settings, tmp_path), "--workers", str(workers_over_redis), "--json")
    assert many.returncode == 1
    assert json.loads(many.stdout)["redis"]["over_budget"] is True


def test_an_unreachable_store_exits_2(settings: Settings, tmp_path: Path) -> None:
    no_redis = _doctor(
        kurir_env(
            str(settings.database_url),
            f"redis://127.0.0.1:{free_port()}/0",
            tmp_path / "doctor",
        ),
        "--json",
    )
    assert no_redis.returncode == 2
    report = json.loads(no_redis.stdout)
    assert [u["store"] for u in report["unreachable"]] == ["Redis"]
    assert report["postgresql"]["max_connections"] > 0
    no_postgres = _doctor(
        kurir_env(
            f"postgresql://kurir@127.0.0.1:{free_port()}/kurir",
            str(settings.redis_url),
            tmp_path / "doctor",
        )
    )
    assert no_postgres.returncode == 2
    assert "PostgreSQL is unreachable" in no_postgres.stderr
    assert "Traceback" not in no_postgres.stderr


def test_connections_carry_their_kind_and_doctor_counts_them_now(
    settings: Settings, tmp_path: Path
) -> None:
    worker = Runtime(settings, kind=ProcessKind.WORKER)
    try:
        with worker.db.engine.connect() as connection:
            name = connection.execute(text("SELECT current_setting('application_name')")).scalar()
            assert name == "kurir-worker"
            worker.redis.ping()
            assert worker.redis.client_getname() in ("kurir-worker", b"kurir-worker")
            result = _doctor(_env(settings, tmp_path), "--json")
            report = json.loads(result.stdout)
            assert report["postgresql"]["in_use"].get("worker", 0) >= 1
            assert report["redis"]["in_use"].get("worker", 0) >= 1
    finally:
        worker.close()
    probe = redis.Redis.from_url(str(settings.redis_url))
    own_db = probe.connection_pool.connection_kwargs.get("db", 0)
    try:
        # The worker's connections are gone once it closes.
        wait_for(
            lambda: (
                not any(
                    c.get("name") == "kurir-worker" and c.get("db") == str(own_db)
                    for c in probe.client_list()  # server-wide: other runs use other dbs
                )
            ),
            timeout_s=10,
        )
    finally:
        probe.close()
