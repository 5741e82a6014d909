"""The operator UI through Flask's test client: login, CSRF, every page and every action."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
import redis
from rq import Queue
from sqlalchemy import select

from app.accounts import create_operator
from app.clock import utcnow
from app.models import (
    AuditRecord,
    DeadLetter,
    Endpoint,
    EndpointSecret,
    InboundEvent,
    InboundSource,
    OperationalEvent,
    Operator,
    ResendJob,
)
from app.ports import free_port
from app.queues import DEFAULT, KurirJob
from app.registry.secrets import current_secret
from app.runtime import Runtime
from app.web.ui import throttle
from dlq import resend as resend_mod
from tests.support.dlq_factories import letters_for, make_scene
from tests.support.factories import wait_for

EMAIL, PASSWORD = "ops@example.com", "correct horse battery"
_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def token(client, path: str = "/ui/login") -> str:
    match = _TOKEN.search(client.get(path).text)
    assert match, "no CSRF token on the page"
    return match.group(1)


@pytest.fixture
def operator(runtime):
    with runtime.db.begin() as session:
        create_operator(session, EMAIL, PASSWORD)


@pytest.fixture
def ui(client, operator):
    """A test client signed in as an operator."""
    response = client.post(
        "/ui/login", data={"email": EMAIL, "password": PASSWORD, "csrf_token": token(client)}
    )
    assert response.status_code == 302
    return client


@pytest.fixture
def letters(runtime):
    with runtime.db.begin() as session:
        scene = make_scene(
            session,
            runtime.secret_box,
            uid="acme",
            headers={"X-Api-Key": "partner-api-key-value", "X-Trace": "t-1"},
        )
        ids = letters_for(
            session, scene, 3, attempts=2, data=lambda i: {"sku": ["apple", "banana", "cherry"][i]}
        )
    return scene, ids


def _state(runtime, letter_id: str) -> str:
    with runtime.db.begin() as session:
        return session.get_one(DeadLetter, letter_id).state


# ------------------------------------------------------------------------------ session


def test_logged_out_user_is_sent_to_login_and_back_after(client, operator):
    response = client.get("/ui/dead-letters?q=apple")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/ui/login?next=")
    query = parse_qs(urlsplit(response.headers["Location"]).query)
    assert query["next"] == ["/ui/dead-letters?q=apple"]
    login = client.post(
        "/ui/login",
        data={
            "email": EMAIL,
            "password": PASSWORD,
            "next": "/ui/dead-letters?q=apple",
            "csrf_token": token(client),
        },
    )
    assert login.headers["Location"] == "/ui/dead-letters?q=apple"


def test_wrong_password_is_refused_and_the_session_cookie_is_locked_down(client, operator):
    bad = client.post(
        "/ui/login", data={"email": EMAIL, "password": "nope", "csrf_token": token(client)}
    )
    assert bad.status_code == 401 and "Wrong email or password" in bad.text
    good = client.post(
        "/ui/login", data={"email": EMAIL, "password": PASSWORD, "csrf_token": token(client)}
    )
    cookie = good.headers["Set-Cookie"]
    assert "kurir_session=" in cookie and "HttpOnly" in cookie
    assert "SameSite=Lax" in cookie and "Path=/ui" in cookie
    assert client.get("/ui/").status_code == 200


def _sign_in(client, password: str, email: str = EMAIL, address: str = "203.0.113.7"):
    return client.post(
        "/ui/login",
        data={"email": email, "password": password, "csrf_token": token(client)},
        environ_base={"REMOTE_ADDR": address},
    )


@pytest.fixture
def clock(monkeypatch):
    """The throttle's wall clock, standing still until a test moves it."""
    now = [1_000_000.0]
    monkeypatch.setattr(throttle, "_clock", lambda: now[0])
    return now


