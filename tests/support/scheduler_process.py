"""`kurir scheduler` as a real process, and what its log says it ran.

Each process logs JSON at debug level to its own file; the scheduler writes a "periodic job
started" and a "periodic job finished" line around every run, with wall-clock times, so a
test can lay the runs of several processes side by side and count overlaps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KURIR = str(Path(sys.executable).with_name("kurir"))
SECRET_KEY = "kurir-process-test-secret"  # noqa: S105 - a throwaway database


def kurir_env(database_url: str, redis_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a `kurir` process on the given stores, nothing inherited from ours."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KURIR_") and k not in {"DATABASE_URL", "REDIS_URL"}
    }
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        KURIR_DATA_DIR=str(data_dir),
        KURIR_SECRET_KEY=SECRET_KEY,
        **extra,
    )
    return env


@dataclass
class Run:
    """One periodic job run as a scheduler logged it; `ended` None while it still ran."""

    scheduler: str
    job: str
    epoch: int
    started: float
    ended: float | None


class Spawned:
    """A `kurir` process in its own group and data dir, logging to a file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.log_path = logs / f"{name}.log"
        Path(env["KURIR_DATA_DIR"]).mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [KURIR, *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


class SchedulerProcess:
    """One `kurir scheduler` in its own process group and data dir, logging to a file."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.killed_at: float | None = None
        env = {**env, "KURIR_LOG_LEVEL": "debug", "KURIR_LOG_FORMAT": "json"}
        Path(env["KURIR_DATA_DIR"]).mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [KURIR, "scheduler"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def records(self) -> list[dict[str, Any]]:
        """Every JSON line logged so far (a line cut short by a kill is skipped)."""
        found = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    found.append(record)
        return found

    def said(self, message: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("msg") == message]

    def holder(self) -> str | None:
        """The holder id this process logged at start."""
        started = self.said("scheduler started")
        return str(started[0]["holder"]) if started else None

    def runs(self) -> list[Run]:
        """Its job runs; one cut off by SIGKILL ends at the kill."""
        finished = {
            (r["job"], r["started"]): r["ended"] for r in self.said("periodic job finished")
        }
        return [
            Run(
                self.name,
                r["job"],
                int(r["epoch"]),
                float(r["started"]),
                finished.get((r["job"], r["started"]), self.killed_at),
            )
            for r in self.said("periodic job started")
        ]

    def kill(self) -> float:
        """SIGKILL the whole group; the moment, on the wall clock the runs are logged in."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.killed_at = time.time()
        self.process.wait(30)
        return self.killed_at

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def overlapping_runs(runs: list[Run]) -> list[tuple[Run, Run]]:
    """Every pair of runs of the same job whose time spans meet (a run still going counts as
    running until now)."""
    now = time.time()
    pairs = []
    by_job: dict[str, list[Run]] = {}
    for run in runs:
        by_job.setdefault(run.job, []).append(run)
    for job_runs in by_job.values():
        job_runs.sort(key=lambda r: r.started)
        for i, first in enumerate(job_runs):
            first_end = first.ended if first.ended is not None else now
            for second in job_runs[i + 1 :]:
                if second.started >= first_end:
                    break
                pairs.append((first, second))
    return pairs
