"""The HTTP servers `kurir api` can run the WSGI app under: gunicorn (gthread) and granian.

`KURIR_HTTP_SERVER` (or `kurir api --server`) picks one; docs/benchmarks.md has the
measurements behind the default and what each server does with slow, early-answered and
stopping connections. Both run `api_workers` processes of `api_threads` threads each, build
the app once per worker process and freeze what it built (see :func:`_build_app`).

What each server is asked for, and why:

- an answer given before the body was read closes its connection and says so
  (app/web/keepalive.py), through the glue installed here for each server;
- a bounded wait for a request's headers, so that a client trickling them in cannot hold a
  thread or a connection slot for ever (granian: ``header_read_timeout``, which is also its
  idle keep-alive limit; gunicorn gthread has no such bound, see docs/benchmarks.md);
- a graceful stop on SIGTERM: in-flight requests finish within GRACEFUL_TIMEOUT_S and new
  connections are refused (granian; a stopping gunicorn worker still lets the kernel accept
  them, then resets them); SIGHUP starts fresh workers and lets the old ones finish theirs;
- a worker that dies is replaced.
"""

from __future__ import annotations

import gc
import importlib.util
import os
from typing import Any

from app.config import HTTP_SERVERS, Settings

# In-flight requests get this long to finish on SIGTERM (and on SIGHUP, for the old workers).
GRACEFUL_TIMEOUT_S = 10
# gunicorn: how long an idle kept-alive connection stays open.
GUNICORN_KEEPALIVE_S = 5
# gunicorn: a worker silent this long (a request stuck in the app) is killed and replaced.
GUNICORN_WORKER_TIMEOUT_S = 60
# granian: a request's headers must arrive within this long of the connection being ready
# for them (a new connection, or a kept-alive one after its previous answer); then it closes.
GRANIAN_HEADER_READ_TIMEOUT_S = 10
# granian: connections one worker serves at once (kept-alive idle ones count); over it, new
# connections wait in the listen backlog. Idle ones close after the header timeout above.
GRANIAN_CONNECTIONS_PER_WORKER = 512
# granian: seconds between starting a new worker and stopping the old one on SIGHUP.
GRANIAN_RESPAWN_INTERVAL_S = 1.0


def installed(server: str) -> bool:
    """Whether `server` (one of app.config.HTTP_SERVERS) can be imported here."""
    return importlib.util.find_spec(server) is not None


def missing(server: str) -> str | None:
    """Why `server` cannot run here (what to do instead), or None when it can."""
    if installed(server):
        return None
    others = [other for other in HTTP_SERVERS if other != server and installed(other)]
    instead = f", or choose KURIR_HTTP_SERVER={others[0]}" if others else ""
    return f"the HTTP server {server!r} is not installed here: pip install {server}{instead}"


def serve(
    server: str, settings: Settings, host: str, port: int, workers: int, threads: int
) -> None:
    """Run `server` (one of app.config.HTTP_SERVERS) until it is stopped."""
    if server == "granian":
        _serve_granian(settings, host, port, workers, threads)
    else:
        _serve_gunicorn(settings, host, port, workers, threads)


def _build_app(settings: Settings, *, gunicorn: bool) -> Any:
    """The WSGI app for one worker process.

    Everything built so far lives as long as the worker: out of the collector's sight, a full
    collection no longer walks it (~100 ms with every thread stopped).
    """
    from app.budget import ProcessKind
    from app.runtime import Runtime
    from app.web import create_app, keepalive

    app: Any = create_app(runtime=Runtime(settings, kind=ProcessKind.API))
    app = keepalive.with_gunicorn_close(app) if gunicorn else keepalive.with_close_header(app)
    gc.freeze()
    return app


def _serve_gunicorn(settings: Settings, host: str, port: int, workers: int, threads: int) -> None:
    from gunicorn.app.base import BaseApplication

    from app.web import keepalive

    class KurirServer(BaseApplication):
        def load_config(self) -> None:
            self.cfg.set("bind", f"{host}:{port}")
            self.cfg.set("workers", workers)
            self.cfg.set("threads", threads)
            self.cfg.set("worker_class", "gthread")
            self.cfg.set("graceful_timeout", GRACEFUL_TIMEOUT_S)
            self.cfg.set("timeout", GUNICORN_WORKER_TIMEOUT_S)
            self.cfg.set("keepalive", GUNICORN_KEEPALIVE_S)
            self.cfg.set("accesslog", None)
            self.cfg.set("loglevel", "warning")
            self.cfg.set("pre_request", keepalive.remember_request)

        def load(self) -> Any:
            return _build_app(settings, gunicorn=True)

    KurirServer().run()


def _granian_app(settings: Settings) -> Any:
    """granian's target loader, run in each worker process (module level: it is pickled)."""
    return without_process_environment(_build_app(settings, gunicorn=False), dict(os.environ))


# What a WSGI server sets for each request (PEP 3333 and CGI), besides HTTP_* and wsgi.*.
_REQUEST_KEYS = frozenset(
    (
        "REQUEST_METHOD",
        "SCRIPT_NAME",
        "PATH_INFO",
        "QUERY_STRING",
        "CONTENT_TYPE",
        "CONTENT_LENGTH",
        "SERVER_NAME",
        "SERVER_PORT",
        "SERVER_PROTOCOL",
        "SERVER_SOFTWARE",
        "GATEWAY_INTERFACE",
        "REMOTE_ADDR",
        "REMOTE_PORT",
        "REQUEST_URI",
        "RAW_URI",
    )
)


def without_process_environment(app: Any, process_env: dict[str, str]) -> Any:
    """Drop from each request's environ what granian copied there from the process's.

    granian starts every WSGI environ from ``os.environ`` (a CGI habit PEP 3333 allows),
    so each request would carry KURIR_SECRET_KEY, DATABASE_URL and the rest into anything
    that logs or reports an environ. gunicorn does not; neither does Kurir under granian.
    The keys the server sets for the request are never dropped, whatever the process's
    environment holds; a header that happens to equal a same-named variable
    (``HTTP_PROXY``) is, which loses nothing.
    """
    inherited = tuple((k, v) for k, v in process_env.items() if k not in _REQUEST_KEYS)

    def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
        for key, value in inherited:
            if environ.get(key) == value:
                del environ[key]
        return app(environ, start_response)

    return wsgi


def _serve_granian(settings: Settings, host: str, port: int, workers: int, threads: int) -> None:
    from functools import partial

    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels
    from granian.server import Server

    server = Server(
        "kurir",  # a name only: the app comes from the loader below
        address=host,
        port=port,
        interface=Interfaces.WSGI,
        http=HTTPModes.http1,
        websockets=False,
        workers=workers,
        blocking_threads=threads,
        backpressure=GRANIAN_CONNECTIONS_PER_WORKER,
        http1_settings=HTTP1Settings(header_read_timeout=GRANIAN_HEADER_READ_TIMEOUT_S * 1000),
        log_level=LogLevels.warning,
        log_dictconfig=_GRANIAN_LOGGING,
        respawn_failed_workers=True,
        respawn_interval=GRANIAN_RESPAWN_INTERVAL_S,
        workers_kill_timeout=GRACEFUL_TIMEOUT_S,
    )
    server.serve(target_loader=partial(_granian_app, settings), wrap_loader=False)


# granian's own messages on stderr, as gunicorn's are (its default is stdout).
_GRANIAN_LOGGING: dict[str, Any] = {
    "handlers": {
        "console": {
            "formatter": "generic",
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
        },
        "access": {
            "formatter": "access",
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
        },
    }
}