def test_repeated_wrong_passwords_make_the_account_wait(client, operator, clock):
    for _ in range(throttle.MAX_FAILURES_PER_ACCOUNT):
        assert _sign_in(client, "guess").status_code == 401
    locked = _sign_in(client, PASSWORD)  # even the right password waits: no oracle
    assert locked.status_code == 429 and "Too many failed sign-ins" in locked.text
    assert 0 < int(locked.headers["Retry-After"]) <= throttle.MAX_DELAY_S
    assert client.get("/ui/").status_code == 302
    # Another address does not unlock the account; another account is not locked.
    assert _sign_in(client, PASSWORD, address="198.51.100.9").status_code == 429
    assert _sign_in(client, "guess", email="other@example.com").status_code == 401
    # When the wait is over, the right password works and clears the count.
    clock[0] += int(locked.headers["Retry-After"])
    assert _sign_in(client, PASSWORD).status_code == 302
    client.post("/ui/logout", data={"csrf_token": token(client, "/ui/")})
    assert _sign_in(client, "guess").status_code == 401


def test_the_wait_doubles_with_each_failure_and_is_capped_not_a_lockout(client, operator, clock):
    """Back off instead of a fixed 15-minute lock anyone could keep renewing: each counted
    failure past the free ones doubles the next wait, up to MAX_DELAY_S; refused attempts
    count for nothing and do not extend it."""
    for _ in range(throttle.MAX_FAILURES_PER_ACCOUNT - 1):
        assert _sign_in(client, "guess").status_code == 401
    waits = []
    for _ in range(12):
        assert _sign_in(client, "guess").status_code == 401
        refused = _sign_in(client, "guess")
        assert refused.status_code == 429
        waits.append(int(refused.headers["Retry-After"]))
        for _ in range(3):  # hammering while refused changes nothing
            assert int(_sign_in(client, "guess").headers["Retry-After"]) == waits[-1]
        clock[0] += waits[-1]
    assert waits[:5] == [1, 2, 4, 8, 16]
    assert waits == sorted(waits) and waits[-1] == throttle.MAX_DELAY_S
    assert max(waits) < 900  # never the old fixed lock
    assert _sign_in(client, PASSWORD).status_code == 302


def test_a_concurrent_burst_is_counted_before_any_password_is_checked(
    live_server, operator, monkeypatch, clock
):
    """Every attempt is counted before the slow hash runs: a burst of guesses arriving
    together reaches the password check no more often than the free attempts allow. Each
    guess is held inside the password check until the whole burst has been answered or is
    inside it too, so the burst is as concurrent as it can be."""
    import threading

    import requests

    from app.services import operators as operators_service

    burst = 12
    arrived, answered = [0], [0]
    lock = threading.Lock()
    go = threading.Event()
    real_sign_in = operators_service.sign_in

    def held_sign_in(session, email, password):
        with lock:
            arrived[0] += 1
        go.wait(30)
        return real_sign_in(session, email, password)

    monkeypatch.setattr(operators_service, "sign_in", held_sign_in)
    form = requests.get(live_server.url + "/ui/login", timeout=30)
    csrf_token = _TOKEN.search(form.text).group(1)
    cookies = form.cookies.get_dict()
    codes: list[int] = []

    def guess() -> None:
        response = requests.post(
            live_server.url + "/ui/login",
            allow_redirects=False,
            cookies=cookies,
            timeout=60,
            data={"email": EMAIL, "password": "guess", "csrf_token": csrf_token},
        )
        with lock:
            codes.append(response.status_code)
            answered[0] += 1

    threads = [threading.Thread(target=guess) for _ in range(burst)]
    for thread in threads:
        thread.start()
    wait_for(
        lambda: arrived[0] + answered[0] >= burst,
        timeout_s=30,
        message="every guess to be answered or inside the password check",
    )
    go.set()
    for thread in threads:
        thread.join(60)
    assert len(codes) == burst
    assert codes.count(401) == arrived[0] == throttle.MAX_FAILURES_PER_ACCOUNT
    assert codes.count(429) == burst - throttle.MAX_FAILURES_PER_ACCOUNT


def test_one_address_spraying_many_accounts_is_throttled(client, operator, clock):
    for n in range(throttle.MAX_FAILURES_PER_CLIENT):
        assert _sign_in(client, "guess", email=f"user{n}@example.com").status_code == 401
    assert _sign_in(client, PASSWORD).status_code == 429
    assert _sign_in(client, PASSWORD, address="198.51.100.9").status_code == 302


