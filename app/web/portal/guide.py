"""What the portal teaches: the headers Kurir sends, verification snippets, example envelopes.

The snippets are meant to be copied and run as they are; tests/integration/test_portal_guide.py
runs them against real deliveries, so they stay correct. Each names the endpoint's secret by
its first characters only (the page that reveals it is one click away), so a partner with
several endpoints knows which secret goes where. An Ed25519 endpoint's snippets verify `v1a`
signatures with its public key, which they name in full: it is public.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.models import EventType
from app.vocabulary import SignatureKind


@dataclass(frozen=True)
class HeaderDoc:
    name: str
    example: str
    meaning: str


HEADERS = (
    HeaderDoc(
        "webhook-id",
        "evt_01J…",
        "the event id: the same on every retry and resend, so you can skip duplicates",
    ),
    HeaderDoc(
        "webhook-timestamp",
        "1767182400",
        "Unix seconds when this attempt was signed "
        "(new on every attempt); refuse it when more "
        "than 5 minutes away from your clock",
    ),
    HeaderDoc(
        "webhook-signature",
        "v1,K5oZ…=",
        "v1, then the base64 HMAC-SHA256 of "
        '"{webhook-id}.{webhook-timestamp}.{body}" '
        "keyed with the base64-decoded part of your "
        "secret after whsec_; while a rotated secret "
        "overlaps, one signature per secret, separated "
        "by spaces",
    ),
    HeaderDoc("content-type", "application/json", "the body is the event as JSON"),
    HeaderDoc("user-agent", "Kurir/…", "who is calling"),
)
ED25519_HEADERS = tuple(
    HeaderDoc(
        "webhook-signature",
        "v1a,hnO3…==",
        "v1a, then the base64 Ed25519 signature of "
        '"{webhook-id}.{webhook-timestamp}.{body}", made with the private key Kurir keeps; '
        "verify it with the endpoint's public key (the base64 after whpk_). While a rotated "
        "key overlaps, one signature per key, separated by spaces",
    )
    if h.name == "webhook-signature"
    else h
    for h in HEADERS
)


def headers(signature: str) -> tuple[HeaderDoc, ...]:
    """The headers an endpoint signed so receives, explained."""
    return ED25519_HEADERS if signature == SignatureKind.ED25519 else HEADERS


def secret_hint(prefix: str | None) -> str:
    """How a snippet names the secret: `whsec_AbCd…`, or a placeholder."""
    return f"{prefix}…" if prefix else "whsec_…"


def envelope(row: EventType, data: Any, partner_uid: str) -> dict[str, Any]:
    """An example body exactly as delivered (the fields every webhook carries, plus `data`)."""
    return {
        "id": "evt_01JEXAMPLE0000000000000000",
        "type": row.name,
        "version": row.version,
        "occurred_at": "2026-01-31T12:00:00Z",
        "partner": partner_uid,
        "resource": None,
        "correlation_id": None,
        "data": data,
    }


PYTHON = """# pip install flask standardwebhooks
import os

from flask import Flask, request
from standardwebhooks import Webhook, WebhookVerificationError

app = Flask(__name__)
wh = Webhook(os.environ["WEBHOOK_SECRET"])  # {hint}


@app.post("/webhooks")
def webhooks():
    try:
        # The raw body, exactly as received: parse it only once it is verified.
        event = wh.verify(request.get_data(), dict(request.headers))
    except WebhookVerificationError:
        return "invalid signature", 400
    print(event["type"], event["id"])  # the id repeats on retries: skip duplicates
    return "", 204
"""

NODE = """// Node 18 or later, no dependencies: WEBHOOK_SECRET={hint} node webhooks.js
const crypto = require("node:crypto");
const http = require("node:http");

const secret = Buffer.from(process.env.WEBHOOK_SECRET.replace(/^whsec_/, ""), "base64");

function verify(body, headers) {
  const id = headers["webhook-id"];
  const timestamp = headers["webhook-timestamp"];
  if (!id || !timestamp) return false;
  if (Math.abs(Date.now() / 1000 - Number(timestamp)) > 300) return false; // stale or replayed
  const expected = crypto.createHmac("sha256", secret)
    .update(`${id}.${timestamp}.`).update(body).digest();
  return (headers["webhook-signature"] || "").split(" ").some((entry) => {
    const [version, signature] = entry.split(",");
    const given = Buffer.from(signature || "", "base64");
    return version === "v1" && given.length === expected.length
      && crypto.timingSafeEqual(given, expected);
  });
}

http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const body = Buffer.concat(chunks); // the raw body: parse it only once it is verified
    if (!verify(body, req.headers)) {
      res.writeHead(400).end("invalid signature");
      return;
    }
    const event = JSON.parse(body);
    console.log(event.type, event.id); // the id repeats on retries: skip duplicates
    res.writeHead(204).end();
  });
}).listen(3000);
"""

GO = """// Go 1.18 or later, no dependencies: WEBHOOK_SECRET={hint} go run webhooks.go
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"log"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

var secret, _ = base64.StdEncoding.DecodeString(
	strings.TrimPrefix(os.Getenv("WEBHOOK_SECRET"), "whsec_"))

func verify(body []byte, h http.Header) bool {
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sent, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil || math.Abs(float64(time.Now().Unix()-sent)) > 300 {
		return false // missing, stale or replayed
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	expected := mac.Sum(nil)
	for _, entry := range strings.Split(h.Get("webhook-signature"), " ") {
		version, signature, found := strings.Cut(entry, ",")
		given, err := base64.StdEncoding.DecodeString(signature)
		if found && version == "v1" && err == nil && hmac.Equal(given, expected) {
			return true
		}
	}
	return false
}

func main() {
	http.HandleFunc("/webhooks", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body) // the raw body: decode it only once it is verified
		if err != nil || !verify(body, r.Header) {
			http.Error(w, "invalid signature", http.StatusBadRequest)
			return
		}
		log.Printf("%s", body) // webhook-id repeats on retries: skip duplicates
		w.WriteHeader(http.StatusNoContent)
	})
	log.Fatal(http.ListenAndServe(":3000", nil))
}
"""


PYTHON_ED25519 = """# pip install flask cryptography
import base64
import os
import time

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from flask import Flask, request

