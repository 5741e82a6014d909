"""Signing cost per delivery: HMAC (`v1`) against Ed25519 (`v1a`), on a typical body.

Prints the CPU time (µs) one `webhook-signature` header costs the worker, for an HMAC secret,
an Ed25519 key (decoded once and kept, as the worker does), an Ed25519 key decoded afresh (the
first delivery after a rotation or a restart), and a rotation's two Ed25519 keys; and what a
receiver pays to verify one v1a signature. Each beside the HMAC figure of the same run.

    .venv/bin/python bench/signing.py [-n 20000] [--body-bytes 600]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app import signing  # noqa: E402


def _body(size: int) -> bytes:
    """An envelope as delivered, its data padded to about `size` bytes."""
    envelope = {
        "id": "evt_01JEXAMPLE0000000000000000",
        "type": "order.paid",
        "version": 1,
        "occurred_at": "2026-01-31T12:00:00Z",
        "partner": "acme",
        "resource": None,
        "correlation_id": None,
        "data": {"order_id": "ord_42", "amount": 1999, "note": ""},
    }
    base = len(json.dumps(envelope, separators=(",", ":")))
    envelope["data"]["note"] = "x" * max(0, size - base)  # type: ignore[index]
    return json.dumps(envelope, separators=(",", ":")).encode()


def _cpu_us(count: int, work: Callable[[int], object]) -> float:
    """CPU µs per call of `work(i)`, best of three runs (the machine is shared)."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for i in range(count):
            work(i)
        best = min(best, (time.process_time() - started) / count * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20000, help="signatures per figure")
    parser.add_argument("--body-bytes", type=int, default=600)
    args = parser.parse_args()
    body = _body(args.body_bytes)
    ts = int(time.time())
    secret = signing.generate_secret()
    key, older = signing.generate_signing_key(), signing.generate_signing_key()
    public = signing.public_key_of(key)
    fresh = [signing.generate_signing_key() for _ in range(min(args.n, 2000))]

    hmac_us = _cpu_us(args.n, lambda i: signing.sign([secret], f"evt_{i}", ts, body))
    ed_us = _cpu_us(args.n, lambda i: signing.sign([key], f"evt_{i}", ts, body))
    two_us = _cpu_us(args.n, lambda i: signing.sign([key, older], f"evt_{i}", ts, body))

    def cold(i: int) -> object:
        signing._private_key.cache_clear()  # the decode a new key costs once
        return signing.sign([fresh[i % len(fresh)]], f"evt_{i}", ts, body)

    cold_us = _cpu_us(len(fresh), cold)
    header = signing.sign([key], "evt_v", ts, body)
    verify_us = _cpu_us(
        args.n // 4, lambda i: signing.verify_v1a([public], "evt_v", ts, body, header)
    )

    print(f"body {len(body)} bytes, {args.n} signatures per figure, CPU µs (best of 3)")
    rows = [
        ("HMAC-SHA256 v1 (one secret)", hmac_us),
        ("Ed25519 v1a (one key, kept decoded)", ed_us),
        ("Ed25519 v1a, key decoded afresh", cold_us),
        ("Ed25519 v1a, rotation: two keys", two_us),
        ("receiver: verify one v1a", verify_us),
    ]
    for label, us in rows:
        print(f"  {label:40s} {us:8.1f} µs   {us / hmac_us:6.1f} × HMAC")


if __name__ == "__main__":
    main()