def test_sign_in_still_works_when_redis_is_down(client, operator, runtime, monkeypatch):
    # The counters are disposable: an operator must get in to see why Redis is down.
    dead = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    monkeypatch.setattr(runtime, "redis", dead)
    assert _sign_in(client, "guess").status_code == 401
    assert _sign_in(client, PASSWORD).status_code == 302


def test_login_never_redirects_off_site(client, operator):
    for target in ("https://evil.example/ui", "//evil.example/ui", "/\\evil.example"):
        response = client.post(
            "/ui/login",
            data={
                "email": EMAIL,
                "password": PASSWORD,
                "next": target,
                "csrf_token": token(client),
            },
        )
        assert response.headers["Location"] == "/ui/"


def test_posts_without_the_csrf_token_are_rejected_and_change_nothing(ui, runtime, letters):
    _, ids = letters
    for data in ({}, {"csrf_token": "forged"}):
        response = ui.post(f"/ui/dead-letters/{ids[0]}/resend", data=data)
        assert response.status_code == 400
        assert "CSRF" in response.text
    assert _state(runtime, ids[0]) == "open"
    assert ui.post("/ui/login", data={"email": EMAIL, "password": PASSWORD}).status_code == 400


def test_logout_needs_the_token_and_ends_the_session(ui):
    assert ui.post("/ui/logout").status_code == 400
    response = ui.post("/ui/logout", data={"csrf_token": token(ui, "/ui/")})
    assert response.headers["Location"] == "/ui/login"
    assert ui.get("/ui/").status_code == 302


def test_a_disabled_operator_is_signed_out(ui, runtime):
    with runtime.db.begin() as session:
        session.scalar(select(Operator)).disabled = True
    assert ui.get("/ui/").status_code == 302


def test_pages_forbid_inline_script_and_framing(ui):
    response = ui.get("/ui/")
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "<script>" not in response.text and " style=" not in response.text


# ------------------------------------------------------------------------------ dead letters


def test_list_searches_the_payload_and_shows_empty_states(ui, runtime, letters):
    _, ids = letters
    page = ui.get("/ui/dead-letters?q=banana")
    assert ids[1] in page.text and ids[0] not in page.text
    nothing = ui.get("/ui/dead-letters?q=durian")
    assert "Nothing matches" in nothing.text and "clear all filters" in nothing.text
    bad = ui.get("/ui/dead-letters?status_code=abc")
    assert bad.status_code == 200 and "status_code" in bad.text  # flashed, not a crash
    with runtime.db.begin() as session:
        for letter in session.scalars(select(DeadLetter)):
            letter.state = "discarded"
    empty = ui.get("/ui/dead-letters")
    assert "No open dead letters" in empty.text


def test_list_paginates_with_a_cursor(ui, letters):
    _, ids = letters
    first = ui.get("/ui/dead-letters?limit=25")
    assert "Next page" not in first.text
    with_limit = ui.get("/ui/dead-letters", query_string={"limit": "25"})
    assert all(i in with_limit.text for i in ids)


def test_bulk_resend_and_discard_of_selected_letters(ui, runtime, letters):
    _, ids = letters
    csrf = token(ui, "/ui/dead-letters")
    response = ui.post(
        "/ui/dead-letters/bulk",
        data={
            "csrf_token": csrf,
            "action": "resend",
            "ids": [ids[0], ids[1]],
            "back": "/ui/dead-letters",
        },
        follow_redirects=True,
    )
    assert "Resent 2 dead letters." in response.text
    response = ui.post(
        "/ui/dead-letters/bulk",
        data={"csrf_token": csrf, "action": "discard", "ids": [ids[2]], "note": "dup of #12"},
        follow_redirects=True,
    )
    assert "Discarded 1 dead letter." in response.text
    with runtime.db.begin() as session:
        letters_ = {dl.id: dl for dl in session.scalars(select(DeadLetter))}
        assert [letters_[i].state for i in ids] == ["resent", "resent", "discarded"]
        assert letters_[ids[2]].note == "dup of #12"
        assert letters_[ids[0]].audit[-1].actor == f"operator:{EMAIL}"
    none = ui.post(
        "/ui/dead-letters/bulk",
        data={"csrf_token": csrf, "action": "resend"},
        follow_redirects=True,
    )
    assert "Select at least one" in none.text


