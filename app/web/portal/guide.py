"""What the portal teaches: the headers Kurir sends, verification snippets, example envelopes.

The snippets are meant to be copied and run as they are; tests/integration/test_portal_guide.py
runs the Python and Node ones against real deliveries, so they stay correct. Each names the
endpoint's secret by its first characters only (the page that reveals it is one click away),
so a partner with several endpoints knows which secret goes where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.models import EventType


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


@dataclass(frozen=True)
class Snippet:
    language: str
    key: str
    code: str


def snippets(hint: str | None) -> list[Snippet]:
    shown = hint or secret_hint(None)
    return [
        Snippet("Python (standardwebhooks)", "python", PYTHON.replace("{hint}", shown)),
        Snippet("Node", "node", NODE.replace("{hint}", shown)),
        Snippet("Go", "go", GO.replace("{hint}", shown)),
    ]
