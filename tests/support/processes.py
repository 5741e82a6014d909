"""Stopping a child started in its own session (`start_new_session=True`), whole group at once.

`kurir api` is gunicorn, whose master forks its workers. Signalling the child alone could
leave such grandchildren behind, holding ports and database connections into the next test
or bench phase, so the signal goes to the child's process group. The benches stop their
servers and workers with it too: one copy, here, where both the tests and bench/ may import
it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable
from typing import Any


def stop_groups(processes: Iterable[subprocess.Popen[Any] | None], timeout_s: float = 20.0) -> None:
    """SIGTERM every group first, so they shut down side by side, then wait for each leader;
    a group whose leader has not exited within `timeout_s` gets SIGKILL. A group that is
    already gone is no error (the leader may have died on its own)."""
    started = [process for process in processes if process is not None]
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    for process in started:
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def stop_group(process: subprocess.Popen[Any], timeout_s: float = 20.0) -> None:
    """Stop one child's process group: SIGTERM, then SIGKILL after `timeout_s`."""
    stop_groups([process], timeout_s)