def test_a_bulk_discard_passes_over_letters_no_longer_open_and_keeps_the_others(
    ui, runtime, letters
):
    _, ids = letters
    csrf = token(ui, "/ui/dead-letters")
    ui.post(f"/ui/dead-letters/{ids[1]}/discard", data={"csrf_token": csrf, "note": "first"})
    response = ui.post(
        "/ui/dead-letters/bulk",
        data={
            "csrf_token": csrf,
            "action": "discard",
            "ids": [ids[0], ids[1], ids[2], "dl_gone"],
            "note": "bulk",
        },
        follow_redirects=True,
    )
    assert "Discarded 2 dead letters; 2 were no longer open." in response.text
    with runtime.db.begin() as session:
        notes = {dl.id: (dl.state, dl.note) for dl in session.scalars(select(DeadLetter))}
    assert [notes[i] for i in ids] == [
        ("discarded", "bulk"),
        ("discarded", "first"),
        ("discarded", "bulk"),
    ]


def test_many_selected_letters_resend_in_the_background(ui, runtime, letters, monkeypatch):
    monkeypatch.setattr(resend_mod, "INLINE_LIMIT", 2)
    _, ids = letters
    response = ui.post(
        "/ui/dead-letters/bulk",
        data={"csrf_token": token(ui, "/ui/dead-letters"), "action": "resend", "ids": ids},
    )
    assert response.headers["Location"].startswith("/ui/jobs/bop_")


def test_resend_all_matching_runs_a_job_whose_progress_is_shown(ui, runtime, letters, redis_client):
    _, ids = letters
    response = ui.post(
        "/ui/dead-letters/resend-matching",
        data={"csrf_token": token(ui, "/ui/dead-letters"), "q": "apple"},
    )
    job_url = response.headers["Location"]
    assert job_url.startswith("/ui/jobs/")
    pending = ui.get(job_url)
    assert 'http-equiv="refresh"' in pending.text and "Waiting for a worker" in pending.text
    (job,) = Queue(DEFAULT, connection=redis_client, job_class=KurirJob).get_jobs()
    job.perform()
    done = ui.get(job_url)
    assert "succeeded" in done.text and [_state(runtime, i) for i in ids] == [
        "resent",
        "open",
        "open",
    ]
    # The job is done, its run is not: the page counts outcomes, and stops refreshing (a run
    # on the retry schedule can take days), saying so.
    assert 'data-testid="job-in-progress">1<' in done.text
    assert "finished · 0 delivered, 1 still on their way" in done.text
    assert 'http-equiv="refresh"' not in done.text and 'data-testid="no-refresh"' in done.text
    with runtime.db.begin() as session:
        session.get_one(DeadLetter, ids[0]).delivery.state = "succeeded"
    delivered = ui.get(job_url).text
    assert 'data-testid="job-delivered">1<' in delivered
    assert 'data-testid="job-failed-again">0<' in delivered
    assert 'http-equiv="refresh"' not in delivered
    with runtime.db.begin() as session:
        session.get_one(DeadLetter, ids[0]).delivery.state = "dead"
    assert 'data-testid="job-failed-again">1<' in ui.get(job_url).text


def test_resend_all_matching_without_criteria_needs_the_explicit_all(
    ui, runtime, letters, redis_client
):
    _, ids = letters
    listing = ui.get("/ui/dead-letters")
    assert 'name="all" value="1"' in listing.text
    assert "resends <strong>every</strong>" in listing.text
    assert 'name="all"' not in ui.get("/ui/dead-letters?q=apple").text
    implied = ui.post(
        "/ui/dead-letters/resend-matching", data={"csrf_token": token(ui, "/ui/dead-letters")}
    )
    assert implied.headers["Location"] == "/ui/dead-letters"
    assert "no search criteria were given" in ui.get("/ui/dead-letters").text
    assert [_state(runtime, i) for i in ids] == ["open"] * 3
    assert Queue(DEFAULT, connection=redis_client).count == 0
    explicit = ui.post(
        "/ui/dead-letters/resend-matching",
        data={"csrf_token": token(ui, "/ui/dead-letters"), "all": "1"},
    )
    assert explicit.headers["Location"].startswith("/ui/jobs/")
    (job,) = Queue(DEFAULT, connection=redis_client, job_class=KurirJob).get_jobs()
    job.perform()
    assert [_state(runtime, i) for i in ids] == ["resent"] * 3


