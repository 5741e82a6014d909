"""`kurir up` on the embedded defaults, as a new user runs it: no env vars, Ctrl-C to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import redis
import requests
from rq import Worker

from app.ports import free_port
from tests.support.factories import wait_for

pytestmark = pytest.mark.slow


def test_kurir_up_serves_ready_and_stops_every_child_on_sigint(tmp_path: Path) -> None:
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KURIR_") and k not in {"DATABASE_URL", "REDIS_URL"}
    }
    kurir = Path(sys.executable).with_name("kurir")
    process = subprocess.Popen(
        [str(kurir), "up", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    children: list[psutil.Process] = []
    try:

        def ready() -> bool:
            assert process.poll() is None, process.stdout.read().decode()  # type: ignore[union-attr]
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
            except (requests.ConnectionError, requests.Timeout):
                return False  # not listening yet, or too busy starting up to answer
            return answer.status_code == 200

        wait_for(ready, timeout_s=90, interval_s=0.3, message="/readyz to answer 200")
        database = tmp_path / "var" / "kurir.db"
        assert database.exists()  # the embedded SQLite default

        def started() -> list[psutil.Process] | None:
            """Every child past its start-up: the API answers (above), the worker has
            registered with RQ, the scheduler holds the database open (its first sweep ran),
            and the embedded redis-server runs."""
            assert process.poll() is None, process.stdout.read().decode()  # type: ignore[union-attr]
            kids = psutil.Process(process.pid).children(recursive=True)
            try:
                commands = {kid: " ".join(kid.cmdline()) for kid in kids}
                scheduler = [
                    kid for kid, command in commands.items() if command.endswith(" scheduler")
                ]
                swept = bool(scheduler) and os.path.realpath(database) in {
                    os.path.realpath(f.path) for f in scheduler[0].open_files()
                }
            except psutil.NoSuchProcess:
                return None  # a child came or went: look again
            with redis.Redis(unix_socket_path=str(tmp_path / "var" / "redis.sock")) as conn:
                registered = bool(Worker.all(connection=conn))
            redis_up = any("redis-server" in command for command in commands.values())
            return kids if swept and registered and redis_up else None

        children = wait_for(
            started, timeout_s=90, interval_s=0.3, message="every child to get past its start-up"
        )
        assert all(c.status() != psutil.STATUS_ZOMBIE for c in children)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "redis-server" in names and " api" in names
        assert " worker" in names and " scheduler" in names
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=40)[0].decode()
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert "exited with" not in output, output  # no child died on its own
    assert "did not stop in time" not in output, output  # each child honoured SIGTERM
    assert f"http://127.0.0.1:{port}" in output
    assert "kurir keys create" in output  # first-run banner
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], [p.cmdline() for p in alive]
