"""Command lines that serve a WSGI app under each HTTP server the benches compare.

The same settings as `kurir api` gives each (app/cli/http_servers.py), so that a bare app
served here and Kurir under `kurir api --server …` are measured under the same server.
"""

from __future__ import annotations

import sys

# `kurir api --server` names, and the bench's: gunicorn's sync worker is measured, not offered.
KURIR_NAMES = {"granian": "granian", "gthread": "gunicorn", "gunicorn": "gunicorn"}


def command(
    server: str, target: str, port: int, workers: int, threads: int, sync_workers: int = 1
) -> list[str]:
    """Serve `target` (``module:factory``, called once per worker) on 127.0.0.1:`port`.

    `server`: ``granian``, ``gthread`` (or ``gunicorn``) or ``sync`` (`sync_workers`
    processes of one thread, no keep-alive).
    """
    python = sys.executable
    if server == "granian":
        return [python, "-m", "granian", "--interface", "wsgi", "--factory", "--http", "1",
                "--no-ws", "--workers", str(workers), "--blocking-threads", str(threads),
                "--backpressure", "512", "--http1-header-read-timeout", "10000",
                "--workers-kill-timeout", "10", "--log-level", "error",
                "--port", str(port), target]  # fmt: skip
    gunicorn = [python, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--log-level",
                "warning", "--keep-alive", "5", "--timeout", "60",
                "--graceful-timeout", "10"]  # fmt: skip
    if server == "sync":
        gunicorn += ["--worker-class", "sync", "--workers", str(sync_workers)]
    else:
        gunicorn += ["--worker-class", "gthread", "--workers", str(workers)]
        gunicorn += ["--threads", str(threads)]
    return [*gunicorn, f"{target}()"]