def test_detail_shows_payload_attempts_and_hides_secrets(ui, letters):
    _, ids = letters
    page = ui.get(f"/ui/dead-letters/{ids[0]}")
    assert page.status_code == 200
    assert "&#34;sku&#34;: &#34;apple&#34;" in page.text  # pretty-printed, escaped
    assert "#2" in page.text and "#1" in page.text
    assert "upstream exploded" in page.text  # the response body
    assert "X-Trace" in page.text and "t-1" in page.text
    assert "X-Api-Key" in page.text and "partner-api-key-value" not in page.text
    assert "webhook-signature" in page.text and "c2VjcmV0LXNpZ25hdHVyZQ" not in page.text
    assert "park" in page.text  # the audit trail
    missing = ui.get("/ui/dead-letters/dl_nope")
    assert missing.status_code == 404 and "dead letter dl_nope not found" in missing.text


def test_resend_from_detail_to_a_disabled_endpoint_enables_it_or_is_forced(ui, runtime):
    with runtime.db.begin() as session:
        off = make_scene(session, runtime.secret_box, state="disabled")
        first, second = letters_for(session, off, 2)
    page = ui.get(f"/ui/dead-letters/{first}")
    assert "Enable the endpoint and resend" in page.text and "Resend anyway" in page.text
    csrf = token(ui, f"/ui/dead-letters/{first}")
    refused = ui.post(
        f"/ui/dead-letters/{first}/resend",
        data={"csrf_token": csrf},
        headers={"Referer": f"http://localhost/ui/dead-letters/{first}"},
        follow_redirects=True,
    )
    assert "endpoint is disabled" in refused.text
    assert _state(runtime, first) == "open"
    forced = ui.post(
        f"/ui/dead-letters/{first}/resend",
        data={"csrf_token": csrf, "force": "1"},
        follow_redirects=True,
    )
    assert "starts run 2" in forced.text
    assert _state(runtime, first) == "resent"
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, off.endpoint_id).state == "disabled"
    enabled = ui.post(
        f"/ui/dead-letters/{second}/resend",
        data={"csrf_token": csrf, "enable": "1"},
        follow_redirects=True,
    )
    assert "Endpoint enabled. Resent" in enabled.text
    assert _state(runtime, second) == "resent"
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, off.endpoint_id).state == "enabled"


def test_discard_from_detail_with_a_note(ui, runtime, letters):
    _, ids = letters
    response = ui.post(
        f"/ui/dead-letters/{ids[0]}/discard",
        data={"csrf_token": token(ui, f"/ui/dead-letters/{ids[0]}"), "note": "refunded by hand"},
        follow_redirects=True,
    )
    assert "Discarded." in response.text and "refunded by hand" in response.text
    assert _state(runtime, ids[0]) == "discarded"


# ------------------------------------------------------------------------------ endpoints


def test_endpoint_list_shows_health(ui, letters):
    scene, _ = letters
    page = ui.get("/ui/endpoints")
    assert scene.partner_uid in page.text and "0 %" in page.text  # 6 failed attempts
    assert ui.get("/ui/endpoints?state=disabled").text.count("/ui/endpoints/ep_") == 0


