"""Test kit for the inbound receiver: callbacks signed the way each provider signs them.

Standard Webhooks signatures come from the `standardwebhooks` package's own signer; Stripe
headers are built by hand as Stripe documents them and cross-checked with the `stripe`
package's verifier; GitHub and Shopify are HMAC-SHA256 over the raw body (hex / base64).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import stripe
from standardwebhooks.webhooks import Webhook

from app.inbound import sources
from app.runtime import Runtime

SCHEMES = ("standard-webhooks", "stripe", "github", "shopify")
TIMESTAMPED = ("standard-webhooks", "stripe")

SECRETS = {
    "standard-webhooks": "whsec_" + base64.b64encode(b"k" * 32).decode(),
    "stripe": "whsec_stripe_test_0123456789abcdef",
    "github": "github-webhook-secret",
    "shopify": "shpss_0123456789abcdef0123456789abcdef",
}
OTHER_SECRETS = {
    "standard-webhooks": "whsec_" + base64.b64encode(b"z" * 32).decode(),
    "stripe": "whsec_stripe_other_secret_fedcba98",
    "github": "another-github-secret",
    "shopify": "shpss_ffffffffffffffffffffffffffffffff",
}


def create_source(runtime: Runtime, name: str, scheme: str, **options: Any) -> str:
    secrets = options.pop("secrets", [SECRETS[scheme]])
    # As the operator's command line does: handlers may be given as module paths.
    options.setdefault("allow_handler_paths", True)
    with runtime.db.begin() as session:
        source = sources.create_source(
            session,
            runtime.secret_box,
            runtime.settings,
            name=name,
            scheme=scheme,
            secrets=secrets,
            **options,
        )
        return source.id


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat().replace("+00:00", "Z")


def callback(
    scheme: str,
    *,
    event_id: str,
    resource_id: str,
    version: int | None = None,
    status: str = "created",
    event_type: str | None = None,
    occurred: float | None = None,
) -> tuple[bytes, list[tuple[str, str]]]:
    """A body in the shape the scheme's preset mapping reads, and its unsigned headers."""
    occurred = time.time() if occurred is None else occurred
    headers: list[tuple[str, str]] = [("Content-Type", "application/json")]
    if scheme == "standard-webhooks":
        doc: dict[str, Any] = {
            "id": event_id,
            "type": event_type or f"payment.{status}",
            "version": 1,
            "occurred_at": iso(occurred),
            "partner": "acme",
            "resource": {"type": "payment", "id": resource_id, "version": version},
            "data": {"status": status, "note": "caf\u00e9 \u2603"},
        }
        headers.append(("webhook-id", event_id))
    elif scheme == "stripe":
        doc = {
            "id": event_id,
            "object": "event",
            "type": event_type or f"payment_intent.{status}",
            "created": int(occurred),
            "data": {"object": {"id": resource_id, "object": "payment_intent", "status": status}},
        }
    elif scheme == "github":
        doc = {
            "action": status,
            "pull_request": {"id": int(resource_id), "state": status, "updated_at": iso(occurred)},
        }
        headers += [
            ("X-GitHub-Delivery", event_id),
            ("X-GitHub-Event", event_type or "pull_request"),
        ]
    elif scheme == "shopify":
        doc = {"id": int(resource_id), "financial_status": status, "updated_at": iso(occurred)}
        headers += [
            ("X-Shopify-Webhook-Id", event_id),
            ("X-Shopify-Topic", event_type or f"orders/{status}"),
            ("X-Shopify-Shop-Domain", "acme.myshopify.com"),
        ]
    else:
        raise ValueError(scheme)
    # Not json.dumps defaults: keep odd spacing so a re-serialised body would not match.
    body = json.dumps(doc, separators=(", ", " : "), ensure_ascii=False).encode()
    return body, headers


def sign(
    scheme: str,
    secret: str,
    body: bytes,
    headers: list[tuple[str, str]],
    *,
    timestamp: int | None = None,
) -> list[tuple[str, str]]:
    """Add the scheme's signature headers, computed as the provider computes them."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    signed = list(headers)
    if scheme == "standard-webhooks":
        msg_id = dict((k.lower(), v) for k, v in headers).get("webhook-id", "msg_test")
        if not any(k.lower() == "webhook-id" for k, _ in headers):
            signed.append(("webhook-id", msg_id))
        signature = Webhook(secret).sign(
            msg_id, datetime.fromtimestamp(timestamp, tz=UTC), body.decode()
        )
        signed += [("webhook-timestamp", str(timestamp)), ("webhook-signature", signature)]
    elif scheme == "stripe":
        mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
        header = f"t={timestamp},v1={mac.hexdigest()}"
        signed.append(("Stripe-Signature", header))
    elif scheme == "github":
        mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        signed.append(("X-Hub-Signature-256", f"sha256={mac}"))
    elif scheme == "shopify":
        mac = base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest())
        signed.append(("X-Shopify-Hmac-Sha256", mac.decode()))
    else:
        raise ValueError(scheme)
    return signed


def stripe_accepts(body: bytes, headers: list[tuple[str, str]], secret: str) -> bool:
    """Stripe's own verifier agrees with our header (tolerance far wider than any test)."""
    header = dict(headers)["Stripe-Signature"]
    try:
        stripe.WebhookSignature.verify_header(body.decode(), header, secret, tolerance=10**10)
    except stripe.SignatureVerificationError:
        return False
    return True


def signed_callback(
    scheme: str, *, secret: str | None = None, timestamp: int | None = None, **fields: Any
) -> tuple[bytes, list[tuple[str, str]]]:
    body, headers = callback(scheme, **fields)
    return body, sign(scheme, secret or SECRETS[scheme], body, headers, timestamp=timestamp)
