"""Test data built straight on the models, so delivery tests need no publish API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from app.clock import isoformat, utcnow
from app.crypto import SecretBox
from app.ids import new_id
from app.models import PENDING, Delivery, Endpoint, Event, Partner
from app.registry.secrets import add_secret
from app.signing import generate_secret


def make_partner(session: Session, uid: str | None = None, name: str | None = None) -> Partner:
    uid = uid or f"ptn-{new_id('x')[-10:].lower()}"
    partner = Partner(id=new_id("ptn"), uid=uid, name=name or uid)
    session.add(partner)
    session.flush()
    return partner


def make_endpoint(
    session: Session,
    partner: Partner,
    url: str,
    box: SecretBox,
    *,
    secret: str | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: int = 15,
    rate_limit_per_s: int | None = None,
    event_types: list[str] | None = None,
    state: str = "enabled",
    **fields: Any,
) -> Endpoint:
    """An endpoint with one encrypted signing secret (`endpoint.test_secret` holds it)."""
    endpoint = Endpoint(
        id=new_id("ep"),
        partner=partner,
        url=url,
        headers=headers or {},
        timeout_s=timeout_s,
        rate_limit_per_s=rate_limit_per_s,
        event_types=event_types,
        state=state,
        **fields,
    )
    session.add(endpoint)
    session.flush()
    secret = secret or generate_secret()
    add_secret(session, endpoint, secret, box)
    session.flush()
    endpoint.test_secret = secret  # type: ignore[attr-defined]
    return endpoint


def event_payload(event: Event, partner_uid: str) -> str:
    """The exact body a partner receives, as the publish API writes it."""
    resource = None
    if event.resource_type or event.resource_id:
        resource = {
            "type": event.resource_type,
            "id": event.resource_id,
            "version": event.resource_version,
        }
    return json.dumps(
        {
            "id": event.id,
            "type": event.type,
            "version": event.version,
            "occurred_at": isoformat(event.occurred_at),
            "partner": partner_uid,
            "resource": resource,
            "correlation_id": event.correlation_id,
            "data": event.data,
        },
        separators=(",", ":"),
    )


def make_event(
    session: Session,
    partner: Partner,
    *,
    type: str = "payment.succeeded",
    version: int = 1,
    data: dict[str, Any] | None = None,
    occurred_at: datetime | None = None,
) -> Event:
    event = Event(
        id=new_id("evt"),
        partner_id=partner.id,
        type=type,
        version=version,
        data=data if data is not None else {"amount": 100},
        occurred_at=occurred_at or utcnow(),
        payload="",
    )
    event.payload = event_payload(event, partner.uid)
    session.add(event)
    return event


def make_event_with_deliveries(
    session: Session,
    partner: Partner,
    endpoints: Sequence[Endpoint],
    *,
    state: str = PENDING,
    next_attempt_at: datetime | None = None,
    **event_fields: Any,
) -> tuple[Event, list[Delivery]]:
    """One event and one due delivery per endpoint, as a publish would commit them."""
    event = make_event(session, partner, **event_fields)
    now = utcnow()
    deliveries = [
        Delivery(
            id=new_id("dlv"),
            event_id=event.id,
            endpoint_id=endpoint.id,
            state=state,
            next_attempt_at=next_attempt_at or now,
        )
        for endpoint in endpoints
    ]
    session.add_all(deliveries)
    session.flush()
    return event, deliveries


def make_events(
    session: Session,
    partner: Partner,
    endpoints: Sequence[Endpoint],
    count: int,
    **event_fields: Any,
) -> list[str]:
    """`count` events fanned out to `endpoints`; returns every delivery id, in order."""
    ids: list[str] = []
    for i in range(count):
        _, deliveries = make_event_with_deliveries(
            session, partner, endpoints, data={"n": i}, **event_fields
        )
        ids.extend(d.id for d in deliveries)
    return ids


# ------------------------------------------------------------------------------- receivers


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when the request was read
    client_port: int = 0

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Reply = tuple[int, dict[str, str], bytes]


class Receiver:
    """A real HTTP server on 127.0.0.1 that records every POST and answers as told.

    `reply(received, count_for_path)` returns (status, headers, body), or None to close the
    connection without an answer; the default is 200. `hang_paths` never answer (until the
    receiver closes), like a partner that hangs.
    """

    def __init__(
        self,
        reply: Callable[[Received, int], Reply | None] | None = None,
        hang_paths: Sequence[str] = (),
    ) -> None:
        self.requests: list[Received] = []
        self.reply = reply
        self.hang_paths = set(hang_paths)
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.counts: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                item = Received(
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    time.time(),
                    self.client_address[1],
                )
                with receiver.lock:
                    receiver.requests.append(item)
                    count = receiver.counts[self.path] = receiver.counts.get(self.path, 0) + 1
                if self.path in receiver.hang_paths:
                    receiver.closing.wait(60)
                    self.close_connection = True
                    return
                answer = receiver.reply(item, count) if receiver.reply else (200, {}, b"ok")
                if answer is None:
                    self.close_connection = True
                    return
                status, headers, out = answer
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def on(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def client_ports(self) -> set[int]:
        """The client-side ports seen: one per TCP connection the sender opened."""
        with self.lock:
            return {r.client_port for r in self.requests}

    def event_ids(self, path: str | None = None) -> list[str]:
        with self.lock:
            return [
                r.headers["webhook-id"] for r in self.requests if path is None or r.path == path
            ]


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float = 30.0,
    interval_s: float = 0.02,
    message: str = "condition",
) -> Any:
    """Poll until `predicate()` is truthy; a deadline, not a sleep, bounds the test."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")
        time.sleep(interval_s)


