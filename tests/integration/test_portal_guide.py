"""The portal's verification snippets, run as a partner would run them, against real
deliveries from the real engine: they accept Kurir's webhooks (also with two signatures during
a rotation) and refuse a forged one. Each runs twice: for an HMAC endpoint with its secret, and
for an Ed25519 endpoint with its public key (the one from before a rotation, so the second
webhook verifies by its older signature)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from werkzeug.serving import make_server

from app.models import Delivery
from app.ports import free_port
from app.web.portal import guide
from tests.support.factories import WorkerThread, wait_for
from tests.support.publish import make_partner


def _snippet(key: str, secret: str, signature: str = "hmac") -> str:
    hint = secret if signature == "ed25519" else secret[:10] + "…"
    (found,) = [s for s in guide.snippets(hint, signature) if s.key == key]
    return found.code


def _probe(client, auth, url: str, signature: str) -> tuple[dict, str, str]:
    """An endpoint of partner probe; its key for the snippet, and the variable holding it."""
    make_partner(client, auth, "probe")
    probe = client.post(
        "/v1/partners/probe/endpoints", headers=auth, json={"url": url, "signature": signature}
    ).get_json()
    if signature == "ed25519":
        return probe, probe["public_key"], "WEBHOOK_PUBLIC_KEY"
    return probe, probe["secret"], "WEBHOOK_SECRET"


def _forged(url: str) -> int:
    """A webhook signed v1 with another secret and v1a with another key: refused by all."""
    body = b'{"id":"evt_forged","type":"order.created","data":{}}'
    timestamp = str(int(time.time()))
    content = f"evt_forged.{timestamp}.".encode() + body
    wrong = hmac.new(b"not the secret", content, hashlib.sha256).digest()
    wrong_v1a = Ed25519PrivateKey.generate().sign(content)
    return requests.post(
        url,
        data=body,
        timeout=10,
        headers={
            "content-type": "application/json",
            "webhook-id": "evt_forged",
            "webhook-timestamp": timestamp,
            "webhook-signature": f"v1,{base64.b64encode(wrong).decode()} "
            f"v1a,{base64.b64encode(wrong_v1a).decode()}",
        },
    ).status_code


@pytest.fixture
def python_receiver(runtime) -> Iterator[tuple[str, dict[str, str]]]:
    env: dict[str, str] = {}
    holder: dict[str, object] = {}
    building = threading.Lock()

    def app(environ, start_response):  # the snippet's Flask app, built on first request
        with building:
            _build()
        return holder["app"](environ, start_response)  # type: ignore[operator]

    def _build() -> None:
        if "app" not in holder:
            namespace: dict[str, object] = {"__name__": "webhooks"}
            name = env["variable"]
            previous = os.environ.get(name)
            os.environ[name] = env["secret"]
            try:
                exec(compile(env["code"], "webhooks.py", "exec"), namespace)  # noqa: S102
            finally:
                if previous is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = previous
            holder["app"] = namespace["app"]

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/webhooks", env
    server.shutdown()


@pytest.mark.parametrize("signature", ["hmac", "ed25519"])
def test_the_python_snippet_verifies_real_webhooks(
    client, auth, runtime, python_receiver, signature: str
):
    url, env = python_receiver
    # The secret is only known once the endpoint exists: the app reads it on first request.
    probe, key, env["variable"] = _probe(client, auth, url, signature)
    env["secret"] = key
    env["code"] = _snippet("python", key, signature)
    library = "cryptography" if signature == "ed25519" else "standardwebhooks"
    assert library in env["code"] and key[:10] in env["code"]
    base = f"/v1/partners/probe/endpoints/{probe['id']}"
    first = client.post(f"{base}/test", headers=auth).get_json()["id"]
    client.post(f"{base}/secret/rotate", headers=auth)
    second = client.post(f"{base}/test", headers=auth).get_json()["id"]
    with WorkerThread(runtime):
        wait_for(
            lambda: _states(runtime, [first, second]) == ["succeeded", "succeeded"],
            timeout_s=30,
            message="the snippet to accept both test events",
        )
    assert _forged(url) == 400


def _states(runtime, ids: list[str]) -> list[str]:
    with runtime.db.begin() as session:
        found = [session.get_one(Delivery, i) for i in ids]
        states = [d.state for d in found]
        if any(s in ("retrying", "dead") for s in states):  # say why, rather than time out
            raise AssertionError(
                [
                    (d.state, [(a.response_status, a.error, a.response_body) for a in d.attempts])
                    for d in found
                ]
            )
        return states


RUNNERS = {
    # language: (program, how the snippet listens, how the test makes it listen, file name)
    "node": (shutil.which("node"), ".listen(3000)", '.listen({port}, "127.0.0.1")', "webhooks.js"),
    "go": (
        shutil.which("go"),
        'ListenAndServe(":3000"',
        'ListenAndServe("127.0.0.1:{port}"',
        "webhooks.go",
    ),
}


@pytest.mark.parametrize("signature", ["hmac", "ed25519"])
@pytest.mark.parametrize("language", sorted(RUNNERS))
def test_the_node_and_go_snippets_verify_real_webhooks(
    client, auth, runtime, tmp_path: Path, language: str, signature: str
):
    program, listens, instead, name = RUNNERS[language]
    if program is None:
        pytest.skip(f"{language} is not installed (apt-get install nodejs golang-go)")
    port = free_port()
    url = f"http://127.0.0.1:{port}/webhooks"
    probe, key, variable = _probe(client, auth, url, signature)
    code = _snippet(language, key, signature)
    assert listens in code and key[:10] in code
    script = tmp_path / name
    script.write_text(code.replace(listens, instead.format(port=port)))
    env = dict(
        os.environ,
        **{variable: key},
        GOCACHE=str(tmp_path / "gocache"),
        GOPATH=str(tmp_path / "gopath"),
        GO111MODULE="off",
    )
    command = [program, str(script)]
    if language == "go":
        built = subprocess.run(
            [program, "build", "-o", str(tmp_path / "webhooks"), str(script)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            timeout=300,
        )
        assert built.returncode == 0, built.stderr.decode()
        command = [str(tmp_path / "webhooks")]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path
    )
    try:
        wait_for(
            lambda: _listening(port) or process.poll() is not None,
            timeout_s=120,
            message=f"the {language} receiver to listen",
        )
        assert process.poll() is None, process.communicate()[0].decode()
        base = f"/v1/partners/probe/endpoints/{probe['id']}"
        first = client.post(f"{base}/test", headers=auth).get_json()["id"]
        client.post(f"{base}/secret/rotate", headers=auth)  # two signatures from now on
        second = client.post(f"{base}/test", headers=auth).get_json()["id"]
        with WorkerThread(runtime):
            wait_for(
                lambda: _states(runtime, [first, second]) == ["succeeded", "succeeded"],
                timeout_s=30,
                message="the snippet to accept both test events",
            )
        assert _forged(url) == 400
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0].decode()
    assert "kurir.test" in output  # it printed each event it accepted


def _listening(port: int) -> bool:
    try:
        requests.get(f"http://127.0.0.1:{port}/", timeout=1)
    except requests.ConnectionError:
        return False
    return True


def test_the_go_snippet_uses_only_the_standard_library_and_names_the_secret():
    code = _snippet("go", "whsec_AbCdEfGhIjKl")
    imports = code.split("import (", 1)[1].split(")", 1)[0].split()
    assert all("." not in name.strip('"') for name in imports), imports  # no module to fetch
    assert (
        "whsec_AbCd…" in code
        and 'strings.TrimPrefix(os.Getenv("WEBHOOK_SECRET"), "whsec_")' in code
    )
    public_key = "whpk_" + "A" * 43 + "="
    ed25519 = _snippet("go", public_key, "ed25519")
    imports = ed25519.split("import (", 1)[1].split(")", 1)[0].split()
    assert all("." not in name.strip('"') for name in imports), imports
    assert f"WEBHOOK_PUBLIC_KEY={public_key} go run" in ed25519  # public: named in full
