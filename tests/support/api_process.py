"""`kurir api` as a new user runs it, on SQLite, for tests over real HTTP.

What these tests look at is the HTTP server and the processes, which do not depend on the
database behind them; its data lives in a temporary directory. `server` picks the HTTP server
(`kurir api --server`); SERVERS lists those installed here, for tests that run under each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from app.cli.http_servers import installed
from app.config import HTTP_SERVERS
from app.ports import free_port
from tests.support.processes import stop_group

# The HTTP servers `kurir api` can run under that are installed here.
SERVERS: tuple[str, ...] = tuple(server for server in HTTP_SERVERS if installed(server))


@dataclass
class Api:
    url: str
    admin: str
    reader: str
    pid: int
    process: subprocess.Popen[bytes]
    server: str | None = None


def _kurir(*args: str, env: dict[str, str]) -> str:
    kurir = Path(sys.executable).with_name("kurir")
    done = subprocess.run(
        [str(kurir), *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def serve_api(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    *extra_args: str,
    server: str | None = None,
) -> Iterator[Api]:
    """Migrate, make an admin and a read-only key, start `kurir api` (under `server`, else
    the default), create a partner `acme` and a GitHub-signed inbound source `shop`; stop
    it (SIGTERM) afterwards, unless the test stopped it already."""
    data = tmp_path_factory.mktemp("kurir-api")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KURIR_") and k not in {"DATABASE_URL", "REDIS_URL"}
    }
    env.update(
        DATABASE_URL=f"sqlite:///{data / 'kurir.db'}",
        REDIS_URL=redis_url,
        KURIR_DATA_DIR=str(data),
        KURIR_SECRET_KEY="api-process-test-secret",
    )
    _kurir("db", "upgrade", env=env)
    admin = _kurir("keys", "create", "--name", "admin", env=env).strip().splitlines()[-1]
    reader = (
        _kurir("keys", "create", "--name", "reader", "--scope", "read", env=env)
        .strip()
        .splitlines()[-1]
    )
    port = free_port()
    kurir = Path(sys.executable).with_name("kurir")
    chosen = ["--server", server] if server else []
    process = subprocess.Popen(
        [str(kurir), "api", "--port", str(port), *chosen, *extra_args],
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, "kurir api exited"
            try:
                if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "kurir api did not come up"
            time.sleep(0.2)
        bearer = {"Authorization": f"Bearer {admin}"}
        assert (
            requests.post(
                f"{url}/v1/partners",
                json={"uid": "acme", "name": "Acme"},
                headers=bearer,
                timeout=10,
            ).status_code
            == 201
        )
        assert (
            requests.post(
                f"{url}/v1/sources",
                headers=bearer,
                timeout=10,
                json={"name": "shop", "scheme": "github", "secret": "github-webhook-secret"},
            ).status_code
            == 201
        )
        yield Api(url, admin, reader, process.pid, process, server)
    finally:
        stop_group(process)
