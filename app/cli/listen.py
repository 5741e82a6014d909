"""`kurir listen`: a local receiver that prints every webhook it gets, signature checked.

For trying Kurir on a laptop and for debugging a partner integration: point an endpoint at it
(with KURIR_ALLOW_PRIVATE_TARGETS=1, since it listens on 127.0.0.1) and watch what a partner
would see: the Standard Webhooks headers, the verdict on the signature, the pretty body.
An HMAC endpoint's `v1` signature is checked with `--secret`, an Ed25519 one's `v1a` with
`--public-key`.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import click

from app import headers as header_names
from app import signing
from app.inbound.verify import DEFAULT_TOLERANCE_S, SignatureError, verify

MAX_BODY_BYTES = 4 * 1024 * 1024
_HEADERS_SHOWN = (
    "webhook-id",
    "webhook-timestamp",
    header_names.SEQUENCE_HEADER,
    header_names.PREVIOUS_ID_HEADER,
    "user-agent",
)


def verify_v1a(public_key: str, headers: Any, body: bytes, now: float) -> None:
    """Raise SignatureError unless a `v1a` signature of the webhook verifies with the key."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise SignatureError("missing_header", "a webhook-id, -timestamp or -signature is missing")
    if not timestamp.isdigit() or len(timestamp) > 12:
        raise SignatureError("malformed_header", "webhook-timestamp is not integer Unix seconds")
    if abs(now - int(timestamp)) > DEFAULT_TOLERANCE_S:
        raise SignatureError(
            "timestamp_out_of_tolerance", f"more than {DEFAULT_TOLERANCE_S} s from this clock"
        )
    if not signing.verify_v1a([public_key], msg_id, int(timestamp), body, signatures):
        raise SignatureError("signature_mismatch", "no v1a signature verifies with the key")


def make_server(
    host: str,
    port: int,
    *,
    secret: str | None,
    status: int,
    echo: Any = click.echo,
    public_key: str | None = None,
) -> ThreadingHTTPServer:
    """The receiver, not yet serving; `echo` prints one block per webhook."""
    printing = threading.Lock()

    class Receiver(BaseHTTPRequestHandler):
        server_version = "kurir-listen"

        def do_POST(self) -> None:  # noqa: N802 - http.server API
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(413, f"body over {MAX_BODY_BYTES} bytes")
                return
            body = self.rfile.read(length)
            verdict, code = "not checked (no --secret or --public-key)", status
            if secret is not None or public_key is not None:
                try:
                    if public_key is not None:
                        verify_v1a(public_key, self.headers, body, time.time())
                    else:
                        verify(
                            "standard-webhooks",
                            [str(secret)],
                            list(self.headers.items()),
                            body,
                            time.time(),
                        )
                    verdict = "ok"
                except SignatureError as exc:
                    verdict, code = f"INVALID ({exc.reason}: {exc})", 401
            lines = [f"{time.strftime('%H:%M:%S')}  POST {self.path}  -> {code}"]
            lines += [
                f"  {name}: {self.headers.get(name)}"
                for name in _HEADERS_SHOWN
                if self.headers.get(name) is not None
            ]
            lines.append(f"  signature: {verdict}")
            lines.append(_pretty(body))
            with printing:
                echo("\n".join(lines) + "\n")
            self._answer(code, "ok" if code < 300 else verdict)

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            self._answer(200, "kurir listen: POST webhooks here")

        def _answer(self, code: int, text: str) -> None:
            data = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass  # the block printed per webhook says it all

    return ThreadingHTTPServer((host, port), Receiver)


def _pretty(body: bytes) -> str:
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except ValueError:
        return body.decode("utf-8", "replace")


@click.command("listen")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=9000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--secret",
    envvar="KURIR_LISTEN_SECRET",
    default=None,
    help="The endpoint's whsec_ secret: signatures are checked and a bad one "
    "answered 401. Also read from KURIR_LISTEN_SECRET.",
)
@click.option(
    "--public-key",
    envvar="KURIR_LISTEN_PUBLIC_KEY",
    default=None,
    help="An Ed25519 endpoint's whpk_ public key: v1a signatures are checked and a bad "
    "one answered 401. Also read from KURIR_LISTEN_PUBLIC_KEY.",
)
@click.option(
    "--status",
    default=200,
    show_default=True,
    type=click.IntRange(100, 599),
    help="Status to answer (try 500 or 410 to watch retries or auto-disable).",
)
def listen_command(
    host: str, port: int, secret: str | None, public_key: str | None, status: int
) -> None:
    """Receive webhooks locally and print them, with their signature checked."""
    if secret is not None and public_key is not None:
        raise click.UsageError("give --secret (HMAC) or --public-key (Ed25519), not both")
    if public_key is not None and not signing.is_valid_public_key(public_key):
        raise click.BadParameter(
            "must be 'whpk_' followed by the base64 of 32 bytes", param_hint="--public-key"
        )
    server = make_server(host, port, secret=secret, status=status, public_key=public_key)
    bound_port = server.server_address[1]
    click.echo(
        f"kurir listen: POST webhooks to http://{host}:{bound_port}/ "
        f"(answering {status}); Ctrl-C to stop",
        err=True,
    )
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


COMMANDS = (listen_command,)
