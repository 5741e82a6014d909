"""`kurir up` on the embedded defaults, as a new user runs it: no env vars, Ctrl-C to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

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
        assert (tmp_path / "var" / "kurir.db").exists()  # the embedded SQLite default
        time.sleep(1.0)  # let every child get past its start-up
        assert process.poll() is None, process.stdout.read().decode()  # type: ignore[union-attr]
        children = psutil.Process(process.pid).children(recursive=True)
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
