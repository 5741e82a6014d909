"""`kurir listen` as a user runs it: a subprocess the real delivery engine delivers to."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from app import runtime as runtime_mod
from app.models import SUCCEEDED, Delivery
from app.ports import free_port
from app.runtime import Runtime
from app.signing import build_headers, generate_secret, generate_signing_key, public_key_of
from sender.dispatch import enqueue_now
from tests.support.factories import (
    WorkerThread,
    make_endpoint,
    make_event_with_deliveries,
    make_partner,
    wait_for,
)

KURIR = str(Path(sys.executable).with_name("kurir"))


class Listener:
    """`kurir listen` in a subprocess, its printout collected."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [KURIR, "listen", "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "KURIR_LISTEN_SECRET"},
        )
        wait_for(self._up, timeout_s=60)  # a process start on a busy machine

    def _up(self) -> bool:
        try:
            return requests.get(self.url, timeout=1).status_code == 200
        except requests.ConnectionError:
            return False

    def stop(self) -> str:
        self.process.terminate()
        out, _ = self.process.communicate(timeout=10)
        return out


@pytest.fixture
def listener_factory() -> Iterator[Any]:
    started: list[Listener] = []

    def start(*args: str) -> Listener:
        listener = Listener(*args)
        started.append(listener)
        return listener

    yield start
    for listener in started:
        if listener.process.poll() is None:
            listener.process.kill()
            listener.process.communicate(timeout=10)


def test_a_delivery_arrives_printed_with_its_signature_checked(
    settings, migrated, redis_client, listener_factory
):
    rt = Runtime(settings, database=migrated.db)
    runtime_mod.install(rt)
    secret = generate_secret()
    listener = listener_factory("--secret", secret)
    with rt.db.begin() as session:
        partner = make_partner(session, "acme")
        endpoint = make_endpoint(
            session, partner, listener.url + "/hooks", rt.secret_box, secret=secret
        )
        event, deliveries = make_event_with_deliveries(session, partner, [endpoint])
    enqueue_now(rt.redis, [d.id for d in deliveries])
    with WorkerThread(rt):

        def delivered() -> bool:
            with rt.db.begin() as session:
                return session.get_one(Delivery, deliveries[0].id).state == SUCCEEDED

        wait_for(delivered, timeout_s=20)
    printed = listener.stop()
    rt.close()
    assert "POST /hooks  -> 200" in printed
    assert f"webhook-id: {event.id}" in printed
    assert "signature: ok" in printed
    assert '"partner": "acme"' in printed  # the pretty body


def test_a_bad_signature_is_answered_401_and_said_so(listener_factory):
    listener = listener_factory("--secret", generate_secret())
    body = b'{"id": "evt_1", "data": {}}'
    forged = build_headers("evt_1", int(time.time()), body, [generate_secret()], "test")
    assert requests.post(listener.url, data=body, headers=forged, timeout=5).status_code == 401
    printed = listener.stop()
    assert "signature: INVALID (signature_mismatch" in printed


def test_an_ed25519_delivery_is_checked_with_the_public_key(
    settings, migrated, redis_client, listener_factory
):
    rt = Runtime(settings, database=migrated.db)
    runtime_mod.install(rt)
    key = generate_signing_key()
    listener = listener_factory("--public-key", public_key_of(key))
    with rt.db.begin() as session:
        partner = make_partner(session, "acme")
        endpoint = make_endpoint(
            session,
            partner,
            listener.url + "/hooks",
            rt.secret_box,
            secret=key,
            signature="ed25519",
        )
        _, deliveries = make_event_with_deliveries(session, partner, [endpoint])
    enqueue_now(rt.redis, [d.id for d in deliveries])
    with WorkerThread(rt):

        def delivered() -> bool:
            with rt.db.begin() as session:
                return session.get_one(Delivery, deliveries[0].id).state == SUCCEEDED

        wait_for(delivered, timeout_s=20)
    body = b'{"id": "evt_1", "data": {}}'
    forged = build_headers("evt_1", int(time.time()), body, [generate_signing_key()], "test")
    assert forged["webhook-signature"].startswith("v1a,")
    assert requests.post(listener.url, data=body, headers=forged, timeout=5).status_code == 401
    printed = listener.stop()
    rt.close()
    assert "POST /hooks  -> 200" in printed and "signature: ok" in printed
    assert "signature: INVALID (signature_mismatch" in printed


def test_a_malformed_public_key_is_refused_at_the_start():
    started = subprocess.run(
        [KURIR, "listen", "--port", "0", "--public-key", "whpk_short"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2 and "--public-key" in started.stderr


def test_without_a_secret_it_answers_the_chosen_status(listener_factory):
    listener = listener_factory("--status", "503")
    answer = requests.post(listener.url, data=b"not json", timeout=5)
    assert answer.status_code == 503
    printed = listener.stop()
    assert (
        "signature: not checked (no --secret or --public-key)" in printed and "not json" in printed
    )


def test_an_ordered_delivery_shows_its_sequence_and_previous_id(listener_factory):
    listener = listener_factory("--status", "200")
    sent = {"webhook-id": "evt_2", "webhook-sequence": "2", "webhook-previous-id": "evt_1"}
    assert requests.post(listener.url, data=b"{}", headers=sent, timeout=5).status_code == 200
    printed = listener.stop()
    assert "webhook-sequence: 2" in printed and "webhook-previous-id: evt_1" in printed