def test_disable_enable_and_rotate_an_endpoint(ui, runtime, letters):
    scene, _ = letters
    url = f"/ui/endpoints/{scene.endpoint_id}"
    csrf = token(ui, url)
    ui.post(f"{url}/disable", data={"csrf_token": csrf, "reason": "partner maintenance"})
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, scene.endpoint_id)
        assert (endpoint.state, endpoint.disabled_reason) == ("disabled", "partner maintenance")
    ui.post(f"{url}/enable", data={"csrf_token": csrf})
    rotated = ui.post(f"{url}/rotate-secret", data={"csrf_token": csrf})
    # Post, redirect, get: the page showing the secret is safe to reload.
    assert rotated.status_code == 302
    assert rotated.headers["Location"] == f"{url}/secret"
    assert "whsec_" not in rotated.text
    shown = ui.get(f"{url}/secret")
    secret = re.search(r'data-testid="secret">(whsec_[^<]+)<', shown.text).group(1)
    assert 'data-copy="#secret"' in shown.text and 'data-testid="overlap"' in shown.text
    assert secret not in ui.get(url).text  # never flashed through the cookie
    with runtime.db.begin() as session:
        endpoint = session.get_one(Endpoint, scene.endpoint_id)
        assert endpoint.state == "enabled"
        assert current_secret(endpoint, runtime.secret_box, utcnow()) == secret != scene.secret
        kinds = session.scalars(select(OperationalEvent.kind).order_by(OperationalEvent.id))
        # Rotations are in the endpoint's history too, beside disables and enables.
        assert list(kinds) == [
            "endpoint.disabled",
            "endpoint.enabled",
            "endpoint.secret_rotated",
        ]
        trail = session.execute(
            select(AuditRecord.action, AuditRecord.actor)
            .where(AuditRecord.subject_id == scene.endpoint_id)
            .order_by(AuditRecord.id)
        ).all()
        # Showing the secret is audited too: who saw it, and when.
        assert trail == [
            (action, f"operator:{EMAIL}")
            for action in (
                "endpoint.disabled",
                "endpoint.enabled",
                "endpoint.secret_rotated",
                "endpoint.secret_revealed",
            )
        ]
    page = ui.get(url).text
    assert "endpoint.enabled" in page and "endpoint.secret_rotated" in page


def test_reloading_the_secret_page_after_a_rotation_rotates_nothing(ui, runtime, letters):
    scene, _ = letters
    url = f"/ui/endpoints/{scene.endpoint_id}"
    ui.post(f"{url}/rotate-secret", data={"csrf_token": token(ui, url)})
    first = ui.get(f"{url}/secret").text
    again = ui.get(f"{url}/secret").text
    pattern = r'data-testid="secret">(whsec_[^<]+)<'
    assert re.search(pattern, first).group(1) == re.search(pattern, again).group(1)
    with runtime.db.begin() as session:
        secrets = session.scalars(
            select(EndpointSecret.id).where(EndpointSecret.endpoint_id == scene.endpoint_id)
        ).all()
    assert len(secrets) == 2  # the first one and one rotation, however often it is shown


def test_resend_everything_parked_since_the_endpoint_was_disabled(ui, runtime, redis_client):
    disabled_at = utcnow() - timedelta(hours=1)
    with runtime.db.begin() as session:
        scene = make_scene(session, runtime.secret_box)
        before = letters_for(session, scene, 1, created_at=disabled_at - timedelta(hours=1))
        parked = letters_for(session, scene, 2, reason="endpoint_disabled")
        endpoint = session.get_one(Endpoint, scene.endpoint_id)
        endpoint.state, endpoint.disabled_at = "disabled", disabled_at
    url = f"/ui/endpoints/{scene.endpoint_id}"
    page = ui.get(url)
    assert "Enable and resend everything parked since it was disabled (2)" in page.text
    response = ui.post(f"{url}/resend-parked", data={"csrf_token": token(ui, url)})
    assert response.headers["Location"].startswith("/ui/jobs/")
    (job,) = Queue(DEFAULT, connection=redis_client, job_class=KurirJob).get_jobs()
    job.perform()
    assert [_state(runtime, i) for i in parked] == ["resent", "resent"]
    assert _state(runtime, before[0]) == "open"
    with runtime.db.begin() as session:
        assert session.get_one(Endpoint, scene.endpoint_id).state == "enabled"
        job = session.scalar(select(ResendJob))
        assert (job.total, job.done) == (2, 2)
    # After re-enabling, the page still knows when it had been disabled.
    shown = disabled_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    assert re.search("since <time[^>]*>" + shown, ui.get(url).text)


# ------------------------------------------------------------------------------ other pages


def test_dashboard_shows_the_figures_an_operator_needs(ui, runtime, letters):
    page = ui.get("/ui/")
    assert page.status_code == 200
    assert re.search(r'data-testid="open-dead-letters">3<', page.text)
    assert "kurir-deliveries" in page.text  # queue depth table
    assert "<svg" in page.text and "s-dead" in page.text  # the chart has the dead deliveries