app = Flask(__name__)
# WEBHOOK_PUBLIC_KEY={hint}
public_key = Ed25519PublicKey.from_public_bytes(
    base64.b64decode(os.environ["WEBHOOK_PUBLIC_KEY"].removeprefix("whpk_"))
)


def verify(body, headers):
    msg_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    if not msg_id or not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
        return False  # missing, stale or replayed
    signed = f"{msg_id}.{timestamp}.".encode() + body
    for entry in headers.get("webhook-signature", "").split():
        version, _, signature = entry.partition(",")
        if version != "v1a":
            continue
        try:
            public_key.verify(base64.b64decode(signature), signed)
            return True
        except (InvalidSignature, ValueError):
            continue
    return False


@app.post("/webhooks")
def webhooks():
    body = request.get_data()  # the raw body: parse it only once it is verified
    if not verify(body, request.headers):
        return "invalid signature", 400
    event = request.get_json()
    print(event["type"], event["id"])  # the id repeats on retries: skip duplicates
    return "", 204
"""

NODE_ED25519 = """// Node 18 or later, no dependencies: WEBHOOK_PUBLIC_KEY={hint} node webhooks.js
const crypto = require("node:crypto");
const http = require("node:http");

// The 32 bytes after whpk_, behind the DER prefix of an Ed25519 public key.
const publicKey = crypto.createPublicKey({
  key: Buffer.concat([
    Buffer.from("302a300506032b6570032100", "hex"),
    Buffer.from(process.env.WEBHOOK_PUBLIC_KEY.replace(/^whpk_/, ""), "base64"),
  ]),
  format: "der",
  type: "spki",
});

function verify(body, headers) {
  const id = headers["webhook-id"];
  const timestamp = headers["webhook-timestamp"];
  if (!id || !timestamp) return false;
  if (Math.abs(Date.now() / 1000 - Number(timestamp)) > 300) return false; // stale or replayed
  const signed = Buffer.concat([Buffer.from(`${id}.${timestamp}.`), body]);
  return (headers["webhook-signature"] || "").split(" ").some((entry) => {
    const [version, signature] = entry.split(",");
    return version === "v1a"
      && crypto.verify(null, signed, publicKey, Buffer.from(signature || "", "base64"));
  });
}

http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const body = Buffer.concat(chunks); // the raw body: parse it only once it is verified
    if (!verify(body, req.headers)) {
      res.writeHead(400).end("invalid signature");
      return;
    }
    const event = JSON.parse(body);
    console.log(event.type, event.id); // the id repeats on retries: skip duplicates
    res.writeHead(204).end();
  });
}).listen(3000);
"""

GO_ED25519 = """// Go 1.18 or later, no dependencies: WEBHOOK_PUBLIC_KEY={hint} go run webhooks.go
package main

import (
	"crypto/ed25519"
	"encoding/base64"
	"io"
	"log"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

var publicKey, _ = base64.StdEncoding.DecodeString(
	strings.TrimPrefix(os.Getenv("WEBHOOK_PUBLIC_KEY"), "whpk_"))

func verify(body []byte, h http.Header) bool {
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sent, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil || math.Abs(float64(time.Now().Unix()-sent)) > 300 {
		return false // missing, stale or replayed
	}
	if len(publicKey) != ed25519.PublicKeySize {
		return false
	}
	signed := append([]byte(id+"."+ts+"."), body...)
	for _, entry := range strings.Split(h.Get("webhook-signature"), " ") {
		version, signature, found := strings.Cut(entry, ",")
		given, err := base64.StdEncoding.DecodeString(signature)
		if found && version == "v1a" && err == nil && ed25519.Verify(publicKey, signed, given) {
			return true
		}
	}
	return false
}

func main() {
	http.HandleFunc("/webhooks", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body) // the raw body: decode it only once it is verified
		if err != nil || !verify(body, r.Header) {
			http.Error(w, "invalid signature", http.StatusBadRequest)
			return
		}
		log.Printf("%s", body) // webhook-id repeats on retries: skip duplicates
		w.WriteHeader(http.StatusNoContent)
	})
	log.Fatal(http.ListenAndServe(":3000", nil))
}
"""

PUBLIC_KEY_HINT = "whpk_…"


@dataclass(frozen=True)
class Snippet:
    language: str
    key: str
    code: str


def snippets(hint: str | None, signature: str = SignatureKind.HMAC) -> list[Snippet]:
    """The snippets for an endpoint signed so; `hint` names its secret (HMAC: the first
    characters) or its public key (Ed25519: the whole key)."""
    if signature == SignatureKind.ED25519:
        key = hint or PUBLIC_KEY_HINT
        return [
            Snippet("Python (cryptography)", "python", PYTHON_ED25519.replace("{hint}", key)),
            Snippet("Node", "node", NODE_ED25519.replace("{hint}", key)),
            Snippet("Go", "go", GO_ED25519.replace("{hint}", key)),
        ]
    shown = hint or secret_hint(None)
    return [
        Snippet("Python (standardwebhooks)", "python", PYTHON.replace("{hint}", shown)),
        Snippet("Node", "node", NODE.replace("{hint}", shown)),
        Snippet("Go", "go", GO.replace("{hint}", shown)),
    ]
