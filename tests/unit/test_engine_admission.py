"""Admission and the ledger's rooms: first contact, learning, and forgetting idle endpoints."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

import redis

from app.net.http import ERROR_TIMEOUT
from sender.deliver import AttemptResult
from sender.engine import ledger as ledger_mod
from sender.engine.admission import FIRST_CONTACT_CAP, Admission
from sender.engine.ledger import FAILING_STREAK, Ledger
from sender.ratelimit import RateLimiter


def make_admission(ledger: Ledger) -> Admission:
    # Nothing here talks to Redis: the client never connects (port 1 would refuse).
    connection = redis.Redis(host="127.0.0.1", port=1)
    return Admission(
        ledger, connection, RateLimiter(connection), random.Random(1), fast_cap=4, slow_cap=1
    )


def answer(duration_ms: int, status: int | None = 200, error: str | None = None) -> AttemptResult:
    return AttemptResult(datetime.now(UTC), duration_ms, status, b"", error, None, {}, None)


def test_an_endpoint_never_heard_from_sends_one_at_a_time_until_its_first_answer():
    ledger = Ledger()
    admission = make_admission(ledger)
    room = ledger.room("ep_new")
    mono = time.monotonic()
    assert admission.cap(room, mono) == FIRST_CONTACT_CAP == 1
    admission.observe(room, answer(20), mono)
    assert admission.cap(room, mono) == 4


def test_an_endpoint_whose_first_attempt_times_out_goes_to_the_slow_cap():
    ledger = Ledger()
    admission = make_admission(ledger)
    room = ledger.room("ep_hangs")
    mono = time.monotonic()
    assert admission.observe(room, answer(2000, None, ERROR_TIMEOUT), mono) is True
    assert admission.cap(room, mono) == 1
    assert room.is_slow(mono)


def test_idle_rooms_are_forgotten_past_the_bound_and_busy_ones_kept(monkeypatch):
    monkeypatch.setattr(ledger_mod, "MAX_ROOMS", 10)
    ledger = Ledger()
    for n in range(10):
        ledger.room(f"ep_{n}")
    ledger.rooms["ep_0"].inflight = 1  # sending now: must survive
    ledger.room("ep_new")
    assert len(ledger.rooms) <= 10 // 2 + 2
    assert "ep_0" in ledger.rooms and "ep_new" in ledger.rooms
    assert "ep_1" not in ledger.rooms  # the oldest idle room went first


def test_an_endpoint_failing_in_a_row_is_failing_until_one_attempt_succeeds():
    ledger = Ledger()
    admission = make_admission(ledger)
    room = ledger.room("ep_500")
    mono = time.monotonic()
    for _ in range(FAILING_STREAK - 1):
        admission.observe(room, answer(30, 500), mono)
    assert not room.failing
    admission.observe(room, answer(30, None, "protocol_error"), mono)
    assert room.failing and not room.is_slow(mono)  # quick errors: failing, not slow
    admission.observe(room, answer(30, 200), mono)
    assert not room.failing
