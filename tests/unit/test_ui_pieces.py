"""Pure pieces of the operator UI and the dead-letter store: no database, no network."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from flask import Flask

from app.config import Settings
from app.ids import id_floor, new_id
from app.runtime import Runtime
from app.web import present
from app.web.ui import security


@pytest.mark.parametrize(
    "name",
    [
        "webhook-signature",
        "Authorization",
        "X-Api-Key",
        "x-partner-token",
        "Proxy-Authorization",
        "X-Client-Secret",
        "Cookie",
        "X-Session-Id",
        "X-Auth",
    ],
)
def test_credential_headers_are_hidden(name):
    (shown,) = present.shown_headers({name: "s3cr3t"})
    assert shown.hidden and "s3cr3t" not in shown.value and shown.name == name


@pytest.mark.parametrize(
    "name", ["webhook-id", "webhook-timestamp", "content-type", "user-agent", "X-Trace", "X-Tenant"]
)
def test_ordinary_headers_are_shown(name):
    (shown,) = present.shown_headers({name: "v"})
    assert not shown.hidden and shown.value == "v"


def test_pretty_json_indents_json_and_leaves_other_text():
    assert present.pretty_json('{"a":[1,2]}') == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert present.pretty_json(b"not json \xff") == "not json \ufffd"
    assert present.pretty_json(None) == ""
    assert present.pretty_json('{"city":"Zürich"}') == '{\n  "city": "Zürich"\n}'


def test_ago_and_duration_read_naturally():
    now = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
    assert present.ago(now - timedelta(seconds=5), now) == "5 s ago"
    assert present.ago(now - timedelta(minutes=3), now) == "3 min ago"
    assert present.ago(now - timedelta(days=2), now) == "2 d ago"
    assert present.ago(now + timedelta(hours=2), now) == "in 2 h"
    assert present.ago(None, now) == "never"
    assert present.duration(0.25) == "250 ms" and present.duration(7200) == "2.0 h"


def test_id_floor_orders_ids_by_creation_time():
    before = datetime.now(UTC) - timedelta(seconds=1)
    made = new_id("dlv")
    assert id_floor("dlv", before) < made < id_floor("dlv", before + timedelta(seconds=5))


def test_session_key_is_stable_purpose_bound_and_not_the_master_key(tmp_path):
    given = Runtime(Settings(data_dir=tmp_path, secret_key="master-key"))
    assert security.session_secret(given) == security.session_secret(
        Runtime(Settings(data_dir=tmp_path / "other", secret_key="master-key"))
    )
    assert "master-key" not in security.session_secret(given)
    dev = Runtime(Settings(data_dir=tmp_path / "dev"))
    first = security.session_secret(dev)  # generates the dev key file once
    assert first == security.session_secret(Runtime(Settings(data_dir=tmp_path / "dev")))
    assert first != security.session_secret(given)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/ui/dead-letters?q=a", "/ui/dead-letters?q=a"),
        ("/ui/", "/ui/"),
        ("https://evil.example/ui/", "/ui/"),
        ("//evil.example/ui", "/ui/"),
        ("/v1/dead-letters", "/ui/"),
        ("/ui\\..\\evil", "/ui/"),
        ("", "/ui/"),
    ],
)
def test_login_redirects_only_to_local_ui_paths(target, expected):
    app = Flask(__name__)
    app.add_url_rule("/ui/", "ui.dashboard", lambda: "")
    with app.test_request_context():
        assert security.safe_next(target) == expected


def test_workers_importing_dlq_do_not_load_flask():
    code = (
        "import sys, dlq.resend, dlq.discard, app.lifecycle.purge, dlq.search; "
        "assert 'flask' not in sys.modules, 'flask was imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
