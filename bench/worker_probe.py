"""A `kurir worker` that counts what it does, for `bench/everyday.py --probe`.

    python bench/worker_probe.py DIR      (instead of `python -m app.cli worker`)

Where a delivery's CPU goes at a trickle is a question of *how many* things happen per
delivery (SQL statements, commits, Redis round trips, thread wake-ups) as much as of what each
costs, and a sampling profiler answers only the second. This runs the ordinary worker with
counters hooked in from outside (the engine carries no bench code):

  sql        statements sent to the database (SQLAlchemy `before_cursor_execute`, and those
             run on the driver, `app.db_direct`), keyed by their first words, and per thread
  commits    transactions committed (SQLAlchemy `commit`), per thread
  checkouts  pool checkouts (a session's connection), per thread
  redis      Redis round trips (one per command, one per pipeline), per thread
  cpu, wakes per thread: user + system CPU and voluntary context switches (each one a sleep
             that ended: a wake-up), from /proc/self/task

On SIGUSR1 it writes them all to DIR/<pid>.json (atomically); the bench reads them at the
start and end of a phase and divides the difference by the phase's deliveries.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_COUNTS: Counter[str] = Counter()
_TICKS = os.sysconf("SC_CLK_TCK")
# kurir-fast-3 -> kurir-fast: one line per kind of thread, not per thread.
_NUMBERED = re.compile(r"[-_ ]?\d+$")


def _thread() -> str:
    return _NUMBERED.sub("", threading.current_thread().name)


def _count(kind: str, detail: str | None = None) -> None:
    thread = _thread()
    # Counter updates from many threads: the GIL makes each += atomic enough for a bench.
    _COUNTS[f"{kind}|{thread}"] += 1
    if detail is not None:
        _COUNTS[f"{kind}:{detail}"] += 1


def _statement_key(statement: str) -> str:
    """`UPDATE deliveries`, `INSERT INTO attempts`, `SELECT ... FROM endpoints`..."""
    words = statement.split()
    if not words:
        return "?"
    verb = words[0].upper()
    lowered = [w.lower() for w in words]
    marker = {"INSERT": "into", "SELECT": "from", "DELETE": "from"}.get(verb, verb.lower())
    if marker in lowered[:-1]:
        return f"{verb} {lowered[lowered.index(marker) + 1].strip('(')}"
    return verb


def install() -> None:
    """Hook the counters into SQLAlchemy and redis-py, and the dump into SIGUSR1."""
    import redis.connection
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import Pool

    def before_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        _count("sql", _statement_key(statement))

    event.listen(Engine, "before_cursor_execute", before_execute)
    event.listen(Engine, "commit", lambda conn: _count("commits"))
    event.listen(Pool, "checkout", lambda *args: _count("checkouts"))

    # Statements run on the driver (the claim, the record of successes) bypass SQLAlchemy's
    # execution events: counted where they are sent.
    from app.db_direct import DirectStatement

    direct = DirectStatement._call

    def counted_direct(self: DirectStatement, params: Any, *, fetch: bool, held: Any = None) -> Any:
        _count("sql", _statement_key(self.sql))
        return direct(self, params, fetch=fetch, held=held)

    DirectStatement._call = counted_direct  # type: ignore[method-assign]

    send = redis.connection.AbstractConnection.send_packed_command

    def counted_send(self: Any, command: Any, check_health: bool = True) -> None:
        _count("redis")
        send(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _dump)


def threads() -> dict[str, dict[str, float]]:
    """CPU seconds and voluntary context switches per kind of thread, this process."""
    names = {t.native_id: _NUMBERED.sub("", t.name) for t in threading.enumerate()}
    out: dict[str, dict[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICKS
        wakes = int(re.search(r"voluntary_ctxt_switches:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
        name = names.get(int(task.name), "other")
        entry = out.setdefault(name, {"cpu": 0.0, "wakes": 0})
        entry["cpu"] += cpu
        entry["wakes"] += wakes
    return out


def _dump(*_: Any) -> None:
    target = Path(os.environ["KURIR_PROBE_DIR"]) / f"{os.getpid()}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps({"counts": dict(_COUNTS), "threads": threads()}))
    tmp.replace(target)


def main() -> None:
    os.environ["KURIR_PROBE_DIR"] = sys.argv[1]
    install()
    from app.cli import cli

    cli(["worker"], prog_name="kurir")


if __name__ == "__main__":
    main()