def test_dashboard_empty_state(ui):
    page = ui.get("/ui/")
    assert "No deliveries in the last 24 hours" in page.text
    assert "Every endpoint is enabled" in page.text


def test_event_lookup_by_any_id(ui, runtime, letters):
    _, ids = letters
    with runtime.db.begin() as session:
        letter = session.get_one(DeadLetter, ids[0])
        event_id, delivery_id = letter.event_id, letter.delivery_id
    assert ui.get(f"/ui/events?id={event_id}").headers["Location"] == f"/ui/events/{event_id}"
    assert (
        ui.get(f"/ui/events?id={delivery_id}").headers["Location"]
        == f"/ui/deliveries/{delivery_id}"
    )
    assert ui.get(f"/ui/events?id={ids[0]}").headers["Location"] == f"/ui/dead-letters/{ids[0]}"
    page = ui.get(f"/ui/events/{event_id}")
    assert "apple" in page.text and "badge-dead" in page.text
    assert f"/ui/dead-letters/{ids[0]}" in page.text
    unknown = ui.get("/ui/events?id=evt_nope")
    assert unknown.status_code == 404 and "Nothing has the id" in unknown.text


def test_inbound_page_lists_by_status_and_replays(ui, runtime):
    with runtime.db.begin() as session:
        source = InboundSource(name="shop", scheme="github", mapping={})
        session.add(source)
        session.flush()
        session.add(
            InboundEvent(
                source_id=source.id,
                event_id="gh-1",
                status="quarantined",
                reason="version_gap",
                raw_body=(
                    b'{"issue": {"id": 7, "state": "open", "updated_at": "2026-01-01T00:00:00Z"}}'
                ),
                headers={"x-github-delivery": "gh-1", "x-github-event": "issues"},
            )
        )
        session.add(
            InboundEvent(
                source_id=source.id, event_id="gh-2", status="applied", raw_body=b"{}", headers={}
            )
        )
    page = ui.get("/ui/inbound?status=quarantined")
    assert "gh-1" in page.text and "gh-2" not in page.text and "version_gap" in page.text
    empty = ui.get("/ui/inbound?status=failed")
    assert "No inbound event matches" in empty.text
    with runtime.db.begin() as session:
        inbound_id = session.scalar(select(InboundEvent.id).where(InboundEvent.event_id == "gh-1"))
    response = ui.post(
        f"/ui/inbound/{inbound_id}/replay",
        data={"csrf_token": token(ui, "/ui/inbound")},
        follow_redirects=True,
    )
    assert "queued for processing again" in response.text
    with runtime.db.begin() as session:
        assert session.get_one(InboundEvent, inbound_id).status == "received"
    missing = ui.post(
        "/ui/inbound/ine_nope/replay",
        data={"csrf_token": token(ui, "/ui/inbound")},
        follow_redirects=True,
    )
    assert "flash-error" in missing.text


# ------------------------------------------------------------------------------ review fixes


def test_a_filter_typo_is_marked_and_never_widens_a_bulk_action(ui, runtime, redis_client):
    """`since=yesterday` once dropped the whole filter: the page listed every open letter and
    offered to resend them all. Now the field is marked, the valid criteria stay applied and
    every bulk action is off; a hand-made POST with the typo resends nothing."""
    with runtime.db.begin() as session:
        mine = letters_for(session, make_scene(session, runtime.secret_box, uid="acme"), 2)
        other = letters_for(session, make_scene(session, runtime.secret_box, uid="globex"), 2)
    page = ui.get("/ui/dead-letters?partner=acme&since=yesterday")
    assert page.status_code == 200
    assert 'data-testid="error-since"' in page.text and 'aria-invalid="true"' in page.text
    assert "(got yesterday)" in page.text  # what was typed is shown, to be fixed
    assert all(i in page.text for i in mine) and not any(i in page.text for i in other)
    assert 'data-testid="bulk-off"' in page.text
    assert "resend-matching" not in page.text
    assert re.search(r'<button[^>]*value="resend"[^>]*disabled', page.text)
    posted = ui.post(
        "/ui/dead-letters/resend-matching",
        data={"csrf_token": token(ui, "/ui/dead-letters"), "partner": "acme", "since": "yesterday"},
        follow_redirects=True,
    )
    assert "Not resent" in posted.text and "since" in posted.text
    assert [_state(runtime, i) for i in mine + other] == ["open"] * 4
    assert Queue(DEFAULT, connection=redis_client).get_jobs() == []