# ------------------------------------------------------------------------------- processes


def _joined(
    thread: threading.Thread, timeout_s: float, what: str, exc_type: type[BaseException] | None
) -> None:
    """Join `thread`; one still running would go on into the next test, so that fails loudly
    (unless the test is already failing: its own error matters more)."""
    thread.join(timeout_s)
    if thread.is_alive() and exc_type is None:
        raise AssertionError(
            f"{what} did not stop within {timeout_s}s; where every thread "
            f"stands:\n{_thread_stacks()}"
        )


def _thread_stacks() -> str:
    """Every live thread's stack, for a thread that would not stop (which wait held it)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"--- {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    )


class WorkerThread:
    """`run_worker` in a thread (SimpleWorker + engine), stopped on exit."""

    def __init__(self, runtime: Any) -> None:
        from app.processes.worker import run_worker

        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=run_worker, args=(runtime,), kwargs={"stop": self.stop}, daemon=True
        )

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop.set()
        _joined(self.thread, 60, "the worker thread", exc_type)


class SweeperThread:
    """The sweeper pass on a short interval, as `kurir scheduler` runs it."""

    def __init__(self, runtime: Any, interval_s: float = 0.2) -> None:
        self.runtime = runtime
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.passes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from sender.sweeper import sweep

        while not self.stop.wait(self.interval_s):
            try:
                sweep(self.runtime)
            except Exception:  # noqa: S112 - a failing pass is retried, like the scheduler's
                continue
            self.passes += 1

    def __enter__(self) -> SweeperThread:
        self.thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop.set()
        _joined(self.thread, 30, "the sweeper thread", exc_type)


class WorkerProcess:
    """A real `kurir worker` process on the test's stores (SIGKILL it with `.kill()`);
    `command="scheduler"` runs `kurir scheduler` the same way."""

    def __init__(self, settings: Any, log_path: Any, command: str = "worker", **env: str) -> None:
        self.command = command
        self.env = dict(
            os.environ,
            DATABASE_URL=settings.database_url,
            REDIS_URL=settings.redis_url,
            KURIR_SECRET_KEY=settings.secret_key,
            KURIR_DATA_DIR=str(settings.data_dir),
            KURIR_ALLOW_PRIVATE_TARGETS="1",
            KURIR_LOG_LEVEL="info",
            **env,
        )
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> WorkerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", self.command], env=self.env, stdout=log, stderr=log
        )
        log.close()
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")
