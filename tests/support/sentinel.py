"""A real Redis master, its replica and three sentinels, all on 127.0.0.1, for failover tests.

Each server is a `redis-server` child in its own session with a generated config in the test's
directory, on a free port. Failure detection is shortened (`down-after-milliseconds`,
`failover-timeout`) so that a forced failover completes in seconds.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from app.ports import free_port
from tests.support.factories import wait_for
from tests.support.processes import stop_groups

MASTER_NAME = "kurir"
QUORUM = 2


def redis_server() -> str:
    """The `redis-server` binary, or skip: the test needs real servers."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    return binary


class SentinelGroup:
    """Master + replica + sentinels; `url` is the REDIS_URL Kurir is given."""

    def __init__(self, directory: Path, sentinels: int = 3) -> None:
        self.directory = directory
        self.master_port = free_port()
        self.replica_port = free_port()
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def _spawn(self, name: str, config: str, *args: str) -> None:
        folder = self.directory / name
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "redis.conf"
        conf.write_text(config + f"dir {folder}\n")
        log = open(folder / "log", "ab")  # noqa: SIM115 - the child holds it
        self.processes.append(
            subprocess.Popen(
                [redis_server(), str(conf), *args],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        log.close()

    def start(self) -> SentinelGroup:
        server = 'bind 127.0.0.1\nport {port}\nsave ""\nappendonly no\n'
        self._spawn("master", server.format(port=self.master_port))
        self._spawn(
            "replica",
            server.format(port=self.replica_port) + f"replicaof 127.0.0.1 {self.master_port}\n",
        )
        for n, port in enumerate(self.sentinel_ports):
            self._spawn(
                f"sentinel-{n}",
                f"bind 127.0.0.1\nport {port}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} {QUORUM}\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} 2000\n"
                f"sentinel failover-timeout {MASTER_NAME} 10000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n",
                "--sentinel",
            )
        wait_for(lambda: self.replication_up(self.replica_port), 30, message="replica in sync")
        wait_for(self._sentinels_ready, 60, 0.2, message="sentinels see each other and the replica")
        return self

    def stop(self) -> None:
        stop_groups(self.processes, timeout_s=10)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)

    def _ask(self, port: int, *command: Any) -> Any:
        with contextlib.closing(self.client(port)) as client:
            return client.execute_command(*command)

    def replication_up(self, port: int) -> bool:
        """True once the server at `port` is a replica with its link to the master up."""
        with contextlib.suppress(redis.RedisError):
            with contextlib.closing(self.client(port)) as client:
                info = client.info("replication")
            return info.get("role") == "slave" and info.get("master_link_status") == "up"
        return False

    def role(self, port: int) -> str | None:
        """`master` or `slave` as the server at `port` says, None when it does not answer."""
        try:
            return str(self._ask(port, "ROLE")[0].decode())
        except redis.RedisError:
            return None

    def _sentinels_ready(self) -> bool:
        for port in self.sentinel_ports:
            try:
                with contextlib.closing(self.client(port)) as client:
                    state = client.sentinel_master(MASTER_NAME)
            except redis.RedisError:
                return False
            others = int(state["num-other-sentinels"])
            if int(state["num-slaves"]) < 1 or others < len(self.sentinel_ports) - 1:
                return False
        return True

    def master_seen_by_all(self) -> int | None:
        """The master's port when every sentinel names the same one, else None."""
        ports = set()
        for port in self.sentinel_ports:
            try:
                _host, master = self._ask(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
            except (redis.RedisError, TypeError):
                return None
            ports.add(int(master))
        return ports.pop() if len(ports) == 1 else None

    def failover(self) -> None:
        """`SENTINEL FAILOVER`, asked again while the sentinel has no good replica yet."""

        def ask() -> bool:
            try:
                return bool(self._ask(self.sentinel_ports[0], "SENTINEL", "FAILOVER", MASTER_NAME))
            except redis.ResponseError as exc:
                if "NOGOODSLAVE" in str(exc):
                    return False
                raise

        wait_for(ask, 30, 0.2, message="the sentinel to start a failover")
