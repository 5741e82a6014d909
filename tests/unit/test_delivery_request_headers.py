"""The request a partner receives: protocol headers win, custom ones filtered, secrets hidden."""

from __future__ import annotations

import time

from standardwebhooks.webhooks import Webhook

from app.headers import REDACTED, redact_sent
from sender.deliver import custom_headers, request_headers

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
BODY = b'{"test": 2432232314}'


def test_signed_headers_verify_and_carry_the_event_id():
    headers = request_headers("msg_p5jXN8AQM9LWM0D4loKWxJek", BODY, [SECRET], {}, 1614265330)
    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("Kurir/")
    fresh = request_headers("evt_1", BODY, [SECRET], {}, int(time.time()))
    assert Webhook(SECRET).verify(BODY, fresh) == {"test": 2432232314}


def test_custom_headers_cannot_override_protocol_or_framing_headers():
    headers = request_headers(
        "evt_1",
        BODY,
        [SECRET],
        {
            "X-Tenant": "t-1",
            "Webhook-Id": "forged",
            "webhook-signature": "v1,forged",
            "Content-Type": "text/plain",
            "Host": "evil",
            "Transfer-Encoding": "chunked",
            "X-Split": "a\r\nInjected: yes",
            "User-Agent": "other",
        },
        1614265330,
    )
    assert headers["X-Tenant"] == "t-1"
    assert headers["webhook-id"] == "evt_1"
    assert headers["content-type"] == "application/json"
    lowered = {k.lower() for k in headers}
    assert "host" not in lowered and "transfer-encoding" not in lowered
    assert "x-split" not in lowered
    assert [k for k in headers if k.lower() == "webhook-id"] == ["webhook-id"]


def test_custom_headers_ignore_non_strings():
    assert custom_headers({"X-Num": 5, "X-Ok": "yes"}) == {"X-Ok": "yes"}


def test_stored_request_headers_keep_custom_values_only_when_public():
    custom = {"Authorization": "Bearer abc", "X-Partner-Ref": "p-9", "X-Tenant": "t-1"}
    sent = {**custom, "webhook-signature": "v1,sig", "user-agent": "Kurir/1"}
    stored = redact_sent(sent, custom, public=["x-tenant"])
    # Write-only by default, whatever the name looks like: X-Partner-Ref may be a credential.
    assert stored["Authorization"] == stored["X-Partner-Ref"] == REDACTED
    assert stored["X-Tenant"] == "t-1"
    assert stored["webhook-signature"] == "v1,sig" and stored["user-agent"] == "Kurir/1"