_sprayed = itertools.count()


def test_behind_trusted_proxies_the_throttle_counts_the_real_client(
    settings, runtime, operator, clock
):
    from app.web import create_app

    app = create_app(
        runtime=Runtime(
            settings.with_overrides(trusted_proxies=("10.0.0.0/8",)), database=runtime.db
        )
    )
    client = app.test_client()

    def attempt(
        forwarded: str,
        password: str = "guess",  # noqa: S107
        peer: str = "10.1.2.3",
        email: str | None = None,
    ) -> int:
        return client.post(
            "/ui/login",
            data={
                "email": email or f"u{next(_sprayed)}@example.com",
                "password": password,
                "csrf_token": token(client),
            },
            headers={"X-Forwarded-For": forwarded},
            environ_base={"REMOTE_ADDR": peer},
        ).status_code

    for _ in range(throttle.MAX_FAILURES_PER_CLIENT):
        assert attempt("203.0.113.7") == 401
    assert attempt("203.0.113.7", PASSWORD, email=EMAIL) == 429
    # Another client behind the same proxy is not locked out with the first one...
    assert attempt("198.51.100.20", PASSWORD, email=EMAIL) == 302
    # ...and a peer outside the trusted networks cannot choose its address.
    assert attempt("198.51.100.21", PASSWORD, email=EMAIL, peer="203.0.113.7") == 429


def test_a_forwarded_request_with_no_trusted_proxy_is_warned_about_once(settings, runtime, caplog):
    """Behind an unnamed proxy every operator shares one address (and one sign-in count):
    the first request that shows a proxy in front says so in the log."""
    from app.web import create_app

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "app.web.proxy"]

    client = create_app(runtime=runtime).test_client()
    with caplog.at_level("WARNING", logger="app.web.proxy"):
        client.get("/healthz")
        assert warnings() == []
        for hop in ("203.0.113.7", "203.0.113.8"):
            client.get("/healthz", headers={"X-Forwarded-For": hop})
        assert len(warnings()) == 1 and "KURIR_TRUSTED_PROXIES" in warnings()[0]
        trusted = create_app(
            runtime=Runtime(settings.with_overrides(trusted_proxies=1), database=runtime.db)
        ).test_client()
        trusted.get("/healthz", headers={"X-Forwarded-For": "203.0.113.9"})
        assert len(warnings()) == 1


@pytest.mark.parametrize(
    ("base_url", "configured", "secure"),
    [
        ("http://localhost", None, False),  # a laptop over plain HTTP: the browser keeps it
        ("http://127.0.0.1:8080", None, False),
        ("http://kurir.internal.example", None, True),
        ("https://kurir.example.com", None, True),
        ("http://kurir.internal.example", False, False),  # said outright
        ("http://localhost", True, True),
    ],
)
def test_session_cookie_secure_flag(settings, runtime, operator, base_url, configured, secure):
    from app.web import create_app

    app = create_app(
        runtime=Runtime(settings.with_overrides(cookie_secure=configured), database=runtime.db)
    )
    client = app.test_client()
    page = client.get("/ui/login", base_url=base_url)
    cookie = page.headers["Set-Cookie"]
    assert ("; Secure" in cookie) is secure


def test_nul_and_giant_values_are_refused_not_a_server_error(client, ui, letters):
    """PostgreSQL refuses NUL in text, SQLite a LIKE pattern over 50,000 bytes: both a 400."""
    signed_out = client.application.test_client()
    answer = signed_out.post(
        "/ui/login",
        data={"email": "a\x00b@example.com", "password": PASSWORD, "csrf_token": token(signed_out)},
    )
    assert answer.status_code == 302  # sent back, the reason flashed
    assert "NUL character" in signed_out.get(answer.headers["Location"], follow_redirects=True).text
    for query in ("q=%00", "error=" + "e" * 1_000_000, "partner=%00", "next=%00"):
        page = ui.get(f"/ui/dead-letters?{query}")
        assert page.status_code == 400, (query[:20], page.status_code)
