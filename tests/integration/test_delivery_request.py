"""What a partner receives and how each answer is judged, end to end."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.clock import utcnow
from app.models import RETRYING, SUCCEEDED, Attempt, Delivery, Endpoint
from app.queues import DEFAULT, INBOUND, JobSpec, enqueue_many
from app.registry.secrets import rotate
from app.runtime import Runtime
from app.signing import generate_secret
from sender.dispatch import enqueue_now
from tests.support.factories import (
    Receiver,
    WorkerProcess,
    WorkerThread,
    make_endpoint,
    make_events,
    make_partner,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]


def _state(rt: Runtime, delivery_id: str) -> str:
    with rt.db.begin() as session:
        return session.get(Delivery, delivery_id).state


def _attempts(rt: Runtime) -> list[Attempt]:
    with rt.db.begin() as session:
        return list(session.scalars(select(Attempt).order_by(Attempt.delivery_id, Attempt.n)))


def _deliver(
    rt: Runtime, receiver_url: str, path: str = "/h", count: int = 1, **endpoint: Any
) -> tuple[Endpoint, list[str]]:
    with rt.db.begin() as session:
        partner = make_partner(session)
        ep = make_endpoint(session, partner, receiver_url + path, rt.secret_box, **endpoint)
        ids = make_events(session, partner, [ep], count)
    enqueue_now(rt.redis, ids)
    return ep, ids


def _headers(received: Any) -> dict[str, str]:
    return {
        k: received.headers[k] for k in ("webhook-id", "webhook-timestamp", "webhook-signature")
    }


def test_every_attempt_has_a_fresh_timestamp_and_signature_and_the_same_id(make_rt):
    rt = make_rt(retry_schedule=(1, 1), retry_jitter=0.0)
    with Receiver(lambda r, c: (500, {}, b"") if c == 1 else (200, {}, b"")) as receiver:
        ep, [delivery_id] = _deliver(rt, receiver.url)
        with WorkerThread(rt):
            wait_for(lambda: _state(rt, delivery_id) == SUCCEEDED, message="second attempt")
        first, second = receiver.on("/h")
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert int(second.headers["webhook-timestamp"]) > int(first.headers["webhook-timestamp"])
    assert second.headers["webhook-signature"] != first.headers["webhook-signature"]
    for received in (first, second):
        Webhook(ep.test_secret).verify(received.body, _headers(received))


def test_during_rotation_both_secrets_sign_and_after_it_only_the_new_one(make_rt):
    rt = make_rt()
    with Receiver() as receiver:
        with rt.db.begin() as session:
            partner = make_partner(session)
            ep = make_endpoint(session, partner, receiver.url + "/h", rt.secret_box)
            old = ep.test_secret
            new = generate_secret()
            rotate(session, ep, new, rt.secret_box, utcnow(), overlap_s=3600)
            during = make_events(session, partner, [ep], 1)
        enqueue_now(rt.redis, during)
        with WorkerThread(rt):
            wait_for(lambda: len(receiver.requests) == 1, message="delivery during overlap")
        [received] = receiver.requests
        assert len(received.headers["webhook-signature"].split(" ")) == 2
        Webhook(old).verify(received.body, _headers(received))
        Webhook(new).verify(received.body, _headers(received))

        with rt.db.begin() as session:
            for row in session.get(Endpoint, ep.id).secrets:
                if row.expires_at is not None:
                    row.expires_at = utcnow() - timedelta(seconds=1)  # the overlap is over
            partner = session.get(Endpoint, ep.id).partner
            after = make_events(session, partner, [session.get(Endpoint, ep.id)], 1)
        enqueue_now(rt.redis, after)
        with WorkerThread(rt):
            wait_for(lambda: len(receiver.requests) == 2, message="delivery after overlap")
        received = receiver.requests[1]
        assert " " not in received.headers["webhook-signature"]
        Webhook(new).verify(received.body, _headers(received))
        with pytest.raises(WebhookVerificationError):
            Webhook(old).verify(received.body, _headers(received))


def test_a_redirect_is_a_failure_and_its_target_is_never_contacted(make_rt):
    rt = make_rt()
    with (
        Receiver() as target,
        Receiver(lambda r, c: (302, {"Location": target.url + "/elsewhere"}, b"")) as receiver,
    ):
        _, [delivery_id] = _deliver(rt, receiver.url)
        with WorkerThread(rt):
            wait_for(lambda: _state(rt, delivery_id) == RETRYING, message="failed attempt")
        assert target.requests == []
    [attempt] = _attempts(rt)
    assert attempt.response_status == 302


def test_response_body_is_capped_at_4_kib_and_never_inflated(make_rt):
    rt = make_rt()
    bomb = gzip.compress(b"A" * 1_000_000)
    replies = {"/big": (200, {}, b"x" * 20_000), "/gz": (200, {"Content-Encoding": "gzip"}, bomb)}
    with Receiver(lambda r, c: replies[r.path]) as receiver:
        _, big = _deliver(rt, receiver.url, "/big")
        _, gz = _deliver(rt, receiver.url, "/gz")
        with WorkerThread(rt):
            wait_for(
                lambda: _state(rt, big[0]) == SUCCEEDED == _state(rt, gz[0]),
                message="both delivered",
            )
    by_url = {a.url.rsplit("/", 1)[1]: a for a in _attempts(rt)}
    assert by_url["big"].response_body == b"x" * 4096
    assert by_url["gz"].response_body == bomb[:4096]  # stored as sent, not decompressed


def test_the_answers_headers_are_kept_bounded_and_without_credentials(make_rt):
    rt = make_rt()
    flood = {f"X-Flood-{i}": "v" * 300 for i in range(60)}  # within what HTTP accepts
    replies = {
        "/plain": (202, {"X-Request-Id": "req-7", "Set-Cookie": "sid=s3cr3t"}, b"ok"),
        "/flood": (200, flood, b"ok"),
    }
    with Receiver(lambda r, c: replies[r.path]) as receiver:
        _, plain = _deliver(rt, receiver.url, "/plain")
        _, flooded = _deliver(rt, receiver.url, "/flood")
        with WorkerThread(rt):
            wait_for(
                lambda: _state(rt, plain[0]) == SUCCEEDED == _state(rt, flooded[0]),
                message="both delivered",
            )
    by_url = {a.url.rsplit("/", 1)[1]: a for a in _attempts(rt)}
    kept = by_url["plain"].response_headers
    assert kept["x-request-id"] == "req-7" and kept["set-cookie"] == "[redacted]"
    flooded_kept = by_url["flood"].response_headers
    assert 0 < len(flooded_kept) <= 50
    assert sum(len(k) + len(v) for k, v in flooded_kept.items()) <= 4096


def test_private_target_is_refused_at_send_time_as_blocked_address(make_rt):
    rt = make_rt(allow_private_targets=False)
    with Receiver() as receiver:
        _, [delivery_id] = _deliver(rt, receiver.url)
        with WorkerThread(rt):
            wait_for(lambda: _state(rt, delivery_id) == RETRYING, message="refused attempt")
        assert receiver.requests == []
    [attempt] = _attempts(rt)
    assert attempt.error == "blocked_address" and attempt.response_status is None
    with rt.db.begin() as session:
        assert session.get(Delivery, delivery_id).last_error == "blocked_address"


def test_retry_after_on_429_waits_at_least_that_long(make_rt):
    rt = make_rt(retry_schedule=(1, 1), retry_jitter=0.0)

    def reply(received: Any, count: int) -> tuple[int, dict[str, str], bytes]:
        return (429, {"Retry-After": "2"}, b"") if count == 1 else (200, {}, b"")

    with Receiver(reply) as receiver:
        _, [delivery_id] = _deliver(rt, receiver.url)
        with WorkerThread(rt):
            wait_for(lambda: _state(rt, delivery_id) == SUCCEEDED, message="after Retry-After")
        first, second = receiver.on("/h")
    # The schedule says 1 s; Retry-After says 2 s: at least 2 s it is.
    assert second.at - first.at >= 2.0


def test_an_endpoint_that_never_answers_times_out_at_its_deadline(make_rt):
    """Its own 1 s deadline ends the attempt: not the default timeout (30 s here), not the
    receiver (which would hang for 60 s)."""
    rt = make_rt(default_timeout_s=30)
    with Receiver(hang_paths=["/hang"]) as receiver:
        _, [delivery_id] = _deliver(rt, receiver.url, "/hang", timeout_s=1)
        with WorkerThread(rt):
            wait_for(lambda: _state(rt, delivery_id) == RETRYING, timeout_s=25, message="timed out")
    [attempt] = _attempts(rt)
    assert attempt.error == "timeout"
    assert 900 <= attempt.duration_ms < 15_000  # 1 s, far from the default's 30 s


def test_connections_are_reused_and_duplicate_jobs_are_harmless(make_rt):
    rt = make_rt()
    with Receiver() as receiver:
        _, ids = _deliver(rt, receiver.url, count=30)
        for _ in range(3):  # every job three times over
            enqueue_now(rt.redis, ids, tag="dup")
            enqueue_now(rt.redis, ids[::-1], tag="rev")
        with WorkerThread(rt):
            wait_for(lambda: all(_state(rt, i) == SUCCEEDED for i in ids), message="all")
        assert len(receiver.requests) == 30
        assert len(set(receiver.event_ids())) == 30
        ports = receiver.client_ports()
    # Keep-alive: a handful of pooled connections served all 30 POSTs.
    assert len(ports) <= 8, ports


def test_the_worker_never_imports_flask():
    """Neither the job module, the worker, nor any module of the engine loads Flask."""
    code = (
        "import importlib, pkgutil, sys, sender.engine, sender.jobs, app.processes.worker\n"
        "names = [m.name for m in pkgutil.iter_modules(sender.engine.__path__,"
        " 'sender.engine.')]\n"
        "assert len(names) >= 8, names\n"
        "for name in names: importlib.import_module(name)\n"
        "assert 'flask' not in sys.modules, 'flask was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def write_pid(path: str) -> None:
    """A job that leaves the pid it ran in (the inbound queue's reader keeps no return values)."""
    Path(path).write_text(str(os.getpid()))


@pytest.mark.parametrize("backend", ["sqlite"])  # no database work: one backend will do
def test_the_worker_runs_every_job_in_its_own_process_without_forking(
    settings, redis_client, tmp_path
):
    """Jobs on the default and inbound queues run inside the `kurir worker` process itself:
    each leaves the pid it ran in, and a fork per job would show a child's pid."""
    pid_files = [tmp_path / f"pid-{n}" for n in range(3)]
    specs = [
        JobSpec(queue, f"{__name__}.write_pid", (str(pid_file),))
        for queue, pid_file in zip((DEFAULT, INBOUND, DEFAULT), pid_files, strict=True)
    ]
    assert enqueue_many(redis_client, specs) == 3
    env = WorkerProcess(settings, tmp_path / "worker.log").env  # the test's stores
    worker = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--burst"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output = worker.communicate(timeout=120)[0].decode(errors="replace")
    assert worker.returncode == 0, output
    pids = [int(pid_file.read_text()) if pid_file.exists() else None for pid_file in pid_files]
    assert pids == [worker.pid] * 3, (pids, worker.pid, output)
